"""Isolation model: each node's candidate computation, alone, fed with the reference's values.

For every target tensor the candidate graph is walked backwards from the tensor's producer until it
reaches tensors the reference also has (the boundary) or initializers. Those nodes (the node itself
plus whatever the candidate inserted around it: Casts, Q/DQ pairs) form a segment. All segments go
into ONE model whose inputs are the boundary tensors, so a single session measures the error every
node INTRODUCES when it receives exact (reference) inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx
from onnx import helper

from ..model.walk import subgraphs_of

log = logging.getLogger(__name__)

PREFIX = "iso{}::"


@dataclass
class IsolationModel:
    """The combined model, which boundary input stands for which reference tensor, and outputs per target."""

    model: onnx.ModelProto
    boundary: dict[str, str]  # isolation input name (candidate tensor) -> reference tensor name
    outputs: dict[str, str]  # isolation output name -> target candidate tensor
    skipped: dict[str, str] = field(default_factory=dict)  # target -> why not isolated


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used |= set(node.input) | {n for _, g in subgraphs_of(node) for n in _outer_reads(g)}
        defined |= set(node.output)
    return {u for u in used - defined if u}


def _reads(node: onnx.NodeProto) -> list[str]:
    extra = sorted({n for _, g in subgraphs_of(node) for n in _outer_reads(g)} - set(node.input))
    return [i for i in node.input if i] + extra


def _rename_in_subgraphs(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    for _, g in subgraphs_of(node):
        for inner in g.node:
            for i, name in enumerate(inner.input):
                if name in renames:
                    inner.input[i] = renames[name]
            _rename_in_subgraphs(inner, renames)


def build_isolation(
    candidate: onnx.ModelProto,
    targets: list[str],
    known: dict[str, str],
    types: dict[str, onnx.TypeProto] | None = None,
    max_segment: int = 64,
) -> IsolationModel:
    """Build the isolation model for ``targets`` (candidate tensor names).

    ``known`` maps candidate tensor names that have a reference value to the reference tensor's name
    (matched tensors and graph inputs); walking stops there. ``types``: tensor name -> TypeProto (from
    shape inference on a weight-free copy; default: the candidate's own value_info). A segment longer than
    ``max_segment`` nodes is skipped (its candidate graph does not line up with the reference's).
    """
    g = candidate.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    if types is None:
        types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)}
    nodes: list[onnx.NodeProto] = []
    boundary: dict[str, str] = {}
    outputs: dict[str, str] = {}
    used_inits: set[str] = set()
    skipped: dict[str, str] = {}
    out_types: dict[str, onnx.TypeProto] = {}
    order = {id(n): i for i, n in enumerate(g.node)}
    for k, target in enumerate(targets):
        if target not in producer:
            skipped[target] = "not produced by a node in the candidate graph"
            continue
        segment, seg_bounds, seg_inits, stack, seen = [], set(), set(), [producer[target]], set()
        ok = True
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            segment.append(node)
            if len(segment) > max_segment:
                ok = False
                break
            for name in _reads(node):
                if name in inits:
                    seg_inits.add(name)
                elif name in known and name != target:
                    seg_bounds.add(name)
                elif name in producer:
                    stack.append(producer[name])
                else:
                    ok = False
                    break
            if not ok:
                break
        if not ok:
            skipped[target] = f"its candidate computation does not reach matched tensors within {max_segment} nodes"
            continue
        prefix = PREFIX.format(k)
        segment.sort(key=lambda n: order[id(n)])
        renames = {o: prefix + o for n in segment for o in n.output if o}
        for node in segment:
            new = onnx.NodeProto()
            new.CopyFrom(node)
            new.name = prefix + (node.name or node.op_type)
            for i, name in enumerate(new.input):
                if name in renames:
                    new.input[i] = renames[name]
            for i, name in enumerate(new.output):
                if name:
                    new.output[i] = renames[name]
            _rename_in_subgraphs(new, renames)
            nodes.append(new)
        for b in seg_bounds:
            boundary[b] = known[b]
        used_inits |= seg_inits
        outputs[renames[target]] = target
        if target in types:
            out_types[renames[target]] = types[target]
    graph_inputs = [_value_info(name, types.get(name)) for name in sorted(boundary)]
    graph_outputs = [_value_info(name, out_types.get(name)) for name in outputs]
    graph = helper.make_graph(nodes, "isolation", graph_inputs, graph_outputs,
                              [inits[n] for n in sorted(used_inits)])
    model = helper.make_model(graph, opset_imports=list(candidate.opset_import))
    model.ir_version = candidate.ir_version
    model.functions.extend(candidate.functions)
    for target, why in skipped.items():
        log.debug("not isolating %s: %s", target, why)
    return IsolationModel(model, boundary, outputs, skipped)


def _value_info(name: str, type_proto: onnx.TypeProto | None) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    vi.name = name
    if type_proto is not None:
        vi.type.CopyFrom(type_proto)
    return vi


def set_input_ranks(model: onnx.ModelProto, ranks: dict[str, int]) -> None:
    """Give inputs whose shape inference lost the rank symbolic dims of the rank actually seen, in place
    (OpenVINO's frontend needs static ranks; symbolic dims keep feeds of other sizes valid)."""
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if vi.name in ranks and vi.type.HasField("tensor_type") and not tt.HasField("shape"):
            for i in range(ranks[vi.name]):
                tt.shape.dim.add().dim_param = f"{vi.name}:{i}"
