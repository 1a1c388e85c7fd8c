"""Engine overlays of the model graph: where each ONNX node ran (execution provider), in what precision the engine
ran it, how long its executed node took, and the fused groups (one executed node running several ONNX nodes).

The data comes from an :class:`~workbench.engine_graphs.result.EngineGraph` (``workbench.engine_graph(...)``); an
ONNX node belongs to the compute node that runs it (:meth:`EngineGraph.group_of`), so the nodes of a fused group
share its provider, precision and latency. Pure functions: nothing here runs an engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: overlay key -> label (the graph view's colour menu)
ENGINE_OVERLAYS = {
    "provider": "execution provider (engine)",
    "runtime_precision": "runtime precision (engine)",
    "latency": "latency (engine)",
}
#: what the engine overlays say when there is no engine graph to draw from
NO_ENGINE = "inspect an engine in the Engine tab first"
#: the requested provider first, then these (fallbacks stand out in warm colours)
PROVIDER_COLORS = ["#4e79a7", "#e15759", "#f28e2b", "#b07aa1", "#edc948", "#9c755f", "#76b7b2", "#ff9da7"]
#: the engines' short precision names (ORT, OpenVINO, TensorRT) -> colour; fp32 and fp16 as in "precision"
RUNTIME_PRECISION_COLORS = {"f32": "#90a4ae", "f16": "#42a5f5", "bf16": "#26a69a", "f64": "#8d6e63",
                            "i8": "#ab47bc", "u8": "#ce93d8", "i4": "#6a1b9a", "f8e4m3": "#5c6bc0",
                            "i32": "#a1887f", "i64": "#bcaaa4", "boolean": "#fff176"}
#: an executed node's share of a run (its mean latency / the run's mean end to end), upper bounds
LATENCY_BANDS = [(0.003, "#fff8e1", "under 0.3% of a run"), (0.01, "#ffe0b2", "0.3-1% of a run"),
                 (0.03, "#ffb74d", "1-3% of a run"), (0.10, "#fb8c00", "3-10% of a run"),
                 (0.30, "#e65100", "10-30% of a run"), (math.inf, "#b71c1c", "over 30% of a run")]
NOT_PROFILED = ("#cfd8dc", "executed, not profiled (runs=0)")
FOLDED = ("#d7ccc8", "folded into a constant by the engine")
NOT_EXECUTED = ("#eeeeee", "not in the engine graph")
#: fused-group boxes (the widget and the static figure draw them in this colour)
GROUP_COLOR, GROUP_FILL = "#8e24aa", "rgba(142, 36, 170, 0.10)"
#: latency classes that are not shares
_FOLDED_CLASS, _UNMAPPED_CLASS, _UNPROFILED_CLASS = -3.0, -2.0, -1.0


@dataclass
class EngineView:
    """One engine graph indexed by ONNX node name: ``group`` (ONNX node -> the compute node running it),
    ``folded`` (ONNX nodes the engine computed while building), ``requested`` provider, ``total_ms`` (what a
    node's latency is a share of: the run's mean end to end, else the summed node times)."""

    graph: Any
    group: dict[str, Any] = field(default_factory=dict)
    folded: set[str] = field(default_factory=set)
    requested: str | None = None
    total_ms: float | None = None
    provider_colors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Any) -> EngineView:
        group: dict[str, Any] = {}
        for n in graph.compute_nodes:
            for o in n.onnx_nodes:
                group.setdefault(o, n)
        total = graph.end_to_end_mean_ms or graph.end_to_end_ms
        if not total:
            total = sum(_latency(n) or 0.0 for n in graph.nodes) or None
        requested = graph.details.get("requested_provider") or graph.primary_provider
        providers = sorted({n.provider for n in graph.compute_nodes if n.provider},
                           key=lambda p: (p != requested, p))
        colors = {p: PROVIDER_COLORS[i % len(PROVIDER_COLORS)] for i, p in enumerate(providers)}
        return cls(graph, group, set(graph.folded), requested, total, colors)

    def share(self, node: Any) -> float | None:
        """The executed node's latency as a share of a run (None when not profiled)."""
        ms = _latency(node)
        return None if ms is None or not self.total_ms else ms / self.total_ms

    def provider_label(self, provider: str) -> str:
        return provider if not self.requested or provider == self.requested else f"{provider} (fell back)"

    def describe(self, onnx_node: str) -> list[str]:
        """Tooltip lines: what the engine made of ``onnx_node``."""
        g = self.graph
        n = self.group.get(onnx_node)
        if n is None:
            return [f"{g.engine}: " + ("folded into a constant while building" if onnx_node in self.folded
                                        else "not in the engine graph")]
        lines = [f"{g.engine}: {n.name} ({n.kind})" + (f", fuses {len(n.onnx_nodes)} ONNX nodes" if n.fused else "")]
        where = [self.provider_label(n.provider) if n.provider else "", n.precision or ""]
        ms, share = n.latency_ms, self.share(n)
        if ms is not None:
            where.append(f"{ms:.4g} ms" + (f" ({share:.1%} of a run)" if share is not None else "")
                         + (" for the group" if n.fused else ""))
        lines.append("  ".join(w for w in where if w))
        return lines


def _latency(node: Any) -> float | None:
    """Mean latency (means add up to a run), else the median."""
    return node.latency_mean_ms if node.latency_mean_ms is not None else node.latency_ms


