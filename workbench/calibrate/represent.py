"""Representativeness: do the calibration data look like the evaluation data, tensor by tensor?

Per tensor, from the two sets of histograms (collected the same way):

- ``beyond_fraction``: fraction of evaluation values with |x| > the calibrated amax (uniform within a bin), and
  ``excess_beyond`` = that minus the calibration data's own fraction beyond it (percentile and entropy clip
  some calibration values by design);
- ``range_drift``: evaluation amax / calibration amax, both by the same method (and ``max_ratio`` of max |x|);
- ``js_distance``: Jensen-Shannon distance (base 2, in [0, 1]) between the two |x| histograms on a common grid:
  both are re-binned exactly onto the coarser power-of-two range, then merged 2**k bins at a time until the
  occupied span has at most K bins, K the power of two <= sqrt(n)/2 (n: the smaller value count) in [4, 64];
- ``js_noise``: the JS distance two samples of one distribution would show with these counts and K bins
  (chi-square approximation: JSD ~ (K - 1)(1/n1 + 1/n2) / (8 ln 2) bits).

A tensor is flagged when ``excess_beyond`` > ``beyond_limit`` (1%) and beyond four standard errors of a
two-proportion test, or when ``js_distance`` > ``js_limit`` (0.2) and beyond twice ``js_noise``: few values (a
10-logit output over 4 feeds) do not raise a flag on sampling noise alone. Rows come worst first (flagged
first, then by JS distance). Values within one feed are correlated, so the noise terms are optimistic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core.floats import decode_float, encode_float
from .fakequant import HistogramErrorModel
from .histogram import TensorHistogram, _merge_bins

BEYOND_LIMIT = 0.01
JS_LIMIT = 0.2
JS_MAX_BINS = 64


@dataclass
class Representativeness:
    """Calibration vs evaluation histograms of one tensor."""

    tensor: str
    calib_amax: float
    eval_amax: float
    range_drift: float
    max_ratio: float
    beyond_fraction: float
    calib_beyond_fraction: float
    js_distance: float
    js_noise: float
    flagged: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def excess_beyond(self) -> float:
        return self.beyond_fraction - self.calib_beyond_fraction

    def to_json(self) -> dict:
        return {k: (encode_float(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> Representativeness:
        v = {k: decode_float(x) for k, x in d.items()}
        return cls(v["tensor"], float(v["calib_amax"]), float(v["eval_amax"]), float(v["range_drift"]),
                   float(v["max_ratio"]), float(v["beyond_fraction"]), float(v["calib_beyond_fraction"]),
                   float(v["js_distance"]), float(v.get("js_noise", 0.0)), bool(v["flagged"]),
                   list(v.get("reasons", [])))


def js_distance(a: TensorHistogram, b: TensorHistogram, max_bins: int | None = None) -> tuple[float, float]:
    """(Jensen-Shannon distance (base 2) between the |x| histograms of ``a`` and ``b`` on a common grid of at
    most ``max_bins`` occupied bins (default: from the value counts, see the module docstring), its noise)."""
    if a.count == 0 or b.count == 0:
        return (0.0 if a.count == b.count else 1.0), 0.0
    if max_bins is None:
        max_bins = js_bins(min(a.count, b.count))
    exponent = max(a.exponent, b.exponent)
    p, q = a.regrid(exponent).abs_counts, b.regrid(exponent).abs_counts
    occupied = int(max(np.flatnonzero(p)[-1], np.flatnonzero(q)[-1])) + 1
    k = math.ceil(math.log2(occupied / max_bins)) if occupied > max_bins else 0
    p, q = _merge_bins(p, k, 0).astype(np.float64), _merge_bins(q, k, 0).astype(np.float64)
    bins = int(np.count_nonzero(p + q))
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2
    noise = math.sqrt(max(0, bins - 1) * (1 / a.count + 1 / b.count) / (8 * math.log(2)))
    return float(math.sqrt(max(0.0, (_kl2(p, m) + _kl2(q, m)) / 2))), min(1.0, noise)


def js_bins(n: int) -> int:
    """The power of two <= sqrt(n) / 2, within [4, JS_MAX_BINS]."""
    return min(JS_MAX_BINS, 1 << max(2, int(math.floor(math.log2(max(1.0, math.sqrt(n) / 2))))))


def _kl2(p: np.ndarray, m: np.ndarray) -> float:
    nz = p > 0
    return float(np.sum(p[nz] * np.log2(p[nz] / m[nz])))


def compare_histograms(
    calib: dict[str, TensorHistogram], evaluation: dict[str, TensorHistogram], amax: dict[str, float],
    eval_amax: dict[str, float], *, beyond_limit: float = BEYOND_LIMIT, js_limit: float = JS_LIMIT,
) -> list[Representativeness]:
    """Rows for the tensors in both sets, worst first. ``amax``: the calibrated amax under the chosen rule;
    ``eval_amax``: what the same rule gives on the evaluation data."""
    rows = []
    for name, c in calib.items():
        e = evaluation.get(name)
        if e is None or name not in amax:
            continue
        a = float(amax[name])
        their = float(eval_amax.get(name, 0.0))
        beyond = HistogramErrorModel(e.abs_counts, e.abs_width, e.zeros, e.amax).clipped_fraction(a)
        own = HistogramErrorModel(c.abs_counts, c.abs_width, c.zeros, c.amax).clipped_fraction(a)
        js, noise = js_distance(c, e)
        stderr = 0.0
        if e.count and c.count:
            pooled = (beyond * e.count + own * c.count) / (e.count + c.count)
            stderr = math.sqrt(pooled * (1 - pooled) * (1 / e.count + 1 / c.count))
        reasons = []
        if beyond - own > max(beyond_limit, 4 * stderr):
            reasons.append(f"{beyond:.2%} of evaluation values beyond the calibrated amax {a:.4g} "
                           f"(calibration: {own:.2%})")
        if js > max(js_limit, 2 * noise):
            reasons.append(f"|x| distributions differ (Jensen-Shannon distance {js:.2f} > {js_limit})")
        rows.append(Representativeness(name, a, their, _ratio(their, a), _ratio(e.amax, c.amax), beyond,
                                       own, js, noise, bool(reasons), reasons))
    rows.sort(key=lambda r: (not r.flagged, -r.js_distance, -r.excess_beyond))
    return rows


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 1.0 if num == 0 else math.inf
