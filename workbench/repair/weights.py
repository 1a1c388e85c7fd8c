"""How much of a model's weights stay in the candidate's precision after a repair."""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import TensorProto

from ..core.shapes import tensor_nbytes
from .graph import FLOATS, constants

_NARROW = {"fp16": {TensorProto.FLOAT16}, "bf16": {TensorProto.BFLOAT16}}


def weight_bytes(model: onnx.ModelProto) -> Counter:
    """Weight bytes by element-type name: float initializers/Constants, and quantized tensors that
    DequantizeLinear reads (integer biases included)."""
    consts = constants(model)
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input}
    # a float constant quantized as the model runs (Constant -> QuantizeLinear -> DequantizeLinear, as quantize_static
    # leaves weights held in Constant nodes, e.g. PP-OCR's) is an INT8 weight too: counted as its int8 bytes
    runtime = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input
               and n.input[0] in consts and n.input[0] not in quantized}
    out: Counter = Counter()
    for name, t in consts.items():
        if name in runtime:
            out["int8"] += _count(t)  # one byte per value once quantized
        elif t.data_type in FLOATS or name in quantized:
            out[TensorProto.DataType.Name(t.data_type).lower()] += tensor_nbytes(t)
    return out


def _count(t: TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def precision_share(model: onnx.ModelProto, family: str) -> dict:
    """``{"share", "candidate_bytes", "total_bytes", "by_type"}``: the share of weight bytes held in the
    candidate's precision (FP16/BF16 tensors; for int8, the tensors DequantizeLinear reads)."""
    by_type = weight_bytes(model)
    total = sum(by_type.values())
    if family in _NARROW:
        names = {TensorProto.DataType.Name(t).lower() for t in _NARROW[family]}
        narrow = sum(v for k, v in by_type.items() if k in names)
    else:
        floats = {TensorProto.DataType.Name(t).lower() for t in FLOATS}
        narrow = sum(v for k, v in by_type.items() if k not in floats)
    return {"share": narrow / total if total else None, "candidate_bytes": narrow, "total_bytes": total,
            "by_type": dict(by_type)}
