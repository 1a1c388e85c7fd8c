"""ONNX Runtime's entropy and percentile rules, as ``quantize_static`` computes them (``create_calibrator`` with
CalibrationMethod.Entropy / Percentile and its default options; onnxruntime/quantization/calibrate.py).

ORT runs every calibration feed, then builds ONE histogram per tensor from all of them at once:

- entropy: the signed values, ``num_bins`` (default 128) bins over [-T, T], T = max |x| over all feeds
  (np.histogram, float32 edges); for each half-window i in [num_quantized_bins // 2, num_bins // 2]: p = the
  window with the outliers on each side added to its end bins; q = the window merged into ``num_quantized_bins``
  levels of floor(window / levels) bins (the remainder goes to the last level's mass but keeps q = 0), each
  level's mass divided by the number of non-zero p bins in it and truncated to an integer; both smoothed (zeros
  become 1e-4, the same amount taken off the non-zero bins) and normalised in float32; KL in float32; the range
  is (edges[start], edges[end]) of the FIRST minimum, clipped to the observed (min, max). With the default 128
  bins and 128 levels there is a single window: the range is (min, max).
- percentile (symmetric, ORT's default for it): |x| in ``num_bins`` (default 2048) bins over [min |x|, max |x|];
  the first bin whose cumulative fraction reaches p / 100 (default 99.999) gives t = its lower edge; the range
  is (max(-t, min), min(t, max)).

Both histograms need the final range before the first value is binned. :class:`OrtHistograms` is therefore filled
in a second pass over the feeds, once the first pass has found min and max; np.histogram with a fixed range bins
each value by the same float32 edges whatever the batch, so the per-feed sums equal ORT's single histogram.
Every window's KL is first scored in float64 from prefix sums; the windows within rounding of the best are
then scored again with the same float32 array operations as ORT's, one window at a time, and decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

ENTROPY_BINS = 128
QUANTIZED_BINS = 128
PERCENTILE_BINS = 2048
DEFAULT_PERCENTILE = 99.999
_EPS = 0.0001


@dataclass
class OrtHistograms:
    """One tensor's two ORT histograms over fixed ranges (float32 bounds from the first pass; the edges are made
    once, on the first feed)."""

    vmin: np.float32
    vmax: np.float32
    abs_low: np.float32
    entropy_bins: int = ENTROPY_BINS
    percentile_bins: int = PERCENTILE_BINS
    signed: np.ndarray | None = None
    absolute: np.ndarray | None = None

    @property
    def threshold(self) -> np.float32:
        return np.float32(max(abs(self.vmin), abs(self.vmax)))

    @cached_property
    def signed_edges(self) -> np.ndarray:
        t = np.array(self.threshold, dtype=np.float32)
        return np.histogram_bin_edges(np.zeros(0, np.float32), self.entropy_bins, range=(-t, t))

    @cached_property
    def abs_edges(self) -> np.ndarray:
        lo, hi = np.float32(self.abs_low), np.float32(max(abs(self.vmin), abs(self.vmax)))
        return np.histogram_bin_edges(np.zeros(0, np.float32), self.percentile_bins, range=(lo, hi))

    def update(self, values: np.ndarray, finite: bool = False) -> OrtHistograms:
        """Add one feed's values; ``finite``: known to hold no NaN/inf (skips the check)."""
        x = np.asarray(values, dtype=np.float32).reshape(-1)
        if not finite and not np.isfinite(x).all():
            x = x[np.isfinite(x)]
        if self.entropy_bins // 2 > QUANTIZED_BINS // 2:  # else a single window: its counts never matter
            signed = fixed_histogram(x, self.signed_edges)
            self.signed = signed if self.signed is None else self.signed + signed
        absolute = fixed_histogram(np.absolute(x), self.abs_edges)
        self.absolute = absolute if self.absolute is None else self.absolute + absolute
        return self

    def to_json(self) -> dict:
        from .histogram import _sparse

        return {"min": float(self.vmin), "max": float(self.vmax), "abs_low": float(self.abs_low),
                "entropy_bins": self.entropy_bins, "percentile_bins": self.percentile_bins,
                "signed": _sparse(self._or_zeros(self.signed, self.entropy_bins)),
                "absolute": _sparse(self._or_zeros(self.absolute, self.percentile_bins))}

    @classmethod
    def from_json(cls, d: dict) -> OrtHistograms:
        from .histogram import _dense

        eb, pb = int(d["entropy_bins"]), int(d["percentile_bins"])
        return cls(np.float32(d["min"]), np.float32(d["max"]), np.float32(d["abs_low"]), eb, pb,
                   _dense(d["signed"], eb), _dense(d["absolute"], pb))

    @staticmethod
    def _or_zeros(counts, n):
        return np.zeros(n, np.int64) if counts is None else counts


