"""NNCF's INT8 models as TensorRT would take them. NNCF quantizes non-negative activations to uint8 (zero point 0)
and the inputs of depthwise convolutions per channel; TensorRT's explicit quantization takes activations as signed
INT8, zero point 0, one scale per tensor. In the model that ``benchmarks/anchors_int8.py`` saved
(``MODEL.nncf.int8.onnx`` in its work folder) each uint8 pair is made a signed INT8 pair over the same range and each
per-channel activation pair a per-tensor one over its widest channel (:func:`tensorrt_format`), and the task is
judged again on the held-out set (scripts/int8_qdq_truth.py, onnxruntime), beside the model as NNCF saved it.

    python benchmarks/nncf_tensorrt_format.py --work DIR --models ppocrv3-rec ppocrv5-det [--heldout N] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))


def tensorrt_format(model):
    """A copy of ``model`` in the Q/DQ format TensorRT's explicit quantization takes for activations: every uint8
    pair made signed INT8 over the same range (scale x 255/127, zero point 0 as int8), every per-channel activation
    pair made per-tensor over the widest channel's range (scale = the largest of the channels'). Weights (pairs
    on initializers) keep their per-channel scales. -> (copy, uint8 pairs changed, per-channel activation pairs
    changed)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    pairs = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits and len(n.input) > 2
             and n.input[1] in inits and n.input[2] in inits]
    unsigned = [n for n in pairs if inits[n.input[2]].data_type == onnx.TensorProto.UINT8]
    channels = [n for n in pairs if numpy_helper.to_array(inits[n.input[1]]).size > 1]
    for scale, zero in {(n.input[1], n.input[2]) for n in unsigned}:
        zp = numpy_helper.to_array(inits[zero])
        if np.any(zp != 0):
            raise ValueError(f"{zero}: a uint8 zero point other than 0 has no signed equivalent over the same range")
        value = numpy_helper.to_array(inits[scale]).astype(np.float32) * np.float32(255.0 / 127.0)
        inits[scale].CopyFrom(numpy_helper.from_array(value, scale))
        inits[zero].CopyFrom(numpy_helper.from_array(np.zeros(zp.shape, np.int8), zero))
    for scale, zero in {(n.input[1], n.input[2]) for n in channels}:
        value = np.float32(numpy_helper.to_array(inits[scale]).max())
        inits[scale].CopyFrom(numpy_helper.from_array(np.array(value, np.float32), scale))
        inits[zero].CopyFrom(numpy_helper.from_array(np.array(0, np.int8), zero))
    per_tensor = {n.output[0] for n in channels}
    for n in g.node:  # the per-channel pairs' QuantizeLinear and DequantizeLinear lose their axis
        q = n if n.op_type == "QuantizeLinear" else None
        if n.op_type == "DequantizeLinear":
            q = producer.get(n.input[0])
        if q is not None and q.output[0] in per_tensor:
            kept = [a for a in n.attribute if a.name != "axis"]
            del n.attribute[:]
            n.attribute.extend(kept)
    typed = {n.output[0] for n in unsigned}
    kept_info = [vi for vi in g.value_info if vi.name not in typed]  # their uint8 type no longer holds
    del g.value_info[:]
    g.value_info.extend(kept_info)
    return model, len(unsigned), len(channels)


def main(argv: list[str] | None = None) -> int:
    import int8_qdq_truth as Q
    import onnx
    from anchors_int8 import KINDS, _feeds, _session

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="benchmarks/anchors_int8.py's --work folder")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--heldout", type=int, default=8, help="the held-out set's size, as anchors_int8.py was given")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    lines = [f"{'model':12s} {'NNCF model':34s} {'uint8':>6s} {'per-channel':>11s} {'as FP32':>8s} {'error':>7s}"]
    for name in args.models:
        folder, kind = args.work / "int8", KINDS[name]
        held = _feeds(folder / f"{name}.heldout{'' if args.heldout == 8 else args.heldout}")
        ref = _session(folder / f"{name}.fp32.onnx")
        refs = [ref.run(None, f)[0] for f in held]
        saved = onnx.load(str(folder / f"{name}.nncf.int8.onnx"))
        converted, unsigned, channels = tensorrt_format(saved)
        for label, model in (("as saved", saved), ("in TensorRT's activation format", converted)):
            session = _session(model)
            cands = [session.run(None, f)[0] for f in held]
            ok = sum(bool(Q.task_score(kind, [r], [c])["healthy"]) for r, c in zip(refs, cands))
            error = Q.task_score(kind, refs, cands)["error"]
            lines.append(f"{name:12s} {label:34s} {unsigned:6d} {channels:11d} {ok:>5d}/{len(held):<2d} {error:7.4f}")
            print(lines[-1], flush=True)
    if args.out:
        from workbench._atomic import atomic_write_text

        command = "$ python benchmarks/nncf_tensorrt_format.py " + " ".join(argv or sys.argv[1:])
        atomic_write_text(args.out, command + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
