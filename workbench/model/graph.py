"""Graph structure: topological order, producers/consumers, per-tensor shapes and dtypes, parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
from onnx import helper

from .walk import iter_nodes, subgraphs_of


@dataclass(frozen=True)
class TensorInfo:
    """A named value: kind is input | output | initializer | constant | intermediate."""

    name: str
    kind: str
    dtype: str | None
    shape: tuple[int | str | None, ...] | None

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = None if self.shape is None else list(self.shape)
        return d


@dataclass(frozen=True)
class NodeInfo:
    """A top-level node, with its position in file order and in topological order."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    index: int
    topo_index: int


@dataclass(frozen=True)
class SubgraphInfo:
    """A graph attribute (If branch, Loop/Scan body) of some node, at some nesting depth."""

    node: str
    op_type: str
    attribute: str
    nodes: int
    depth: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class GraphInfo:
    """Structure of a model's main graph. Nodes are listed in topological order."""

    nodes: list[NodeInfo]
    tensors: dict[str, TensorInfo]
    producer: dict[str, str]
    consumers: dict[str, list[str]]
    inputs: list[str]
    outputs: list[str]
    param_count: int
    param_bytes: int
    subgraphs: list[SubgraphInfo] = field(default_factory=list)
    cycles: bool = False
    _by_name: dict[str, NodeInfo] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def node(self, name: str) -> NodeInfo:
        return self._by_name[name]

    @property
    def topo_tensors(self) -> list[str]:
        """Node outputs in topological order (the tensors a layer-wise comparison walks)."""
        return [t for n in self.nodes for t in n.outputs if t]

    @classmethod
    def build(cls, model: onnx.ModelProto) -> GraphInfo:
        g = model.graph
        initializers = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
        inputs = [i.name for i in g.input if i.name not in initializers]
        outputs = [o.name for o in g.output]
        producer = {out: i for i, node in enumerate(g.node) for out in node.output if out}
        consumers: dict[str, list[str]] = {}
        for node in g.node:
            for name in _node_reads(node):
                consumers.setdefault(name, []).append(node.name)
        order, cycles = topological_order(g)
        topo = {idx: pos for pos, idx in enumerate(order)}
        nodes = [
            NodeInfo(n.name, n.op_type, n.domain or "ai.onnx", tuple(n.input), tuple(n.output), i, topo[i])
            for i, n in ((i, g.node[i]) for i in order)
        ]
        count, nbytes = _parameters(model)
        return cls(
            nodes=nodes, tensors=_tensors(g, initializers), producer={t: g.node[i].name for t, i in producer.items()},
            consumers=consumers, inputs=inputs, outputs=outputs, param_count=count, param_bytes=nbytes,
            subgraphs=_subgraphs(g), cycles=cycles,
        )


def topological_order(g: onnx.GraphProto) -> tuple[list[int], bool]:
    """Node indices in a topological order that keeps file order where it can (outer-scope reads of
    subgraphs count as inputs); ``(file order, True)`` when the graph has a cycle."""
    producer = {out: i for i, node in enumerate(g.node) for out in node.output if out}
    edges = [(producer[name], i) for i, node in enumerate(g.node) for name in _node_reads(node)
             if name in producer and producer[name] != i]
    if all(a < b for a, b in edges):  # already sorted (the usual case): no graph library needed
        return list(range(len(g.node))), False
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(g.node)))
    graph.add_edges_from(edges)
    try:
        return list(nx.lexicographical_topological_sort(graph)), False
    except nx.NetworkXUnfeasible:
        return list(range(len(g.node))), True


def sort_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Reorder ``model``'s main-graph and subgraph nodes topologically, in place; return it."""
    _sort_graph(model.graph)
    return model


def _sort_graph(g: onnx.GraphProto) -> None:
    for node in g.node:
        for _, sub in subgraphs_of(node):
            _sort_graph(sub)
    order, cycles = topological_order(g)
    if not cycles and order != list(range(len(g.node))):
        nodes = [g.node[i] for i in order]
        copies = [onnx.NodeProto() for _ in nodes]
        for c, n in zip(copies, nodes):
            c.CopyFrom(n)
        del g.node[:]
        g.node.extend(copies)


def _node_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads: its inputs plus the outer-scope names its subgraphs use."""
    reads = {i for i in node.input if i}
    for _, sub in subgraphs_of(node):
        reads |= _outer_names(sub)
    return reads


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used |= _node_reads(node)
        defined |= set(node.output)
    return used - defined


def _dtype(elem_type: int) -> str | None:
    if not elem_type:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _shape(vi_type: onnx.TypeProto) -> tuple[int | str | None, ...] | None:
    if not vi_type.tensor_type.HasField("shape"):
        return None
    return tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi_type.tensor_type.shape.dim
    )


def _tensors(g: onnx.GraphProto, initializers: set[str]) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    outputs = {o.name for o in g.output}
    for vi, kind in [(v, "input") for v in g.input] + [(v, "intermediate") for v in g.value_info] + [
        (v, "output") for v in g.output
    ]:
        if vi.name in initializers:
            continue
        if kind == "intermediate" and vi.name in outputs:
            continue
        out[vi.name] = TensorInfo(vi.name, kind, _dtype(vi.type.tensor_type.elem_type), _shape(vi.type))
    for t in g.initializer:
        out[t.name] = TensorInfo(t.name, "initializer", _dtype(t.data_type), tuple(t.dims))
    for node in g.node:
        for name in node.output:
            if name and name not in out:
                out[name] = TensorInfo(name, "intermediate", None, None)
        if node.op_type == "Constant" and node.output and out[node.output[0]].kind == "intermediate":
            old = out[node.output[0]]
            out[old.name] = TensorInfo(old.name, "constant", old.dtype, old.shape)
    return out


def _tensor_size(t: onnx.TensorProto) -> tuple[int, int]:
    n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 0
    return n, n * itemsize


def _parameters(model: onnx.ModelProto) -> tuple[int, int]:
    """Element count and bytes of initializers and Constant values, subgraphs included."""
    tensors = list(model.graph.initializer)
    for node in iter_nodes(model.graph):
        if node.op_type == "Constant":
            tensors += [a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
        for _, sub in subgraphs_of(node):
            tensors += list(sub.initializer)
    sizes = [_tensor_size(t) for t in tensors]
    return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


def _subgraphs(g: onnx.GraphProto, depth: int = 1) -> list[SubgraphInfo]:
    found = []
    for node in g.node:
        for attr, sub in subgraphs_of(node):
            found.append(SubgraphInfo(node.name, node.op_type, attr, sum(1 for _ in iter_nodes(sub)), depth))
            found += _subgraphs(sub, depth + 1)
    return found
