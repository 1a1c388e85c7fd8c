"""Mixed precision side by side: NVIDIA ModelOpt AutoCast and `workbench repair`, from the FP32 model, same task.

    python benchmarks/bench_repair_anchors.py [--precision fp16|int8|all] [--models NAME ...] [--out FILE.json]
                                              [--autocast-path DIR] [--keep DIR]

Models (real, from PyPI wheels, scripts/fetch_models.py): PP-OCRv4/v3/v5 detectors, PP-OCRv4/v3/v5 recognizers,
the PP-OCR direction classifier; and a 2-layer BERT-base-like encoder (benchmarks/bert_model.py, random weights).
Feeds: rendered text as rapidocr preprocesses it (tests/ocr_truth.py, small sets: det one 480x640 page, rec three
line crops, cls four crops, two of them rotated 180 degrees); BERT its one deterministic feed.

Tools, each in its own process (wall time and peak RSS of that process, os.wait4), each from the FP32 model:
  autocast        python -m modelopt.onnx.autocast --keep_io_types --providers cpu  (its defaults: random inputs)
  autocast+calib  the same with --calibration_data FEEDS (the task's feeds)
  workbench       workbench repair FP32 --cand ort:fp16 --inputs FEEDS --metric THIS_FILE:TASK --target T
                  --verify none (the task target below; the repaired model is the one judged)
Task target (the same for every tool), judged here independently of both tools: onnxruntime runs the FP32 model and
the tool's model, and the outputs are decoded as the task reads them (tests/ocr_truth.py): det < 0.5% of the DB
text-mask pixels flipped (worst feed), rec the same greedy-CTC text, cls the same class, BERT the same argmax
over the hidden units at >= 99% of the tokens and SQNR >= 30 dB.
High precision, counted the same way on every tool's model: nodes (other than Cast/Constant/Identity) with a
float32 output after onnx shape inference, and bytes of float32/float64 weights (initializers, Constants).

With --precision int8|all, benchmarks/anchors_int8.py (when present) adds its rows: ``run_int8(args)`` returns
rows with the keys of :data:`KEYS`; ``args`` carries ``models``, ``work`` (a scratch folder) and ``feeds`` (model
name -> folder of feed .npz). AutoCast needs ModelOpt's ONNX extras (onnx-graphsurgeon, onnxslim, lief); install
them into a folder (``pip install --no-deps --target DIR ...``) and pass ``--autocast-path DIR`` when the
environment lacks them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KEYS = ("model", "tool", "precision", "met", "high_nodes", "high_weight_bytes", "wall_s", "rss_mib", "note")
OCR_MODELS = ("ppocr-det", "ppocrv3-det", "ppocrv5-det", "ppocr-rec", "ppocrv3-rec", "ppocrv5-rec", "ppocr-cls")
MODELS = (*OCR_MODELS, "bert-L2")
TARGETS = {"det": ">=0.995", "rec": None, "cls": None, "bert": None}  # None: the task function returns a bool
MEMORY_CAP = 8 * 2**30  # address-space cap for each tool's process


# --- the task metrics (``--metric THIS_FILE:det_task``); reference and candidate outputs by name ---------------
def _first(outputs: dict) -> np.ndarray:
    return np.asarray(next(iter(outputs.values())))


def det_task(ref: dict, cand: dict) -> float:
    """Share of DB text-mask pixels (probability > 0.3) that agree with the reference."""
    return float(np.mean((_first(ref)[:, 0] > 0.3) == (_first(cand)[:, 0] > 0.3)))


def _ctc(probs: np.ndarray) -> list[list[int]]:
    out = []
    for row in probs.argmax(axis=-1):
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        out.append([int(i) for i in row[keep & (row != 0)]])
    return out


def rec_task(ref: dict, cand: dict) -> bool:
    """The same greedy CTC decode."""
    return _ctc(_first(ref)) == _ctc(_first(cand))


def cls_task(ref: dict, cand: dict) -> bool:
    """The same class."""
    return bool((_first(ref).argmax(-1) == _first(cand).argmax(-1)).all())


def _sqnr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    noise = float(np.sum((c - r) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(r**2) / noise))


def bert_task(ref: dict, cand: dict) -> bool:
    """Argmax over the hidden units agrees on >= 99% of the tokens and the SQNR is >= 30 dB."""
    r, c = _first(ref), _first(cand)
    return bool(np.mean(r.argmax(-1) == c.argmax(-1)) >= 0.99 and _sqnr_db(r, c) >= 30)


# --- models, feeds, truth --------------------------------------------------------------------------------------
def kind_of(name: str) -> str:
    return "bert" if name.startswith("bert") else name.rsplit("-", 1)[1]


def prepare(name: str, work: Path) -> tuple[Path, Path, list[dict]]:
    """(FP32 model, folder of feed .npz, the feeds)."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "scripts"), str(REPO / "benchmarks")]
    if kind_of(name) == "bert":
        import bert_model

        model = bert_model.build_model(int(name.rsplit("L", 1)[1]))
        feeds = [bert_model.make_feed()]
    else:
        import ocr_truth
        from fetch_models import fetch

        model = Path(fetch(name))
        feeds = ocr_truth.make_feeds(name, small=True)
    folder = work / f"{name}-feeds"
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed_{i:03d}.npz", **feed)
    return model, folder, feeds


