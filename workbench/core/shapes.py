"""Weight-free copies of a model, for shape inference, the checker and graph walks.

Shape inference, onnx's checker and every structural question need dims and types, never weight values; on a
transformer the weights are hundreds of MB that each full copy would duplicate. :func:`strip_weights` copies a
model with every tensor above ``keep_bytes`` reduced to a stub (name, dims, type, no data); small tensors (shape
constants, int64 indices) are kept so that data propagation still works.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

log = logging.getLogger(__name__)

#: tensors up to this many bytes keep their data in a stripped copy (Reshape shapes, axes, small constants)
KEEP_BYTES = 4096
#: the external-data location stubs point to (see :func:`check_stripped`)
STUB_FILE = "__workbench_stripped__.bin"


def tensor_nbytes(t: TensorProto) -> int:
    """Bytes of a tensor's data from its dims and type (serialized size for types numpy does not know)."""
    size = _itemsize(t.data_type)
    if size is None:
        return t.ByteSize()
    return math.prod(t.dims) * size


@functools.cache
def _itemsize(data_type: int) -> int | None:
    """numpy's item size of an ONNX element type, None for a type numpy does not know."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def stub_tensor(t: TensorProto) -> TensorProto:
    """``t`` without its data: same name, dims and type, data "external" in :data:`STUB_FILE`."""
    stub = TensorProto()
    copy_fields(t, stub, {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                           "uint64_data", "external_data", "data_location", "segment"})
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", STUB_FILE), ("offset", "0"), ("length", str(tensor_nbytes(t)))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


def _heavy(t: TensorProto, keep_bytes: int) -> bool:
    if t.data_location == TensorProto.EXTERNAL:  # only weights left mapped in their files (absolute location)
        return any(e.key == "location" and os.path.isabs(e.value) for e in t.external_data)
    return tensor_nbytes(t) > keep_bytes


def copy_fields(src, dst, skip: set[str]) -> None:
    """Copy every set field of ``src`` but ``skip`` into ``dst``, field by field (a corrupt, non-UTF-8 string is
    left out rather than raising: the checker reports the model, the copy must not crash)."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        try:
            if fd.is_repeated:
                getattr(dst, fd.name).extend(value)
            elif fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(value)
            else:
                setattr(dst, fd.name, value)
        except (TypeError, ValueError) as e:
            log.debug("field %s not copied: %s", fd.name, e)


#: ``replace(tensor, key)`` -> the tensor to write instead, or None to copy it as is. ``key``: an initializer's
#: name, or ``"<node output>::<attribute>"`` for a tensor attribute (Constant values often share names).
Replace = Callable[[TensorProto, str], "TensorProto | None"]


def _has_tensors(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS, onnx.AttributeProto.GRAPH,
                          onnx.AttributeProto.GRAPHS) for a in node.attribute)


def map_model_tensors(model: onnx.ModelProto, replace: Replace) -> onnx.ModelProto:
    """A copy of ``model`` with every tensor (initializers, tensor attributes, subgraphs and their initializers
    included) passed through ``replace``; only the replaced tensors and the graph structure are copied anew."""
    out = onnx.ModelProto()
    copy_fields(model, out, {"graph"})
    _map_graph(model.graph, out.graph, replace)
    return out


def _map_graph(src: onnx.GraphProto, dst: onnx.GraphProto, replace: Replace) -> None:
    copy_fields(src, dst, {"initializer", "node"})
    for t in src.initializer:
        dst.initializer.add().CopyFrom(replace(t, t.name) or t)
    for node in src.node:
        if not _has_tensors(node):
            dst.node.add().CopyFrom(node)
            continue
        new = dst.node.add()
        copy_fields(node, new, {"attribute"})
        owner = node.output[0] if node.output else node.name
        for a in node.attribute:
            na = new.attribute.add()
            if a.type == onnx.AttributeProto.TENSOR:
                copy_fields(a, na, {"t"})
                na.t.CopyFrom(replace(a.t, f"{owner}::{a.name}") or a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                copy_fields(a, na, {"tensors"})
                for i, t in enumerate(a.tensors):
                    na.tensors.add().CopyFrom(replace(t, f"{owner}::{a.name}[{i}]") or t)
            elif a.type == onnx.AttributeProto.GRAPH:
                copy_fields(a, na, {"g"})
                _map_graph(a.g, na.g, replace)
            elif a.type == onnx.AttributeProto.GRAPHS:
                copy_fields(a, na, {"graphs"})
                for g in a.graphs:
                    _map_graph(g, na.graphs.add(), replace)
            else:
                na.CopyFrom(a)


def strip_weights(model: onnx.ModelProto, keep_bytes: int = KEEP_BYTES) -> onnx.ModelProto:
    """A copy of ``model`` whose tensors over ``keep_bytes`` (initializers, Constant values, tensor attributes,
    subgraphs included) are stubs: same name, dims and type, data "external" in :data:`STUB_FILE`. The copy
    costs the graph's size, not the weights'."""
    return map_model_tensors(model, lambda t, _key: stub_tensor(t) if _heavy(t, keep_bytes) else None)


def is_stub(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STUB_FILE for e in t.external_data)


def infer_shapes_lenient(model: onnx.ModelProto, *, data_prop: bool = False,
                         input_shapes: dict[str, tuple] | None = None) -> onnx.ModelProto:
    """A shape-inferred, weight-free copy of ``model`` (the weight-free copy itself where inference fails:
    types are a best effort). ``input_shapes`` fixes graph inputs' dims first (for size estimates)."""
    skeleton = strip_weights(model)
    for vi in skeleton.graph.input:
        if input_shapes and vi.name in input_shapes and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in input_shapes[vi.name]:
                shape.dim.add().dim_value = int(d)
    try:
        return onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=data_prop)
    except Exception as e:  # noqa: BLE001 - inference raises assorted C++ errors; types are a best effort
        log.debug("shape inference failed: %s", e)
        return skeleton


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Tensor name -> TypeProto from a model's inputs, value_info and outputs (main graph)."""
    g = model.graph
    types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)
             if vi.type.WhichOneof("value")}
    for t in g.initializer:
        if t.name not in types:
            types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def elem_type_of(types: dict[str, onnx.TypeProto], name: str) -> int:
    """The ONNX element type of tensor ``name`` (0 when unknown)."""
    tp = types.get(name)
    return tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
