"""Plots of a comparison: pure functions, a :class:`~workbench.compare.result.CompareResult` (or arrays) in,
a plotly ``go.Figure`` out. Nothing here runs an engine. Histograms are binned with numpy first, so a figure
holds bin counts, never the raw tensor.

Every figure is JSON-compliant: no NaN or infinity reaches it (JupyterLab refuses "Out of range float values").
An exact match (SQNR +inf dB) is drawn at :data:`SQNR_EXACT_DB`; a tensor whose metric is inf/NaN is drawn as a
marker at a cap just past the worst finite value, with the real value in its hover text; a missing value is a
``None`` gap.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..compare.floor import FLOOR_MARGIN_DB
from ..core.metric_info import HIGHER_IS_BETTER, LOG_METRICS, METRIC_INFO, unit_of
from . import esc, fit_title, short_label

#: where an exact match (SQNR = inf dB) is drawn
SQNR_EXACT_DB = 200.0
OK_COLOR, BAD_COLOR, FIRST_COLOR, REF_COLOR, CAND_COLOR = "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd"
DIP_COLOR, FLOOR_COLOR, AT_FLOOR_COLOR, OUTPUT_COLOR, HARMLESS_COLOR = ("#ff9896", "#7f7f7f", "#17becf", "#222222",
                                                                       "#c7c7c7")
#: from this many layers on, the curve gets a range slider to zoom with
ZOOM_LAYERS = 500
#: at most this many x-axis ticks on the per-layer curve (their labels never pile up)
CURVE_TICKS = 12
#: the curve's range slider: transparent, with a neutral border, so it reads in light and dark themes alike
RANGESLIDER = {"visible": True, "thickness": 0.08, "bgcolor": "rgba(0,0,0,0)", "bordercolor": "rgba(127,127,127,0.6)",
               "borderwidth": 1}
#: the floor band's fill: errors inside it are within FLOOR_MARGIN_DB of what holding the values costs
FLOOR_FILL = "rgba(127,127,127,0.18)"


def _metric(result, metric: str | None) -> str:
    return metric or result.criterion.metric


def _value(value: Any) -> float | None:
    """A metric value as a float (inf/NaN kept), None when missing or not a number."""
    if value is None or isinstance(value, (str, bool)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _shown(value: Any, metric: str) -> float | None:
    """A plottable finite float, or None: +inf SQNR -> SQNR_EXACT_DB; other inf/NaN and missing -> None."""
    v = _value(value)
    if v is None or math.isnan(v):
        return None
    if math.isinf(v):
        return SQNR_EXACT_DB if metric == "sqnr_db" and v > 0 else None
    return v


def _unit(metric: str) -> str:
    u = unit_of(metric)
    return f" {u}" if u else ""


def _axis_title(metric: str) -> str:
    info = METRIC_INFO.get(metric)
    if info is None:
        return metric
    return f"{metric} ({info.label}" + (f", {info.unit})" if info.unit else ")")


def _label(value: Any, metric: str) -> str:
    v = _value(value)
    if v is None:
        return "-"
    if math.isinf(v) and metric == "sqnr_db" and v > 0:
        return "exact (inf dB)"
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return f"{v:.4g}" + _unit(metric)


def _threshold(result, metric: str) -> float | None:
    return result.criterion.threshold if result.criterion.metric == metric else None


def _log_axis(metric: str, values: list[float | None]) -> bool:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return metric in LOG_METRICS and bool(finite) and min(finite) > 0


def _bad_cap(metric: str, values: list[float | None], threshold: float | None, log: bool) -> float:
    """Where a non-finite metric is drawn: a little worse than the worst finite value (and the tolerance)."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v != SQNR_EXACT_DB]
    if threshold is not None:
        finite.append(threshold)
    if not finite:
        return 0.0
    lo, hi = min(finite), max(finite)
    if metric in HIGHER_IS_BETTER:
        pad = max(0.15 * (hi - lo), 10.0 if metric == "sqnr_db" else 0.05 * max(abs(lo), 1e-3))
        return lo - pad
    if log and hi > 0:
        return hi * 10.0
    return hi + max(0.15 * (hi - lo), 0.1 * abs(hi), 1e-6)


def _plotted(value: Any, metric: str, cap: float, log: bool, exact: bool = True) -> tuple[float | None, bool]:
    """(y, capped): the value as drawn. inf/NaN (and -inf dB) go to ``cap``; +inf dB to SQNR_EXACT_DB when
    ``exact`` (the tensor matches), else to ``cap`` too (e.g. finite values equal, inf/NaN where the other is not)."""
    v = _value(value)
    if v is None or not math.isfinite(v):
        if v is not None and math.isinf(v) and v > 0 and metric == "sqnr_db" and exact:
            return SQNR_EXACT_DB, False
        return cap, True
    if log and v <= 0:
        return None, False  # an exact 0 on a log axis: left out (the hover of other points still reads)
    return v, False


