"""Plots of an INT8 calibration report: a tensor's |x| histogram with every method's threshold, and tensors
ranked by sensitivity. Pure functions: a :class:`~workbench.calibrate.CalibrationReport` in, a figure out."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.graph_objects import Bar, Figure, Scatter  # noqa: F401 - resolve plotly's lazy classes at import

METHOD_COLORS = {"max": "#d62728", "percentile": "#2ca02c", "entropy": "#1f77b4", "mse": "#9467bd",
                 "imported": "#ff7f0e"}
CALIB_COLOR, EVAL_COLOR = "#607d8b", "#ff7f0e"
#: bars drawn at most: neighbouring bins are summed beyond this (2048-bin histograms stay light in the browser)
MAX_BARS = 512


def _binned(counts: np.ndarray, edges: np.ndarray, upto: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left edges, widths, counts) up to the bin holding ``upto``, merged into at most MAX_BARS bars."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.sum() == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    last = int(np.nonzero(counts)[0][-1]) + 1
    if math.isfinite(upto) and upto > 0:
        last = max(last, min(len(counts), int(np.searchsorted(edges, upto, side="right"))))
    counts, edges = counts[:last], edges[: last + 1]
    k = max(1, math.ceil(last / MAX_BARS))
    pad = (-len(counts)) % k
    merged = np.concatenate([counts, np.zeros(pad, np.int64)]).reshape(-1, k).sum(axis=1)
    width = (edges[1] - edges[0]) * k
    left = edges[0] + width * np.arange(merged.size)
    return left, np.full(merged.size, width), merged


def calibration_histogram(report: Any, tensor: str, methods: list[str] | None = None, log_y: bool = True,
                          show_eval: bool = True) -> go.Figure:
    """The |x| histogram of ``tensor`` over the calibration data (log counts), each method's amax as a vertical
    line labelled with the fraction of values it clips, the evaluation data's histogram overlaid (as fractions of
    each data set, so different sizes compare) and imported thresholds (a cache read back) dashed."""
    h = report.histograms[tensor]
    methods = [m for m in (methods or report.methods) if m in report.ranges]
    errors = report.errors.get(tensor, {})
    thresholds = {m: report.ranges[m].get(tensor) for m in methods}
    finite = [a for a in thresholds.values() if a is not None and math.isfinite(a)]
    upto = max(finite, default=0.0)
    ev = (report.eval_histograms or {}).get(tensor) if show_eval else None
    fig = go.Figure()
    left, width, counts = _binned(h.abs_counts, h.abs_edges, upto)
    total = max(1, int(h.abs_counts.sum()))
    fig.add_trace(go.Bar(x=left + width / 2, y=counts / total, width=width, name=f"calibration ({h.count:,} values)",
                         marker={"color": CALIB_COLOR, "line": {"width": 0}}, opacity=0.85, customdata=counts,
                         hovertemplate="|x| %{x:.4g}<br>%{customdata:,} values (%{y:.3g})<extra>calibration</extra>"))
    if ev is not None and ev.count:
        el, ew, ec = _binned(ev.abs_counts, ev.abs_edges, upto)
        etotal = max(1, int(ev.abs_counts.sum()))
        fig.add_trace(go.Scatter(x=el + ew / 2, y=np.where(ec > 0, ec / etotal, np.nan), mode="lines",
                                 line={"color": EVAL_COLOR, "width": 1.5, "shape": "hvh"},
                                 name=f"evaluation ({ev.count:,} values)", connectgaps=False,
                                 hovertemplate="|x| %{x:.4g}<br>%{y:.3g} of evaluation values<extra></extra>"))
    lines = [(m, thresholds[m], errors.get(m)) for m in methods if thresholds[m] is not None]
    imported = getattr(report, "imported", None)
    if imported is not None and tensor in imported.amax:
        lines.append(("imported", imported.amax[tensor], None))
    for k, (method, amax, err) in enumerate(sorted(lines, key=lambda t: t[1])):
        if not math.isfinite(amax):
            continue
        clip = f", clips {err.clipped_fraction:.3%}" if err is not None else ""
        sqnr = f", {err.worst_sqnr_db:.1f} dB" if err is not None and math.isfinite(err.worst_sqnr_db) else ""
        chosen = " (used)" if method == report.method else ""
        fig.add_vline(x=amax, line={"color": METHOD_COLORS.get(method, "#333"), "width": 2,
                                    "dash": "dash" if method == "imported" else "solid"})
        fig.add_annotation(x=amax, y=1 - 0.09 * k, yref="paper", xanchor="left", showarrow=False,
                           text=f"{method}{chosen}: {amax:.4g}{clip}{sqnr}", font={"size": 11},
                           bgcolor="rgba(255,255,255,0.8)", bordercolor=METHOD_COLORS.get(method, "#333"))
    notes = []
    if h.nonfinite:
        notes.append(f"{h.nonfinite:,} NaN/inf left out")
    if h.zeros:
        notes.append(f"{h.zeros:,} zeros")
    fig.update_layout(title=f"{tensor}: |x| over the calibration data" + (f" ({', '.join(notes)})" if notes else ""),
                      xaxis_title="|x|", yaxis_title="fraction of values", template="plotly_white", bargap=0,
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 60})
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def sensitivity_bars(report: Any, top: int = 20, methods: list[str] | None = None) -> go.Figure:
    """The ``top`` most sensitive tensors (worst first, under the report's method) and each method's worst-case
    SQNR on them (min of all-values and bulk SQNR): which method would save which tensor."""
    worst = report.worst(k=top)
    names = [e.tensor for e in worst]
    fig = go.Figure()
    for method in methods or report.methods:
        vals = [report.errors[t][method].worst_sqnr_db if method in report.errors.get(t, {}) else None
                for t in names]
        fig.add_trace(go.Bar(y=names, x=[v if v is None or math.isfinite(v) else None for v in vals],
                             orientation="h", name=method, marker_color=METHOD_COLORS.get(method),
                             hovertemplate="%{y}<br>" + method + ": %{x:.1f} dB<extra></extra>"))
    fig.update_layout(title=f"most sensitive tensors under '{report.method}' (worst-case SQNR, higher is better)",
                      barmode="group", xaxis_title="worst-case SQNR (dB)", template="plotly_white",
                      yaxis={"autorange": "reversed"}, height=max(300, 100 + 26 * len(names) * 1.4),
                      legend={"orientation": "h", "y": -0.15})
    return fig