def run_ort(path: Path, feeds: list[dict]) -> list[dict]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, f))) for f in feeds]


def task_met(name: str, ref: list[dict], got: list[dict]) -> tuple[bool, str]:
    """Whether ``got`` keeps the task's answer, decoded here (tests/ocr_truth.py for PP-OCR), and a short detail."""
    kind = kind_of(name)
    if kind == "bert":
        r, c = _first(ref[0]), _first(got[0])
        agree, sqnr = float(np.mean(r.argmax(-1) == c.argmax(-1))), _sqnr_db(r, c)
        return agree >= 0.99 and sqnr >= 30, f"argmax {100 * agree:.1f}%, {sqnr:.1f} dB"
    import ocr_truth

    truth = ocr_truth.task_truth(kind, [list(o.values()) for o in ref], [list(o.values()) for o in got])
    d = truth["detail"]
    detail = {"det": lambda: f"{100 * d['max_flip_fraction']:.3f}% mask flipped",
              "rec": lambda: f"{d['mismatches']} text mismatch(es)",
              "cls": lambda: f"classes {d['fp16']} vs {d['fp32']}"}[kind]()
    return truth["healthy"], detail


def high_precision(path: Path) -> tuple[int, int]:
    """(nodes other than Cast/Constant/Identity with a float32 output, bytes of float32/float64 weights)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.load(str(path))
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*typed.graph.value_info, *typed.graph.input, *typed.graph.output]}
    wide = (TensorProto.FLOAT, TensorProto.DOUBLE)
    weight = 0
    for t in model.graph.initializer:
        types[t.name] = t.data_type
        if t.data_type in wide:
            weight += numpy_helper.to_array(t).nbytes
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in wide:
                    types[n.output[0]] = a.t.data_type
                    weight += numpy_helper.to_array(a.t).nbytes
    nodes = sum(1 for n in model.graph.node if n.op_type not in ("Cast", "Constant", "Identity")
                and any(types.get(o) == TensorProto.FLOAT for o in n.output if o))
    return nodes, weight


# --- running the tools -----------------------------------------------------------------------------------------
def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def measure(argv: list[str], env: dict | None = None, timeout: float = 1800) -> dict:
    """Run ``argv`` in its own process (address space capped); wall seconds, its peak RSS (MiB), exit code,
    the tail of its output."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        from peak_rss import peak_mib, wrap  # here: this file is also imported alone (a --metric module)
        launch, rss_file = wrap(argv)  # the tool's own peak RSS (peak_rss.py)
        proc = subprocess.Popen(launch, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                preexec_fn=_cap)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    return {"wall_s": time.perf_counter() - start, "rss_mib": peak_mib(rss_file, usage.ru_maxrss),
            "rc": proc.returncode, "output": out[-4000:]}


def _error(run: dict) -> str:
    lines = [x for x in run["output"].strip().splitlines() if x.strip()]
    err = next((x for x in reversed(lines) if "Error" in x or "error" in x), lines[-1] if lines else "")
    return f"exit {run['rc']}: {err.strip()[:200]}"


def autocast(fp32: Path, out: Path, feeds: Path | None, path: str | None) -> dict:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [sys.executable, "-m", "modelopt.onnx.autocast", "--onnx_path", str(fp32), "--output_path", str(out),
            "--keep_io_types", "--providers", "cpu"] + (["--calibration_data", str(feeds)] if feeds else [])
    return measure(argv, env)


def ours(name: str, fp32: Path, out: Path, feeds: Path, work: Path) -> dict:
    kind = kind_of(name)
    target = TARGETS[kind]
    argv = [str(BIN / "workbench"), "repair", str(fp32), "--ref", "ort", "--cand", "ort:fp16", "--inputs",
            str(feeds), "--metric", f"{Path(__file__).resolve()}:{kind}_task", "--out", str(out), "--json",
            str(work / f"{name}.repair.json"), "--verify", "none"] + (["--target", target] if target else [])
    run = measure(argv)
    if run["rc"] in (0, 1):
        doc = json.loads((work / f"{name}.repair.json").read_text())
        run["repairs"] = [f"{r['kind']} {r['node']}" for r in doc.get("repairs", [])]
    return run


