"""Plots of a dataset comparison: each layer's error across samples (mean, p95, worst), each sample's task metric,
and where samples first diverge. Pure functions: a :class:`~workbench.dataset.DatasetResult` in, a figure out, in
the style of the other plots (:func:`_styled`: their template, wrapped titles)."""

from __future__ import annotations

import math
from html import escape
from typing import Any

import plotly.graph_objects as go
from plotly.graph_objects import Bar, Figure, Scatter  # noqa: F401 - resolve plotly's lazy classes at import

from ..core.metric_info import HIGHER_IS_BETTER
from . import fit_title

#: the template every workbench plot uses
TEMPLATE = "plotly_white"

#: exact agreement (infinite SQNR) is drawn at this height, like the comparison's error curve
EXACT_DB = 200.0
SERIES = (("mean", "#1f77b4", "solid"), ("p95", "#ff7f0e", "dot"), ("worst", "#d62728", "dash"))


def _styled(fig: go.Figure) -> go.Figure:
    """``fig`` in the other plots' style: their template and a wrapped, left-aligned title."""
    fig.update_layout(template=TEMPLATE)
    return fit_title(fig)


def _shown(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    if math.isnan(v):
        return None
    if math.isinf(v):
        return EXACT_DB if v > 0 else -EXACT_DB
    return v


def layer_spread(result: Any) -> go.Figure:
    """The judged metric of every compared layer across samples: mean, p95 (the value 95% of samples do better
    than) and worst, in topological order, with the criterion's threshold. Hover names the layer."""
    metric = result.criterion.metric
    rows = result.layers
    x = list(range(len(rows)))
    names = [f"{escape(r['tensor'])} ({escape(r['op_type'])})<br>diverged in {r['diverged_samples']} sample(s), "
             f"first in {r['first_divergent_samples']}" for r in rows]
    fig = go.Figure()
    for key, color, dash in SERIES:
        fig.add_trace(go.Scatter(x=x, y=[_shown(r[key]) for r in rows], mode="lines", name=key,
                                 line={"color": color, "dash": dash, "width": 1.5}, text=names,
                                 hovertemplate="%{text}<br>" + key + ": %{y:.4g}<extra></extra>"))
    firsts = [i for i, r in enumerate(rows) if r["first_divergent_samples"]]
    if firsts:
        fig.add_trace(go.Scatter(x=firsts, y=[_shown(rows[i]["worst"]) for i in firsts], mode="markers",
                                 name="first divergence", marker={"symbol": "star", "size": 10, "color": "#d62728"},
                                 text=[names[i] for i in firsts], hovertemplate="%{text}<extra></extra>"))
    fig.add_hline(y=result.criterion.threshold, line={"color": "#888", "dash": "dash"},
                  annotation_text=f"criterion {result.criterion.describe()}", annotation_position="top left")
    unit = " (dB)" if metric == "sqnr_db" else ""
    fig.update_layout(title={"text": f"{escape(metric)} of each layer across {len(result.samples)} samples"},
                      xaxis_title="layer (topological order)", yaxis_title=metric + unit,
                      yaxis_type="log" if metric not in HIGHER_IS_BETTER and _positive(rows) else "linear",
                      legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 20, "t": 50, "b": 60},
                      hovermode="closest")
    return _styled(fig)


def _positive(rows: list[dict]) -> bool:
    vals = [_shown(r["worst"]) for r in rows]
    return bool(vals) and all(v is None or v > 0 for v in vals)


def sample_metric(result: Any, name: str | None = None) -> go.Figure:
    """Each sample's task metric ``name`` (default: the first one; without task metrics the worst output's judged
    metric), worst samples marked. ``customdata`` holds each point's sample index (for click handlers)."""
    samples = result.samples
    if name is None:
        name = next(iter(samples[0]["task"]), None) if samples and samples[0]["task"] else None
    if name is not None:
        y = [s["task"].get(name) for s in samples]
        title = f"{escape(name)} per sample"
    else:
        m = result.criterion.metric
        name = f"worst output {m}"
        y = [_worst_output(s, m) for s in samples]
        title = f"{escape(name)} per sample"
    worst = {s["index"] for s in result.worst()}
    failing = result.failing_indices()
    missed = " (task target missed)" if result.task_target is not None else " (diverged)"
    colors = ["#d62728" if s["index"] in worst else ("#ff7f0e" if s["index"] in failing else "#1f77b4")
              for s in samples]
    text = [f"#{s['index']} {escape(str(s['source']))}" + (missed if s["index"] in failing else "")
            + (" (outputs diverged)" if s["diverged"] and result.task_target is not None else "") for s in samples]
    fig = go.Figure(go.Scatter(x=[s["index"] for s in samples], y=[_shown(v) for v in y], mode="markers",
                               marker={"color": colors, "size": 7}, text=text,
                               customdata=[s["index"] for s in samples],
                               hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"))
    target = result.task_target
    if target is not None and target.name == name:
        fig.add_hline(y=target.threshold, line={"color": "#888", "dash": "dash"},
                      annotation_text=escape(f"task target {target.text()}"), annotation_position="top left")
    fig.update_layout(title={"text": title}, xaxis_title="sample", yaxis_title=escape(name),
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, hovermode="closest")
    return _styled(fig)


def _worst_output(sample: dict, metric: str) -> float | None:
    vals = [_shown((m or {}).get(metric)) for m in sample["outputs"].values()]
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return min(vals) if metric in HIGHER_IS_BETTER else max(vals)


def first_divergence_bars(result: Any, top: int = 15) -> go.Figure:
    """How many samples first diverge at each layer (the ``top`` most frequent)."""
    rows = sorted((r for r in result.layers if r["first_divergent_samples"]),
                  key=lambda r: (-r["first_divergent_samples"], r["topo_index"]))[:top]
    fig = go.Figure(go.Bar(x=[r["first_divergent_samples"] for r in rows][::-1],
                           y=[escape(f"{r['tensor']} ({r['op_type']})") for r in rows][::-1], orientation="h",
                           marker_color="#d62728", hovertemplate="%{y}: %{x} sample(s)<extra></extra>"))
    fig.update_layout(title={"text": "where samples first diverge"}, xaxis_title="samples",
                      margin={"l": 220, "r": 20, "t": 50, "b": 50}, height=max(260, 28 * len(rows) + 120))
    fig.update_yaxes(automargin=True)
    return _styled(fig)