def _floor_edge(metric: str, floor: float) -> float | None:
    """The far edge of the floor band: an error FLOOR_MARGIN_DB (noise power) worse than ``floor``."""
    if not math.isfinite(floor):
        return None
    if metric == "sqnr_db":
        return floor - FLOOR_MARGIN_DB
    if metric == "cosine":
        return 1.0 - (1.0 - floor) * 10 ** (FLOOR_MARGIN_DB / 10)
    return floor * 10 ** (FLOOR_MARGIN_DB / 20)


def _state(result, t) -> str:
    outputs = set(result.outputs)
    if t.diverged:
        text = "DIVERGED" if result.diverged else "internal dip (under the criterion; the outputs pass)"
    elif t.at_floor:
        fmt = str((t.floor or {}).get("format", "")).upper()
        text = f"at its {fmt} floor (the format cannot hold the values; not diverged)"
    else:
        text = "ok"
    return text + (" · graph output" if t.tensor in outputs else "")


def _precision_text(result) -> str:
    prec = getattr(result, "precision", None) or {}
    ref, cand = (prec.get(s, {}).get("precision") for s in ("reference", "candidate"))
    return f" ({ref} vs {cand})" if ref and cand else ""


def layer_error_curve(result, metric: str | None = None, label_worst: int = 3, bands: Any = None) -> go.Figure:
    """``metric`` per compared tensor over the reference's topological order, with:

    - the precision floor per format (the error of the reference merely held in the candidate's FP16/BF16/INT8
      format) as a line and a shaded band ``FLOOR_MARGIN_DB`` deep (errors in it are "at the floor");
    - the criterion's tolerance as a dashed line;
    - diverged tensors (red rings), internal dips when the outputs pass (pink rings), tensors at their floor
      (cyan diamonds), graph outputs (black squares), inf/NaN mismatches (x), and the first divergent tensor
      (star) only when the run diverged;
    - layer names written on the curve: the first divergent layer and the ``label_worst`` worst others;
    - from :data:`ZOOM_LAYERS` layers on, a transparent range slider under the axis (a zoom is kept across
      redraws); the legend is a column right of the plot, where neither the slider nor the title meets it;
    - an x axis that ends at the first and last layer (autorange bounded), with at most :data:`CURVE_TICKS` ticks;
    - inf/NaN metric values drawn at a cap just past the worst finite value (hover says so), never as gaps;
    - with ``bands`` (:class:`~workbench.plots.thresholds.Bands` of ``metric``: the user's colour thresholds) the
      good / marginal / bad ranges shaded behind the curve, each point coloured by its band and the legend stating
      the thresholds.
    """
    m = _metric(result, metric)
    tensors = sorted(result.tensors, key=lambda t: t.topo_index)
    threshold = _threshold(result, m)
    raw = [_shown(t.metrics.get(m), m) for t in tensors]
    log = _log_axis(m, raw)
    cap = _bad_cap(m, raw + [_shown((t.floor or {}).get(m), m) for t in tensors], threshold, log)
    # only an exact match sits on the SQNR_EXACT_DB line; a diverged tensor with +inf dB is drawn with the bad ones
    exact = [not t.diverged and not (t.metrics.get("nonfinite_mismatch") or 0) for t in tensors]
    drawn = [_plotted(t.metrics.get(m), m, cap, log, ok) for t, ok in zip(tensors, exact)]
    x = [t.topo_index for t in tensors]
    y = [d[0] for d in drawn]
    capped = [d[1] for d in drawn]
    custom = []
    for t, is_capped in zip(tensors, capped):
        floor = t.floor or {}
        v = _value(t.metrics.get(m))
        value = ("inf dB on the finite values, but not a match" if is_capped and v == math.inf
                 else _label(t.metrics.get(m), m)) + (" (drawn at the cap)" if is_capped else "")
        floor_text = f"{str(floor.get('format', '')).upper()} floor {_label(floor.get(m), m)}" if t.floor else \
            "no floor (held in float32 or wider)"
        custom.append([t.tensor, t.node, t.op_type, value, t.metrics.get("nonfinite_mismatch") or 0, floor_text,
                       _state(result, t), esc(t.tensor), esc(t.node), esc(t.op_type)])
    # the raw names (0-2) are what a click reads; their escaped copies (7-9) are what the hover shows
    hover = ("#%{x} %{customdata[8]} (%{customdata[9]})<br>tensor %{customdata[7]}<br>" + m
             + " %{customdata[3]}<br>%{customdata[5]}<br>non-finite mismatches %{customdata[4]}"
               "<br>%{customdata[6]}<extra></extra>")
    fig = go.Figure()
    banded = bands is not None and bands.metric == m
    colors = [_point_color(bands, t.metrics.get(m), c) for t, c in zip(tensors, capped)] if banded else OK_COLOR
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=m, customdata=custom, hovertemplate=hover,
                             line={"color": OK_COLOR, "width": 1.5}, marker={"size": 6, "color": colors}))
    if banded:
        add_bands(fig, bands, [v for v in y if v is not None], "y", log)
    _add_floor_band(fig, tensors, m, x, custom, log)

    def marks(indices: list[int], name: str, marker: dict) -> None:
        if indices:
            fig.add_trace(go.Scatter(x=[x[i] for i in indices], y=[y[i] for i in indices], mode="markers", name=name,
                                     customdata=[custom[i] for i in indices], hovertemplate=hover, marker=marker))

    bad = [i for i, t in enumerate(tensors) if t.diverged]
    if result.diverged:
        marks(bad, "diverged", {"size": 9, "color": BAD_COLOR, "symbol": "circle-open", "line": {"width": 2}})
    else:
        marks(bad, "internal dip (outputs pass)", {"size": 9, "color": DIP_COLOR, "symbol": "circle-open",
                                                   "line": {"width": 2}})
    formats = sorted({str((t.floor or {}).get("format", "")).upper() for t in tensors if t.at_floor})
    marks([i for i, t in enumerate(tensors) if t.at_floor], f"at its {'/'.join(formats)} floor (not diverged)",
          {"size": 10, "color": AT_FLOOR_COLOR, "symbol": "diamond-open", "line": {"width": 2}})
    outputs = set(result.outputs)
    marks([i for i, t in enumerate(tensors) if t.tensor in outputs], "graph output",
          {"size": 14, "color": "rgba(0,0,0,0)", "symbol": "square-open", "line": {"width": 2, "color": OUTPUT_COLOR}})
    # diverged by inf/NaN where the reference is finite, whatever the metric says
    marks([i for i, t in enumerate(tensors) if (t.metrics.get("nonfinite_mismatch") or 0) > 0], "inf/NaN mismatch",
          {"size": 8, "color": BAD_COLOR, "symbol": "x"})
    marks([i for i, c in enumerate(capped) if c], f"{m} inf/NaN (drawn at the cap)",
          {"size": 9, "color": BAD_COLOR, "symbol": "triangle-down-open", "line": {"width": 2}})
    if threshold is not None:
        fig.add_hline(y=threshold, line={"color": BAD_COLOR, "dash": "dash", "width": 1},
                      annotation_text=f"tolerance: {esc(result.criterion.describe())}",
                      annotation_position="top left")
    first = result.first_divergent  # None unless an output diverged
    if first is not None:
        i = next(k for k, t in enumerate(tensors) if t.tensor == first.tensor)
        fig.add_trace(go.Scatter(x=[x[i]], y=[y[i]], mode="markers", name="first divergent",
                                 marker={"size": 16, "color": FIRST_COLOR, "symbol": "star"},
                                 customdata=[custom[i]], hovertemplate=hover))
        fig.add_annotation(x=x[i], y=math.log10(y[i]) if log and y[i] else (y[i] if y[i] is not None else 0),
                           text=f"first divergent: {esc(first.node)}", showarrow=True, arrowhead=2, ax=40, ay=-40)
    _label_worst(fig, tensors, m, x, y, log, skip=first.tensor if first is not None else None, count=label_worst)
    notes = []
    if any(capped):
        notes.append(f"inf/NaN values drawn at {_label(cap, m)}")
    if m == "sqnr_db" and any(v == SQNR_EXACT_DB for v in y):
        notes.append(f"exact matches drawn at {SQNR_EXACT_DB:g} dB")
    if notes:
        # inside the plot's top-right corner
        fig.add_annotation(xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="top", showarrow=False,
                           text="; ".join(notes), name="curve notes")
    verdict = "DIVERGED" if result.diverged else "ok"
    fig.update_layout(title=esc(f"{m} per layer: {result.reference} (reference) vs {result.candidate} (candidate)"
                                f"{_precision_text(result)}: {verdict}"),
                      xaxis_title="topological index", yaxis_title=_axis_title(m).replace(" (", "<br>(", 1),
                      hovermode="closest", template="plotly_white", legend=CURVE_LEGEND)
    if log:
        fig.update_yaxes(type="log")
    fig.update_layout(uirevision="layer-error-curve")  # a zoom survives redraws of the selection ring
    # the axis ends at the first and last layer: plotly's autorange also makes room for the layer names written
    # on the curve, which ran it hundreds of layers past the last one; ticks are thinned so they never pile up
    if x:
        pad = max(1.0, 0.01 * (max(x) - min(x)))
        span = [min(x) - pad, max(x) + pad]
        fig.update_xaxes(autorangeoptions={"minallowed": span[0], "maxallowed": span[1]}, nticks=CURVE_TICKS,
                         automargin=True)
    if len(tensors) >= ZOOM_LAYERS:  # too many layers to read at once: a range slider under the axis
        fig.update_xaxes(rangeslider={**RANGESLIDER, "range": span, "autorange": False})
    # the legend is a column right of the plot (below it, its rows climbed onto the axis title and tick labels,
    # and a range slider would cover it; above it, they covered the title)
    return fit_title(fig)


