"""Quantization error per tensor and method, from the histograms alone, and tensors ranked by sensitivity.

Three views of one tensor quantized with one amax (convention and error model: see fakequant.py):

- ``sqnr_db``: 10 log10(sum x^2 / sum (x' - x)^2) over every finite value: rounding AND clipping. Large values
  dominate it, so a few outliers make it look fine while every ordinary value is crushed to zero.
- ``bulk_sqnr_db``: the same over the bulk only, the values with |x| up to the bin where the |x| histogram
  reaches its 99.9th percentile: what ordinary values keep. Clipping a rare outlier does not show here.
- ``clipped_fraction``: the fraction of values with |x| > amax.

``worst_sqnr_db`` = min(sqnr_db, bulk_sqnr_db) catches both failure modes (max calibration crushing the bulk,
percentile/entropy clipping values that carry energy); sensitivity ranks tensors by it, worst first, ties in
topological order. Whether a loss matters for the model's outputs is what the sweep (sweep.py) measures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..core.floats import decode_float, encode_float
from .fakequant import HistogramErrorModel
from .histogram import TensorHistogram

#: the bulk: values up to the bin where the |x| histogram reaches this percentile
BULK_PERCENTILE = 99.9


@dataclass
class QuantError:
    """Fake-quant error of one tensor under one amax."""

    amax: float
    sqnr_db: float
    bulk_sqnr_db: float
    clipped_fraction: float

    @property
    def worst_sqnr_db(self) -> float:
        return min(self.sqnr_db, self.bulk_sqnr_db)

    def to_json(self) -> dict:
        return {k: encode_float(v) for k, v in asdict(self).items()} | {
            "worst_sqnr_db": encode_float(self.worst_sqnr_db)}

    @classmethod
    def from_json(cls, d: dict) -> QuantError:
        return cls(*(float(decode_float(d[k])) for k in ("amax", "sqnr_db", "bulk_sqnr_db", "clipped_fraction")))


@dataclass
class SensitivityEntry:
    """One tensor in the sensitivity ranking (worst first) under ``method``, and the method that does best."""

    rank: int
    tensor: str
    method: str
    amax: float
    worst_sqnr_db: float
    sqnr_db: float
    bulk_sqnr_db: float
    clipped_fraction: float
    best_method: str
    best_worst_sqnr_db: float

    def to_json(self) -> dict:
        return {k: encode_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> SensitivityEntry:
        v = {k: decode_float(x) for k, x in d.items()}
        return cls(int(v["rank"]), v["tensor"], v["method"], float(v["amax"]), float(v["worst_sqnr_db"]),
                   float(v["sqnr_db"]), float(v["bulk_sqnr_db"]), float(v["clipped_fraction"]), v["best_method"],
                   float(v["best_worst_sqnr_db"]))


def bulk_bound(h: TensorHistogram, percentile: float = BULK_PERCENTILE) -> float:
    """Upper edge of the |x| bin where the cumulative count first reaches ``percentile`` (inf if empty)."""
    if h.count == 0:
        return math.inf
    cum = np.cumsum(h.abs_counts)
    k = int(np.searchsorted(cum, percentile / 100.0 * cum[-1]))
    return min(k + 1, h.num_bins) * h.abs_width


def tensor_errors(h: TensorHistogram, amax: dict[str, float]) -> dict[str, QuantError]:
    """{method: QuantError} for one tensor, from its histogram."""
    model = HistogramErrorModel(h.abs_counts, h.abs_width, h.zeros, h.amax)
    bulk = bulk_bound(h)
    out = {}
    for method, a in amax.items():
        out[method] = QuantError(float(a), model.sqnr_db(a), model.sqnr_db(a, bulk), model.clipped_fraction(a))
    return out


def rank_sensitivity(errors: dict[str, dict[str, QuantError]], method: str, order: list[str]) -> list[SensitivityEntry]:
    """Tensors (in ``order``: topological) ranked by ``worst_sqnr_db`` under ``method``, worst first."""
    position = {t: i for i, t in enumerate(order)}
    rows = []
    for tensor, by_method in errors.items():
        if method not in by_method:
            continue
        e = by_method[method]
        best = max(by_method, key=lambda m: (by_method[m].worst_sqnr_db, m == method))
        rows.append((e.worst_sqnr_db, position.get(tensor, len(order)), tensor, e, best, by_method[best]))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [SensitivityEntry(rank, tensor, method, e.amax, e.worst_sqnr_db, e.sqnr_db, e.bulk_sqnr_db,
                             e.clipped_fraction, best, b.worst_sqnr_db)
            for rank, (_, _, tensor, e, best, b) in enumerate(rows, 1)]
