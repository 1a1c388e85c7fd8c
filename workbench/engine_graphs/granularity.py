"""Fusion-aware comparison (``granularity="fused"``): compare only tensors the candidate engine's own graph holds.

Marking every tensor as an output changes what an engine fuses, so the thing compared is not the thing deployed.
At fused granularity a comparison marks only the boundaries of the candidate engine's fused groups (the outputs of
its executed nodes), checked by building the engine again with those tensors marked: a tensor whose marking
changes a group (OpenVINO fuses a residual Add in place only while nothing else reads its input) is dropped and
the check repeats. Each compared tensor's error, and each culprit (the isolation walk stops at the compared
tensors, so a culprit is a whole group run alone), is attributed to the group and its ONNX nodes; the tensors left
out are listed with the reason.
"""

from __future__ import annotations

import logging

import onnx

from ..errors import SpecError
from .api import BUILDERS, build
from .onnx_side import OnnxGraph
from .result import EngineGraph

log = logging.getLogger(__name__)

GRANULARITIES = ("all", "fused")
#: rebuilds that check (and repair) that marking leaves the fusions alone
MAX_CHECKS = 6


def observe(model: onnx.ModelProto, engine: str, feeds: list[dict], options: dict | None = None,
            onnx_graph: OnnxGraph | None = None) -> tuple[EngineGraph, set[str], dict[str, str]]:
    """(engine graph, tensors observable without changing fusion, tensor -> why it was dropped after marking)."""
    og = onnx_graph or OnnxGraph.build(model)
    graph = build(engine, model, feeds, runs=0, options=options, onnx_graph=og)
    groups = {frozenset(n.onnx_nodes) for n in graph.compute_nodes}
    marked = sorted(graph.observable_tensors() - set(og.graph_outputs))
    dropped: dict[str, str] = {}
    unstable: set[str] = set()  # nodes an unmarked compile groups differently from one compile to the next
    for attempt in range(MAX_CHECKS):
        if not marked:
            break
        again = build(engine, model, feeds, runs=0, options=options, outputs=marked, onnx_graph=og)
        changed = [g for g in groups if g not in {frozenset(n.onnx_nodes) for n in again.compute_nodes}
                   and not g & unstable]
        if changed and not unstable:  # OpenVINO's CPU plugin does not fuse alike on every compile: tell apart
            unstable = _unstable(engine, model, feeds, options, og, groups)
            changed = [g for g in changed if not g & unstable]
        if not changed:
            graph.details["fusion_checked"] = f"rebuilt with {len(marked)} boundary tensors marked: same fusions" + (
                f" (besides {len(unstable)} node(s) fused differently from one plain compile to the next: "
                f"{_short(sorted(unstable, key=og.topo.get))})" if unstable else "")
            break
        for g in changed:
            reads, writes = og.boundary(set(g))
            suspects = set(reads) | (set(writes) if attempt else set())
            for t in suspects & set(marked):
                dropped[t] = f"marking it changes how the engine fuses {_short(sorted(g, key=og.topo.get))}"
        marked = [t for t in marked if t not in dropped]
    else:
        graph.details["fusion_checked"] = f"fusions still differ after {MAX_CHECKS} rebuilds"
        graph.notes.append("marking the group boundaries still changed some fusions; their errors may differ from "
                           "the deployed engine's")
    return graph, set(marked) | set(og.graph_outputs), dropped


#: plain compiles compared to find the nodes an engine groups differently each time
UNSTABLE_BUILDS = 4


def _unstable(engine, model, feeds, options, og, groups: set) -> set[str]:
    """Nodes whose fused group differs between plain (unmarked) compiles of the same model."""
    nodes: set[str] = set()
    for _ in range(UNSTABLE_BUILDS):
        other = {frozenset(n.onnx_nodes) for n in build(engine, model, feeds, runs=0, options=options,
                                                          onnx_graph=og).compute_nodes}
        for g in groups ^ other:
            nodes |= g
    if nodes:
        log.info("%d node(s) fuse differently between plain compiles on %s", len(nodes), engine)
    return nodes