def engine_classes(names: list[str], overlay: str, ev: EngineView) -> tuple[list[Any], list[tuple[str, str]]]:
    """Per ONNX node a class (higher = more remarkable; sortable within one overlay) and the legend."""
    if overlay == "latency":
        cls = []
        for name in names:
            n = ev.group.get(name)
            if n is None:
                cls.append(_FOLDED_CLASS if name in ev.folded else _UNMAPPED_CLASS)
            else:
                share = ev.share(n)
                cls.append(_UNPROFILED_CLASS if share is None else share)
        legend = [(label, color) for _, color, label in LATENCY_BANDS]
        if _UNPROFILED_CLASS in cls:
            legend.append((NOT_PROFILED[1], NOT_PROFILED[0]))
        return cls, legend + _absent_legend(cls)
    if overlay == "provider":
        values = [_value(ev, name, ev.group[name].provider if name in ev.group else None) for name in names]
        present = {v for v in values if not v.startswith("\0")}
        order = sorted(present, key=lambda p: (p != ev.requested, p))
        legend = [(ev.provider_label(p), ev.provider_colors.get(p, PROVIDER_COLORS[-1])) for p in order]
        return values, legend + _absent_legend(values)
    if overlay == "runtime_precision":
        values = [_value(ev, name, ev.group[name].precision if name in ev.group else None) for name in names]
        present = sorted({v for v in values if not v.startswith("\0")})
        return values, [(p, runtime_precision_color(p)) for p in present] + _absent_legend(values)
    raise ValueError(f"not an engine overlay: {overlay!r}")


#: categorical classes of nodes without a value (sort below every real value: "\0" < any name)
_FOLDED_VALUE, _UNMAPPED_VALUE, _UNKNOWN_VALUE = "\0folded", "\0unmapped", "\0unknown"


def _value(ev: EngineView, name: str, value: str | None) -> str:
    if name not in ev.group:
        return _FOLDED_VALUE if name in ev.folded else _UNMAPPED_VALUE
    return value or _UNKNOWN_VALUE


def _absent_legend(classes: list[Any]) -> list[tuple[str, str]]:
    found = set(classes)
    legend = []
    if _UNKNOWN_VALUE in found:
        legend.append(("not recorded", NOT_PROFILED[0]))
    if _FOLDED_VALUE in found or _FOLDED_CLASS in found:
        legend.append((FOLDED[1], FOLDED[0]))
    if _UNMAPPED_VALUE in found or _UNMAPPED_CLASS in found:
        legend.append((NOT_EXECUTED[1], NOT_EXECUTED[0]))
    return legend


def runtime_precision_color(precision: str) -> str:
    known = RUNTIME_PRECISION_COLORS.get(precision)
    if known is not None:
        return known
    return PROVIDER_COLORS[sum(map(ord, precision)) % len(PROVIDER_COLORS)]


def engine_color(overlay: str, cls: Any, ev: EngineView) -> str:
    """The colour of a class of :func:`engine_classes`."""
    if overlay == "latency":
        if cls == _FOLDED_CLASS:
            return FOLDED[0]
        if cls == _UNMAPPED_CLASS:
            return NOT_EXECUTED[0]
        if cls == _UNPROFILED_CLASS:
            return NOT_PROFILED[0]
        return next(color for upper, color, _ in LATENCY_BANDS if cls <= upper)
    if cls == _FOLDED_VALUE:
        return FOLDED[0]
    if cls == _UNMAPPED_VALUE:
        return NOT_EXECUTED[0]
    if cls == _UNKNOWN_VALUE:
        return NOT_PROFILED[0]
    if overlay == "provider":
        return ev.provider_colors.get(cls, PROVIDER_COLORS[-1])
    return runtime_precision_color(cls)


def scope_class(overlay: str, members: list[str], classes: list[Any], ev: EngineView) -> Any:
    """The class a collapsed scope shows: its most common provider / precision; for latency, the share of a run
    its executed nodes take together (each counted once)."""
    from collections import Counter

    if overlay != "latency":
        real = [c for c in classes if not c.startswith("\0")]
        return Counter(real or classes).most_common(1)[0][0]
    nodes = {id(ev.group[m]): ev.group[m] for m in members if m in ev.group}
    shares = [ev.share(n) for n in nodes.values()]
    if not nodes:
        return max(classes)
    if all(s is None for s in shares):
        return _UNPROFILED_CLASS
    return sum(s for s in shares if s is not None)


def fused_groups(ev: EngineView, item_of_node: dict[str, int]) -> list[dict]:
    """The engine's fused groups over the items drawn: ``{"id", "label", "items", "tip"}`` for each executed node
    running several ONNX nodes that show as two or more items (a group inside one collapsed scope is not boxed)."""
    out = []
    for n in ev.graph.fused_nodes:
        items = sorted({item_of_node[o] for o in n.onnx_nodes if o in item_of_node})
        if len(items) < 2:
            continue
        share = ev.share(n)
        tip = [f"fused by {ev.graph.engine}: {n.name}", f"{n.kind}, {len(n.onnx_nodes)} ONNX nodes: "
               + ", ".join(n.onnx_nodes[:6]) + (" ..." if len(n.onnx_nodes) > 6 else "")]
        facts = [n.provider or "", n.precision or ""]
        if n.latency_ms is not None:
            facts.append(f"{n.latency_ms:.4g} ms" + (f" ({share:.1%} of a run)" if share is not None else ""))
        if any(facts):
            tip.append("  ".join(f for f in facts if f))
        out.append({"id": n.name, "label": n.kind, "items": items, "tip": "\n".join(tip)})
    return out
