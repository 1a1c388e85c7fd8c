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

CONVERT = (
    "import sys, onnx; from onnxruntime.transformers.float16 import convert_float_to_float16 as c; "
    "onnx.save(c(onnx.load(sys.argv[1]), keep_io_types=True), sys.argv[2])"
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


def measure(argv: list[str], cwd: Path, timeout: float | None = None) -> dict:
    """Run ``argv``; wall seconds, peak RSS (MiB) of that child, exit code, output. Past ``timeout`` seconds the
    child's process group is killed and ``timed_out`` is set."""
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    with tempfile.TemporaryFile(mode="w+") as log:  # a file, not a pipe: nothing to drain while waiting
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if timer:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024,
            "rc": proc.returncode, "output": out, "timed_out": killed.is_set()}


def _bert():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import bert_model

    return bert_model


def model_path(spec: dict) -> Path:
    if "path" in spec:
        return spec["path"]
    if "bert" in spec:
        return _bert().build_model(spec["bert"])
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    return fetch(spec["fetch"])


def run_ours(path: Path, shapes: list[str], work: Path, feed: Path | None = None, budget: str | None = None,
             timeout: float | None = None) -> dict:
    argv = [str(BIN / "workbench"), "compare", str(path), "--ref", "ort", "--cand", "ort:fp16", "--json",
            str(work / "ours.json")]
    if shapes:
        argv += ["--input-shapes", *shapes]
    if feed:
        argv += ["--inputs", str(feed)]
    if budget:
        argv += ["--memory-budget", budget]
    res = measure(argv, work, timeout)
    if res["timed_out"]:
        raise RuntimeError(f"workbench compare ran past {timeout:.0f} s and was killed: {res['output'][-2000:]}")
    if res["rc"] not in (0, 1):
        raise RuntimeError(f"workbench compare failed (exit {res['rc']}): {res['output'][-2000:]}")
    doc = json.loads((work / "ours.json").read_text())
    res.update(builds=doc["builds"], tensors=len(doc["tensors"]),
               flagged=sum(t["diverged"] for t in doc["tensors"]),
               first_divergent=(doc["first_divergent"] or {}).get("tensor"),
               culprit=(doc["culprits"][0]["node"] if doc["culprits"] else None), timing=doc.get("timing"),
               notes=doc.get("notes"))
    return res


def run_polygraphy(path: Path, shapes: list[str], work: Path, inputs_json: Path | None = None,
                   timeout: float | None = None) -> dict:
    """The anchor's three steps. With ``inputs_json`` both runs --load-inputs it; otherwise the first run
    generates the inputs and saves them for the second."""
    shape_args = ["--input-shapes", *shapes] if shapes else []
    inputs = ["--load-inputs", str(inputs_json)] if inputs_json else ["--save-inputs", "in.json"]
    fp16 = work / "model_fp16.onnx"
    steps = [
        measure([sys.executable, "-c", CONVERT, str(path), str(fp16)], work, timeout),
        measure([str(BIN / "polygraphy"), "run", str(path), "--onnxrt", "--onnx-outputs", "mark", "all",
                 *shape_args, *inputs, "--save-results", "ref.json"], work, timeout),
    ]
    steps.append(measure([str(BIN / "polygraphy"), "run", str(fp16), "--onnxrt", "--onnx-outputs", "mark", "all",
                          "--load-inputs", str(inputs_json or "in.json"), "--load-outputs", "ref.json"], work,
                         timeout))
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
    path = model_path(spec)
    row: dict = {"model": name, "weights_mib": weights_mib(path)}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        feed = inputs_json = None
        if "bert" in spec:
            bert = _bert()
            feed = bert.build_feed(work / "feed.npz")
            inputs_json = bert.write_polygraphy_inputs(work / "feed.json")
        try:
            ours = run_ours(path, spec["shapes"], work, feed, args.memory_budget, args.timeout)
            row["ours"] = {k: v for k, v in ours.items() if k != "output"}
        except RuntimeError as e:
            row["ours"] = {"error": str(e)}
        if not args.no_floor:
            floor_feed = feed or random_feed(path, spec["shapes"], work / "floor_feed.npz")
            try:
                row["floor"] = {k: v for k, v in run_floor(path, floor_feed, work, args.timeout).items()
                                if k != "output"}
            except RuntimeError as e:
                row["floor"] = {"error": str(e)}
        if not args.ours_only:
            row["polygraphy"] = run_polygraphy(path, spec["shapes"], work, inputs_json, args.timeout)
    ours, anchor, floor = row["ours"], row.get("polygraphy"), row.get("floor")
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
    if "error" in ours:
        lines.append(f"  ours       FAILED: {ours['error'][:600]}")
    else:
        t = ours.get("timing") or {}
        lines.append(f"  ours       {ours['wall_s']:8.2f} s  {ours['rss_mib']:7.0f} MiB peak RSS  "
                     f"cpu {ours['cpu_s']:.1f} s  "
                     f"(peak RSS - weights {ours['rss_mib'] - w:.0f} MiB; {ours['builds']} builds, {ours['flagged']} "
                     f"of {ours['tensors']} tensors flagged, first {ours['first_divergent']}, culprit "
                     f"{ours['culprit']}; timing {t})")
    if floor:
        if "error" in floor:
            lines.append(f"  floor      FAILED: {floor['error'][:600]}")
        else:
            lines.append(f"  floor      {floor['wall_s']:8.2f} s  {floor['rss_mib']:7.0f} MiB peak RSS  "
                         f"cpu {floor['cpu_s']:.1f} s  "
                         f"(peak RSS - weights {floor['rss_mib'] - w:.0f} MiB)")
    if anchor:
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