#: how opaque the colour bands are behind a plot
BAND_OPACITY = 0.12


def _point_color(bands: Any, value: Any, capped: bool) -> str:
    from .thresholds import BAD, band_color

    band = BAD if capped else bands.classify(value)
    return band_color(band) or OK_COLOR


def band_spans(bands: Any, values: list[float], log: bool = False) -> list[tuple[int, float, float]]:
    """(band, start, end) ranges covering the ``values`` and both thresholds, low to high (pure)."""
    from .thresholds import BAD, GOOD, MARGINAL

    pts = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    pts += [v for v in (bands.good, bands.bad) if v > 0 or not log]
    if not pts:
        return []
    lo, hi = min(pts), max(pts)
    if log:
        lo, hi = lo / 3.0, hi * 3.0
    else:
        pad = max(0.05 * (hi - lo), 1e-6 if bands.metric == "cosine" else 1.0)
        lo, hi = lo - pad, hi + pad
    if bands.higher_is_better:
        spans = [(BAD, lo, bands.bad), (MARGINAL, bands.bad, bands.good), (GOOD, bands.good, hi)]
    else:
        spans = [(GOOD, lo, bands.good), (MARGINAL, bands.good, bands.bad), (BAD, bands.bad, hi)]
    return [(b, max(a, lo), min(c, hi)) for b, a, c in spans if min(c, hi) > max(a, lo)]


