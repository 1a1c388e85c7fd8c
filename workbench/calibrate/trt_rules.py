"""TensorRT/ModelOpt's range rules over a :class:`~workbench.calibrate.trt_histogram.GrowingHistogram`.

Each reproduces ModelOpt 0.47's function of the same purpose (``_compute_amax_entropy``, ``_compute_amax_percentile``,
``_compute_amax_mse`` in ``modelopt/torch/quantization/calib/histogram.py``), on the int32 counts and float32 edges
ModelOpt reads:

- entropy (TensorRT's EntropyCalibration2 search): bins[0] is replaced by bins[1] (so a ReLU's zeros do not
  dominate); for each window i in [128, number of bins]: P = bins[:i] with the clipped tail added to P[i-1];
  Q = bins[:i] merged into 128 levels, level k holding the bins j with linspace(0, i, 129)[k] <= j <
  linspace(0, i, 129)[k+1] (numpy's float64 linspace, as ``np.digitize`` sees it), each level's mass spread
  evenly over its non-zero bins; KL(P || Q) (infinite where P > 0 and Q = 0); amax = edges[i*] at the LAST
  minimum. All windows are scored at once from prefix sums (O(128) each); the few within rounding of the
  minimum are re-scored one by one the way ModelOpt computes them (normalised P and Q, sum of p log(p / q)),
  so near-ties fall the way ModelOpt's arithmetic makes them fall.
- percentile: amax = edges[k] at the first bin k where the cumulative fraction reaches p / 100 (default 99.99).
- mse: the bin centre c_i, i in [128, number of bins), minimising mean((fake_quant(c, c_i) - c)^2 * counts) with
  TensorRT's narrow-range symmetric int8 fake quantisation (scale 127 / amax, round half to even, clamp +-127),
  in float32; the first minimum.
"""

from __future__ import annotations

import math

import numpy as np

from .trt_histogram import GrowingHistogram

START_BIN = 128
LEVELS = 128
DEFAULT_PERCENTILE = 99.99
#: windows whose prefix-sum KL lies within this (relative + absolute) of the minimum are re-scored exactly
_TIE_REL, _TIE_ABS, _TIE_MAX = 1e-9, 1e-12, 64


def level_bounds(windows: np.ndarray, levels: int = LEVELS) -> np.ndarray:
    """(windows x levels+1) first bin of each level: ceil(linspace(0, i, levels + 1)) as numpy computes it."""
    i = windows.astype(np.float64)
    space = np.arange(levels + 1, dtype=np.float64)[None, :] * (i / levels)[:, None]
    space[:, -1] = i
    return np.ceil(space).astype(np.int64)


