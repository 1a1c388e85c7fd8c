"""Range (amax) methods over a tensor's |x| histogram: max, percentile, entropy (TensorRT's KL search), mse.

Grid: ``counts[k]`` holds k*w <= |x| < (k+1)*w. Every method except max returns at most the observed max |x|
(``top``): a larger amax would only waste resolution.

- max: the observed max |x| (exact, not binned).
- percentile(p): the first bin k whose cumulative fraction reaches p/100; amax = its LOWER edge k*w, the
  convention of ONNX Runtime's and pytorch-quantization's percentile calibrators (the upper edge of bin 0 when
  k = 0, which would give amax 0).
- entropy: TensorRT's EntropyCalibration2 search (Migacz, GTC 2017). For each candidate i in
  [num_quantized_bins, last non-empty bin + 1]: P = counts[:i] with the tail sum(counts[i:]) added to P[i-1];
  Q = counts[:i] merged into 128 levels (bin j goes to level floor(j * 128 / i), pytorch-quantization's split
  when 128 does not divide i), each level's mass spread evenly over its non-zero bins; both normalised;
  KL(P || Q), infinite when P > 0 where Q = 0 (no smoothing, unlike ORT's and MXNet's variant). amax =
  (i* + 0.5) * w at the first minimum i*, as in the GTC slides (pytorch-quantization uses i* * w: half a bin
  lower). Vectorised: with prefix sums of counts, of counts*log(counts) and of non-zero flags, each candidate
  costs O(128) (one (candidates x 128) array), not O(num_bins) Python work.
- mse: the amax minimising the expected fake-quant squared error (TensorRT convention, see fakequant.py) over
  the candidates i * w, i in [num_bins/16, num_bins], and the observed max: every num_bins/256-th candidate
  first, then every candidate within that stride of the best one.
"""

from __future__ import annotations

import math

import numpy as np

from .exceptions import CalibrationError
from .fakequant import HistogramErrorModel
from .histogram import TensorHistogram

METHODS = ("max", "percentile", "entropy", "mse")
DEFAULT_PERCENTILE = 99.99
NUM_QUANTIZED_BINS = 128


def check_methods(methods) -> tuple[str, ...]:
    """Validated, de-duplicated method names."""
    if isinstance(methods, str):
        methods = (methods,)
    out = tuple(dict.fromkeys(str(m).lower() for m in methods))
    bad = [m for m in out if m not in METHODS]
    if bad or not out:
        raise CalibrationError(f"unknown calibration method(s) {', '.join(bad) or '(none)'}",
                               f"use {', '.join(METHODS)}")
    return out


def check_percentile(p: float) -> float:
    p = float(p)
    if not 0 < p <= 100:
        raise CalibrationError(f"percentile {p} is outside (0, 100]", "use e.g. 99.99 or 99.9")
    return p


def amax_percentile(counts: np.ndarray, edges: np.ndarray, percentile: float, top: float | None = None) -> float:
    """Lower edge of the bin where the cumulative fraction of ``counts`` first reaches ``percentile``/100."""
    counts = np.asarray(counts)
    total = counts.sum()
    if total == 0:
        return 0.0
    cdf = np.cumsum(counts / total)  # as ORT computes it, so that equal histograms give equal thresholds
    idx = min(int(np.searchsorted(cdf, percentile / 100.0)), counts.size - 1)
    amax = float(edges[idx])
    if amax <= 0:
        amax = float(edges[idx + 1])
    return amax if top is None else min(amax, float(top))


