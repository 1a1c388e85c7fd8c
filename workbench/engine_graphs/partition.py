"""Mapping executed nodes that name only some of their ONNX nodes (OpenVINO's runtime model, TensorRT's layers).

Each executed node arrives as a dict: ``name``, ``kind`` (layer type), ``origin`` (the ONNX nodes its names point
to), ``preds`` (executed nodes it reads), ``order``, and optionally ``kernel``, ``precision``, ``provider``,
``role`` ("layout") and ``mapped_by``. ONNX nodes no name points to are placed by :meth:`OnnxGraph.fill`; an
executed node no name points to borrows the first filled nodes between its neighbours; a layout node maps to the
node whose tensor it converts.
"""

from __future__ import annotations

from collections import defaultdict

from .onnx_side import OnnxGraph
from .result import EngineNode

#: ops an engine may drop between two nodes it runs (OpenVINO names a float-to-float Cast in no runtime node, or
#: in its Multiply's, from one compile to the next)
ELIDED = frozenset({"Cast", "Identity"})


def uncovered(og: OnnxGraph, covered: set[str], constants: set[str]) -> tuple[list[str], list[dict]]:
    """ONNX nodes no executed node runs: (folded: computed while building, because they read only constants, their
    outputs became ``constants`` of the engine, or only folded nodes read them -- or an :data:`ELIDED` op between
    nodes the engine runs; unmapped, with the reason)."""
    live, folded = og.depends_on_inputs(), set()
    for n in reversed(og.nodes):
        if n in covered:
            continue
        users = [c for o in og.outputs[n] for c in og.consumers.get(o, [])]
        if n not in live or all(o in constants for o in og.outputs[n]) or (users and set(users) <= folded):
            folded.add(n)
    for n in og.nodes:  # a type conversion between two nodes the engine runs: elided or fused into a neighbour
        if n in covered or n in folded or og.op_types[n] not in ELIDED:
            continue
        sources = [og.producer.get(t) for t in og.inputs[n] if t not in og.constants]
        users = [c for o in og.outputs[n] for c in og.consumers.get(o, [])]
        if users and all(u in covered for u in users) and all(p is None or p in covered for p in sources):
            folded.add(n)
    unmapped = [{"node": n, "reason": "no graph output depends on it (dead code the engine removed)"
                 if not any(og.consumers.get(o) or o in og.graph_outputs for o in og.outputs[n])
                 else "no executed node computes it"} for n in og.nodes if n not in covered and n not in folded]
    return og.sort(folded), unmapped


