"""What a model expects as feeds: name, element dtype and shape of each graph input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

Dim = int | str | None


@dataclass(frozen=True)
class InputSpec:
    """One graph input. ``dtype`` is None for non-tensor or unknown types; ``shape`` None for unknown rank."""

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None
    type_name: str

    @property
    def shape_text(self) -> str:
        if self.shape is None:
            return "[unknown rank]"
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    def describe(self) -> str:
        return f"{self.type_name} {self.shape_text}"


def as_proto(model: Any) -> onnx.ModelProto:
    """Accept an ``onnx.ModelProto`` or anything with a ``.proto`` (a LoadedModel)."""
    proto = getattr(model, "proto", model)
    if not isinstance(proto, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or a LoadedModel, got {type(model).__name__}")
    return proto


def model_inputs(model: Any) -> list[InputSpec]:
    """The graph inputs a feed must (or may) provide: initializer-backed inputs are left out."""
    graph = as_proto(model).graph
    initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    return [_spec(vi) for vi in graph.input if vi.name not in initializers]


def _spec(vi: onnx.ValueInfoProto) -> InputSpec:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        return InputSpec(vi.name, None, None, helper.printable_type(t) or "unknown type")
    elem = t.tensor_type.elem_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else None
    except (KeyError, TypeError, ValueError):
        dtype = None
    type_name = onnx.TensorProto.DataType.Name(elem).lower() if elem else "unknown"
    if dtype is not None and dtype.kind in "biuf":
        type_name = dtype.name
    shape = None
    if t.tensor_type.HasField("shape"):
        shape = tuple(  # a negative dim_value (Paddle, some TF exports) means dynamic too
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in t.tensor_type.shape.dim
        )
    return InputSpec(vi.name, dtype, shape, type_name)


def dtype_family(dtype: np.dtype) -> str:
    """"float", "int" (signed and unsigned), "bool", or "other"."""
    return {"f": "float", "i": "int", "u": "int", "b": "bool"}.get(dtype.kind, "other")