def _short(nodes: list[str]) -> str:
    return ", ".join(nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")


def restrict(plan) -> tuple[list, dict]:
    """The plan's pairs whose candidate tensor is observable in the candidate engine's graph, and the record of the
    rest (``plan.granularity``)."""
    from ..core.feeds import cast_feeds

    spec = plan.cand_spec
    if spec.engine not in BUILDERS:
        raise SpecError(f"granularity 'fused' compares the candidate engine's fused groups, and {spec.engine!r} has "
                        "no engine graph", f"use granularity 'all', or a candidate on {', '.join(BUILDERS)}")
    og = OnnxGraph.build(plan.cand_model)
    graph, observable, dropped = observe(plan.cand_model, spec.engine, cast_feeds(plan.cand_model, plan.feeds[:1]),
                                         plan.engine_options.get(spec.engine), og)
    graph.engine = str(spec)
    graph.model = {"name": plan.original.name, "sha256": plan.original.fingerprint, "variant": spec.variant}
    plan.engine_graph = graph  # what a bundle records (engine_graph.json) and a rerun checks fusions against
    kept, hidden = [], []
    for p in plan.pairs:
        if p.candidate in observable:
            kept.append(p)
        else:
            hidden.append({"tensor": p.tensor, "node": p.node, "op_type": p.op_type,
                           "reason": dropped.get(p.candidate) or _why(graph, og, p.candidate)})
    info = {"mode": "fused", "engine": spec.engine, "engine_nodes": len(graph.nodes), "compared": len(kept),
            "unobservable": hidden, "fusion_check": graph.details.get("fusion_checked", ""),
            "groups": {p.tensor: _group(graph, og, p.candidate) for p in kept}}
    note = (f"granularity fused: {len(kept)} of {len(plan.pairs)} tensors compared, the boundaries of the "
            f"{len(graph.compute_nodes)} nodes the {spec.engine} engine runs; {len(hidden)} are inside fused nodes "
            "or folded (JSON: granularity.unobservable), so each error is the whole group's")
    return kept, {**info, "note": note}


def _why(graph: EngineGraph, og: OnnxGraph, tensor: str) -> str:
    node = og.producer.get(tensor)
    if node is None:
        return "not computed by the candidate model"
    if node in graph.folded:
        return "folded into a constant while the engine was built"
    group = graph.group_of(node)
    if group is None:
        return "no executed node runs its producer"
    return f"inside {group.kind} '{group.name}', which fuses {_short(group.onnx_nodes)}"


def _group(graph: EngineGraph, og: OnnxGraph, tensor: str) -> dict | None:
    group = graph.group_of(og.producer.get(tensor, ""))
    if group is None:
        return None
    return {"engine_node": group.name, "kind": group.kind, "onnx_nodes": group.onnx_nodes}


def attribute(result, plan) -> None:
    """Record the granularity on ``result`` and attach each culprit's group (its engine node and ONNX nodes)."""
    info = dict(plan.granularity)
    note = info.pop("note", None)
    result.granularity = info
    if note and note not in result.notes:
        result.notes.append(note)
    for c in result.culprits:
        c.group = info["groups"].get(c.tensor)
        if c.group and len(c.group["onnx_nodes"]) > 1:
            others = [n for n in c.group["onnx_nodes"] if n != c.node]
            said = [f"runs fused in {c.group['kind']} '{c.group['engine_node']}' with {_short(others)}"]
            said += _clamps(plan.clamps, set(others))
            c.explanation = "; ".join(said) + (f"; {c.explanation[:1].lower()}{c.explanation[1:]}" if c.explanation
                                               else ".")
            c.explanation = c.explanation[:1].upper() + c.explanation[1:]


def _clamps(clamps: list[dict], members: set[str]) -> list[str]:
    """The converter's changes to constants other nodes of the group use (the group's error is theirs too)."""
    said = []
    for clamp in clamps:
        users = [u for u in clamp.get("consumers", []) if u in members]
        if users:
            verb = "re-quantized" if clamp.get("kind") == "requantized" else "clamped"
            said.append(f"{clamp.get('by') or 'the FP16 converter'} {verb} constant '{clamp.get('name')}' "
                        f"({clamp.get('kind')}, {clamp.get('count')} values) and {users[0]} in this group uses it")
    return said
