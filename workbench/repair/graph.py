"""What an island edit needs to know about a candidate graph: producers, consumers, element types, constants,
and the reference's constants by name; plus the pieces every edit shares (fresh names, pruning what the edit
left unused)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..errors import WorkbenchError

NARROW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: nodes an edit may delete once nothing reads them any more (what the converters and quantizers insert)
PRUNABLE = ("Constant", "Cast", "Identity", *QDQ_OPS)
PREFIX = "wb_repair"


class RepairError(WorkbenchError):
    """A repair request that cannot be carried out as given (unknown node, bad target, unusable output path)."""


def constant_tensor(node: onnx.NodeProto) -> TensorProto | None:
    """The value of a Constant node as a TensorProto (``value``, ``value_float(s)``), else None."""
    for a in node.attribute:
        if a.name == "value" and a.type == AttributeProto.TENSOR:
            return a.t
        if a.name == "value_float":
            return numpy_helper.from_array(np.array(a.f, dtype=np.float32))
        if a.name == "value_floats":
            return numpy_helper.from_array(np.array(list(a.floats), dtype=np.float32))
    return None


def constants(model: onnx.ModelProto) -> dict[str, TensorProto]:
    """Main-graph tensor name -> TensorProto for initializers and Constant-node outputs."""
    found = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.domain in ("", "ai.onnx"):
            t = constant_tensor(n)
            if t is not None:
                found[n.output[0]] = t
    return found


class GraphIndex:
    """Read-only facts about a model's main graph (the model is never changed)."""

    def __init__(self, model: onnx.ModelProto):
        from ..core.shapes import infer_shapes_lenient, value_types

        g = model.graph
        self.model = model
        self.nodes = list(g.node)  # these very objects: ids below stay valid while the index lives
        self.position = {id(n): i for i, n in enumerate(self.nodes)}
        self.by_name = {n.name: n for n in self.nodes if n.name}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.consts = constants(model)
        self.graph_inputs = {i.name for i in g.input}
        self.graph_outputs = {o.name for o in g.output}
        types = value_types(infer_shapes_lenient(model))
        self.types = {k: tp.tensor_type.elem_type for k, tp in types.items() if tp.HasField("tensor_type")}
        for name, t in self.consts.items():
            self.types.setdefault(name, t.data_type)
        self.names = set(self.producer) | self.graph_inputs | set(self.consts) | {n.name for n in g.node}
        self.sub_names = {n.name for n in _subgraph_nodes(g)}

    def type(self, name: str) -> int:
        return self.types.get(name, 0)

    def node(self, name: str, what: str = "candidate") -> onnx.NodeProto:
        """The top-level node called ``name``, or a one-line error."""
        node = self.by_name.get(name)
        if node is None:
            where = " (it is inside an If/Loop/Scan body: only top-level nodes can be kept)" \
                if name in self.sub_names else ""
            raise RepairError(f"node {name!r} is not in the {what} model{where}",
                              "name nodes as the reference model spells them (`workbench compare` lists culprits)")
        if node.op_type == "Constant":
            raise RepairError(f"node {name!r} is a Constant", "keep the node that reads it instead")
        return node


def _subgraph_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    from ..model.walk import subgraphs_of

    for n in graph.node:
        for _, sub in subgraphs_of(n):
            yield from sub.node
            yield from _subgraph_nodes(sub)


class Names:
    """Fresh tensor/node names that collide with nothing in the model."""

    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def cast(src: str, dst: str, to: int, name: str) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], to=to, name=name)


#: standard ops with graph attributes; any node of another domain may have them too
_SUBGRAPH_OPS = ("If", "Loop", "Scan")


def use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for n in graph.node:
        for i in n.input:
            if i:
                counts[i] += 1
        if n.op_type in _SUBGRAPH_OPS or n.domain not in ("", "ai.onnx"):
            for _, sub in _subgraphs(n):
                for name in _outer_reads(sub):
                    counts[name] += 1
    for o in graph.output:
        counts[o.name] += 1
    return counts


def _subgraphs(node):
    from ..model.walk import subgraphs_of

    return subgraphs_of(node)


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    return {i for n in graph.node for i in n.input if i} | {
        name for n in graph.node for _, sub in _subgraphs(n) for name in _outer_reads(sub)}


def prune(graph: onnx.GraphProto, before: dict[str, int]) -> list[str]:
    """Delete what the edit left unread: initializers, and Constant/Cast/Identity/Q/DQ nodes whose outputs were
    read before the edit (``before``: use counts then) and are read by nothing now, and so on up the chains they
    feed. Nothing that was already dead is touched. Returns the removed tensor names (their value_info goes too)."""
    now = use_counts(graph)
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}

    def dead(i: int) -> bool:
        n = graph.node[i]
        return n.op_type in PRUNABLE and bool(n.output) and all(
            o and before.get(o, 0) > 0 and now.get(o, 0) == 0 for o in n.output)

    gone_nodes: set[int] = set()
    work = [i for i in range(len(graph.node)) if dead(i)]
    while work:  # a deleted node no longer reads its inputs: their producers may die in turn
        i = work.pop()
        if i in gone_nodes:
            continue
        gone_nodes.add(i)
        for name in graph.node[i].input:  # PRUNABLE ops have no subgraphs
            if not name:
                continue
            now[name] -= 1
            j = producer.get(name)
            if now[name] == 0 and j is not None and j not in gone_nodes and dead(j):
                work.append(j)
    removed: list[str] = []
    for i in sorted(gone_nodes, reverse=True):
        removed += list(graph.node[i].output)
        del graph.node[i]
    dead_inits = [i for i, t in enumerate(graph.initializer) if before.get(t.name, 0) > 0 and
                  now.get(t.name, 0) == 0]
    for i in reversed(dead_inits):
        removed.append(graph.initializer[i].name)
        del graph.initializer[i]
    gone = set(removed)
    keep = [vi for vi in graph.value_info if vi.name not in gone]
    if len(keep) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(keep)
    return removed
