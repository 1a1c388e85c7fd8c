"""Plots of an INT8 calibration report: a tensor's |x| histogram with every rule's threshold, and tensors ranked
by sensitivity. Each threshold is labelled with its rule and the toolchain whose threshold it reproduces. Pure
functions: a :class:`~workbench.calibrate.CalibrationReport` in, a figure out."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.graph_objects import Bar, Figure, Scatter  # noqa: F401 - resolve plotly's lazy classes at import

from ..calibrate.methods import RULES
from . import esc, fit_title, short_labels

METHOD_COLORS = {"max": "#d62728", "entropy": "#1f77b4", "percentile": "#2ca02c", "mse": "#9467bd",
                 "ort-entropy": "#17becf", "ort-percentile": "#8c564b", "imported": "#e377c2"}
CALIB_COLOR, EVAL_COLOR = "#607d8b", "#ff7f0e"
#: bars drawn at most: neighbouring bins are summed beyond this (2048-bin histograms stay light in the browser)
MAX_BARS = 512
#: thresholds closer than this fraction of the x range share one label on the plot
LABEL_MERGE = 0.02
#: vertical step (pixels) between the staggered threshold labels: an 11 px label with its box and padding
LABEL_ROW_PX = 22
#: threshold label text: dark on the labels' light boxes, in light and dark themes alike
LABEL_TEXT = "#263238"


def rule_tag(method: str) -> str:
    """``method`` and whose threshold it reproduces, e.g. "entropy (TensorRT)"."""
    rule = RULES.get(method)
    return f"{method} ({rule.toolchain})" if rule else method


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
    """The |x| histogram of ``tensor`` over the calibration data (log counts), each rule's amax as a vertical line,
    the evaluation data's histogram overlaid (as fractions of each data set, so different sizes compare) and
    imported thresholds (a cache read back) dashed. Each line has a legend entry naming its rule and toolchain
    with the fraction of values it clips and the worst-case SQNR it leaves (the asymmetric ONNX Runtime rules also
    give their (lowest, highest)); on the plot, short labels at staggered heights, one per group of lines that
    (nearly) coincide."""
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
    lines = [(m, thresholds[m]) for m in methods if thresholds[m] is not None and math.isfinite(thresholds[m])]
    imported = getattr(report, "imported", None)
    if imported is not None and tensor in imported.amax and math.isfinite(imported.amax[tensor]):
        lines.append(("imported", imported.amax[tensor]))
    lines.sort(key=lambda line: line[1])
    bounds = getattr(report, "bounds", None) or {}
    for method, amax in lines:
        color, dash = METHOD_COLORS.get(method, "#333"), "dash" if method == "imported" else "solid"
        fig.add_vline(x=amax, line={"color": color, "width": 2, "dash": dash})
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line={"color": color, "width": 2, "dash": dash},
                                 name=_legend_text(report, method, amax, errors.get(method),
                                                   bounds.get(method, {}).get(tensor)),
                                 hoverinfo="skip"))
    for k, group in enumerate(_label_groups(lines, upto)):
        names = " = ".join(m + (" (used)" if m == report.method else "") for m, _ in group)
        amax, top = group[0][1], group[-1][1]
        value = f"{amax:.4g}" if f"{amax:.4g}" == f"{top:.4g}" else f"{amax:.4g}–{top:.4g}"
        right = amax > 0.85 * upto  # labels near the axis end extend to the left of their line
        # one row per label, LABEL_ROW_PX apart whatever the plot's height: two labels never share a row
        fig.add_annotation(x=amax, y=1, yref="paper", yanchor="top", yshift=-LABEL_ROW_PX * k,
                           xanchor="right" if right else "left", showarrow=False,
                           text=f"{names}: {value}", font={"size": 11, "color": LABEL_TEXT},
                           bgcolor="rgba(255,255,255,0.85)", borderpad=2,
                           bordercolor=METHOD_COLORS.get(group[0][0], "#333"))
    notes = []
    if h.nonfinite:
        notes.append(f"{h.nonfinite:,} NaN/inf left out")
    if h.zeros:
        notes.append(f"{h.zeros:,} zeros")
    fig.update_layout(title=esc(f"{tensor}: |x| over the calibration data" + (f" ({', '.join(notes)})" if notes
                                                                              else "")),
                      xaxis_title="|x|", yaxis_title="fraction of values", template="plotly_white", bargap=0,
                      legend={"orientation": "h", "y": -0.18, "yanchor": "top", "font": {"size": 11}},
                      margin={"t": 60}, height=420 + LABEL_ROW_PX * len(lines))
    if log_y:
        fig.update_yaxes(type="log")
    return fit_title(fig)


def _legend_text(report: Any, method: str, amax: float, err: Any, bound: Any) -> str:
    """"entropy (TensorRT), used: amax 306.2, clips 0.020%, 32.5 dB" (the bounds too for asymmetric rules)."""
    used = ", used" if method == report.method else ""
    where = f"[{bound[0]:.4g}, {bound[1]:.4g}]" if bound is not None and bound[0] != -bound[1] else f"amax {amax:.4g}"
    text = f"{rule_tag(method)}{used}: {where}"
    if err is not None:
        text += f", clips {err.clipped_fraction:.3%}"
        if math.isfinite(err.worst_sqnr_db):
            text += f", {err.worst_sqnr_db:.1f} dB"
    return text


def _label_groups(lines: list[tuple[str, float]], upto: float) -> list[list[tuple[str, float]]]:
    """Sorted (method, amax) lines grouped where neighbours lie within LABEL_MERGE of the x range."""
    groups: list[list[tuple[str, float]]] = []
    for line in lines:
        if groups and line[1] - groups[-1][-1][1] <= LABEL_MERGE * max(upto, 1e-30):
            groups[-1].append(line)
        else:
            groups.append([line])
    return groups


def sensitivity_bars(report: Any, top: int = 20, methods: list[str] | None = None) -> go.Figure:
    """The ``top`` most sensitive tensors (worst first, under the report's rule) and each rule's worst-case SQNR
    on them (min of all-values and bulk SQNR): which rule would save which tensor. Traces are named by rule and
    toolchain."""
    worst = report.worst(k=top)
    names = [e.tensor for e in worst]
    labels = [esc(t) for t in short_labels(names)]  # long tensor names shortened in the middle; hover: in full
    methods = list(methods or report.methods)
    fig = go.Figure()
    for method in methods:
        vals = [report.errors[t][method].worst_sqnr_db if method in report.errors.get(t, {}) else None
                for t in names]
        fig.add_trace(go.Bar(y=labels, x=[v if v is None or math.isfinite(v) else None for v in vals],
                             orientation="h", name=rule_tag(method), marker_color=METHOD_COLORS.get(method),
                             customdata=[esc(t) for t in names],
                             hovertemplate="%{customdata}<br>" + rule_tag(method) + ": %{x:.1f} dB<extra></extra>"))
    fig.update_layout(title=f"most sensitive tensors under {rule_tag(report.method)} (worst-case SQNR, higher is "
                            "better)", barmode="group", xaxis_title="worst-case SQNR (dB)", template="plotly_white",
                      yaxis={"autorange": "reversed"}, height=max(300, 120 + len(names) * (10 + 5 * len(methods))),
                      legend={"orientation": "h", "y": -0.15})
    return fit_title(fig)