def add_bands(fig: go.Figure, bands: Any, values: list[float], axis: str, log: bool, legend: bool = True) -> None:
    """Shade ``bands``' good / marginal / bad ranges behind the plot along ``axis`` ("x" or "y"), with a legend
    entry per band stating its threshold (``legend``; else the caller states them)."""
    from .thresholds import BAND_STYLE

    for band, start, end in band_spans(bands, values, log):
        color = BAND_STYLE[band][0]
        if axis == "y":
            fig.add_hrect(y0=start, y1=end, fillcolor=color, opacity=BAND_OPACITY, line_width=0, layer="below")
        else:
            fig.add_vrect(x0=start, x1=end, fillcolor=color, opacity=BAND_OPACITY, line_width=0, layer="below")
    for label, color in bands.legend() if legend else ():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=esc(label), legendgroup="bands",
                                 hoverinfo="skip", marker={"symbol": "square", "size": 12, "color": color}))


def _badness(t, m: str) -> float:
    """How bad a tensor's ``m`` is, larger worse (inf/NaN mismatches worst of all); -inf for an exact match."""
    if (t.metrics.get("nonfinite_mismatch") or 0) > 0:
        return math.inf
    v = _value(t.metrics.get(m))
    if v is None:
        return -math.inf
    if math.isnan(v):
        return math.inf
    return -v if m in HIGHER_IS_BETTER else v


def _label_worst(fig: go.Figure, tensors: list, m: str, x: list, y: list, log: bool, skip: str | None,
                 count: int) -> None:
    """Name the worst ``count`` layers on the curve (the first divergent one, ``skip``, is named already)."""
    if count <= 0:
        return
    index = {t.tensor: i for i, t in enumerate(tensors)}
    ranked = sorted((t for t in tensors if _badness(t, m) > -math.inf), key=lambda t: (-_badness(t, m), t.topo_index))
    chosen: list[tuple[int, Any]] = []
    for t in ranked:
        if len(chosen) >= count:
            break
        i = index[t.tensor]
        if t.tensor == skip or y[i] is None or (m == "sqnr_db" and y[i] == SQNR_EXACT_DB):
            continue
        chosen.append((i, t))
    # the labels stacked down the page in the layers' order, each to the left of its layer: their arrows run side
    # by side instead of crossing when the worst layers are neighbours
    lowest = sorted(range(len(chosen)), key=lambda k: x[chosen[k][0]])
    for rank, k in enumerate(lowest):
        i, t = chosen[k]
        fig.add_annotation(x=x[i], y=math.log10(y[i]) if log and y[i] > 0 else y[i],
                           text=esc(f"worst #{k + 1}: {short_label(t.node, 32)}"), name="worst layer",
                           showarrow=True, arrowhead=1, ax=-30, ay=28 + 16 * rank, font={"size": 10},
                           xanchor="right")