def fixed_histogram(x: np.ndarray, edges: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    """``np.histogram(x, len(edges) - 1, range=(edges[0], edges[-1]))[0]`` for float32 ``x`` and the float32
    edges np.histogram makes for that range. The bin index comes from the same float32 arithmetic; only values
    within 1/512 of a bin boundary (where that arithmetic may be one bin off) are checked against the edges,
    as np.histogram checks every value, so every value lands in numpy's bin. Blocks of ``block`` values keep
    the temporaries in cache."""
    if x.size > block:
        return sum(fixed_histogram(x[i:i + block], edges, block) for i in range(0, x.size, block))
    n = edges.size - 1
    lo, hi = edges[0], edges[-1]
    if x.size and (x.min() < lo or x.max() > hi):
        x = x[(x >= lo) & (x <= hi)]
    denom = np.float32(hi - lo)
    if denom == 0 or x.size == 0:  # np.histogram widens an empty range
        return np.histogram(x, n, range=(lo, hi))[0]
    # a position within a 1e-4 bin of numpy's (float32 rounding): exact away from the boundaries
    f = np.subtract(x, lo, dtype=np.float32)
    f *= np.float32(n / float(denom))
    idx = f.astype(np.intp)
    f -= idx
    f -= np.float32(0.5)
    np.abs(f, out=f)
    near = np.flatnonzero(f > np.float32(0.5 - 1 / 512))
    del f
    np.minimum(idx, n - 1, out=idx)
    if near.size:  # np.histogram's own correction, against the edges
        v, k = x[near], idx[near]
        k -= v < edges[k]
        k += (v >= edges[k + 1]) & (k != n - 1)
        idx[near] = k
    return np.bincount(idx, minlength=n)


def smooth(p: np.ndarray) -> np.ndarray | None:
    """ORT's smoothing of a count vector (float32), None when it is all zeros."""
    is_zeros = (p == 0).astype(np.float32)
    is_nonzeros = (p != 0).astype(np.float32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = _EPS * float(n_zeros) / float(n_nonzeros)
    out = p.astype(np.float32)
    out += _EPS * is_zeros + (-eps1) * is_nonzeros
    return out


def kl_float32(p: np.ndarray, q: np.ndarray) -> np.float32:
    """KL(p || q) of two positive float32 vectors, normalised and summed in float32."""
    pk = 1.0 * p / np.sum(p, axis=0, keepdims=True)
    qk = 1.0 * q / np.sum(q, axis=0, keepdims=True)
    vec = pk * np.log(pk / qk)
    return np.float32(np.sum(vec, axis=0))


def window_divergence(hist: np.ndarray, csum: np.ndarray, start: int, end: int, levels: int) -> float:
    """ORT's KL for the window hist[start:end] (see the module docstring)."""
    window = hist[start:end]
    p = window.copy()
    p[0] += csum[start]
    p[-1] += csum[-1] - csum[end]
    nonzeros = (p != 0).astype(np.int64)
    merged = window.size // levels
    body = levels * merged
    mass = window[:body].reshape(levels, merged).sum(axis=1)
    mass[-1] += window[body:].sum()
    norm = nonzeros[:body].reshape(levels, merged).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_bin = np.where(norm != 0, mass / np.where(norm != 0, norm, 1), 0.0)
    q = np.zeros(p.size, np.int64)
    q[:body] = np.repeat(per_bin.astype(np.int64), merged)
    ps, qs = smooth(p), smooth(q)
    if ps is None or qs is None:
        return float(np.float32(np.inf))
    return float(kl_float32(ps, qs))


def entropy_range(h: OrtHistograms, levels: int = QUANTIZED_BINS) -> tuple[float, float]:
    """ORT's entropy range (lowest, highest) from ``h.signed``: every window scored at once in float64
    (:func:`screen_divergences`), then the windows within rounding of the best re-scored one by one with ORT's
    float32 operations (:func:`window_divergence`); the first minimum wins, as in ORT."""
    n = h.entropy_bins
    hist = np.zeros(n, np.int64) if h.signed is None else np.asarray(h.signed, dtype=np.int64)
    edges = h.signed_edges
    zero = n // 2
    half = levels // 2
    if zero < half:
        return float(h.vmin), float(h.vmax)
    csum = np.concatenate([[0], np.cumsum(hist)])
    with np.errstate(all="ignore"):  # empty windows give inf/nan scores, ruled out below
        approx = screen_divergences(hist, levels)
    finite = np.isfinite(approx)
    if finite.any():
        best = approx[finite].min()
        near = np.flatnonzero(approx <= best + _SCREEN_ABS + _SCREEN_REL * abs(best))
    else:
        near = np.arange(approx.size)
    if near.size > _SCREEN_MAX:
        near = np.arange(approx.size)  # a flat curve: score every window exactly
    if approx.size == 1:  # one window (ORT's default 128 bins): nothing to score
        near = np.zeros(1, np.int64)
    exact = np.array([window_divergence(hist, csum, zero - i, min(zero + i + 1, n), levels) for i in half + near]
                     if approx.size > 1 else [0.0])
    i = half + int(near[int(np.argmin(exact))])
    lo, hi = edges[zero - i], edges[min(zero + i + 1, n)]
    lo = h.vmin if lo < h.vmin else lo
    hi = h.vmax if hi > h.vmax else hi
    return float(lo), float(hi)


#: windows whose float64 score lies this close to the best are re-scored exactly (ORT's float32 arithmetic
#: moves a KL by ~1e-6 relative); past _SCREEN_MAX such windows every window is re-scored
_SCREEN_REL, _SCREEN_ABS, _SCREEN_MAX = 2e-4, 2e-6, 96
#: counts up to this are handled exactly in the smoothing term; larger ones by a third-order Taylor expansion
_SMALL = 16


def _f(x):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def screen_divergences(hist: np.ndarray, levels: int = QUANTIZED_BINS) -> np.ndarray:
    """ORT's KL for every window i in [levels // 2, n // 2], in float64 from prefix sums: O(levels) per window.

    With p_s, q_s the smoothed p and q, Sp = sum p_s (= every count: the outliers sit in the end bins) and
    Sq = sum q_s: KL = (sum p_s log p_s - sum p_s log q_s) / Sp - log Sp + log Sq. q_s is constant on each level
    (and 1e-4 on the remainder past ``levels * merged`` bins), so the second sum needs only each level's p_s
    mass; the first sums (c - e) log(c - e) over the window's non-zero counts c, exactly for c <= 16 (counted
    per value) and by a Taylor expansion in e = 1e-4 * zeros / non-zeros for larger c."""
    h = np.asarray(hist, dtype=np.int64)
    n = h.size
    zero, half = n // 2, levels // 2
    i = np.arange(half, zero + 1, dtype=np.int64)
    s = zero - i
    e = np.minimum(zero + i + 1, n)
    length = e - s
    merged = length // levels
    body = levels * merged
    hf = h.astype(np.float64)
    total = hf.sum()

    def prefix(values):
        return np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])

    csum, cz, cnz = prefix(hf), prefix(h == 0), prefix(h != 0)
    big = h > _SMALL
    cf, cg = prefix(np.where(big, _f(hf), 0.0)), prefix(np.where(big, np.log(np.maximum(hf, 1)) + 1, 0.0))
    with np.errstate(divide="ignore"):
        inv = np.where(big, 1.0 / np.maximum(hf, 1), 0.0)
    ch, ch2 = prefix(inv), prefix(inv * inv)
    per_value = np.stack([prefix(h == c) for c in range(1, _SMALL + 1)])  # (SMALL, n + 1)

    left, right = csum[s], total - csum[e]
    first, last = hf[s], hf[e - 1]
    # zero / non-zero p bins: the end bins gain the outliers
    zp = (cz[e] - cz[s]) - ((first == 0) & (left > 0)) - ((last == 0) & (right > 0))
    nnzp = length - zp
    with np.errstate(divide="ignore", invalid="ignore"):
        e1p = _EPS * zp / nnzp
    # sum over non-zero p bins of f(c - e1p): window counts as they are, then the two end bins corrected
    small = np.arange(1, _SMALL + 1, dtype=np.float64)
    counts = per_value[:, e] - per_value[:, s]  # (SMALL, windows)
    a = (counts * _f(small[:, None] - e1p[None, :])).sum(axis=0)
    a += (cf[e] - cf[s]) - e1p * (cg[e] - cg[s]) + e1p ** 2 / 2 * (ch[e] - ch[s]) + e1p ** 3 / 6 * (ch2[e] - ch2[s])

    def f_bin(c):  # the term a bin of count c contributed above
        return np.where(c <= 0, 0.0, np.where(c <= _SMALL, _f(c - e1p), _f(c) - e1p * (np.log(np.maximum(c, 1))
                        + 1) + e1p ** 2 / (2 * np.maximum(c, 1)) + e1p ** 3 / (6 * np.maximum(c, 1) ** 2)))

    a += _f(first + left - e1p) * (first + left > 0) - f_bin(first)
    a += _f(last + right - e1p) * (last + right > 0) - f_bin(last)
    a += zp * _f(np.array(_EPS))

    # levels: bins [s + k m, s + (k + 1) m) of hist
    bounds = s[:, None] + merged[:, None] * np.arange(levels + 1)[None, :]
    msum = np.diff(csum[bounds], axis=1)
    nnz = np.diff(cnz[bounds], axis=1)
    rest = csum[e] - csum[s + body]  # the remainder past the levels
    rest_nnz = cnz[e] - cnz[s + body]
    in_body = length == body  # the last bin lies in the last level, not in the remainder
    nnz[:, 0] += (first == 0) & (left > 0)
    nnz[:, -1] += in_body & (last == 0) & (right > 0)
    rest_nnz = rest_nnz + (~in_body & (last == 0) & (right > 0))
    mass = msum.copy()
    mass[:, -1] += rest
    with np.errstate(divide="ignore", invalid="ignore"):
        qv = np.where(nnz > 0, np.trunc(mass / np.maximum(nnz, 1)), 0.0)
    zq = merged * (qv == 0).sum(axis=1) + (length - body)
    nnzq = length - zq
    with np.errstate(divide="ignore", invalid="ignore"):
        e1q = _EPS * zq / nnzq
    qs = np.where(qv > 0, qv - e1q[:, None], _EPS)
    p_level = msum.copy()
    p_level[:, 0] += left
    p_level[:, -1] += np.where(in_body, right, 0.0)
    p_level += -e1p[:, None] * nnz + _EPS * (merged[:, None] - nnz)
    p_rest = rest + np.where(in_body, 0.0, right) - e1p * rest_nnz + _EPS * ((length - body) - rest_nnz)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = (p_level * np.log(qs)).sum(axis=1) + p_rest * np.log(_EPS)
        sq = merged * qv.sum(axis=1)
        kl = (a - b) / total - np.log(total) + np.log(sq)
    return np.where((nnzp > 0) & (nnzq > 0) & (sq > 0), kl, np.inf)


def percentile_range(h: OrtHistograms, percentile: float = DEFAULT_PERCENTILE) -> tuple[float, float]:
    """ORT's symmetric percentile range (lowest, highest) from ``h.absolute``."""
    hist = np.asarray(h.absolute, dtype=np.int64)
    edges = h.abs_edges.astype(np.float32)
    total = hist.sum()
    if total == 0:
        return float(h.vmin), float(h.vmax)
    cdf = np.cumsum(hist / total)
    idx = int(np.searchsorted(cdf, percentile / 100.0))
    t = edges[min(idx, edges.size - 1)]
    lo, hi = -t, t
    lo = h.vmin if lo < h.vmin else lo
    hi = h.vmax if hi > h.vmax else hi
    return float(lo), float(hi)
