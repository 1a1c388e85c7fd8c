"""NNCF's INT8 models as TensorRT would take them: NNCF quantizes non-negative activations to uint8 (zero point 0),
TensorRT's explicit quantization takes signed INT8 with zero point 0 only. Each uint8 pair of the model that
``benchmarks/anchors_int8.py`` saved (``MODEL.nncf.int8.onnx`` in its work folder) is made a signed INT8 pair over
the same range (scale x 255/127, zero point 0 as int8), and the task is judged again on the held-out set
(scripts/int8_qdq_truth.py, onnxruntime), beside the model as NNCF saved it.

    python benchmarks/nncf_signed.py --work /work/int8w/v35 --models ppocrv3-rec ppocrv5-det [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))


def signed(model):
    """A copy of ``model`` with every uint8 QuantizeLinear/DequantizeLinear pair made signed INT8 over the same range
    (their scale and zero point initializers changed once each). -> (copy, pairs changed)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    unsigned = [n for n in g.node if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits
                and inits[n.input[2]].data_type == onnx.TensorProto.UINT8]
    for scale, zero in {(n.input[1], n.input[2]) for n in unsigned}:
        zp = numpy_helper.to_array(inits[zero])
        if np.any(zp != 0):
            raise ValueError(f"{zero}: a uint8 zero point other than 0 has no signed equivalent over the same range")
        value = numpy_helper.to_array(inits[scale]).astype(np.float32) * np.float32(255.0 / 127.0)
        inits[scale].CopyFrom(numpy_helper.from_array(value, scale))
        inits[zero].CopyFrom(numpy_helper.from_array(np.zeros(zp.shape, np.int8), zero))
    typed = {n.output[0] for n in unsigned}
    kept = [vi for vi in g.value_info if vi.name not in typed]  # their uint8 type no longer holds
    del g.value_info[:]
    g.value_info.extend(kept)
    return model, len(unsigned)


def main(argv: list[str] | None = None) -> int:
    import int8_qdq_truth as Q
    import onnx
    from anchors_int8 import KINDS, _feeds, _session

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="benchmarks/anchors_int8.py's --work folder")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    lines = [f"{'model':12s} {'NNCF model':28s} {'uint8 pairs':>11s} {'as FP32':>8s} {'error':>7s}"]
    for name in args.models:
        folder, kind = args.work / "int8", KINDS[name]
        held = _feeds(folder / f"{name}.heldout")
        ref = _session(folder / f"{name}.fp32.onnx")
        refs = [ref.run(None, f)[0] for f in held]
        saved = onnx.load(str(folder / f"{name}.nncf.int8.onnx"))
        converted, count = signed(saved)
        for label, model in (("as saved", saved), ("uint8 pairs made signed", converted)):
            session = _session(model)
            cands = [session.run(None, f)[0] for f in held]
            ok = sum(bool(Q.task_score(kind, [r], [c])["healthy"]) for r, c in zip(refs, cands))
            error = Q.task_score(kind, refs, cands)["error"]
            lines.append(f"{name:12s} {label:28s} {count:11d} {ok:>5d}/{len(held):<2d} {error:7.4f}")
            print(lines[-1], flush=True)
    if args.out:
        from workbench._atomic import atomic_write_text

        atomic_write_text(args.out, "$ python benchmarks/nncf_signed.py " + " ".join(argv or sys.argv[1:]) + "\n"
                          + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