def _add_floor_band(fig: go.Figure, tensors: list, m: str, x: list, custom: list, log: bool) -> None:
    """One floor line per number format, shaded down (worse) by FLOOR_MARGIN_DB: the at-the-floor zone."""
    formats: list[str] = []
    for t in tensors:
        name = (t.floor or {}).get("format")
        if name and name not in formats:
            formats.append(name)
    for name in formats:
        floor_y, edge_y = [], []
        for t in tensors:
            f = _shown((t.floor or {}).get(m), m) if (t.floor or {}).get("format") == name else None
            if f is not None and log and f <= 0:
                f = None
            edge = None if f is None else _floor_edge(m, f)
            if edge is not None and log and edge <= 0:
                edge = None
            floor_y.append(f)
            edge_y.append(edge if f is not None else None)
        if all(v is None for v in floor_y):
            continue
        label = name.upper()
        fig.add_trace(go.Scatter(x=x, y=edge_y, mode="lines", line={"width": 0, "color": FLOOR_COLOR},
                                 hoverinfo="skip", showlegend=False, legendgroup=f"floor-{name}",
                                 name=f"{label} floor band edge"))
        fig.add_trace(go.Scatter(
            x=x, y=floor_y, mode="lines", name=f"{label} floor (reference held in {label})", fill="tonexty",
            fillcolor=FLOOR_FILL, legendgroup=f"floor-{name}", line={"color": FLOOR_COLOR, "width": 1, "dash": "dot"},
            customdata=custom, hovertemplate="#%{x} %{customdata[8]}<br>" + f"{label} floor: {m} " + "%{y:.4g}"
            + _unit(m) + f"<br>(shaded: within {FLOOR_MARGIN_DB:g} dB of the floor)<extra></extra>"))


def metric_histogram(result, metric: str | None = None, bins: int = 40, bands: Any = None) -> go.Figure:
    """Distribution of the per-tensor ``metric`` (within tolerance, at the floor and diverged stacked), with the
    tolerance marked (and ``bands``, the user's colour thresholds of ``metric``, shaded behind, the legend stating
    them). Tensors whose metric is inf/NaN cannot be binned: the title counts them."""
    m = _metric(result, metric)
    groups = (("ok", OK_COLOR, "within tolerance"), ("floor", AT_FLOOR_COLOR, "at its floor (not diverged)"),
              ("bad", BAD_COLOR, "diverged" if result.diverged else "internal dip (outputs pass)"))
    values: dict[str, list[float]] = {key: [] for key, _, _ in groups}
    unbinned = 0
    for t in result.tensors:
        v = _shown(t.metrics.get(m), m)
        if v is None:
            unbinned += 1
            continue
        values["bad" if t.diverged else "floor" if t.at_floor else "ok"].append(v)
    every = [v for key in values for v in values[key]]
    log = _log_axis(m, every)
    fig = go.Figure()
    if every:
        data = np.log10(every) if log else np.asarray(every)
        edges = np.histogram_bin_edges(data, bins=min(bins, max(1, len(every))))
        centers = (edges[:-1] + edges[1:]) / 2
        width = float(edges[1] - edges[0]) if len(edges) > 1 else 1.0
        for key, color, name in groups:
            if not values[key]:
                continue
            d = np.log10(values[key]) if log else np.asarray(values[key])
            counts, _ = np.histogram(d, bins=edges)
            xs = 10 ** centers if log else centers
            fig.add_trace(go.Bar(x=xs.tolist(), y=counts.tolist(), name=name, marker_color=color,
                                 width=None if log else width * 0.95))
    threshold = _threshold(result, m)
    if bands is not None and bands.metric == m:
        add_bands(fig, bands, every, "x", log)
    if threshold is not None:
        fig.add_vline(x=threshold, line={"color": BAD_COLOR, "dash": "dash"}, annotation_text="tolerance")
    left_out = f"; {unbinned} with an inf/NaN {m} not binned" if unbinned else ""
    fig.update_layout(title=f"distribution of per-tensor {m} ({len(result.tensors)} tensors{left_out})",
                      barmode="stack", xaxis_title=_axis_title(m),
                      yaxis_title="tensors", template="plotly_white")
    if log:
        fig.update_xaxes(type="log")
    return fit_title(fig)


