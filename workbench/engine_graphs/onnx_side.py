"""The ONNX side of an engine graph: compute nodes, their tensors, and the walks that map engine nodes to them.

Constant nodes and initializers are parameters, not computation. Every engine maps executed nodes to ONNX nodes
through one of two walks:

* :meth:`OnnxGraph.region`: the ONNX nodes that compute some tensors from others (walk back from the outputs'
  producers, stopping at tensors the engine also holds). Used where the engine's graph keeps ONNX tensor names
  (ONNX Runtime's optimized model).
* :meth:`OnnxGraph.fill`: complete a partial node -> group assignment (known from names the engine kept) by
  topology. Engines fuse epilogues: an elementwise node joins the group that feeds it; any other node joins the
  group of its consumers when they agree, else that of its producers. Used where only some ONNX node names
  survive (OpenVINO, TensorRT).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from ..model.walk import subgraphs_of

#: elementwise ops: engines fuse them into the node that feeds them (epilogues, post-ops)
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Clip", "Relu",
               "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf",
               "Gelu", "Softplus", "Softsign", "Mish", "Min", "Max", "Sum", "Mean", "Floor", "Ceil", "Round", "Sign",
               "Cast", "Identity", "Dropout", "BatchNormalization", "Where", "Not", "And", "Or", "Equal", "Less",
               "Greater", "Sin", "Cos", "ThresholdedRelu", "Shrink"}
#: ops that compute shapes (from shapes): engines that know the input shapes fold them while building
SHAPE_OPS = {"Shape", "Size"}


def _reads(node: onnx.NodeProto) -> list[str]:
    """Inputs plus the outer-scope names a node's subgraphs read."""
    names = [i for i in node.input if i]
    for _, g in subgraphs_of(node):
        defined = {i.name for i in g.input} | {t.name for t in g.initializer}
        for inner in g.node:
            names += [i for i in _reads(inner) if i not in defined]
            defined |= set(inner.output)
    return list(dict.fromkeys(names))


