"""Plots of a comparison: pure functions, a :class:`~workbench.compare.result.CompareResult` (or arrays) in,
a plotly ``go.Figure`` out. Nothing here runs an engine. Histograms are binned with numpy first, so a figure
holds bin counts, never the raw tensor."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..compare.metrics import HIGHER_IS_BETTER

#: where an exact match (SQNR = inf dB) is drawn
SQNR_EXACT_DB = 200.0
#: metrics that are positive errors: a log axis suits them
_LOG_METRICS = {"max_abs", "mean_abs", "max_rel", "norm_max_abs", "norm_mean_abs"}
OK_COLOR, BAD_COLOR, FIRST_COLOR, REF_COLOR, CAND_COLOR = "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd"


def _metric(result, metric: str | None) -> str:
    return metric or result.criterion.metric


def _shown(value: Any, metric: str) -> float:
    """A plottable float: None/NaN -> NaN (a gap), +inf SQNR -> SQNR_EXACT_DB, other infinities -> NaN."""
    if value is None or isinstance(value, str):
        return math.nan
    v = float(value)
    if math.isinf(v):
        if metric == "sqnr_db":
            return SQNR_EXACT_DB if v > 0 else -SQNR_EXACT_DB
        return math.nan
    return v


def _label(value: Any, metric: str) -> str:
    if value is None:
        return "-"
    v = float(value)
    if math.isinf(v) and metric == "sqnr_db" and v > 0:
        return "exact (inf dB)"
    return f"{v:.4g}" + (" dB" if metric == "sqnr_db" else "")


def _threshold(result, metric: str) -> float | None:
    return result.criterion.threshold if result.criterion.metric == metric else None


def _log_axis(metric: str, values: list[float]) -> bool:
    finite = [v for v in values if math.isfinite(v)]
    return metric in _LOG_METRICS and bool(finite) and min(finite) > 0


def layer_error_curve(result, metric: str | None = None) -> go.Figure:
    """``metric`` per compared tensor over the reference's topological order; the criterion's tolerance as a
    line, diverged tensors in red, the first divergent one marked."""
    m = _metric(result, metric)
    tensors = sorted(result.tensors, key=lambda t: t.topo_index)
    x = [t.topo_index for t in tensors]
    y = [_shown(t.metrics.get(m), m) for t in tensors]
    custom = [[t.tensor, t.node, t.op_type, _label(t.metrics.get(m), m), t.metrics.get("nonfinite_mismatch") or 0]
              for t in tensors]
    hover = ("#%{x} %{customdata[1]} (%{customdata[2]})<br>tensor %{customdata[0]}<br>" + m
             + " %{customdata[3]}<br>non-finite mismatches %{customdata[4]}<extra></extra>")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=m, customdata=custom, hovertemplate=hover,
                             line={"color": OK_COLOR, "width": 1.5}, marker={"size": 6, "color": OK_COLOR}))
    bad = [i for i, t in enumerate(tensors) if t.diverged]
    if bad:
        fig.add_trace(go.Scatter(x=[x[i] for i in bad], y=[y[i] for i in bad], mode="markers", name="diverged",
                                 customdata=[custom[i] for i in bad], hovertemplate=hover,
                                 marker={"size": 9, "color": BAD_COLOR, "symbol": "circle-open", "line": {"width": 2}}))
    odd = [i for i, t in enumerate(tensors) if (t.metrics.get("nonfinite_mismatch") or 0) > 0]
    if odd:  # diverged by inf/NaN where the reference is finite, whatever the metric says
        fig.add_trace(go.Scatter(x=[x[i] for i in odd], y=[y[i] for i in odd], mode="markers",
                                 name="inf/NaN mismatch", customdata=[custom[i] for i in odd], hovertemplate=hover,
                                 marker={"size": 8, "color": BAD_COLOR, "symbol": "x"}))
    threshold = _threshold(result, m)
    if threshold is not None:
        fig.add_hline(y=threshold, line={"color": BAD_COLOR, "dash": "dash", "width": 1},
                      annotation_text=f"tolerance: {result.criterion.describe()}", annotation_position="top left")
    first = result.first_divergent
    if first is not None:
        fy = _shown(first.metrics.get(m), m)
        fig.add_trace(go.Scatter(x=[first.topo_index], y=[fy], mode="markers", name="first divergent",
                                 marker={"size": 16, "color": FIRST_COLOR, "symbol": "star"},
                                 customdata=[[first.tensor, first.node, first.op_type, _label(first.metrics.get(m), m),
                                              first.metrics.get("nonfinite_mismatch") or 0]], hovertemplate=hover))
        fig.add_annotation(x=first.topo_index, y=fy if math.isfinite(fy) else 0, text=f"first divergent: {first.node}",
                           showarrow=True, arrowhead=2, ax=40, ay=-40)
    if m == "sqnr_db" and any(v == SQNR_EXACT_DB for v in y):
        fig.add_annotation(xref="paper", yref="paper", x=1, y=1.08, showarrow=False,
                           text=f"exact matches drawn at {SQNR_EXACT_DB:g} dB")
    fig.update_layout(title=f"{m} per layer: {result.reference} (reference) vs {result.candidate} (candidate)",
                      xaxis_title="topological index", yaxis_title=m + (" (dB)" if m == "sqnr_db" else ""),
                      hovermode="closest", template="plotly_white", legend={"orientation": "h", "y": -0.2})
    if _log_axis(m, y):
        fig.update_yaxes(type="log")
    return fig


def metric_histogram(result, metric: str | None = None, bins: int = 40) -> go.Figure:
    """Distribution of the per-tensor ``metric`` (ok and diverged stacked), with the tolerance marked."""
    m = _metric(result, metric)
    values = {False: [], True: []}
    for t in result.tensors:
        v = _shown(t.metrics.get(m), m)
        if math.isfinite(v):
            values[t.diverged].append(v)
    every = values[False] + values[True]
    log = _log_axis(m, every)
    fig = go.Figure()
    if every:
        data = np.log10(every) if log else np.asarray(every)
        edges = np.histogram_bin_edges(data, bins=min(bins, max(1, len(every))))
        centers = (edges[:-1] + edges[1:]) / 2
        width = float(edges[1] - edges[0]) if len(edges) > 1 else 1.0
        for diverged, color, name in ((False, OK_COLOR, "within tolerance"), (True, BAD_COLOR, "diverged")):
            if not values[diverged]:
                continue
            d = np.log10(values[diverged]) if log else np.asarray(values[diverged])
            counts, _ = np.histogram(d, bins=edges)
            xs = 10 ** centers if log else centers
            fig.add_trace(go.Bar(x=xs, y=counts, name=name, marker_color=color,
                                 width=None if log else width * 0.95))
    threshold = _threshold(result, m)
    if threshold is not None:
        fig.add_vline(x=threshold, line={"color": BAD_COLOR, "dash": "dash"}, annotation_text="tolerance")
    fig.update_layout(title=f"distribution of per-tensor {m} ({len(result.tensors)} tensors)", barmode="stack",
                      xaxis_title=m, yaxis_title="tensors", template="plotly_white")
    if log:
        fig.update_xaxes(type="log")
    return fig


def culprit_bars(result, metric: str | None = None) -> go.Figure:
    """Per culprit (worst first): the error it introduces alone vs the error its inputs already carried."""
    m = _metric(result, metric)
    culprits = list(result.culprits)
    names = [f"{i}. {c.node} ({c.op_type})" for i, c in enumerate(culprits, 1)]
    fig = go.Figure()
    for key, color, label in (("introduced", BAD_COLOR, "introduced (node alone, reference inputs)"),
                              ("received", OK_COLOR, "received (worst input)")):
        vals = [_shown(getattr(c, key).get(m), m) for c in culprits]
        text = [_label(getattr(c, key).get(m), m) for c in culprits]
        fig.add_trace(go.Bar(y=names, x=vals, orientation="h", name=label, marker_color=color, text=text,
                             textposition="auto", hovertemplate="%{y}<br>" + label + ": %{text}<extra></extra>"))
    better = "higher is better" if m in HIGHER_IS_BETTER else "lower is better"
    fig.update_layout(title=f"culprits: {m} each node introduces vs receives ({better})", barmode="group",
                      xaxis_title=m, template="plotly_white", yaxis={"autorange": "reversed"},
                      height=max(300, 120 + 60 * len(culprits)), legend={"orientation": "h", "y": -0.25})
    return fig


def _finite(a: np.ndarray) -> tuple[np.ndarray, int]:
    flat = np.asarray(a, dtype=np.float64).ravel()
    ok = np.isfinite(flat)
    return flat[ok], int((~ok).sum())


def value_histograms(ref: np.ndarray, cand: np.ndarray, name: str, bins: int = 80) -> go.Figure:
    """Reference and candidate value histograms (shared bins) and the error (candidate - reference) histogram."""
    from plotly.subplots import make_subplots

    r, r_bad = _finite(ref)
    c, c_bad = _finite(cand)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("values", "error (candidate - reference)"))
    both = np.concatenate([r, c])
    if both.size:
        edges = np.histogram_bin_edges(both, bins=bins)
        centers = (edges[:-1] + edges[1:]) / 2
        for vals, color, label in ((r, REF_COLOR, "reference"), (c, CAND_COLOR, "candidate")):
            counts, _ = np.histogram(vals, bins=edges)
            fig.add_trace(go.Bar(x=centers, y=counts, name=label, marker_color=color, opacity=0.6), row=1, col=1)
    rr = np.asarray(ref, dtype=np.float64).ravel()
    cc = np.asarray(cand, dtype=np.float64).reshape(-1)[: rr.size] if np.size(cand) == rr.size else None
    if cc is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            err = cc - rr
        err = err[np.isfinite(err)]
        if err.size:
            counts, edges = np.histogram(err, bins=bins)
            fig.add_trace(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, name="error", marker_color=BAD_COLOR),
                          row=1, col=2)
    note = f"non-finite: reference {r_bad}, candidate {c_bad}" if r_bad or c_bad else ""
    fig.update_layout(title=f"{name}: value distributions" + (f" ({note})" if note else ""), barmode="overlay",
                      template="plotly_white", bargap=0)
    scale = "log" if r.size > 1000 else "linear"  # long tails show on a log count axis
    fig.update_yaxes(title_text="count", type=scale, row=1, col=1)
    fig.update_yaxes(type=scale, row=1, col=2)
    return fig


def ref_vs_cand_scatter(ref: np.ndarray, cand: np.ndarray, max_points: int = 5000, seed: int = 0,
                        name: str = "") -> go.Figure:
    """Candidate against reference for a seeded sample of at most ``max_points`` elements; y = x dashed."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    c = np.asarray(cand, dtype=np.float64).ravel()
    n = min(r.size, c.size)
    idx = np.arange(n)
    if n > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(n, size=max_points, replace=False))
    rs, cs = r[idx], c[idx]
    ok = np.isfinite(rs) & np.isfinite(cs)
    fig = go.Figure(go.Scatter(x=rs[ok], y=cs[ok], mode="markers", name="elements",
                               marker={"size": 4, "color": CAND_COLOR, "opacity": 0.6},
                               hovertemplate="reference %{x:.5g}<br>candidate %{y:.5g}<extra></extra>"))
    if ok.any():
        lo, hi = float(min(rs[ok].min(), cs[ok].min())), float(max(rs[ok].max(), cs[ok].max()))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="candidate = reference",
                                 line={"color": "#888", "dash": "dash"}))
    shown = f"{idx.size} of {n} elements" + (f", {int((~ok).sum())} non-finite left out" if (~ok).any() else "")
    fig.update_layout(title=f"{name + ': ' if name else ''}candidate vs reference ({shown})",
                      xaxis_title="reference", yaxis_title="candidate", template="plotly_white")
    return fig