def map_runtime(og: OnnxGraph, nodes: list[dict], engine_folded: set[str], *, main_ops: dict | None = None,
                layout_kinds: tuple[str, ...] = (), static_shapes: bool = True) -> dict:
    """Engine nodes for executed nodes (OpenVINO's runtime nodes or TensorRT's layers, as the dicts the module
    docstring describes). ``main_ops``: layer type -> ONNX op types of its main op (found upstream when the engine
    renamed it); ``layout_kinds``: layer types that only convert layouts; ``static_shapes``: the engine built for
    fixed input shapes, so shape computations were folded."""
    groups: dict[str, str] = {}
    named: dict[str, list[str]] = defaultdict(list)
    for e in nodes:
        for o in e["origin"]:
            groups.setdefault(o, e["name"])
            named[e["name"]].append(o)
    for e in nodes:  # a renamed main op (a Conv folded with a Multiply is named after the Multiply)
        wanted = (main_ops or {}).get(e["kind"], set())
        if wanted and named.get(e["name"]) and not any(og.op_types[o] in wanted for o in named[e["name"]]):
            found = og.main_op(set(named[e["name"]]), wanted, groups)
            if found is not None:
                groups[found] = e["name"]
                named[e["name"]].append(found)
    live = og.depends_on_inputs()
    static = og.shape_only() if static_shapes else set()
    skip = {n for n in og.nodes if n not in groups and (n in engine_folded or n not in live or n in static)}
    engine_folded = engine_folded | (static - set(groups))
    filled = og.fill(groups, skip=skip)
    members: dict[str, set[str]] = defaultdict(set)
    for o, g in groups.items():
        members[g].add(o)
    by_name = {e["name"]: e for e in nodes}
    succ: dict[str, list[str]] = defaultdict(list)
    for e in nodes:
        for p in e["preds"]:
            succ[p].append(e["name"])
    out = []
    for e in sorted(nodes, key=lambda e: e["order"]):
        layout = e.get("role") == "layout" or (e["kind"] in layout_kinds and not e["origin"])
        mine = members.get(e["name"], set())
        how = e.get("mapped_by", "names") if named.get(e["name"]) else "topology"
        if not mine and not layout:
            mine, how = _borrow(og, e, by_name, succ, members, filled), "neighbour"
            for o in mine:
                groups[o] = e["name"]
        reads, writes = og.boundary(mine) if mine and not layout else ([], [])
        if any(o in filled for o in mine) and how not in ("topology", "neighbour"):
            how += "+topology"
        out.append(EngineNode(name=e["name"], kind=e["kind"], onnx_nodes=og.sort(mine), provider=e.get("provider"),
                              precision=e.get("precision"), role="layout" if layout else "compute",
                              kernel=e.get("kernel"), inputs=reads, outputs=writes, mapped_by=how, order=e["order"]))
    _map_layout(og, out, by_name, succ)
    folded, unmapped = uncovered(og, {o for n in out for o in n.onnx_nodes}, set())
    folded = og.sort(set(folded) | (engine_folded - {o for n in out for o in n.onnx_nodes}))
    unmapped = [u for u in unmapped if u["node"] not in folded]
    return {"nodes": out, "folded": folded, "unmapped": unmapped}


def _borrow(og: OnnxGraph, e: dict, by_name: dict, succ: dict, members: dict, filled: dict) -> set[str]:
    """ONNX nodes for an executed node no name points to: the topology-filled nodes of its successors that read
    only what its predecessors (or graph inputs and constants) provide."""
    before = set().union(*(members.get(p, set()) for p in e["preds"])) if e["preds"] else set()
    taken = set()
    for s in succ.get(e["name"], []):
        for o in members.get(s, set()):
            if o not in filled:
                continue
            sources = {og.producer.get(t) for t in og.inputs[o] if t not in og.constants}
            if all(src is None or src in before for src in sources):
                taken.add(o)
    for o in taken:
        for s in succ.get(e["name"], []):
            members.get(s, set()).discard(o)
    return taken


def _map_layout(og: OnnxGraph, out: list[EngineNode], by_name: dict, succ: dict) -> None:
    """A layout node converts what its predecessor writes for its successors: the predecessor's ONNX nodes whose
    outputs the successors read (a graph input's readers when it has no predecessor)."""
    nodes = {n.name: n for n in out}
    for n in out:
        if n.role != "layout":
            continue
        preds = [nodes[p] for p in by_name[n.name]["preds"] if p in nodes]
        after = set()
        stack, seen = list(succ.get(n.name, [])), set()
        while stack:  # successors, through further layout nodes
            s = stack.pop()
            if s in seen or s not in nodes:
                continue
            seen.add(s)
            if nodes[s].role == "layout":
                stack += succ.get(s, [])
            else:
                after |= set(nodes[s].onnx_nodes)
        made = [o for p in preds for o in p.onnx_nodes
                if any(c in after for t in og.outputs[o] for c in og.consumers.get(t, []))]
        if not made and preds:
            made = [o for p in preds for o in p.onnx_nodes][-1:]
        if not made:
            made = [o for o in after if any(t in og.graph_inputs for t in og.inputs[o])] or sorted(after)[:1]
        n.onnx_nodes = og.sort(made)
        n.mapped_by = "neighbour"
