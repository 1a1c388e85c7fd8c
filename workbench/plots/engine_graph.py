"""Plots of an engine graph: the slowest nodes with their error, and latency along the execution order coloured by
provider, precision or kind. Pure functions: rows from :func:`workbench.engine_graphs.layers.layer_rows` (or an
EngineGraph and an optional comparison) in, plotly figures out."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.graph_objects import Bar, Figure  # noqa: F401 - resolve plotly's lazy classes at import

from . import esc

#: node names longer than this are shortened in the middle on the axis (the hover has them whole)
LABEL_CHARS = 42
#: the error colour's range, in dB of margin to the criterion's threshold (beyond it: the end colour)
MARGIN_RANGE = (-20.0, 40.0)
_AT = (0.0 - MARGIN_RANGE[0]) / (MARGIN_RANGE[1] - MARGIN_RANGE[0])  # where the threshold sits on the scale
#: absolute: red under the threshold (fails), yellow just above it, green well above it
MARGIN_COLORSCALE = [[0.0, "#a50026"], [_AT, "#f46d43"], [_AT + 1e-4, "#fee08b"], [(1 + _AT) / 2, "#a6d96a"],
                     [1.0, "#1a9850"]]
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"]


def _label(name: str) -> str:
    half = (LABEL_CHARS - 1) // 2
    return name if len(name) <= LABEL_CHARS else f"{name[:half]}…{name[-half:]}"


def _rows(source: Any, result: Any = None) -> list[dict]:
    if isinstance(source, list):
        return source
    from ..engine_graphs.layers import layer_rows

    return layer_rows(source, result)


def _hover(r: dict) -> str:
    onnx = r["onnx_nodes"]
    text = (f"{esc(r['name'])}<br>{esc(r['kind'])} on {esc(r['provider'] or '?')}, {esc(r['precision'] or '?')}"
            f"<br>{len(onnx)} ONNX node(s): {esc(', '.join(onnx[:4]))}{' ...' if len(onnx) > 4 else ''}")
    if r.get("latency_ms") is not None:
        text += f"<br>{r['latency_ms']:.3f} ms median, p90 {(r.get('latency_p90_ms') or 0):.3f} ms"
    if r.get("dispatch_ms"):
        text += f"<br>+ {r['dispatch_ms']:.3f} ms dispatch before it"
    if r.get("error") is not None:
        text += f"<br>{esc(r['metric'])} {r['error']:.4g} at {esc(r['tensor'])}"
    if r.get("fell_back"):
        text += "<br><b>fell back to another provider</b>"
    return text


def slowest_layers(source: Any, result: Any = None, top: int = 20, bands: Any = None) -> go.Figure:
    """The ``top`` slowest executed nodes as horizontal bars (median ms per run), coloured by their worst tensor's
    error when a comparison is given (``result``), with fell-back nodes outlined in red. The colour is absolute: the
    error's margin to the criterion's threshold in dB (``margin_db``), red when it fails, green 40 dB within. With
    ``bands`` (:class:`~workbench.plots.thresholds.Bands` of the rows' metric: the user's colour thresholds) each
    bar is its band's colour instead, the legend stating the thresholds."""
    rows = [r for r in _rows(source, result) if r.get("latency_ms") is not None][:top]
    labels = [esc(f"{k}. {_label(r['name'])}") for k, r in enumerate(rows, 1)]
    margins = [r.get("margin_db") for r in rows]
    metric = next((r["metric"] for r in rows if r.get("metric")), None)
    threshold = next((r["threshold"] for r in rows if r.get("threshold") is not None), None)
    marker: dict = {"line": {"color": ["#d62728" if r.get("fell_back") else "rgba(0,0,0,0)" for r in rows],
                             "width": 2}}
    banded = bool(metric) and bands is not None and bands.metric == metric
    if banded:
        from .thresholds import band_color

        marker["color"] = [band_color(bands.classify(r.get("error"))) or "#bdbdbd" for r in rows]
    elif metric and any(m is not None for m in margins):
        low, high = MARGIN_RANGE
        marker.update(color=[float("nan") if m is None else min(max(m, low), high) for m in margins],
                      colorscale=MARGIN_COLORSCALE, cmin=low, cmax=high, showscale=True,
                      colorbar={"title": {"text": esc(f"{metric}: dB beyond threshold {threshold:g}") + "<br>"
                                          "red: fails, green: well within", "side": "right"},
                                "tickvals": [low, 0.0, 20.0, high],
                                "ticktext": [f"fails by {-low:g}+", "threshold", "+20", f"+{high:g} or exact"]})
    else:
        marker["color"] = PALETTE[0]
    fig = go.Figure(go.Bar(y=labels, x=[r["latency_ms"] for r in rows], orientation="h", marker=marker,
                           hovertext=[_hover(r) for r in rows], hoverinfo="text", showlegend=False))
    if banded:
        for label, color in bands.legend():
            fig.add_trace(go.Bar(y=[None], x=[None], orientation="h", name=esc(label), marker_color=color))
    fig.update_layout(title=f"slowest {len(rows)} executed nodes" + (f", coloured by {metric}" if metric else ""),
                      template="plotly_white", xaxis={"title": "ms per run (median)", "rangemode": "tozero"},
                      yaxis={"autorange": "reversed"}, height=max(260, 90 + 22 * len(rows)),
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def latency_by_node(source: Any, color_by: str = "provider") -> go.Figure:
    """Latency of every executed node along the execution order, one colour per ``color_by`` value (provider,
    precision, kind or role): where the time goes and what ran where, in what precision."""
    if color_by not in ("provider", "precision", "kind", "role"):
        raise ValueError(f"color_by must be provider, precision, kind or role, not {color_by!r}")
    rows = _rows(source)
    order = {r["name"]: k for k, r in enumerate(sorted(rows, key=lambda r: r["order"]))}
    fig = go.Figure()
    groups = list(dict.fromkeys(str(r.get(color_by)) for r in rows))
    for k, value in enumerate(groups):
        mine = [r for r in rows if str(r.get(color_by)) == value]
        fig.add_trace(go.Bar(x=[order[r["name"]] for r in mine], y=[r.get("latency_ms") or 0.0 for r in mine],
                             name=esc(value), marker_color=PALETTE[k % len(PALETTE)],
                             hovertext=[_hover(r) for r in mine], hoverinfo="text"))
    fig.update_layout(title=f"latency per executed node, by {color_by}", template="plotly_white", barmode="overlay",
                      xaxis={"title": "executed node (execution order)"}, yaxis={"title": "ms per run (median)"},
                      legend={"title": color_by}, height=360, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig
