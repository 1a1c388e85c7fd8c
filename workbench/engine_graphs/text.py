"""Readable CLI rendering of an :class:`~workbench.engine_graphs.result.EngineGraph`."""

from __future__ import annotations

from collections import Counter

from ..textfmt import printable, safe_name, table
from .result import EngineGraph

#: the longest name shown in a line or cell (a trace or model may name a node with a megabyte)
MAX_NAME = 120


def _n(name: object) -> str:
    """A node, kind or provider name on one line, cut to :data:`MAX_NAME` characters, control characters escaped
    (a newline in a name cannot forge a line of the rendering)."""
    text = printable(name)
    return text if len(text) <= MAX_NAME else text[:MAX_NAME - 3] + "..."


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(graph: EngineGraph, top: int = 10) -> str:
    d = graph.details
    compute = graph.compute_nodes
    version = " ".join(f"{k} {d[k]}" for k in ("onnxruntime", "openvino", "tensorrt") if d.get(k))
    level = f", graph optimization {d['graph_optimization']}" if d.get("graph_optimization") else ""
    covered = len(graph.covered())
    total = d.get("onnx_compute_nodes")
    lines = [f"{safe_name(graph.model.get('name', 'model'))} on {safe_name(graph.engine)}"
             + (f" ({version}{level})" if version else "")
             + f": {len(graph.nodes)} executed nodes ({len(compute)} compute, {len(graph.nodes) - len(compute)} "
             f"layout), {len(graph.fused_nodes)} fused",
             f"ONNX compute nodes: {total if total is not None else '?'}, {covered} covered "
             f"({len(graph.folded)} folded while building), {len(graph.unmapped)} unmapped"]
    if graph.end_to_end_ms is not None:
        share = graph.latency_share
        lines.append(f"end to end: {_ms(graph.end_to_end_ms)} ms median, {_ms(graph.end_to_end_p90_ms)} p90, "
                     f"{_ms(graph.end_to_end_mean_ms)} mean over {graph.runs} runs ({graph.end_to_end_source})"
                     + (f"; per-node times add up to {share:.0%} of a run (median)" if share else ""))
        over = overhead_summary(graph.overhead, graph.accounted_share)
        if over:
            lines.append(f"outside the node times (median per run): {over}")
        if d.get("unprofiled_wall_ms") is not None and d.get("wall_ms") is not None:
            lines.append(f"profiling: a run took {_ms(d['wall_ms'])} ms profiled, {_ms(d['unprofiled_wall_ms'])} ms "
                         "unprofiled (wall, median; the same session once its profiler ended)")
    for label, key in (("providers", "provider"), ("precisions", "precision")):
        counts = Counter(getattr(n, key) or "?" for n in graph.nodes)
        lines.append(f"{label}: " + (", ".join(f"{_n(k)} {v}" for k, v in counts.most_common()) or "none (no "
                                                                                                   "executed node)"))
    falls = graph.fallbacks()
    if falls:
        lines.append(f"FELL BACK: {len(falls)} node(s) ran on another provider than "
                     f"{_n(d.get('requested_provider'))}: "
                     + ", ".join(f"{_n(n.name)} ({_n(n.provider)})" for n in falls[:5]))
    slow = graph.slowest(top)
    if slow:
        dispatch = any(n.dispatch_ms is not None for n in slow)
        lines += ["", f"slowest {len(slow)} nodes (median ms per run):", table(
            ["node", "kind", "provider", "precision", "ms", "p90"] + (["dispatch"] if dispatch else [])
            + ["share", "ONNX nodes"],
            [[_n(n.name), _n(n.kind), _n(n.provider or "-"), _n(n.precision or "-"), _ms(n.latency_ms),
              _ms(n.latency_p90_ms)]
             + ([_ms(n.dispatch_ms)] if dispatch else [])
             + [f"{graph.share_of(n):.1%}" if graph.share_of(n) is not None else "-",
                ", ".join(_n(o) for o in n.onnx_nodes[:3])
                + (f" (+{len(n.onnx_nodes) - 3})" if len(n.onnx_nodes) > 3 else "")]
             for n in slow])]
    for note in graph.notes:
        lines.append(f"note: {printable(note)}")
    return "\n".join(lines)


def overhead_summary(overhead: dict, accounted_share: float | None = None) -> str | None:
    """The run's time outside the node times, in words (None when not measured)."""
    parts = [f"{_ms(overhead[k])} ms {label}" for k, label in (("between_nodes_ms", "between nodes (dispatch)"),
                                                                ("outside_nodes_ms", "outside them"))
             if overhead.get(k) is not None]
    if not parts:
        return None
    text = ", ".join(parts)
    if accounted_share:
        text += f"; with each node's dispatch the nodes account for {accounted_share:.0%} of a run"
    if overhead.get("counter_resolution_ms"):
        text += (f" (the engine counts whole microseconds per node: up to {_ms(overhead['counter_resolution_ms'])} ms "
                 "of that is truncation)")
    if overhead.get("python_call_ms") is not None:
        text += f"; {_ms(overhead['python_call_ms'])} ms more in the Python call around the run"
    return text