def _gain_text(c) -> str:
    """What fixing culprit ``c`` does to the outputs, as measured (see :attr:`Culprit.impact`)."""
    impact = c.impact
    if not impact:
        return "impact not measured"
    from ..compare.explain import impact_sentence  # the CLI's and the Compare panel's sentence

    per = ", ".join(f"{esc(o)} {_label(g, 'sqnr_db')}" for o, g in (impact.get("gain") or {}).items())
    said = esc(impact_sentence(impact) or "impact not measured")
    return ("HARMLESS: " if impact.get("harmless") else "") + said + (f" ({per})" if per else "")


#: the culprit chart's legend: one horizontal row above the plot (below it, it sat on the x-axis title)
CULPRIT_LEGEND = {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}
#: the per-layer curve's legend: a column right of the plot (plotly widens the right margin for it). Above the
#: plot, INT8's colour bands and the floor made 4-5 rows (a legend group stacks its entries) that covered the title
CURVE_LEGEND = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"}
#: the top margin added for it (up to two rows of entries when the figure is narrow)
LEGEND_ROOM = 48


def culprit_bars(result, metric: str | None = None, bands: Any = None) -> go.Figure:
    """Per culprit (harmful first, harmless last): the error it introduces alone vs the error its inputs already
    carried, its output's precision floor (a tick), and in the hover what fixing it gains on the outputs.
    Harmless culprits (fixing them gains almost nothing) are labelled "(harmless)" and drawn pale. ``bands`` (the
    colour thresholds of ``metric``) are shaded behind, the title stating them."""
    m = _metric(result, metric)
    culprits = list(result.culprits)
    # tick labels: long node names shortened in the middle (numbered, so distinct); the hover names them in full
    names = [esc(f"{i}. {short_label(c.node)} ({c.op_type})" + (" (harmless)" if c.harmless else ""))
             for i, c in enumerate(culprits, 1)]
    full = [esc(f"{c.node} ({c.op_type})") for c in culprits]
    every = [_shown(getattr(c, key).get(m), m) for c in culprits for key in ("introduced", "received")]
    cap = _bad_cap(m, every, _threshold(result, m), False)
    gains = [_gain_text(c) for c in culprits]
    floors = [(f"{str(c.floor.get('format', '')).upper()} floor {_label(c.floor.get(m), m)}" if c.floor else
               "no floor (float32 or wider)")
              + (f"; the error beyond it: {_label(c.beyond_floor, m)}" if c.beyond_floor is not None else "")
              for c in culprits]
    fig = go.Figure()
    shown: list[float] = []  # every bar's drawn value (the bands span them)
    for key, label in (("introduced", "introduced (node alone, reference inputs)"),
                       ("received", "received (worst input)")):
        drawn = [_plotted(getattr(c, key).get(m), m, cap, False) for c in culprits]
        vals = [d[0] for d in drawn]
        shown += [v for v in vals if v is not None]
        text = [_label(getattr(c, key).get(m), m) + (" (at the cap)" if d[1] else "") for c, d in zip(culprits, drawn)]
        if key == "introduced":
            colors = [HARMLESS_COLOR if c.harmless else BAD_COLOR for c in culprits]
        else:
            colors = [OK_COLOR] * len(culprits)
        custom = [[t, f, g, c.introduced.get("nonfinite_mismatch") or 0, n]
                  for t, f, g, c, n in zip(text, floors, gains, culprits, full)]
        fig.add_trace(go.Bar(y=names, x=vals, orientation="h", name=label, marker_color=colors, text=text,
                             textposition="auto", customdata=custom,
                             hovertemplate="%{customdata[4]}<br>" + label + ": %{customdata[0]}<br>%{customdata[1]}"
                             "<br>non-finite introduced: %{customdata[3]}<br>%{customdata[2]}<extra></extra>"))
    floor_x = [_shown((c.floor or {}).get(m), m) for c in culprits]
    if any(v is not None for v in floor_x):
        fig.add_trace(go.Scatter(y=names, x=floor_x, mode="markers", name="its output's precision floor",
                                 marker={"symbol": "line-ns-open", "size": 22, "color": FLOOR_COLOR,
                                         "line": {"width": 3, "color": FLOOR_COLOR}},
                                 customdata=[[f, g, n] for f, g, n in zip(floors, gains, full)],
                                 hovertemplate="%{customdata[2]}<br>%{customdata[0]}<br>%{customdata[1]}"
                                               "<extra></extra>"))
    banded = bands is not None and bands.metric == m
    if banded:
        add_bands(fig, bands, shown, "x", False, legend=False)
    threshold = _threshold(result, m)
    if threshold is not None:
        fig.add_vline(x=threshold, line={"color": BAD_COLOR, "dash": "dash", "width": 1},
                      annotation_text="tolerance", annotation_position="bottom right")  # the legend is on top
    better = "higher is better" if m in HIGHER_IS_BETTER else "lower is better"
    harmless = sum(c.harmless for c in culprits)
    # the bands are stated in the title: three more legend entries would crowd the legend above a short chart
    shaded = ("; shaded: " + ", ".join(esc(label) for label, _ in bands.legend())) if banded else ""
    fig.update_layout(title=f"culprits: {m} each node introduces vs receives ({better}); harmful first"
                            + (f", {harmless} harmless" if harmless else "") + shaded, barmode="group",
                      xaxis_title=_axis_title(m), template="plotly_white",
                      yaxis={"autorange": "reversed"}, height=max(300, 120 + 60 * len(culprits)),
                      legend=CULPRIT_LEGEND)
    fit_title(fig)  # the title's lines set the top margin; the legend's rows go below them, above the plot
    fig.update_layout(margin={"t": fig.layout.margin.t + LEGEND_ROOM})
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
        try:
            edges = np.histogram_bin_edges(both, bins=bins)
        except ValueError:  # (almost) constant values: one bin
            edges = np.histogram_bin_edges(both, bins=1)
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
            try:
                counts, edges = np.histogram(err, bins=bins)
            except ValueError:  # an (almost) constant error: too narrow a range for that many bins
                counts, edges = np.histogram(err, bins=1)
            fig.add_trace(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, name="error", marker_color=BAD_COLOR),
                          row=1, col=2)
    note = f"non-finite: reference {r_bad}, candidate {c_bad}" if r_bad or c_bad else ""
    fig.update_layout(title=esc(f"{name}: value distributions" + (f" ({note})" if note else "")), barmode="overlay",
                      template="plotly_white", bargap=0)
    scale = "log" if r.size > 1000 else "linear"  # long tails show on a log count axis
    fig.update_yaxes(title_text="count", type=scale, row=1, col=1)
    fig.update_yaxes(type=scale, row=1, col=2)
    return fit_title(fig)


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
    fig.update_layout(title=esc(f"{name + ': ' if name else ''}candidate vs reference ({shown})"),
                      xaxis_title="reference", yaxis_title="candidate", template="plotly_white")
    return fit_title(fig)