def entropy_divergences(counts: np.ndarray, num_quantized_bins: int = NUM_QUANTIZED_BINS,
                        stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(candidate window sizes i, KL(P || Q) for each), vectorised; see the module docstring. Candidates run
    from ``num_quantized_bins`` to ``stop`` (default: the last non-empty bin + 1; every larger window also means
    "clip nothing", and TensorRT's grid, which ends at max |x|, has exactly one such candidate)."""
    b = np.asarray(counts, dtype=np.float64)
    nq = int(num_quantized_bins)
    last_window = min(b.size, _occupied(b) if stop is None else int(stop))
    if last_window < nq or b.sum() == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    total = b.sum()
    i = np.arange(nq, last_window + 1, dtype=np.int64)
    csum = np.concatenate([[0.0], np.cumsum(b)])
    nonzero = np.concatenate([[0], np.cumsum(b > 0)])
    xlogx = np.concatenate([[0.0], np.cumsum(_xlogx(b))])
    tail = total - csum[i]
    last = b[i - 1]
    p_log_p = xlogx[i - 1] + _xlogx(last + tail)
    # level k holds bins [ceil(k i / nq), ceil((k + 1) i / nq)): bin j -> floor(j nq / i)
    bounds = (i[:, None] * np.arange(nq + 1)[None, :] + nq - 1) // nq
    mass = np.diff(csum[bounds], axis=1)
    nnz = np.diff(nonzero[bounds], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_log_q = np.where(mass > 0, mass * np.log(mass / np.maximum(nnz, 1)), 0.0).sum(axis=1)
        spread_last = mass[:, -1] / np.maximum(nnz[:, -1], 1)  # Q at bin i-1 when that bin is non-zero
        p_log_q += np.where((tail > 0) & (last > 0), tail * np.log(np.where(last > 0, spread_last, 1.0)), 0.0)
        kept = csum[i]
        kl = (p_log_p - p_log_q) / total - math.log(total) + np.log(np.where(kept > 0, kept, 1.0))
    finite = (kept > 0) & ((tail == 0) | (last > 0))
    return i, np.where(finite, np.maximum(kl, 0.0), np.inf)


def amax_entropy(counts: np.ndarray, width: float, top: float | None = None,
                 num_quantized_bins: int = NUM_QUANTIZED_BINS) -> float:
    """TensorRT's entropy threshold: (i* + 0.5) * width at the first KL minimum (``top`` when no candidate)."""
    i, kl = entropy_divergences(counts, num_quantized_bins)
    if kl.size == 0 or not np.isfinite(kl).any():
        return float(top) if top is not None else _occupied(counts) * width
    amax = (int(i[int(np.argmin(kl))]) + 0.5) * width
    return amax if top is None else min(amax, float(top))


def amax_mse(counts: np.ndarray, width: float, zeros: int = 0, top: float | None = None,
             start: int | None = None) -> float:
    """The candidate amax (i * width, i in [start, n], or ``top``) with the least expected squared error."""
    counts = np.asarray(counts)
    if counts.sum() == 0 or width <= 0:
        return 0.0
    n = counts.size
    first = max(1, n // 16 if start is None else int(start))
    top = float(top) if top is not None else _occupied(counts) * width
    model = HistogramErrorModel(counts, width, zeros, top)
    # coarse pass over every stride-th candidate, then every candidate around the best coarse one
    stride = max(1, n // 256)
    grid = np.arange(first, n + 1, dtype=np.float64) * width
    grid = np.append(grid[grid < top], top)
    coarse = np.unique(np.append(grid[::stride], top))
    best = float(coarse[int(np.argmin(model.squared_error(coarse)))])
    near = grid[np.abs(grid - best) <= stride * width]
    return float(near[int(np.argmin(model.squared_error(near)))])


def compute_amax(h: TensorHistogram, method: str, percentile: float = DEFAULT_PERCENTILE) -> float:
    """amax of ``h`` under ``method`` (0.0 for a tensor without finite values)."""
    if h.count == 0:
        return 0.0
    top = h.amax
    if method == "max":
        return top
    if method == "percentile":
        return amax_percentile(h.abs_counts, h.abs_edges, percentile, top)
    if method == "entropy":
        return amax_entropy(h.abs_counts, h.abs_width, top)
    if method == "mse":
        return amax_mse(h.abs_counts, h.abs_width, h.zeros, top)
    raise CalibrationError(f"unknown calibration method {method!r}", f"use {', '.join(METHODS)}")


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _occupied(counts: np.ndarray) -> int:
    """Bins up to and including the last non-zero one."""
    nz = np.flatnonzero(counts)
    return int(nz[-1]) + 1 if nz.size else 0
