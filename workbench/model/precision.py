"""Which number format a model computes in, read from the model itself (not from how it was asked for).

A user's own FP16 export compared with ``--cand ort`` is still FP16: its criterion, explanations and precision
floor must be FP16's. The precision is inferred from, in order: Q/DQ (and QLinear/Integer) nodes -> int8, fp8 or
int4 by their quantized type; then the share of float weight bytes per float type (float16 / bfloat16 / float32);
then, for a model without float weights, the element types its nodes produce (Casts included).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import onnx
from onnx import TensorProto

from .walk import iter_nodes

#: precision -> the default-criterion family it is judged with
FAMILY = {"fp64": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8": "int8", "fp8": "int8",
          "int4": "int8", "tf32": "fp16"}  # TF32 multiplies with FP16's 10-bit mantissa
#: how much each family loses, to pick the lossier side of a pair
LOSSINESS = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3}

_FLOAT_NAMES = {TensorProto.DOUBLE: "fp64", TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16",
                TensorProto.BFLOAT16: "bf16"}
_FP8 = {getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
        if hasattr(TensorProto, n)}
_INT4 = {getattr(TensorProto, n) for n in ("INT4", "UINT4") if hasattr(TensorProto, n)}
_INT8 = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16}
_QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
              "DynamicQuantizeLinear", "QLinearAdd", "QLinearMul"}


#: (op, input position) of parameters whose schema makes them float32 in any precision (the FP16 converters keep
#: them): not weights the model computes with
_FLOAT32_PARAMETERS = {("Resize", 1), ("Resize", 2), ("Upsample", 1)}


@dataclass(frozen=True)
class Precision:
    """``precision``: fp32 | fp64 | fp16 | bf16 | tf32 | int8 | fp8 | int4; ``source``: what it was read from."""

    precision: str
    source: str

    @property
    def family(self) -> str:
        """The default-criterion family: fp32, fp16, bf16 or int8."""
        return FAMILY.get(self.precision, "fp32")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lossier(a: Precision, b: Precision) -> Precision:
    """The side of a pair that loses more (its family sets the default criterion)."""
    return b if LOSSINESS[b.family] > LOSSINESS[a.family] else a


def _mb(n: int) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e5 else f"{n / 1e3:.3g} kB"


def infer_precision(model: onnx.ModelProto) -> Precision:
    """The precision ``model`` computes in, and what it was read from (works on weight-free copies too)."""
    from ..core.shapes import tensor_nbytes

    g = model.graph
    nodes = list(iter_nodes(g))
    inits = {t.name: t for t in g.initializer}
    quant = Counter(n.op_type for n in nodes if n.op_type in _QUANT_OPS)
    if quant:
        qtypes = Counter()
        for n in nodes:
            if n.op_type == "DequantizeLinear" and n.input and n.input[0] in inits:
                qtypes[inits[n.input[0]].data_type] += 1
            if n.op_type == "QuantizeLinear":
                zp = inits.get(n.input[2]) if len(n.input) > 2 else None
                out = next((a.i for a in n.attribute if a.name == "output_dtype" and a.i), None)
                qtypes[out or (zp.data_type if zp is not None else TensorProto.UINT8)] += 1
        kind = "int8"
        if qtypes and all(t in _FP8 for t in qtypes):
            kind = "fp8"
        elif qtypes and all(t in _INT4 for t in qtypes):
            kind = "int4"
        names = ", ".join(f"{c} {op}" for op, c in quant.most_common())
        typed = ", ".join(sorted({TensorProto.DataType.Name(t).lower() for t in qtypes})) or "int8"
        return Precision(kind, f"{names} ({typed} quantized values)")
    weights: Counter = Counter()
    counts: Counter = Counter()
    tensors = list(g.initializer) + [a.t for n in nodes if n.op_type == "Constant" for a in n.attribute
                                     if a.type == onnx.AttributeProto.TENSOR]
    uses: dict[str, set] = {}
    for n in nodes:
        for i, name in enumerate(n.input):
            uses.setdefault(name, set()).add((n.op_type, i))
    const_out = {a.t.name or n.output[0]: n.output[0] for n in nodes if n.op_type == "Constant"
                 for a in n.attribute if a.type == onnx.AttributeProto.TENSOR}
    for t in tensors:
        used = uses.get(const_out.get(t.name, t.name)) or uses.get(t.name)
        if used and used <= _FLOAT32_PARAMETERS:  # a resize factor, float32 whatever the model computes in
            continue
        if t.data_type in _FLOAT_NAMES:
            weights[t.data_type] += tensor_nbytes(t)
            counts[t.data_type] += 1
    casts = Counter(a.i for n in nodes if n.op_type == "Cast" for a in n.attribute if a.name == "to")
    narrow_casts = {t: c for t, c in casts.items() if t in (TensorProto.FLOAT16, TensorProto.BFLOAT16)}
    cast_text = "".join(f", {c} Cast(s) to {TensorProto.DataType.Name(t).lower()}" for t, c in narrow_casts.items())
    total = sum(weights.values())
    if total:
        dtype, nbytes = weights.most_common(1)[0]
        return Precision(_FLOAT_NAMES[dtype], f"{TensorProto.DataType.Name(dtype).lower()} holds "
                         f"{100 * nbytes / total:.0f}% of the float weight bytes ({_mb(nbytes)} of {_mb(total)}; "
                         f"{counts[dtype]} of {sum(counts.values())} tensors){cast_text}")
    produced = Counter(vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output)
                       if vi.type.tensor_type.elem_type in _FLOAT_NAMES)
    produced.update({t: c for t, c in narrow_casts.items()})
    if produced:
        dtype, c = produced.most_common(1)[0]
        return Precision(_FLOAT_NAMES[dtype], f"no float weights; {c} values/Casts are "
                         f"{TensorProto.DataType.Name(dtype).lower()}")
    return Precision("fp32", "no float weights or narrower float values: taken as float32")


#: torch-cuda variants -> (precision, what it is read from)
_MODULE_VARIANTS = {
    "fp16": ("fp16", "torch module run in float16 (module.half()) on the GPU"),
    "autocast": ("fp16", "torch.autocast float16: matmuls and convolutions in FP16, reductions in FP32"),
    "tf32": ("tf32", "TF32 matmuls and convolutions: 10-bit mantissa inputs, FP32 accumulation and storage"),
}


def module_precision(module: Any, variant: str = "fp32") -> Precision:
    """The precision of a torch.nn.Module run as ``variant`` (a torch-cuda variant), else from its parameters'
    dtypes by bytes."""
    if variant in _MODULE_VARIANTS:
        return Precision(*_MODULE_VARIANTS[variant])
    sizes: Counter = Counter()
    for p in module.parameters():
        sizes[str(p.dtype).replace("torch.", "")] += p.numel() * p.element_size()
    if not sizes:
        return Precision("fp32", "torch module without parameters: taken as float32")
    name, nbytes = sizes.most_common(1)[0]
    short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}.get(name, "fp32")
    return Precision(short, f"torch module: {name} holds {100 * nbytes / sum(sizes.values()):.0f}% of parameter bytes")
