"""Weight-free copies of a model, for shape inference, the checker and graph walks.

Shape inference, onnx's checker and every structural question need dims and types, never weight values; on a
transformer the weights are hundreds of MB that each full copy would duplicate. :func:`strip_weights` copies a
model with every tensor above ``keep_bytes`` reduced to a stub (name, dims, type, no data); small tensors (shape
constants, int64 indices) are kept so that data propagation still works.
"""

from __future__ import annotations

import logging

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
    n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    try:
        return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return t.ByteSize()


def _stub(t: TensorProto) -> TensorProto:
    stub = TensorProto()
    _copy_fields(t, stub, {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                           "uint64_data", "external_data", "data_location", "segment"})
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", STUB_FILE), ("offset", "0"), ("length", str(tensor_nbytes(t)))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


def _heavy(t: TensorProto, keep_bytes: int) -> bool:
    return t.data_location != TensorProto.EXTERNAL and tensor_nbytes(t) > keep_bytes


def _node_is_heavy(node: onnx.NodeProto, keep_bytes: int) -> bool:
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            return True
        if a.type == onnx.AttributeProto.TENSOR and _heavy(a.t, keep_bytes):
            return True
        if a.type == onnx.AttributeProto.TENSORS and any(_heavy(t, keep_bytes) for t in a.tensors):
            return True
    return False


def _copy_fields(src, dst, skip: set[str]) -> None:
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


def _strip_node(src: onnx.NodeProto, dst: onnx.NodeProto, keep_bytes: int) -> None:
    _copy_fields(src, dst, {"attribute"})
    for a in src.attribute:
        new = dst.attribute.add()
        if a.type == onnx.AttributeProto.TENSOR and _heavy(a.t, keep_bytes):
            new.name, new.type, new.doc_string = a.name, a.type, a.doc_string
            new.t.CopyFrom(_stub(a.t))
        elif a.type == onnx.AttributeProto.TENSORS:
            new.name, new.type = a.name, a.type
            for t in a.tensors:
                new.tensors.add().CopyFrom(_stub(t) if _heavy(t, keep_bytes) else t)
        elif a.type == onnx.AttributeProto.GRAPH:
            new.name, new.type = a.name, a.type
            _strip_graph(a.g, new.g, keep_bytes)
        elif a.type == onnx.AttributeProto.GRAPHS:
            new.name, new.type = a.name, a.type
            for g in a.graphs:
                _strip_graph(g, new.graphs.add(), keep_bytes)
        else:
            new.CopyFrom(a)


def _strip_graph(src: onnx.GraphProto, dst: onnx.GraphProto, keep_bytes: int) -> None:
    _copy_fields(src, dst, {"initializer", "node"})
    for t in src.initializer:
        dst.initializer.add().CopyFrom(_stub(t) if _heavy(t, keep_bytes) else t)
    for node in src.node:
        if _node_is_heavy(node, keep_bytes):
            _strip_node(node, dst.node.add(), keep_bytes)
        else:
            dst.node.add().CopyFrom(node)


def strip_weights(model: onnx.ModelProto, keep_bytes: int = KEEP_BYTES) -> onnx.ModelProto:
    """A copy of ``model`` whose tensors over ``keep_bytes`` (initializers, Constant values, tensor attributes,
    subgraphs included) are stubs: same name, dims and type, data "external" in :data:`STUB_FILE`. The copy
    costs the graph's size, not the weights'."""
    out = onnx.ModelProto()
    _copy_fields(model, out, {"graph"})
    _strip_graph(model.graph, out.graph, keep_bytes)
    return out


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