def channel_error_heatmap(ref: np.ndarray, cand: np.ndarray, axis: int = 1, max_cols: int = 128,
                          name: str = "") -> go.Figure:
    """Mean |candidate - reference| per channel (rows, along ``axis``) and position (the other axes flattened,
    averaged into at most ``max_cols`` columns): shows whether the error sits in a few channels."""
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64).reshape(r.shape) if np.size(cand) == r.size else None
    fig = go.Figure()
    if c is None or r.size == 0:
        fig.update_layout(title=esc(f"{name}: shapes differ, no per-channel view"))
        return fit_title(fig)
    if r.ndim < 2:
        r, c, axis = r.reshape(1, -1), c.reshape(1, -1), 0
    past = "" if -r.ndim <= axis < r.ndim else f"; axis {axis} is past its {r.ndim} dimensions"
    axis = axis % r.ndim if not past else 1  # an axis past the rank is said, not wrapped around
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
    fig.update_layout(title=esc(f"{name + ': ' if name else ''}mean |error| per channel (axis {axis}) and position"
                                f"{past}"),
                      xaxis_title=f"position (other axes flattened, {cols} groups)", yaxis_title="channel",
                      template="plotly_white")
    return fit_title(fig)


def image_channels(shape: tuple) -> int | None:
    """How many channels a tensor of ``shape`` has when it is image-like (NCHW, CHW or HW with both spatial
    dimensions above 1), else None."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 4 and shape[2] > 1 and shape[3] > 1:
        return shape[1]
    if len(shape) == 3 and shape[1] > 1 and shape[2] > 1:
        return shape[0]
    if len(shape) == 2 and shape[0] > 1 and shape[1] > 1:
        return 1
    return None


def _plane(a: np.ndarray, channel: int, batch: int) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim == 4:
        return a[min(batch, a.shape[0] - 1), channel % a.shape[1]]
    if a.ndim == 3:
        return a[channel % a.shape[0]]
    return a


def _thin(a: np.ndarray, max_side: int) -> np.ndarray:
    """Every k-th row/column so no side exceeds ``max_side`` (a figure holds at most max_side**2 cells)."""
    steps = [max(1, -(-n // max_side)) for n in a.shape]
    return a[tuple(slice(None, None, k) for k in steps)]


def _cells(a: np.ndarray) -> list:
    """A 2-D array as JSON-safe rows (inf/NaN become None gaps)."""
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isfinite(a), a, None).tolist()


def tensor_side_by_side(ref: np.ndarray, cand: np.ndarray, name: str = "", *, channel: int = 0, batch: int = 0,
                        max_side: int = 256, max_points: int = 4000) -> go.Figure:
    """The reference, the candidate and their difference (candidate - reference) side by side. An image-like
    tensor (see :func:`image_channels`) shows one ``channel`` (of batch item ``batch``) as three images, the
    reference and candidate on one colour scale, the difference on a diverging one; any other tensor shows its
    flattened values (every k-th element, at most ``max_points``)."""
    from plotly.subplots import make_subplots

    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    same = r.shape == c.shape
    fig = make_subplots(rows=1, cols=3, subplot_titles=("reference", "candidate", "difference (cand - ref)"),
                        horizontal_spacing=0.1)
    channels = image_channels(r.shape) if same else None
    label = f"{name}: " if name else ""
    if channels is not None:
        channel = int(channel) % channels
        rp, cp = _thin(_plane(r, channel, batch), max_side), _thin(_plane(c, channel, batch), max_side)
        with np.errstate(invalid="ignore", over="ignore"):
            dp = cp - rp
        both = np.concatenate([rp[np.isfinite(rp)], cp[np.isfinite(cp)]])
        lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
        finite_d = np.abs(dp[np.isfinite(dp)])
        span = float(finite_d.max()) if finite_d.size and finite_d.max() > 0 else 1.0
        hover = "row %{y}, column %{x}<br>%{z:.5g}<extra></extra>"
        fig.add_trace(go.Heatmap(z=_cells(rp), zmin=lo, zmax=hi, colorscale="Viridis", showscale=False,
                                 name="reference", hovertemplate=hover), row=1, col=1)
        fig.add_trace(go.Heatmap(z=_cells(cp), zmin=lo, zmax=hi, colorscale="Viridis", name="candidate",
                                 colorbar={"x": 0.645, "len": 0.9, "thickness": 10}, hovertemplate=hover), row=1, col=2)
        fig.add_trace(go.Heatmap(z=_cells(dp), zmin=-span, zmax=span, colorscale="RdBu", reversescale=True,
                                 name="difference", colorbar={"x": 1.0, "len": 0.9, "thickness": 10},
                                 hovertemplate=hover), row=1, col=3)
        for col in (1, 2, 3):
            fig.update_yaxes(autorange="reversed", scaleanchor=f"x{'' if col == 1 else col}", row=1, col=col)
        full = _plane(r, channel, batch).shape
        thinned = "" if rp.shape == full else f", shown {rp.shape[0]}x{rp.shape[1]} of {full[0]}x{full[1]}"
        title = f"{label}channel {channel} of {channels}" + (f", batch item {batch}" if r.ndim == 4 else "") + thinned
    else:
        rf, cf = r.ravel(), c.ravel()
        n = min(rf.size, cf.size)
        step = max(1, -(-n // max_points))
        idx = np.arange(0, n, step)
        with np.errstate(invalid="ignore", over="ignore"):
            d = cf[idx] - rf[idx]
        for col, (vals, color, what) in enumerate(((rf[idx], REF_COLOR, "reference"), (cf[idx], CAND_COLOR,
                                                                                        "candidate"),
                                                   (d, BAD_COLOR, "difference")), 1):
            fig.add_trace(go.Scatter(x=idx.tolist(), y=np.where(np.isfinite(vals), vals, None).tolist(),
                                     mode="lines", name=what, line={"color": color, "width": 1},
                                     hovertemplate="element %{x}<br>%{y:.5g}<extra></extra>"), row=1, col=col)
            fig.update_xaxes(title_text="element (flattened)", row=1, col=col)
        shapes = f"shape {list(r.shape)}" if same else f"shapes differ: {list(r.shape)} vs {list(c.shape)}"
        title = f"{label}values, {shapes}" + (f", every {step}th element" if step > 1 else "")
    fig.update_layout(title=esc(title), template="plotly_white", showlegend=False, height=360)
    return fit_title(fig)