def channel_error_heatmap(ref: np.ndarray, cand: np.ndarray, axis: int = 1, max_cols: int = 128,
                          name: str = "") -> go.Figure:
    """Mean |candidate - reference| per channel (rows, along ``axis``) and position (the other axes flattened,
    averaged into at most ``max_cols`` columns): shows whether the error sits in a few channels."""
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64).reshape(r.shape) if np.size(cand) == r.size else None
    fig = go.Figure()
    if c is None or r.size == 0:
        fig.update_layout(title=f"{name}: shapes differ, no per-channel view")
        return fig
    if r.ndim < 2:
        r, c, axis = r.reshape(1, -1), c.reshape(1, -1), 0
    axis = axis % r.ndim
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(np.moveaxis(c, axis, 0) - np.moveaxis(r, axis, 0)).reshape(r.shape[axis], -1)
    cols = min(max_cols, err.shape[1])
    groups = np.array_split(np.arange(err.shape[1]), cols)
    finite = np.where(np.isfinite(err), err, 0.0)
    counted = np.isfinite(err).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.stack([finite[:, g].sum(axis=1) / counted[:, g].sum(axis=1) for g in groups], 1)
    fig.add_trace(go.Heatmap(z=np.where(np.isfinite(z), z, None).tolist(), colorscale="Reds",
                             colorbar={"title": "mean |error|"},
                             hovertemplate="channel %{y}<br>position group %{x}<br>mean |error| %{z:.4g}"
                                           "<extra></extra>"))
    fig.update_layout(title=f"{name + ': ' if name else ''}mean |error| per channel (axis {axis}) and position",
                      xaxis_title=f"position (other axes flattened, {cols} groups)", yaxis_title="channel",
                      template="plotly_white")
    return fig