def row(name: str, tool: str, run: dict, model: Path, ref: list[dict], feeds: list[dict]) -> dict:
    base = {"model": name, "tool": tool, "precision": "fp16", "wall_s": round(run["wall_s"], 1),
            "rss_mib": round(run["rss_mib"]), "met": None, "high_nodes": None, "high_weight_bytes": None}
    if run["rc"] not in (0, 1) or not model.is_file():
        return {**base, "note": _error(run)}
    try:
        met, detail = task_met(name, ref, run_ort(model, feeds))
        nodes, weight = high_precision(model)
    except Exception as e:  # noqa: BLE001 - a model the tool wrote that onnxruntime or onnx rejects is a result
        return {**base, "note": f"its model fails: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    note = detail + ("; " + ", ".join(run["repairs"]) if run.get("repairs") else "")
    return {**base, "met": met, "high_nodes": nodes, "high_weight_bytes": weight, "note": note}


def run_fp16(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name in args.models:
        fp32, folder, feeds = args.prepared[name]
        ref = run_ort(fp32, feeds)
        for tool in ("autocast", "autocast+calib", "workbench"):
            out = args.work / f"{name}.{tool}.onnx"
            print(f"{name}: {tool}", file=sys.stderr, flush=True)
            if tool == "workbench":
                run = ours(name, fp32, out, folder, args.work)
            else:
                run = autocast(fp32, out, folder if tool.endswith("calib") else None, args.autocast_path)
            rows.append(row(name, tool, run, out, ref, feeds))
            print("  " + json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def run_int8(args: argparse.Namespace) -> list[dict]:
    """benchmarks/anchors_int8.py's rows (the INT8 side: ORT quantize_static, NNCF, workbench repair)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import anchors_int8
    except ImportError as e:
        return [{"model": "-", "tool": "-", "precision": "int8", "met": None, "high_nodes": None,
                 "high_weight_bytes": None, "wall_s": None, "rss_mib": None,
                 "note": f"benchmarks/anchors_int8.py not available ({e})"}]
    return anchors_int8.run_int8(args)


# --- the table -------------------------------------------------------------------------------------------------
def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def table(rows: list[dict]) -> str:
    head = ["model", "tool", "prec", "task met", "high nodes", "high weight bytes", "wall s", "peak RSS MiB", "note"]
    cells = [[_cell(r.get(k)) for k in KEYS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    widths[-1] = 0
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    return "\n".join(lines)


def verdict(rows: list[dict]) -> list[str]:
    """Per model and precision, ours (a tool named workbench...) against each other tool: fewer/no more/MORE
    high-precision nodes and weight bytes where both meet the task."""
    out, pairs = [], []
    for precision in dict.fromkeys(r["precision"] for r in rows):
        mine_rows = [r for r in rows if r["precision"] == precision]
        for name in dict.fromkeys(r["model"] for r in mine_rows):
            here = [r for r in mine_rows if r["model"] == name]
            mine = next((r for r in here if str(r["tool"]).startswith("workbench")), None)
            for other in (r for r in here if r is not mine):
                label = f"{name} ({precision}) vs {other['tool']}"
                if not (mine and mine["met"] and other["met"]):
                    who = [t for t, r in (("workbench", mine), (other["tool"], other)) if not (r and r["met"])]
                    out.append(f"{label}: not both met ({', '.join(who)} did not)")
                    continue
                n = (mine["high_nodes"], other["high_nodes"])
                b = (mine["high_weight_bytes"], other["high_weight_bytes"])
                word = "fewer" if n[0] < n[1] and b[0] <= b[1] else "no more" if n[0] <= n[1] and b[0] <= b[1] \
                    else "MORE"
                pairs.append(word)
                out.append(f"{label}: {word} (nodes {n[0]} vs {n[1]}, weight bytes {b[0]} vs {b[1]})")
    out.append(f"where both met: workbench keeps strictly fewer high-precision nodes on {pairs.count('fewer')} of "
               f"{len(pairs)} pairs, more nodes or bytes on {pairs.count('MORE')}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=["fp16", "int8", "all"], default="fp16")
    parser.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME",
                        help=f"default: {' '.join(MODELS)}")
    parser.add_argument("--autocast-path", metavar="DIR", default=os.environ.get("AUTOCAST_PYTHONPATH"),
                        help="a folder put on AutoCast's PYTHONPATH (ModelOpt's ONNX extras; default "
                        "$AUTOCAST_PYTHONPATH)")
    parser.add_argument("--out", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep the models each tool wrote in DIR (default: a "
                        "temporary folder, removed)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="bench-anchors-") as tmp:
        args.work = Path(args.keep or tmp)
        args.work.mkdir(parents=True, exist_ok=True)
        args.prepared = {}
        for name in args.models:
            print(f"{name}: preparing", file=sys.stderr, flush=True)
            args.prepared[name] = prepare(name, args.work)
        args.feeds = {name: p[1] for name, p in args.prepared.items()}
        rows = run_fp16(args) if args.precision in ("fp16", "all") else []
        if args.precision in ("int8", "all"):
            rows += run_int8(args)
    print(table(rows))
    print()
    for line in verdict(rows):
        print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
