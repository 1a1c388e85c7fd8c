"""Cost and accuracy of each executed node side by side: an engine graph joined with a comparison's tensor errors.

A compared tensor belongs to the executed node that runs the ONNX node producing it (at fused granularity, the
group the comparison recorded); a node's error is the worst among its tensors, by the comparison's criterion.
"""

from __future__ import annotations

from typing import Any

from .result import EngineGraph, EngineNode


def node_errors(graph: EngineGraph, result: Any) -> dict[str, dict]:
    """Engine node name -> {"tensor", "metrics", "diverged"} of its worst compared tensor."""
    crit = result.criterion
    groups = (getattr(result, "granularity", None) or {}).get("groups", {})
    by_name = {n.name: n for n in graph.nodes}
    worst: dict[str, dict] = {}
    for t in result.tensors:
        group = (groups.get(t.tensor) or {}).get("engine_node")
        node = graph.group_of(t.node) if group is None else by_name.get(group)
        if node is None:
            continue
        have = worst.get(node.name)
        if have is None or crit.badness(t.metrics) > crit.badness(have["metrics"]):
            worst[node.name] = {"tensor": t.tensor, "metrics": t.metrics, "diverged": t.diverged}
    return worst


def layer_rows(graph: EngineGraph, result: Any = None, top: int | None = None) -> list[dict]:
    """One row per executed node, slowest first (unprofiled ones last): latency, its share of the run, provider,
    precision, whether it fell back, its ONNX nodes, and with ``result`` its worst tensor's error."""
    errors = node_errors(graph, result) if result is not None else {}
    metric = result.criterion.metric if result is not None else None
    primary = graph.details.get("requested_provider") or graph.primary_provider
    end = graph.end_to_end_mean_ms or graph.end_to_end_ms
    rows = []
    for n in sorted(graph.nodes, key=_slowest):
        err = errors.get(n.name)
        rows.append({"name": n.name, "order": n.order, "kind": n.kind, "role": n.role, "provider": n.provider,
                     "precision": n.precision,
                     "latency_ms": n.latency_ms, "latency_p90_ms": n.latency_p90_ms, "dispatch_ms": n.dispatch_ms,
                     "share": (n.latency_mean_ms / end) if (n.latency_mean_ms is not None and end) else None,
                     "fell_back": bool(n.role == "compute" and n.provider and primary and n.provider != primary),
                     "onnx_nodes": n.onnx_nodes, "metric": metric,
                     "error": None if err is None else err["metrics"].get(metric),
                     "tensor": None if err is None else err["tensor"],
                     "diverged": None if err is None else err["diverged"]})
    return rows[:top] if top else rows


def _slowest(n: EngineNode) -> tuple:
    return (n.latency_ms is None, -(n.latency_ms or 0.0), n.order)
