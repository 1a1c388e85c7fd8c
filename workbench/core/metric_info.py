"""One descriptor per comparison metric: how it reads (direction, unit, scale) wherever it is shown or judged.

Plots, panels, the HTML report, diff and the criterion read these instead of keeping their own lists: a new
metric is one :class:`MetricInfo` here plus its computation in :mod:`workbench.core.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    """``higher_is_better``: larger values mean closer agreement (a criterion flags values below its threshold).
    ``log_scale``: plot on a log axis. ``tolerance``: a typical threshold to offer when a user picks it."""

    name: str
    label: str
    higher_is_better: bool = False
    unit: str = ""
    log_scale: bool = False
    tolerance: float | None = None
    judged: bool = True  # can be a criterion's metric
    #: the values the metric can take (a criterion's threshold outside them never or always fires)
    bounds: tuple[float, float] = (0.0, float("inf"))


METRIC_INFO: dict[str, MetricInfo] = {m.name: m for m in (
    MetricInfo("max_abs", "max |error|", log_scale=True, tolerance=1e-3),
    MetricInfo("mean_abs", "mean |error|", log_scale=True, tolerance=1e-3),
    MetricInfo("max_rel", "max relative error", log_scale=True, tolerance=1e-2),
    MetricInfo("norm_max_abs", "max |error| / max |ref|", log_scale=True, tolerance=1e-2),
    MetricInfo("norm_mean_abs", "mean |error| / mean |ref|", log_scale=True, tolerance=0.1),
    MetricInfo("cosine", "cosine similarity", higher_is_better=True, tolerance=0.999, bounds=(-1.0, 1.0)),
    MetricInfo("sqnr_db", "SQNR", higher_is_better=True, unit="dB", tolerance=30.0,
               bounds=(float("-inf"), float("inf"))),
    MetricInfo("nonfinite_mismatch", "inf/NaN mismatches", judged=False),
)}

METRICS = tuple(METRIC_INFO)
HIGHER_IS_BETTER = frozenset(m.name for m in METRIC_INFO.values() if m.higher_is_better)
LOG_METRICS = frozenset(m.name for m in METRIC_INFO.values() if m.log_scale)
JUDGED = tuple(m.name for m in METRIC_INFO.values() if m.judged)


def unit_of(metric: str) -> str:
    info = METRIC_INFO.get(metric)
    return info.unit if info else ""
