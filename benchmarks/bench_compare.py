"""FP32 vs FP16, layer by layer: `workbench compare` against Polygraphy's flow, side by side in one run.

    python benchmarks/bench_compare.py [--models ppocr-det sample:cnn_fp16_overflow bert-12 ...]
        [--memory-budget 1G] [--ours-only] [--no-floor] [--timeout 600] [--out results.json]

Ours, one process:
    workbench compare M --ref ort --cand ort:fp16 [--input-shapes ...] [--inputs FEED.npz]
        [--memory-budget SIZE] --json ours.json
Polygraphy (the anchor), three processes, as its users run it:
    python -c <ORT's float16 converter, keep_io_types>   (polygraphy convert --fp-to-fp16 uses onnxconverter-common,
                                                         whose model ORT rejects on PP-OCR-det; see notes)
    polygraphy run M      --onnxrt --onnx-outputs mark all --save-inputs in.json --save-results ref.json
    polygraphy run M_fp16 --onnxrt --onnx-outputs mark all --load-inputs in.json --load-outputs ref.json
With a fixed feed (the bert-N models: benchmarks/bert_model.py), both sides get the same one: ours reads it as
.npz (--inputs) and both Polygraphy runs --load-inputs it as a Polygraphy inputs JSON.
Floor (one process): load the model with onnx, mark every node output as a graph output, convert to FP16 with ORT's
converter (keep_io_types), build the two ORT CPU sessions and run the feed once through both, no metrics: the lower
bound of the straightforward approach.
Wall time is summed over the anchor's steps and peak RSS is the largest step's (each measured by wait4 on the
child). Ratios are ours / anchor: the targets are time <= 0.1x (0.2x for the bert-N models) and peak RSS <= 0.5x.
"weights" is the model's file size (.onnx plus external data).

decoder-1.5b (benchmarks/decoder_model.py: 1.54B parameters, 5.7 GiB FP32 in external data, built into --bigcache):
ours streams it segment by segment (`--stream auto`: its files exceed the memory budget); "plain" is one ONNX
Runtime session and run of the FP32 model plus one of the FP16 model (decoder-fp16.onnx, same weights), each in its
own process; the targets are peak RSS <= 0.6x the FP32 file size and time < 3x plain. Every step of the big model
(ours, plain, each Polygraphy step) runs under a watchdog that kills its process group past --cap-gib of RSS; the
floor is skipped for it. Run the whole benchmark under `flock /work/bigcache/.lock` (one multi-GB job at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent

MODELS = {
    "ppocr-det": {"fetch": "ppocr-det", "shapes": ["x:[1,3,320,320]"]},
    "ppocr-rec": {"fetch": "ppocr-rec", "shapes": ["x:[1,3,48,320]"]},
    "ppocr-cls": {"fetch": "ppocr-cls", "shapes": ["x:[1,3,48,192]"]},
}
for _name in ("cnn_fp16_overflow", "fp16_clamp_constant", "healthy_cnn", "transformer_block"):
    MODELS[f"sample:{_name}"] = {"path": REPO / "sample_models" / f"{_name}.onnx", "shapes": []}
for _layers in (2, 12, 24):
    MODELS[f"bert-{_layers}"] = {"bert": _layers, "shapes": [], "time_target": 0.2}
MODELS["decoder-1.5b"] = {"decoder": True, "shapes": []}

# One plain ONNX Runtime session and run: argv = model, feed .npz.
PLAIN = """
import sys
import numpy as np, onnxruntime as ort
opts = ort.SessionOptions()
opts.log_severity_level = 3
session = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
out = session.run(None, dict(np.load(sys.argv[2])))
print(out[0].shape, float(np.isfinite(out[0]).mean()))
"""

CONVERT = (  # past protobuf's 2 GB, as its users must: no in-memory shape inference, saved with external data
    "import sys, onnx; from onnxruntime.transformers.float16 import convert_float_to_float16 as c; "
    "big = sys.argv[3:] == ['external']; "
    "m = c(onnx.load(sys.argv[1]), keep_io_types=True, disable_shape_infer=big); "
    "onnx.save(m, sys.argv[2], save_as_external_data=big, location='model_fp16.onnx.data')"
)

# The floor: argv = model, feed .npz. Typed outputs come from shape inference (the converter's keep_io_types casts
# only typed float outputs back to float32); a tensor inference could not type is marked untyped.
FLOOR = """
import sys

