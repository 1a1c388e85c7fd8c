"""Cost and accuracy of each executed node side by side: an engine graph joined with a comparison's tensor errors.

A compared tensor belongs to the executed node that runs the ONNX node producing it (at fused granularity, the
group the comparison recorded); a node's error is the worst among its tensors, by the comparison's criterion.
"""

from __future__ import annotations

import math
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
    """One row per executed node, slowest first (unprofiled ones last): latency, its share of the run
    (:meth:`EngineGraph.share_of`: ``latency_ms / run_ms``, the median end to end), provider, precision, whether it
    fell back, its ONNX nodes, and with ``result`` its worst tensor's error, the criterion's threshold and the
    error's margin to it (:func:`margin_db`)."""
    errors = node_errors(graph, result) if result is not None else {}
    metric = result.criterion.metric if result is not None else None
    threshold = result.criterion.threshold if result is not None else None
    primary = graph.details.get("requested_provider") or graph.primary_provider
    rows = []
    for n in sorted(graph.nodes, key=_slowest):
        err = errors.get(n.name)
        rows.append({"name": n.name, "order": n.order, "kind": n.kind, "role": n.role, "provider": n.provider,
                     "precision": n.precision,
                     "latency_ms": n.latency_ms, "latency_p90_ms": n.latency_p90_ms, "dispatch_ms": n.dispatch_ms,
                     "share": graph.share_of(n), "run_ms": graph.end_to_end_ms,
                     "fell_back": bool(n.role == "compute" and n.provider and primary and n.provider != primary),
                     "onnx_nodes": n.onnx_nodes, "metric": metric,
                     "error": None if err is None else err["metrics"].get(metric), "threshold": threshold,
                     "margin_db": None if err is None else margin_db(err["metrics"].get(metric), metric, threshold),
                     "tensor": None if err is None else err["tensor"],
                     "diverged": None if err is None else err["diverged"]})
    return rows[:top] if top else rows


def _slowest(n: EngineNode) -> tuple:
    return (n.latency_ms is None, -(n.latency_ms or 0.0), n.order)


def margin_db(value: Any, metric: str, threshold: float) -> float | None:
    """How far ``value`` of ``metric`` is on the good side of the criterion's ``threshold``, in dB: positive
    passes, negative fails, 0 at the threshold (+inf: exact agreement). sqnr_db: the difference; cosine: the ratio
    of the distances to 1 (1 - cosine is half the squared relative error, so 10 dB is 10 dB of SQNR); error metrics
    (amplitudes): 20 log10 of threshold / value. None when not measured."""
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    if metric == "sqnr_db":
        return float(value - threshold)
    if metric == "cosine":
        good, have = 1.0 - threshold, 1.0 - value
        scale = 10.0
    else:
        good, have = threshold, value
        scale = 20.0
    if have <= 0:
        return math.inf
    if good <= 0:
        return -math.inf
    return scale * math.log10(good / have)