@dataclass
class OnnxGraph:
    """Compute nodes of a model's main graph in topological order, with producers and consumers of tensors."""

    nodes: list[str]  # compute node names, topological order
    op_types: dict[str, str]
    inputs: dict[str, list[str]]  # node -> tensors read (constants included)
    outputs: dict[str, list[str]]  # node -> tensors written
    producer: dict[str, str]  # tensor -> compute node
    consumers: dict[str, list[str]]  # tensor -> compute nodes
    constants: set[str]  # initializers and Constant outputs
    graph_inputs: list[str]
    graph_outputs: list[str]
    topo: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, model: onnx.ModelProto) -> OnnxGraph:
        from ..model.graph import topological_order

        g = model.graph
        order, _ = topological_order(g)
        constants = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
        nodes, op_types, inputs, outputs, producer, consumers = [], {}, {}, {}, {}, {}
        for i in order:
            node = g.node[i]
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                constants.update(o for o in node.output if o)
                continue
            name = node.name or f"{node.op_type}_{i}"
            nodes.append(name)
            op_types[name] = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            inputs[name] = _reads(node)
            outputs[name] = [o for o in node.output if o]
            for o in outputs[name]:
                producer[o] = name
        for name in nodes:
            for t in inputs[name]:
                consumers.setdefault(t, []).append(name)
        graph_inputs = [i.name for i in g.input if i.name not in constants]
        return cls(nodes, op_types, inputs, outputs, producer, consumers, constants, graph_inputs,
                   [o.name for o in g.output], {n: k for k, n in enumerate(nodes)})

    def computed(self, tensor: str) -> bool:
        """A tensor some compute node writes (not a graph input, not a constant)."""
        return tensor in self.producer

    def sort(self, names) -> list[str]:
        """``names`` (ONNX nodes) in topological order, unknown names dropped."""
        return sorted((n for n in set(names) if n in self.topo), key=self.topo.__getitem__)

    def region(self, outputs, stop: set[str]) -> list[str]:
        """The compute nodes that produce ``outputs`` from tensors in ``stop`` (and graph inputs, constants):
        walk back from the outputs' producers, never crossing a tensor in ``stop``."""
        seen: set[str] = set()
        stack = [self.producer[t] for t in outputs if t in self.producer]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack += [self.producer[t] for t in self.inputs[node] if t in self.producer and t not in stop]
        return self.sort(seen)

    def depends_on_inputs(self) -> set[str]:
        """Compute nodes downstream of a graph input (the others compute constants: engines fold them)."""
        live: set[str] = set()
        reached = set(self.graph_inputs)
        for node in self.nodes:
            if any(t in reached for t in self.inputs[node]):
                live.add(node)
                reached.update(self.outputs[node])
        return live

    def fill(self, groups: dict[str, str], skip: set[str] | None = None) -> dict[str, str]:
        """Complete ``groups`` (ONNX node -> engine node, for nodes the engine named) by topology, leaving ``skip``
        (folded nodes) alone; return the nodes assigned here. Repeated until nothing changes: an elementwise node
        whose non-constant inputs all come from one group joins it (a post-op); a node whose assigned consumers
        all sit in one group joins it (engines name a fused node after its last op, so an unnamed node usually
        feeds the group that absorbed it). Last, the rest: the group of its producers when they agree, else of its
        first consumer."""
        filled: dict[str, str] = {}
        skip = skip or set()

        def put(node: str, group: str) -> None:
            groups[node] = filled[node] = group

        changed = True
        while changed:
            changed = False
            for node in self.nodes:
                if node in groups or node in skip or self.op_types[node] not in ELEMENTWISE:
                    continue
                feeds = {groups.get(self.producer.get(t)) for t in self.inputs[node] if t in self.producer}
                if len(feeds) == 1 and None not in feeds:
                    put(node, feeds.pop())
                    changed = True
            for node in reversed(self.nodes):
                if node in groups or node in skip:
                    continue
                around = {groups[c] for t in self.outputs[node] for c in self.consumers.get(t, ()) if c in groups}
                if len(around) == 1:
                    put(node, around.pop())
                    changed = True
        for node in self.nodes:
            if node in groups or node in skip:
                continue
            before = [groups[self.producer[t]] for t in self.inputs[node] if self.producer.get(t) in groups]
            after = [groups[c] for t in self.outputs[node] for c in self.consumers.get(t, ()) if c in groups]
            pick = before[0] if before and len(set(before)) == 1 else (after or before or [None])[0]
            if pick is not None:
                put(node, pick)
        return filled

    def shape_only(self) -> set[str]:
        """Nodes that compute from shapes only (Shape/Size and what reads only their results and constants)."""
        found: set[str] = set()
        for node in self.nodes:
            data = [t for t in self.inputs[node] if t not in self.constants]
            if self.op_types[node] in SHAPE_OPS or (data and all(self.producer.get(t) in found for t in data)):
                found.add(node)
        return found

    def main_op(self, seeds: set[str], op_types: set[str], taken: dict[str, str]) -> str | None:
        """The nearest node of one of ``op_types`` upstream of ``seeds`` through nodes no group has ``taken``: the
        main op of a fused node whose engine renamed it (OpenVINO names a Conv folded with a Multiply after the
        Multiply). Breadth first; among equally near ones the latest in topological order."""
        frontier, seen = self.sort(seeds), set(seeds)
        while frontier:
            nxt, found = [], []
            for node in frontier:
                for t in self.inputs[node]:
                    p = self.producer.get(t)
                    if p is None or p in seen or (p in taken and p not in seeds):
                        continue
                    seen.add(p)
                    (found if self.op_types[p] in op_types else nxt).append(p)
            if found:
                return max(found, key=self.topo.__getitem__)
            frontier = self.sort(nxt)
        return None

    def boundary(self, members: set[str]) -> tuple[list[str], list[str]]:
        """(tensors a set of nodes reads from outside it, tensors it writes that leave it or are graph outputs)."""
        outs = set(self.graph_outputs)
        reads = [t for n in self.sort(members) for t in self.inputs[n]
                 if t not in self.constants and self.producer.get(t) not in members]
        writes = [t for n in self.sort(members) for t in self.outputs[n]
                  if t in outs or any(c not in members for c in self.consumers.get(t, ()))]
        return list(dict.fromkeys(reads)), list(dict.fromkeys(writes))
