"""INT8 fake quantization (TensorRT's convention) and its expected error computed from a |x| histogram.

Convention (TensorRT implicit INT8 / pytorch-quantization's default ``narrow_range``): symmetric, zero point 0,
``scale = amax / 127``, ``q = clip(round_half_to_even(x / scale), -127, 127)``, ``x' = q * scale``. ONNX
QuantizeLinear (what a QDQ model runs) clips to [-128, 127]; the two differ only for x < -127.5 * scale.

Error model: values are spread uniformly within each histogram bin, except exact zeros (counted apart, error 0)
and the last occupied bin, whose values are spread up to the observed max |x| only (``top``).
Then the expected squared error of any amax is a sum over the 128 rounding cells [(m - 1/2) s, (m + 1/2) s)
of integrals of (x - m s)^2 against a piecewise-constant density, computed from prefix moments of the
histogram: O(128) per candidate amax, whatever the number of bins, and no activation is ever kept.
"""

from __future__ import annotations

import math

import numpy as np

#: largest quantized magnitude: q in [-QMAX, QMAX]
QMAX = 127


def fake_quant(x: np.ndarray, amax: float) -> np.ndarray:
    """``x`` quantized to int8 with ``scale = amax / 127`` and dequantized (float64; the definition, on raw data)."""
    if amax <= 0:
        return np.zeros_like(x, dtype=np.float64)
    scale = amax / QMAX
    return np.clip(np.round(np.asarray(x, np.float64) / scale), -QMAX, QMAX) * scale


class HistogramErrorModel:
    """Expected fake-quant error of a tensor described by its |x| histogram (``counts`` over bins of ``width``
    starting at 0), its count of exact zeros and its observed max |x| (``top``; None: the last bin's edge)."""

    def __init__(self, counts: np.ndarray, width: float, zeros: int = 0, top: float | None = None):
        mass = np.asarray(counts, dtype=np.float64).copy()
        if mass.size:
            mass[0] = max(0.0, mass[0] - zeros)
        self.total = float(np.sum(counts))  # every finite value, zeros included
        self.width = float(width)
        self.n = mass.size
        edges = np.arange(self.n + 1, dtype=np.float64) * self.width
        upper = edges[1:].copy()
        occupied = np.flatnonzero(mass)
        self.top = math.inf
        if top is not None and occupied.size and self.width > 0:
            k = int(occupied[-1])
            upper[k] = min(upper[k], max(float(top), edges[k] + self.width * 1e-9))
            self.top = float(top)
        spans = upper - edges[:-1]
        self.density = np.where(spans > 0, mass / np.where(spans > 0, spans, 1.0), 0.0)
        self.moments = [np.concatenate([[0.0], np.cumsum(self.density * (upper ** (k + 1) - edges[:-1] ** (k + 1))
                                                         / (k + 1))]) for k in range(3)]

    def moments_at(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Integrals over [0, y] of density * x**k for k = 0, 1, 2 (y may be inf)."""
        y = np.asarray(y, dtype=np.float64)
        if self.width <= 0:
            return np.zeros_like(y), np.zeros_like(y), np.zeros_like(y)
        finite = np.isfinite(y)
        yy = np.minimum(np.where(finite, np.maximum(y, 0.0), self.n * self.width), self.top)
        j = np.minimum(np.floor(yy / self.width), self.n).astype(np.int64)
        jj = np.minimum(j, self.n - 1)
        d = np.where(j < self.n, self.density[jj], 0.0)
        e = jj * self.width
        yk, ek = yy, e
        whole = yy >= self.top  # at or past the observed max: everything
        out = []
        for k in range(3):
            out.append(np.where(whole, self.moments[k][-1], self.moments[k][j] + d * (yk - ek) / (k + 1)))
            if k < 2:
                yk, ek = yk * yy, ek * e
        return out[0], out[1], out[2]

    def moment(self, k: int, y: np.ndarray) -> np.ndarray:
        """integral over [0, y] of density * x**k (y may be inf)."""
        return self.moments_at(y)[k]

    def squared_error(self, amax: np.ndarray | float, upto: float = math.inf) -> np.ndarray:
        """Expected sum of squared fake-quant errors over the values with |x| <= ``upto``, for each amax."""
        a = np.atleast_1d(np.asarray(amax, dtype=np.float64))
        s = (a / QMAX)[:, None]
        m = np.arange(QMAX + 1, dtype=np.float64)[None, :]
        # cell m = [(m - 1/2) s, (m + 1/2) s) -> m s; cell 0 starts at 0, the last one takes all that is clipped
        bounds = np.empty((a.size, QMAX + 2))
        bounds[:, 0] = 0.0
        bounds[:, 1:-1] = (m[:, :-1] + 0.5) * s
        bounds[:, -1] = math.inf
        i0, i1, i2 = (np.diff(v, axis=1) for v in self.moments_at(np.minimum(bounds, upto)))
        centre = m * s
        err = np.maximum(i2 - 2 * centre * i1 + centre**2 * i0, 0.0).sum(axis=1)
        return np.where(a > 0, err, self.signal(upto))  # amax 0: everything becomes 0

    def signal(self, upto: float = math.inf) -> float:
        """Sum of x**2 over the values with |x| <= ``upto``."""
        return float(self.moment(2, np.array(upto)))

    def clipped_fraction(self, amax: float) -> float:
        """Fraction of all finite values with |x| > amax."""
        if self.total == 0:
            return 0.0
        return float((self.moments[0][-1] - self.moment(0, np.array(amax))) / self.total)

    def sqnr_db(self, amax: float, upto: float = math.inf) -> float:
        """10 log10(signal / expected squared error) over the values with |x| <= ``upto``."""
        return sqnr(self.signal(upto), float(self.squared_error(amax, upto)[0]))


def sqnr(signal: float, noise: float) -> float:
    """10 log10(signal / noise); inf when there is no noise, -inf when there is no signal but noise."""
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
