"""Plots of a repair: pure functions, a :class:`~workbench.repair.result.RepairResult` (or its ``to_json()``
document) in, a plotly ``go.Figure`` out. Nothing here runs an engine.

:func:`repair_outputs_figure` draws each output's metric before the repair (the candidate as converted) and after
it (the repaired model on the candidate engine), with the target's threshold. Like every figure here it is
JSON-compliant: an exact match (SQNR +inf dB) is drawn at :data:`~workbench.plots.compare.SQNR_EXACT_DB`, other
inf/NaN values at a cap past the finite ones with the real value in the hover text.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from ..core.floats import decode_float
from ..core.metric_info import HIGHER_IS_BETTER, unit_of
from . import esc, fit_title
from .compare import BAD_COLOR, OK_COLOR, SQNR_EXACT_DB

BEFORE_COLOR = "#9e9e9e"
#: a failing output before the repair: a lighter, hatched red, so before and after never read as the same bar
BEFORE_BAD_COLOR = "#ef9a9a"


def _doc(result: Any) -> dict:
    return result if isinstance(result, dict) else result.to_json()


def output_metric(doc: dict) -> str | None:
    """The metric the repair judged outputs by (the target's criterion metric), or the first one recorded."""
    from ..compare.criterion import Criterion

    text = (doc.get("target") or {}).get("criterion")
    if text:
        try:
            return Criterion.parse(text).metric
        except Exception:  # noqa: BLE001 - an old or odd document: fall back to what the outputs hold
            pass
    for side in ("before", "after"):
        for metrics in ((doc.get(side) or {}).get("outputs") or {}).values():
            for key in metrics:
                if key not in ("nonfinite_mismatch", "diverged"):
                    return key
    return None


def _number(value: Any) -> float | None:
    value = decode_float(value)
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def repair_rows(result: Any) -> list[dict]:
    """Per output: ``{"output", "metric", "before", "after", "before_failed", "after_failed"}`` (values as
    recorded, inf/NaN as floats; None when missing)."""
    doc = _doc(result)
    metric = output_metric(doc)
    before = (doc.get("before") or {}).get("outputs") or {}
    after = (doc.get("after") or {}).get("outputs") or {}
    rows = []
    for out in list(dict.fromkeys([*before, *after])):
        b, a = before.get(out, {}), after.get(out, {})
        rows.append({"output": out, "metric": metric, "before": _number(b.get(metric)),
                     "after": _number(a.get(metric)), "before_failed": bool(b.get("diverged")),
                     "after_failed": bool(a.get("diverged"))})
    return rows


def _drawn(values: list[float | None], metric: str | None) -> tuple[list[float | None], list[str]]:
    """Plottable values and hover texts: +inf SQNR at SQNR_EXACT_DB, other non-finite at a cap past the rest."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    span = (max(finite) - min(finite)) if len(finite) > 1 else (abs(finite[0]) if finite else 1.0)
    cap_hi = (max(finite) if finite else 0.0) + 0.1 * (span or 1.0)
    cap_lo = (min(finite) if finite else 0.0) - 0.1 * (span or 1.0)
    drawn, texts = [], []
    for v in values:
        if v is None or math.isnan(v):
            drawn.append(None if v is None else cap_lo)
            texts.append("not recorded" if v is None else "nan")
        elif math.isinf(v):
            if metric == "sqnr_db" and v > 0:
                drawn.append(SQNR_EXACT_DB)
                texts.append("inf (exact match)")
            else:
                drawn.append(cap_hi if v > 0 else cap_lo)
                texts.append("inf" if v > 0 else "-inf")
        else:
            drawn.append(v)
            texts.append(f"{v:.4g}")
    return drawn, texts


def repair_outputs_figure(result: Any, height: int = 320) -> go.Figure:
    """Grouped bars per output: the metric before and after the repair, coloured by pass/fail against the target
    criterion, with the criterion's threshold as a dashed line."""
    from ..compare.criterion import Criterion

    doc = _doc(result)
    rows = repair_rows(doc)
    metric = output_metric(doc)
    names = [esc(r["output"]) for r in rows]  # category labels: plotly reads HTML in them
    unit = unit_of(metric) if metric else ""
    fig = go.Figure()
    for side, label in (("before", "before (candidate as converted)"), ("after", "after (repaired model)")):
        drawn, texts = _drawn([r[side] for r in rows], metric)
        if side == "before":
            colors = [BEFORE_BAD_COLOR if r["before_failed"] else BEFORE_COLOR for r in rows]
            marker = {"color": colors, "pattern": {"shape": "/", "fgcolor": "#ffffff", "solidity": 0.3}}
        else:
            marker = {"color": [BAD_COLOR if r["after_failed"] else OK_COLOR for r in rows]}
        fig.add_trace(go.Bar(name=label, x=names, y=drawn, marker=marker, text=texts, textposition="auto",
                             hovertemplate="%{x}<br>" + label + ": %{text}<extra></extra>"))
    criterion = (doc.get("target") or {}).get("criterion")
    if criterion:
        try:
            threshold = Criterion.parse(criterion).threshold
        except Exception:  # noqa: BLE001 - no line rather than no figure
            threshold = None
        if threshold is not None and math.isfinite(threshold):
            better = "above" if metric in HIGHER_IS_BETTER else "below"
            fig.add_hline(y=threshold, line_dash="dash", line_color="#455a64",
                          annotation_text=f"target: {better} {threshold:g}{(' ' + unit) if unit else ''}",
                          annotation_position="top left")
    fig.update_layout(title=f"outputs before and after the repair ({metric or 'metric'})", barmode="group",
                      template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.2},
                      yaxis_title=f"{metric}{f' ({unit})' if unit else ''}" if metric else "")
    return fit_title(fig)
