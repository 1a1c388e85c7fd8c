"""Streaming per-tensor histograms of |x| and x on a canonical power-of-two grid.

Grid: with R = 2**exponent the smallest power of two strictly above every finite |x| seen so far, the |x|
histogram has ``num_bins`` bins of width R/num_bins over [0, R) (bin k holds k*w <= |x| < (k+1)*w, as
TensorRT's) and the signed one ``num_bins`` bins of width 2R/num_bins over [-R, R). When a feed exceeds R,
R doubles as often as needed and each run of 2**k adjacent bins is summed into one bin of the coarser grid.

Why powers of two: widths are powers of two, so ``x / width`` is exact in floating point and a value's bin on
the coarse grid is exactly the merge of its bin on any finer one. The final histogram therefore equals one
histogram of all the data on the final grid: it does not depend on feed order or batching at all. The price is
resolution: max|x| lies in [R/2, R), so between num_bins/2 and num_bins bins cover the data.

Non-finite values (NaN, +-inf: e.g. additive -inf attention masks) are counted in ``nonfinite`` and left out of
everything else. Exact zeros are counted in ``zeros`` too (they also sit in bin 0), so error estimates can treat
them as exact. Memory per tensor is two ``num_bins`` int64 arrays, whatever the number of feeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .exceptions import CalibrationError

#: smallest range exponent: |x| below 2**-100 / num_bins all land in bin 0
MIN_EXPONENT = -100


def check_num_bins(num_bins: int, minimum: int = 2) -> int:
    """``num_bins`` must be a power of two (exact re-binning needs it) of at least ``minimum`` (calibrate() asks
    128: TensorRT's entropy search starts at 128 quantized bins, and ModelOpt's mse reads the same histogram)."""
    n = int(num_bins)
    if n < minimum or n & (n - 1):
        raise CalibrationError(f"num_bins must be a power of two >= {minimum}, got {num_bins}",
                               "use e.g. 2048 (TensorRT's)" + ("; the entropy search starts at 128 bins"
                                                               if minimum >= 128 else ""))
    return n


@dataclass
class TensorHistogram:
    """Histograms of one tensor over all feeds seen. ``exponent`` is None until a finite value arrives."""

    abs_counts: np.ndarray
    signed_counts: np.ndarray
    exponent: int | None = None
    min: float = math.inf
    max: float = -math.inf
    count: int = 0  # finite values (every one is in both histograms)
    nonfinite: int = 0
    zeros: int = 0
    dtype: str | None = field(default=None)

    @classmethod
    def empty(cls, num_bins: int = 2048) -> TensorHistogram:
        n = check_num_bins(num_bins)
        return cls(np.zeros(n, np.int64), np.zeros(n, np.int64))

    @property
    def only_zeros(self) -> bool:
        """Every value seen was 0: no INT8 scale can be read from it."""
        return bool(self.count) and self.zeros == self.count

    @property
    def num_bins(self) -> int:
        return int(self.abs_counts.size)

    @property
    def range(self) -> float:
        """R: the |x| histogram covers [0, R), the signed one [-R, R) (0.0 before any value)."""
        return 0.0 if self.exponent is None else math.ldexp(1.0, self.exponent)

    @property
    def abs_width(self) -> float:
        return self.range / self.num_bins

    @property
    def abs_edges(self) -> np.ndarray:
        return np.linspace(0.0, self.range, self.num_bins + 1)

    @property
    def signed_edges(self) -> np.ndarray:
        return np.linspace(-self.range, self.range, self.num_bins + 1)

    @property
    def amax(self) -> float:
        """max |x| over the finite values seen (0.0 if none)."""
        return max(abs(self.min), abs(self.max)) if self.count else 0.0

    def update(self, values: np.ndarray) -> TensorHistogram:
        """Add one array of values (any shape, a float dtype); returns self."""
        x = np.asarray(values)
        if x.dtype.kind != "f":
            raise CalibrationError(f"cannot histogram a {x.dtype} tensor", "only float tensors are calibrated")
        if self.dtype is None:
            self.dtype = str(x.dtype)
        if x.dtype not in (np.float32, np.float64):  # float16, bfloat16: exact in float32
            x = x.astype(np.float32)
        x = x.reshape(-1)
        if x.size == 0:
            return self
        a = np.abs(x)
        top = float(a.max())  # NaN propagates, so one pass tells whether anything is non-finite
        if not math.isfinite(top):
            keep = np.isfinite(a)
            self.nonfinite += int(x.size - np.count_nonzero(keep))
            x, a = x[keep], a[keep]
            if a.size == 0:
                return self
            top = float(a.max())
        self.count += int(a.size)
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        self.zeros += int(a.size - np.count_nonzero(a))
        self._grow(max(MIN_EXPONENT, math.frexp(top)[1]))  # frexp: top = m * 2**e with m < 1, so top < 2**e
        n = self.num_bins
        scale = a.dtype.type(math.ldexp(n, -self.exponent))  # a power of two: the products below are exact
        np.multiply(a, scale, out=a)  # in [0, n)
        self.abs_counts += np.bincount(a.astype(np.intp), minlength=n)
        del a
        s = x * (scale / 2)  # in (-n/2, n/2)
        np.floor(s, out=s)
        s += n // 2
        self.signed_counts += np.bincount(s.astype(np.intp), minlength=n)
        return self

    def _grow(self, exponent: int) -> None:
        if self.exponent is None:
            self.exponent = exponent
        elif exponent > self.exponent:
            k = exponent - self.exponent
            self.abs_counts = _merge_bins(self.abs_counts, k, 0)
            self.signed_counts = _merge_bins(self.signed_counts, k, self.num_bins // 2)
            self.exponent = exponent

    def regrid(self, exponent: int) -> TensorHistogram:
        """A copy on the coarser grid R = 2**exponent (exact; ``exponent`` >= the current one)."""
        out = self.copy()
        if self.exponent is not None and exponent < self.exponent:
            raise CalibrationError(f"cannot regrid to a finer range 2**{exponent} < 2**{self.exponent}")
        out._grow(exponent)
        return out

    def copy(self) -> TensorHistogram:
        return TensorHistogram(self.abs_counts.copy(), self.signed_counts.copy(), self.exponent, self.min, self.max,
                               self.count, self.nonfinite, self.zeros, self.dtype)

    def merge(self, other: TensorHistogram) -> TensorHistogram:
        """The histogram of both data sets (exact), on the coarser of the two grids."""
        if other.num_bins != self.num_bins:
            raise CalibrationError(f"cannot merge histograms of {self.num_bins} and {other.num_bins} bins")
        exps = [e for e in (self.exponent, other.exponent) if e is not None]
        out = self.copy()
        if not exps:
            out.nonfinite += other.nonfinite
            return out
        out._grow(max(exps))
        theirs = other.regrid(max(exps))
        out.abs_counts += theirs.abs_counts
        out.signed_counts += theirs.signed_counts
        out.min, out.max = min(self.min, other.min), max(self.max, other.max)
        out.count += other.count
        out.nonfinite += other.nonfinite
        out.zeros += other.zeros
        out.dtype = self.dtype or other.dtype
        return out

    def to_json(self) -> dict:
        return {
            "num_bins": self.num_bins, "exponent": self.exponent, "range": self.range, "dtype": self.dtype,
            "min": self.min if self.count else None, "max": self.max if self.count else None,
            "count": self.count, "nonfinite": self.nonfinite, "zeros": self.zeros,
            "abs_counts": _sparse(self.abs_counts), "signed_counts": _sparse(self.signed_counts),
        }

    @classmethod
    def from_json(cls, d: dict) -> TensorHistogram:
        n = check_num_bins(d["num_bins"])
        return cls(
            _dense(d["abs_counts"], n), _dense(d["signed_counts"], n),
            None if d.get("exponent") is None else int(d["exponent"]),
            math.inf if d.get("min") is None else float(d["min"]),
            -math.inf if d.get("max") is None else float(d["max"]),
            int(d.get("count", 0)), int(d.get("nonfinite", 0)), int(d.get("zeros", 0)), d.get("dtype"),
        )


def _merge_bins(counts: np.ndarray, k: int, offset: int) -> np.ndarray:
    """Counts on a grid 2**k times coarser: old bin i -> floor((i - offset) / 2**k) + offset."""
    index = ((np.arange(counts.size, dtype=np.int64) - offset) >> min(k, 62)) + offset
    out = np.zeros_like(counts)
    np.add.at(out, index, counts)
    return out


def _sparse(counts: np.ndarray) -> dict:
    """The occupied span only, as one comma-separated string: ``{"start": i, "counts": "3,0,17"}`` (a JSON list
    of 2048 numbers per histogram would put each on its own line in indented JSON)."""
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return {"start": 0, "counts": ""}
    return {"start": int(nz[0]), "counts": ",".join(map(str, counts[nz[0]:nz[-1] + 1].tolist()))}


def _dense(doc: dict, n: int) -> np.ndarray:
    """Inverse of :func:`_sparse` (a list of numbers is read too)."""
    out = np.zeros(n, np.int64)
    raw = doc.get("counts", [])
    try:
        values = np.array([int(v) for v in raw.split(",") if v] if isinstance(raw, str) else raw, dtype=np.int64)
    except (TypeError, ValueError):
        raise CalibrationError("histogram counts are not whole numbers") from None
    start = int(doc.get("start", 0))
    if start < 0 or start + values.size > n or (values < 0).any():
        raise CalibrationError(f"histogram span [{start}, {start + values.size}) does not fit {n} bins")
    out[start:start + values.size] = values
    return out
