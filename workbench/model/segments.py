"""Cut points of a graph: single-tensor frontiers (a transformer's block boundaries), found from the structure alone.

Nodes in topological order; a cut after node ``i`` is a *frontier* when exactly one tensor made at or before ``i``
is read after it. Cheap side tensors made from the graph inputs alone (an attention mask turned additive: a few
small nodes, no heavy weight) do not count: every segment that reads one recomputes it from the graph inputs,
which every segment receives. Consecutive frontiers bound blocks; blocks are packed into segments whose weights
stay under a size (a block larger than that is a segment of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from ..core.shapes import KEEP_BYTES, tensor_nbytes
from .walk import subgraphs_of

#: at most this many nodes of side computation are recomputed per segment
MAX_SIDE_NODES = 64


@dataclass
class Segment:
    """Nodes ``start..stop-1`` (topological positions) and the tensor entering and leaving it."""

    index: int
    start: int
    stop: int
    enters: str | None  # the frontier tensor read from the previous segment (None: the first segment)
    leaves: str | None  # the frontier tensor the next segment reads (None: the last segment)
    weight_bytes: int = 0
    initializers: list[str] = field(default_factory=list)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Names ``node`` reads: its inputs, and what its subgraphs read from outside."""
    names = [i for i in node.input if i]
    for _, g in subgraphs_of(node):
        names += sorted(_outer_reads(g))
    return names


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used |= set(node_reads(node))
        defined |= set(node.output)
    return {u for u in used - defined if u}


def side_nodes(graph: onnx.GraphProto) -> set[int]:
    """Positions of nodes computed from graph inputs and small constants alone, each with few ancestors: cheap to
    recompute in every segment that needs them."""
    inputs = {i.name for i in graph.input}
    light = {t.name for t in graph.initializer if tensor_nbytes(t) <= KEEP_BYTES}
    heavy = {t.name for t in graph.initializer} - light
    side_tensors: dict[str, set[int]] = {}  # tensor -> side ancestors (positions)
    out: set[int] = set()
    for i, node in enumerate(graph.node):
        ancestors = {i}
        ok = not any(a.type == onnx.AttributeProto.TENSOR and tensor_nbytes(a.t) > KEEP_BYTES for a in node.attribute)
        for name in node_reads(node):
            if name in inputs or name in light:
                continue
            if name in heavy or name not in side_tensors:
                ok = False
                break
            ancestors |= side_tensors[name]
        if ok and len(ancestors) <= MAX_SIDE_NODES:
            out.add(i)
            for o in node.output:
                if o:
                    side_tensors[o] = ancestors
    return out


def crossing(graph: onnx.GraphProto, side: set[int] | None = None) -> list[list[str]]:
    """For each position ``i``: the tensors made at or before node ``i`` (side nodes excepted) and read after it."""
    side = side_nodes(graph) if side is None else side
    made = {o: i for i, n in enumerate(graph.node) if i not in side for o in n.output if o}
    last: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node_reads(node):
            if name in made:
                last[name] = max(last.get(name, -1), i)
    starts: dict[int, list[str]] = {}
    for name, lo in made.items():
        if last.get(name, -1) > lo:
            starts.setdefault(lo, []).append(name)
    out, live = [], set()
    for i in range(len(graph.node)):
        live |= set(starts.get(i, ()))
        live = {t for t in live if last[t] > i}
        out.append(sorted(live))
    return out


def frontiers(graph: onnx.GraphProto) -> dict[int, str]:
    """Position ``i`` -> the one tensor crossing a cut after node ``i`` (single-tensor frontiers only)."""
    cross = crossing(graph)
    return {i: live[0] for i, live in enumerate(cross[:-1]) if len(live) == 1}


def node_weights(graph: onnx.GraphProto) -> list[dict[str, int]]:
    """Per node: the heavy initializers it reads and their sizes in bytes (what a segment must load)."""
    heavy = {t.name: tensor_nbytes(t) for t in graph.initializer if tensor_nbytes(t) > KEEP_BYTES}
    return [{name: heavy[name] for name in node_reads(n) if name in heavy} for n in graph.node]


def plan_segments(graph: onnx.GraphProto, max_bytes: int) -> list[Segment]:
    """Segments of ``graph`` (nodes in topological order) cut at single-tensor frontiers, each reading at most
    ``max_bytes`` of weights where the frontiers allow it."""
    n = len(graph.node)
    cuts = frontiers(graph)
    weights = node_weights(graph)
    blocks, start = [], 0  # (start, stop) between consecutive frontiers
    for i in sorted(cuts):
        blocks.append((start, i + 1))
        start = i + 1
    if start < n or not blocks:
        blocks.append((start, n))

    def size(lo: int, hi: int) -> tuple[int, list[str]]:
        names: dict[str, int] = {}
        for w in weights[lo:hi]:
            names.update(w)
        return sum(names.values()), sorted(names)

    segments: list[Segment] = []
    lo, hi = blocks[0]
    for b_lo, b_hi in blocks[1:]:
        if size(lo, b_hi)[0] > max_bytes:
            segments.append(_segment(len(segments), lo, hi, cuts, size))
            lo = b_lo
        hi = b_hi
    segments.append(_segment(len(segments), lo, hi, cuts, size))
    for prev, seg in zip(segments, segments[1:]):
        seg.enters = prev.leaves
    return segments


def _segment(index: int, lo: int, hi: int, cuts: dict[int, str], size) -> Segment:
    nbytes, names = size(lo, hi)
    return Segment(index, lo, hi, None, cuts.get(hi - 1), nbytes, names)
