"""Self-contained HTML report of an engine graph (``workbench inspect MODEL --engine SPEC --report OUT.html``): the
engine and its end-to-end latency, nodes that fell back to another provider, the slowest executed nodes with their
ONNX nodes, providers and precisions, fused groups, ONNX nodes left unmapped, and the latency plots (same page shell
as the comparison report; the ``workbench.engine_graph/1`` JSON is embedded)."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..engine_graphs.text import overhead_summary
from .html import _e, _figure, _kv, _num, _table, page, require_plotly

log = logging.getLogger(__name__)

#: fused-group and unmapped rows shown (the JSON embedded in the page holds them all)
MAX_ROWS = 500
#: ONNX node names shown in one cell
CELL_NODES = 12
_STYLE = ("<style>.warn { background: #ffebee; border-left: 4px solid #d62728; padding: .4rem 1rem; margin: 1rem 0; }"
          " .notes { background: #fff8e1; border-left: 4px solid #ffb300; padding: .4rem 1rem; margin: 1rem 0; }"
          "</style>")


def render_engine_graph_report(graph: Any, *, top: int = 20, title: str | None = None) -> str:
    """The report of ``graph`` (an :class:`~workbench.engine_graphs.result.EngineGraph`) as one HTML string; the
    ``top`` slowest nodes are listed and plotted."""
    require_plotly()
    from ..plots.engine_graph import latency_by_node, slowest_layers

    doc = graph.to_json()  # the numbers shown are the JSON's (rounded as it rounds them)
    title = title or f"{graph.model.get('name') or 'model'} on {graph.engine}"
    parts = [_STYLE, f"<h1>{_e(title)}</h1>", "<h2>Summary</h2>", _summary(graph, doc)]
    falls = graph.fallbacks()
    if falls:
        wanted = graph.details.get("requested_provider") or graph.primary_provider
        parts.append(f'<div class="warn"><b>{len(falls)} node(s) fell back</b> from {_e(wanted)} to another '
                     "provider: " + _e(", ".join(f"{n.name} ({n.provider})" for n in falls[:20]))
                     + (" ..." if len(falls) > 20 else "") + "</div>")
    if graph.notes:
        parts.append('<div class="notes"><b>Notes</b><ul>' + "".join(f"<li>{_e(n)}</li>" for n in graph.notes)
                     + "</ul></div>")
    nodes = {id(n): d for n, d in zip(graph.nodes, doc["nodes"])}
    slow = graph.slowest(top)
    parts.append(f"<h2>Slowest {len(slow)} executed nodes</h2>")
    if any(n.latency_ms is not None for n in graph.nodes):
        dispatch = any(nodes[id(n)].get("dispatch_ms") is not None for n in slow)  # ORT: read from its trace
        rows = [[k, n.name, n.kind, n.provider or "-", n.precision or "-", _num(nodes[id(n)]["latency_ms"]),
                 _num(nodes[id(n)]["latency_p90_ms"]), _share(graph.share_of(n), 1.0),
                 _onnx(n.onnx_nodes)] + ([_num(nodes[id(n)].get("dispatch_ms"))] if dispatch else [])
                for k, n in enumerate(slow, 1)]
        parts += ["<p class='muted'>Median and p90 ms per run; share: the node's median ms over the run's median end "
                  "to end"
                  + ("; dispatch: the engine's time right before the node, since the previous one ended" if dispatch
                     else "") + ".</p>",
                  _table(["#", "executed node", "kind", "provider", "precision", "ms", "p90 ms", "share",
                          "ONNX nodes"] + (["dispatch ms"] if dispatch else []), rows,
                         numeric={0, 5, 6, 7, 9}, raw={5, 6, 7, 8, 9}),
                  *([_figure(slowest_layers(graph, top=top))] if slow else []),
                  _figure(latency_by_node(graph, "provider"))]
        if len({n.precision for n in graph.nodes}) > 1:
            parts.append(_figure(latency_by_node(graph, "precision")))
    else:
        parts.append("<p class='muted'>Not profiled (--runs 0): the graph only, no latency.</p>")
    parts += ["<h2>Providers</h2>", _by(graph, "provider"), "<h2>Precisions</h2>", _by(graph, "precision"),
              "<h2>Fused groups</h2>", _fused(graph, nodes)]
    if graph.unmapped:
        shown = graph.unmapped[:MAX_ROWS]
        parts += [f"<h2>Unmapped ONNX nodes ({len(graph.unmapped)})</h2>",
                  _table(["ONNX node", "reason"], [[u.get("node"), u.get("reason")] for u in shown])]
    return page(title, parts, doc)


def _summary(graph: Any, doc: dict) -> str:
    d = graph.details
    versions = ", ".join(f"{k} {d[k]}" for k in ("onnxruntime", "openvino", "tensorrt") if d.get(k))
    compute = graph.compute_nodes
    total = d.get("onnx_compute_nodes")
    rows = [("engine", f"<code>{_e(graph.engine)}</code>" + (f" ({_e(versions)})" if versions else "")),
            ("model", f"{_e(graph.model.get('name'))} <code>{_e((graph.model.get('sha256') or '')[:16])}</code>")]
    if d.get("graph_optimization"):
        rows.append(("graph optimization", _e(d["graph_optimization"])))
    if d.get("input_shapes"):
        rows.append(("input shapes", _e(", ".join(f"{k} {v}" for k, v in d["input_shapes"].items()))))
    rows += [("executed nodes", _e(f"{len(graph.nodes)} ({len(compute)} compute, {len(graph.nodes) - len(compute)} "
                                   f"layout), {len(graph.fused_nodes)} fused")),
             ("ONNX compute nodes", _e(f"{total if total is not None else '?'}, {len(graph.covered())} covered "
                                       f"({len(graph.folded)} folded while building), {len(graph.unmapped)} "
                                       "unmapped"))]
    if doc["end_to_end_ms"] is not None:
        share = doc["latency_share"]
        rows.append(("end to end", f"<b>{_num(doc['end_to_end_ms'])} ms</b> median, {_num(doc['end_to_end_p90_ms'])}"
                                   f" ms p90, {_num(doc['end_to_end_mean_ms'])} ms mean over {_e(graph.runs)} runs "
                                   f"<span class='muted'>({_e(graph.end_to_end_source)})</span>"))
        if share is not None:
            rows.append(("per-node times", _e(f"add up to {share:.0%} of a run (median over runs)")))
        over = doc.get("overhead") or {}
        words = overhead_summary(over, doc.get("accounted_share"))
        if words:
            rows.append(("outside the node times", _e(words)
                         + (f" <span class='muted'>({_e(over['source'])})</span>" if over.get("source") else "")))
        if d.get("unprofiled_wall_ms") is not None and d.get("wall_ms") is not None:
            rows.append(("profiling", _e(f"a run took {_num(d['wall_ms'])} ms profiled, {_num(d['unprofiled_wall_ms'])}"
                                         " ms unprofiled (wall, median; the same session once its profiler ended)")))
    else:
        rows.append(("end to end", "<span class='muted'>not measured</span>"))
    return _kv(rows)


def _share(mean: float | None, end: float | None) -> str:
    return "-" if mean is None or not end else _e(f"{mean / end:.1%}")


def _onnx(names: list[str]) -> str:
    """Escaped HTML: the ONNX node names, the first ``CELL_NODES`` of them."""
    shown = ", ".join(f"<code>{_e(n)}</code>" for n in names[:CELL_NODES])
    return shown + (f" <span class='muted'>(+{len(names) - CELL_NODES} more)</span>" if len(names) > CELL_NODES
                    else "")


def _by(graph: Any, key: str) -> str:
    """Executed nodes per provider (or precision): how many, how many fused, and their summed mean time."""
    groups: dict[str, list] = defaultdict(list)
    for n in graph.nodes:
        groups[getattr(n, key) or "?"].append(n)
    end = graph.end_to_end_mean_ms or graph.end_to_end_ms
    rows = []
    for value, ns in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        times = [n.latency_mean_ms for n in ns if n.latency_mean_ms is not None]
        total = sum(times) if times else None
        rows.append([value, len(ns), sum(n.role == "compute" for n in ns), sum(n.fused for n in ns),
                     sum(len(n.onnx_nodes) for n in ns if n.role == "compute"), _num(total), _share(total, end)])
    return _table([key, "executed nodes", "compute", "fused", "ONNX nodes run", "mean ms per run (summed)",
                   "share"], rows, numeric={1, 2, 3, 4, 5, 6}, raw={5, 6})


def _fused(graph: Any, nodes: dict[int, dict]) -> str:
    fused = graph.fused_nodes
    if not fused:
        return "<p class='muted'>The engine fused nothing: each executed node runs one ONNX node.</p>"
    shown = sorted(fused, key=lambda n: n.order)[:MAX_ROWS]
    rows = [[n.name, n.kind, n.provider or "-", n.precision or "-", len(n.onnx_nodes), _onnx(n.onnx_nodes),
             _num(nodes[id(n)]["latency_ms"])] for n in shown]
    return (f"<p>{len(fused)} executed node(s) each run several ONNX nodes (in execution order"
            + (f", the first {len(shown)}" if len(shown) < len(fused) else "") + ").</p>"
            + _table(["executed node", "kind", "provider", "precision", "ONNX nodes", "which", "ms"], rows,
                     numeric={4, 6}, raw={5, 6}))


def write_engine_graph_report(graph: Any, path: str | os.PathLike, *, top: int = 20) -> Path:
    """Write the engine graph report to ``path`` atomically; returns the path."""
    from .._atomic import atomic_write_text

    out = atomic_write_text(path, render_engine_graph_report(graph, top=top))
    log.info("wrote engine graph report %s", out)
    return out