def entropy_divergences(bins: np.ndarray, start: int = START_BIN, levels: int = LEVELS):
    """(windows, KL per window) for ModelOpt's entropy search on ``bins`` (int counts, bins[0] as given)."""
    b = np.asarray(bins, dtype=np.float64)
    n = b.size
    if n < start or b.sum() <= 0:
        return np.zeros(0, np.int64), np.zeros(0)
    total = b.sum()
    i = np.arange(start, n + 1, dtype=np.int64)
    csum = np.concatenate([[0.0], np.cumsum(b)])
    nonzero = np.concatenate([[0], np.cumsum(b > 0)])
    xlogx = np.concatenate([[0.0], np.cumsum(_xlogx(b))])
    tail = total - csum[i]
    last = b[i - 1]
    p_log_p = xlogx[i - 1] + _xlogx(last + tail)
    bounds = level_bounds(i, levels)
    mass = np.diff(csum[bounds], axis=1)
    nnz = np.diff(nonzero[bounds], axis=1)
    # the level holding bin i-1
    k_last = (bounds <= (i - 1)[:, None]).sum(axis=1) - 1
    rows = np.arange(i.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_log_q = np.where(mass > 0, mass * np.log(mass / np.maximum(nnz, 1)), 0.0).sum(axis=1)
        spread_last = mass[rows, k_last] / np.maximum(nnz[rows, k_last], 1)
        p_log_q += np.where((tail > 0) & (last > 0), tail * np.log(np.where(last > 0, spread_last, 1.0)), 0.0)
        kept = csum[i]
        kl = (p_log_p - p_log_q) / total - math.log(total) + np.log(np.where(kept > 0, kept, 1.0))
    finite = (kept > 0) & ((tail == 0) | (last > 0))
    return i, np.where(finite, np.maximum(kl, 0.0), np.inf)


def exact_divergence(bins: np.ndarray, i: int, levels: int = LEVELS) -> float:
    """KL for window ``i`` computed element by element as ModelOpt does (scipy.stats.entropy's normalisation)."""
    b = np.asarray(bins)
    bounds = level_bounds(np.array([i]), levels)[0]
    level = np.repeat(np.arange(levels), np.diff(bounds))
    head = b[:i].astype(np.float64)
    nz = head != 0
    mass = np.bincount(level[nz], weights=head[nz], minlength=levels)
    count = np.bincount(level[nz], minlength=levels)
    q = np.where(nz, mass[level] / np.maximum(count[level], 1), 0.0)
    p = b[:i].astype(np.int64)
    p[-1] += int(b[i:].sum())
    pk = 1.0 * p / np.sum(p)
    qk = 1.0 * q / np.sum(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        vec = np.where((pk > 0) & (qk > 0), pk * np.log(pk / qk), np.where(pk == 0, 0.0, np.inf))
    return float(np.sum(vec))


def amax_entropy(h: GrowingHistogram, start: int = START_BIN) -> float:
    """TensorRT/ModelOpt's entropy threshold (0.0 without data)."""
    if h.counts is None or h.top == 0.0:
        return 0.0
    bins = h.int_counts().copy()
    if bins.size > 1:
        bins[0] = bins[1]
    windows, kl = entropy_divergences(bins, start)
    if kl.size == 0:
        return float(h.edges[-1])
    best = float(np.min(kl))
    if math.isfinite(best):
        near = np.flatnonzero(kl <= best + _TIE_ABS + _TIE_REL * abs(best))
        if near.size > 1:
            near = near[np.argsort(kl[near], kind="stable")[:_TIE_MAX]]
            exact = np.array([exact_divergence(bins, int(windows[k])) for k in near])
            choice = int(near[np.flatnonzero(exact == exact.min()).max()])
        else:
            choice = int(near[0])
    else:
        choice = kl.size - 1  # every window infinite: np.argmin of the reversed list picks the last
    return float(h.edges[int(windows[choice])])


def amax_percentile(h: GrowingHistogram, percentile: float = DEFAULT_PERCENTILE) -> float:
    """ModelOpt's percentile threshold: edges[k] where the cumulative fraction first reaches p / 100."""
    if h.counts is None or h.top == 0.0:
        return 0.0
    counts = h.int_counts()
    cdf = np.cumsum(counts / counts.sum())
    idx = int(np.searchsorted(cdf, percentile / 100))
    edges = h.edges
    return float(edges[min(idx, edges.size - 1)])


def amax_mse(h: GrowingHistogram, start: int = START_BIN) -> float:
    """ModelOpt's mse threshold: the bin centre with the least mean squared fake-quant error (every candidate:
    the error curve is jagged, a coarse-to-fine search misses minima)."""
    if h.counts is None or h.top == 0.0:
        return 0.0
    edges = h.edges
    centers = (edges[1:] + edges[:-1]) / np.float32(2)
    counts = h.int_counts().astype(np.float32)
    n = min(centers.size, counts.size)
    if centers.size <= start:
        return float(centers[-1])
    used = np.flatnonzero(counts[:n] > 0)
    err = _mse(centers[start:], centers[used], counts[used])
    return float(centers[start + int(np.argmin(err))])


def _mse(amax: np.ndarray, c: np.ndarray, w: np.ndarray, block: int = 128) -> np.ndarray:
    """Sum over bins of (fake_quant(c, amax) - c)^2 * w for each amax (float32 terms, as ModelOpt's)."""
    bound = np.float32(127.0)
    out = np.empty(amax.size)
    t = np.empty((block, c.size), np.float32)
    for lo in range(0, amax.size, block):
        a = amax[lo:lo + block]
        k = a.size
        with np.errstate(divide="ignore"):
            scale = np.where(a <= np.float32(1.0 / (1 << 24)), np.float32(0), bound / a).astype(np.float32)
        v = t[:k]
        np.multiply(c[None, :], scale[:, None], out=v)
        np.rint(v, out=v)
        np.clip(v, -bound, bound, out=v)
        np.divide(v, np.where(scale == 0, np.float32(1), scale)[:, None], out=v)
        np.subtract(v, c[None, :], out=v)
        np.multiply(v, v, out=v)
        np.multiply(v, w[None, :], out=v)
        out[lo:lo + k] = v.sum(axis=1, dtype=np.float64)
    return out


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)
