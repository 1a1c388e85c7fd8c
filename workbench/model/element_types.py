"""Element types the ONNX standard defines: a tensor of any other type (a corrupt or hand-edited file) is refused
at load, naming the tensor, rather than failing later inside an engine or a dtype table."""

from __future__ import annotations

import onnx

from ..errors import ModelFormatError
from .external_data import all_tensors
from .walk import iter_nodes

#: element type numbers the installed onnx defines (0 is UNDEFINED: "not given", allowed on value infos)
KNOWN = frozenset(onnx.TensorProto.DataType.values())


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in iter_nodes(graph):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield attr.g
            elif attr.type == onnx.AttributeProto.GRAPHS:
                yield from attr.graphs


def _value_type(tp: onnx.TypeProto) -> int:
    """The element type of a tensor (or sparse tensor) type; 0 for other types."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type
    if kind == "sparse_tensor_type":
        return tp.sparse_tensor_type.elem_type
    return 0


def check_element_types(model: onnx.ModelProto) -> None:
    """Raise :class:`ModelFormatError` for the first tensor whose element type ONNX does not define."""
    for tensor in all_tensors(model):
        if tensor.data_type not in KNOWN:
            _refuse(f"tensor '{tensor.name}'", tensor.data_type)
    for graph in _graphs(model.graph):
        for vi in (*graph.input, *graph.output, *graph.value_info):
            if _value_type(vi.type) not in KNOWN:
                _refuse(f"value '{vi.name}'", _value_type(vi.type))


def _refuse(what: str, elem_type: int) -> None:
    raise ModelFormatError(f"the model's {what} has element type {elem_type}, which ONNX "
                           f"{onnx.__version__} does not define",
                           "the file is damaged or was edited by hand; re-export the model")
