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


def conflicting_shapes(ref: GraphInfo, cand_types: dict[str, onnx.TypeProto], pairs: list[TensorPair]
                       ) -> list[tuple[TensorPair, tuple, tuple]]:
    """Pairs whose two tensors have static shapes that cannot be the same (another rank, or a fixed dimension that
    differs): (pair, reference shape, candidate shape). Such a pair is two different tensors that share a name, as
    when the candidate file is another model rather than a conversion of the reference."""
    out = []
    outputs = set(ref.outputs)  # a graph output of another shape is a divergence the verdict names, not a pair to drop
    for p in pairs:
        if p.tensor in outputs:
            continue
        info = ref.tensors.get(p.tensor)
        t = cand_types.get(p.candidate)
        if info is None or info.shape is None or t is None or not t.tensor_type.HasField("shape"):
            continue
        theirs = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                       for d in t.tensor_type.shape.dim)
        ours = tuple(info.shape)
        if len(ours) != len(theirs) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                           for a, b in zip(ours, theirs)):
            out.append((p, ours, theirs))
    return out
