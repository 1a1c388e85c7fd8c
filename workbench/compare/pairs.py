"""Which reference tensor corresponds to which candidate tensor.

Tensors are matched by name: precision variants keep the original names (a ``tensor_map`` covers
renames), and an INT8 Q/DQ model's consumers see ``DequantizeLinear(QuantizeLinear(T))`` rather than
``T``: that quantized view is what is compared, so quantizing ``T`` is charged to ``T``'s producer.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..model.graph import GraphInfo


@dataclass(frozen=True)
class TensorPair:
    """A reference tensor, the node producing it, and the candidate tensor standing for it."""

    tensor: str
    node: str
    op_type: str
    topo_index: int
    candidate: str


def candidate_names(model: onnx.ModelProto) -> set[str]:
    """Names of everything a candidate graph can return: inputs and node outputs."""
    names = {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(o for o in node.output if o)
    return names


def pair_tensors(ref: GraphInfo, candidate: onnx.ModelProto, views: dict[str, str] | None = None) -> list[TensorPair]:
    """Pairs in the reference's topological order, for every node output the candidate also has.

    Outputs of Constant nodes are parameters, not layers: they are not paired. A converter's change to one
    (an FP16 clamp) shows in the consumer's isolated run, which uses the candidate's constant."""
    views = views or {}
    available = candidate_names(candidate)
    pairs = []
    for node in ref.nodes:
        if node.op_type == "Constant":
            continue
        for out in node.outputs:
            if not out:
                continue
            view = views.get(out, out)
            if view in available:
                pairs.append(TensorPair(out, node.name, node.op_type, node.topo_index, view))
    return pairs