import numpy as np, onnx, onnxruntime as ort
from onnxruntime.transformers.float16 import convert_float_to_float16
model = onnx.load(sys.argv[1])
feed = dict(np.load(sys.argv[2]))
typed = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
skip = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
for node in model.graph.node:
    for name in node.output:
        if name and name not in skip:
            model.graph.output.append(typed.get(name) or onnx.ValueInfoProto(name=name))
            skip.add(name)
fp16 = convert_float_to_float16(model, keep_io_types=True)
opts = ort.SessionOptions()
opts.log_severity_level = 3
cpu = ["CPUExecutionProvider"]
sessions = [ort.InferenceSession(m.SerializeToString(), opts, providers=cpu) for m in (model, fp16)]
outs = [s.run(None, feed) for s in sessions]
print(len(outs[0]), "and", len(outs[1]), "outputs")
"""


def _watchdog(pid: int, cap_mib: float, start: float, over: dict, done: threading.Event) -> None:
    """Kill ``pid``'s process group once its processes together hold more than ``cap_mib`` of RSS."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not done.wait(0.2):
        try:
            procs = [root, *root.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
        except psutil.Error:
            continue
        if rss > cap_mib:
            over.update(at_s=time.perf_counter() - start, rss_mib=rss)
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
            return


def measure(argv: list[str], cwd: Path, timeout: float | None = None, cap_mib: float | None = None) -> dict:
    """Run ``argv``; wall seconds, peak RSS (MiB) of that child, exit code, output. Past ``timeout`` seconds the
    child's process group is killed and ``timed_out`` is set; past ``cap_mib`` of RSS (the group's) it is killed
    and ``over_cap`` holds when and at how much."""
    killed = threading.Event()
    over: dict = {}
    done = threading.Event()

    def kill() -> None:
        killed.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    with tempfile.TemporaryFile(mode="w+") as log:  # a file, not a pipe: nothing to drain while waiting
        start = time.perf_counter()
        from peak_rss import peak_mib, wrap  # here: this file is also imported alone (a --metric module)
        launch, rss_file = wrap(argv)  # the tool's own peak RSS (peak_rss.py)
        proc = subprocess.Popen(launch, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        dog = threading.Thread(target=_watchdog, args=(proc.pid, cap_mib, start, over, done), daemon=True) \
            if cap_mib else None
        if dog:
            dog.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        if dog:
            dog.join()
        if timer:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mib": peak_mib(rss_file, usage.ru_maxrss), "rc": proc.returncode,
            "output": out, "timed_out": killed.is_set(), "over_cap": over or None}


def _bert():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import bert_model

    return bert_model


def _decoder():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import decoder_model

    return decoder_model


def model_path(spec: dict, bigcache: Path | None = None) -> Path:
    if "path" in spec:
        return spec["path"]
    if "decoder" in spec:
        return _decoder().build(bigcache / "decoder-1.5b", dtype="fp32")
    if "bert" in spec:
        return _bert().build_model(spec["bert"])
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    return fetch(spec["fetch"])


def run_ours(path: Path, shapes: list[str], work: Path, feed: Path | None = None, budget: str | None = None,
             timeout: float | None = None, cap_mib: float | None = None, extra: tuple = ()) -> dict:
    argv = [str(BIN / "workbench"), "compare", str(path), "--ref", "ort", "--cand", "ort:fp16", "--json",
            str(work / "ours.json"), *extra]
    if shapes:
        argv += ["--input-shapes", *shapes]
    if feed:
        argv += ["--inputs", str(feed)]
    if budget:
        argv += ["--memory-budget", budget]
    res = measure(argv, work, timeout, cap_mib)
    if res["timed_out"]:
        raise RuntimeError(f"workbench compare ran past {timeout:.0f} s and was killed: {res['output'][-2000:]}")
    if res["over_cap"]:
        raise RuntimeError(f"workbench compare went over {cap_mib / 1024:.0f} GiB at {res['over_cap']['at_s']:.0f} s "
                           "and was killed")
    if res["rc"] not in (0, 1):
        raise RuntimeError(f"workbench compare failed (exit {res['rc']}): {res['output'][-2000:]}")
    doc = json.loads((work / "ours.json").read_text())
    res.update(builds=doc["builds"], tensors=len(doc["tensors"]),
               flagged=sum(t["diverged"] for t in doc["tensors"]),
               first_divergent=(doc["first_divergent"] or {}).get("tensor"),
               culprit=(doc["culprits"][0]["node"] if doc["culprits"] else None), timing=doc.get("timing"),
               diverged=(doc.get("verdict") or {}).get("diverged"),
               notes=doc.get("notes"))
    return res


def run_polygraphy(path: Path, shapes: list[str], work: Path, inputs_json: Path | None = None,
                   timeout: float | None = None, cap_mib: float | None = None, external: bool = False) -> dict:
    """The anchor's three steps. With ``inputs_json`` both runs --load-inputs it; otherwise the first run
    generates the inputs and saves them for the second. A step killed (over ``cap_mib`` or ``timeout``) ends the
    anchor: ``did_not_finish`` says where."""
    shape_args = ["--input-shapes", *shapes] if shapes else []
    inputs = ["--load-inputs", str(inputs_json)] if inputs_json else ["--save-inputs", "in.json"]
    fp16 = work / "model_fp16.onnx"
    argvs = [
        ("convert", [sys.executable, "-c", CONVERT, str(path), str(fp16), *(["external"] if external else [])]),
        ("run FP32", [str(BIN / "polygraphy"), "run", str(path), "--onnxrt", "--onnx-outputs", "mark", "all",
                      *shape_args, *inputs, "--save-results", "ref.json"]),
        ("run FP16", [str(BIN / "polygraphy"), "run", str(fp16), "--onnxrt", "--onnx-outputs", "mark", "all",
                      "--load-inputs", str(inputs_json or "in.json"), "--load-outputs", "ref.json"]),
    ]
    steps = []
    for label, argv in argvs:
        steps.append(measure(argv, work, timeout, cap_mib))
        last = steps[-1]
        failed = last["rc"] != 0 and label != "run FP16"  # the last step's exit code is its verdict
        if last["over_cap"] or last["timed_out"] or failed:
            why = (f"over {cap_mib / 1024:.0f} GiB at {last['over_cap']['at_s']:.0f} s" if last["over_cap"]
                   else f"past {timeout:.0f} s" if last["timed_out"] else
                   f"exit {last['rc']}: {(last['output'].strip().splitlines() or [''])[-1][:300]}")
            total = sum(s["wall_s"] for s in steps)
            return {"did_not_finish": f"did not finish: {why} (step '{label}', {total:.0f} s in all)",
                    "wall_s": total, "rss_mib": max(s["rss_mib"] for s in steps),
                    "steps_s": [round(s["wall_s"], 2) for s in steps],
                    "steps_rss_mib": [round(s["rss_mib"]) for s in steps]}
    log = steps[-1]["output"]
    failed = len(re.findall(r"FAILED \| Output", log))
    passed = len(re.findall(r"PASSED \| Output", log))
    return {"wall_s": sum(s["wall_s"] for s in steps), "cpu_s": sum(s["cpu_s"] for s in steps),
            "rss_mib": max(s["rss_mib"] for s in steps),
            "steps_s": [round(s["wall_s"], 2) for s in steps], "steps_rss_mib": [round(s["rss_mib"]) for s in steps],
            "flagged": failed, "compared": failed + passed, "rc": [s["rc"] for s in steps],
            "timed_out": any(s["timed_out"] for s in steps),
            "ref_json_mib": (work / "ref.json").stat().st_size / 2**20 if (work / "ref.json").exists() else None}


def run_floor(path: Path, feed: Path, work: Path, timeout: float | None = None) -> dict:
    res = measure([sys.executable, "-c", FLOOR, str(path), str(feed)], work, timeout)
    if res["rc"] != 0:
        raise RuntimeError(f"floor script failed (exit {res['rc']}): {res['output'][-2000:]}")
    return res


def run_plain(paths: list[Path], feed: Path, work: Path, timeout: float | None = None,
              cap_mib: float | None = None) -> dict:
    """One plain ORT session and run per model, each in its own process: summed time, largest peak RSS."""
    runs = [measure([sys.executable, "-c", PLAIN, str(p), str(feed)], work, timeout, cap_mib) for p in paths]
    for p, r in zip(paths, runs):
        if r["rc"] != 0 or r["over_cap"]:
            raise RuntimeError(f"plain run of {p.name} failed (exit {r['rc']}, over cap {r['over_cap']}): "
                               f"{r['output'][-1000:]}")
    return {"wall_s": sum(r["wall_s"] for r in runs), "cpu_s": sum(r["cpu_s"] for r in runs),
            "rss_mib": max(r["rss_mib"] for r in runs), "steps_s": [round(r["wall_s"], 2) for r in runs],
            "steps_rss_mib": [round(r["rss_mib"]) for r in runs]}


def random_feed(path: Path, shapes: list[str], out: Path, seed: int = 0) -> Path:
    """A seeded feed for a model without a fixed one (the floor needs one file): ``--input-shapes`` for dynamic
    dims (else 1), standard normal floats, zero integers."""
    import numpy as np
    import onnx
    from onnx import helper

    given = {}
    for item in shapes:
        name, dims = item.rsplit(":", 1)
        given[name] = json.loads(dims)
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feed = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = given.get(vi.name) or [d.dim_value or 1 for d in tt.shape.dim]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        feed[vi.name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind == "f"
                         else np.zeros(shape, dtype=dtype))
    np.savez(out, **feed)
    return out


def weights_mib(path: Path) -> float:
    """The model's file size, external data files next to it included (``<name>.data``)."""
    data = path.with_name(path.name + ".data")
    return (path.stat().st_size + (data.stat().st_size if data.exists() else 0)) / 2**20


def bench_one(name: str, args: argparse.Namespace) -> dict:
    spec = MODELS[name]
    path = model_path(spec, args.bigcache)
    big = "decoder" in spec
    cap = args.cap_gib * 1024 if big else None
    row: dict = {"model": name, "weights_mib": weights_mib(path), "big": big}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        feed = inputs_json = None
        if "bert" in spec:
            bert = _bert()
            feed = bert.build_feed(work / "feed.npz")
            inputs_json = bert.write_polygraphy_inputs(work / "feed.json")
        if big:
            import numpy as np
            from polygraphy.json import save_json

            dec = _decoder()
            feed = work / "feed.npz"
            np.savez(feed, **dec.make_feed())
            inputs_json = work / "feed.json"
            save_json([dec.make_feed()], str(inputs_json))
            fp16_path = dec.build(path.parent, dtype="fp16")
            row["plain"] = run_plain([path, fp16_path], feed, work, args.timeout, cap)
        try:
            ours = run_ours(path, spec["shapes"], work, feed, args.memory_budget, args.timeout, cap)
            row["ours"] = {k: v for k, v in ours.items() if k != "output"}
        except RuntimeError as e:
            row["ours"] = {"error": str(e)}
        if args.stream_too and not big:
            try:
                ours = run_ours(path, spec["shapes"], work, feed, args.memory_budget, args.timeout,
                                extra=("--stream", "on", "--segment-size", args.segment_size))
                row["ours_stream"] = {k: v for k, v in ours.items() if k != "output"}
            except RuntimeError as e:
                row["ours_stream"] = {"error": str(e)}
        if not args.no_floor and not big:
            floor_feed = feed or random_feed(path, spec["shapes"], work / "floor_feed.npz")
            try:
                row["floor"] = {k: v for k, v in run_floor(path, floor_feed, work, args.timeout).items()
                                if k != "output"}
            except RuntimeError as e:
                row["floor"] = {"error": str(e)}
        if not args.ours_only:
            row["polygraphy"] = run_polygraphy(path, spec["shapes"], work, inputs_json, args.timeout, cap, big)
    ours, anchor, floor = row["ours"], row.get("polygraphy"), row.get("floor")
    if "did_not_finish" in (anchor or {}):
        anchor = None
    if "wall_s" in ours and row.get("plain"):
        row["plain_time_ratio"] = ours["wall_s"] / row["plain"]["wall_s"]
        row["rss_per_weights"] = ours["rss_mib"] / row["weights_mib"]
    stream = row.get("ours_stream")
    if stream and "wall_s" in stream and anchor:
        row["stream_time_ratio"] = stream["wall_s"] / anchor["wall_s"]
        row["stream_rss_ratio"] = stream["rss_mib"] / anchor["rss_mib"]
    if "wall_s" in ours:
        ours["rss_minus_weights_mib"] = ours["rss_mib"] - row["weights_mib"]
        if anchor:
            row["time_ratio"] = ours["wall_s"] / anchor["wall_s"]
            row["rss_ratio"] = ours["rss_mib"] / anchor["rss_mib"]
            row["cpu_ratio"] = ours["cpu_s"] / anchor["cpu_s"]
        if floor and "wall_s" in floor:
            row["floor_time_ratio"] = ours["wall_s"] / floor["wall_s"]
            row["floor_rss_ratio"] = ours["rss_mib"] / floor["rss_mib"]
            row["floor_cpu_ratio"] = ours["cpu_s"] / floor["cpu_s"]
    row["time_target"] = spec.get("time_target", 0.1)
    row["memory_budget"] = args.memory_budget
    return row


def _ok(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def report(row: dict) -> str:
    name, w = row["model"], row["weights_mib"]
    ours, anchor, floor = row["ours"], row.get("polygraphy"), row.get("floor")
    lines = [f"{name}: weights {w:.1f} MiB" + (f"; ours with --memory-budget {row['memory_budget']}"
                                              if row.get("memory_budget") else "")]
    for label, res in (("ours", ours), ("ours-stream", row.get("ours_stream"))):
        if res is None:
            continue
        if "error" in res:
            lines.append(f"  {label:<10} FAILED: {res['error'][:600]}")
            continue
        t = res.get("timing") or {}
        lines.append(f"  {label:<10} {res['wall_s']:8.2f} s  {res['rss_mib']:7.0f} MiB peak RSS  "
                     f"cpu {res['cpu_s']:.1f} s  "
                     f"(peak RSS - weights {res['rss_mib'] - w:.0f} MiB; {res['builds']} builds, {res['flagged']} "
                     f"of {res['tensors']} tensors flagged, first {res['first_divergent']}, culprit "
                     f"{res['culprit']}, diverged {res.get('diverged')}; timing {t})")
    plain = row.get("plain")
    if plain:
        lines.append(f"  plain ORT  {plain['wall_s']:8.2f} s  {plain['rss_mib']:7.0f} MiB peak RSS  "
                     f"cpu {plain['cpu_s']:.1f} s  (one session + run of the FP32 and of the FP16 model: "
                     f"{plain['steps_s']} s, {plain['steps_rss_mib']} MiB)")
    if floor:
        if "error" in floor:
            lines.append(f"  floor      FAILED: {floor['error'][:600]}")
        else:
            lines.append(f"  floor      {floor['wall_s']:8.2f} s  {floor['rss_mib']:7.0f} MiB peak RSS  "
                         f"cpu {floor['cpu_s']:.1f} s  "
                         f"(peak RSS - weights {floor['rss_mib'] - w:.0f} MiB)")
    if anchor and "did_not_finish" in anchor:
        lines.append(f"  polygraphy {anchor['did_not_finish']}; steps {anchor['steps_s']} s, "
                     f"{anchor['steps_rss_mib']} MiB")
    elif anchor:
        lines.append(f"  polygraphy {anchor['wall_s']:8.2f} s  {anchor['rss_mib']:7.0f} MiB peak RSS  "
                     f"cpu {anchor['cpu_s']:.1f} s  "
                     f"(peak RSS - weights {anchor['rss_mib'] - w:.0f} MiB; steps {anchor['steps_s']} s, "
                     f"{anchor['steps_rss_mib']} MiB; {anchor['flagged']} of {anchor['compared']} outputs FAILED, "
                     f"ref.json {anchor['ref_json_mib'] or 0:.0f} MiB; rc {anchor['rc']}"
                     f"{'; TIMED OUT' if anchor['timed_out'] else ''})")
    if "time_ratio" in row:
        lines.append(f"  ours/polygraphy: time {row['time_ratio']:.3f}x (target <= {row['time_target']}x: "
                     f"{_ok(row['time_ratio'], row['time_target'])})  peak RSS {row['rss_ratio']:.3f}x "
                     f"(target <= 0.5x: {_ok(row['rss_ratio'], 0.5)})  cpu {row['cpu_ratio']:.3f}x")
    if "stream_time_ratio" in row:
        lines.append(f"  ours-stream/polygraphy: time {row['stream_time_ratio']:.3f}x  "
                     f"peak RSS {row['stream_rss_ratio']:.3f}x")
    if "plain_time_ratio" in row:
        lines.append(f"  ours/plain ORT: time {row['plain_time_ratio']:.2f}x (target < 3x: "
                     f"{_ok(row['plain_time_ratio'], 3.0)})  peak RSS / FP32 file {row['rss_per_weights']:.3f}x "
                     f"(target <= 0.6x: {_ok(row['rss_per_weights'], 0.6)})  culprit named: "
                     f"{'yes' if ours.get('culprit') else 'NO'}")
    if "floor_time_ratio" in row:
        lines.append(f"  ours/floor:      time {row['floor_time_ratio']:.3f}x  peak RSS {row['floor_rss_ratio']:.3f}x  "
                     f"cpu {row['floor_cpu_ratio']:.3f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ppocr-det", "sample:cnn_fp16_overflow",
                                                        "sample:fp16_clamp_constant"], choices=sorted(MODELS))
    parser.add_argument("--memory-budget", metavar="SIZE", help="passed to `workbench compare --memory-budget`")
    parser.add_argument("--ours-only", action="store_true", help="skip the Polygraphy anchor")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor measurement")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="kill a step (ours, the floor, one anchor step) after this many seconds (default 600)")
    parser.add_argument("--out", type=Path, help="write the measurements as JSON")
    parser.add_argument("--bigcache", type=Path, default=Path("/work/bigcache"),
                        help="where decoder-1.5b is built (outside any repository; default /work/bigcache)")
    parser.add_argument("--cap-gib", type=float, default=14.0,
                        help="kill any step of the big model past this much RSS (default 14)")
    parser.add_argument("--stream-too", action="store_true",
                        help="also run ours with --stream on for the models that do not stream by default")
    parser.add_argument("--segment-size", default="64M", help="--segment-size of that run (default 64M)")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(bench_one(name, args))
        print(report(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
