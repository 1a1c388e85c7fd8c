"""The |x| histogram TensorRT's entropy rule sees, grown batch by batch as NVIDIA ModelOpt grows it.

Rule reproduced (ModelOpt 0.47 ``HistogramCalibrator`` with its default ``torch_hist=True``, the
pytorch-quantization lineage of TensorRT's calibrator), in numpy float32 arithmetic:

- values are |x| as float32; each call to :meth:`GrowingHistogram.update` is one batch (one feed);
- first batch with max m: ``num_bins`` bins over [0, m], edges ``linspace(0, m, num_bins + 1)``;
- a later batch whose max m' exceeds the last edge: the width w = edges[1] - edges[0] is kept, the bin count
  becomes ceil(m' / w) and the edges ``arange(0, m' + w, w)``; the old counts are added to the first bins;
- a value's bin is ``floor(float32(float32(|x| * bins) / last_edge))`` (``torch.histc``: linear interpolation
  with no edge correction; |x| == last edge goes to the last bin); counts add up in float32 across batches.

Counts are bit-identical to ModelOpt's. Edges follow torch's scalar ``linspace``/``arange`` formulas; torch's
vectorised kernels may round a lane one float32 ulp apart, far below one bin. Where ModelOpt fails (the first
batch all zeros, then non-zero values: a zero width) the histogram restarts from the new batch with the zeros
kept in bin 0. Non-finite values are left out (ModelOpt's histc rejects an infinite range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .exceptions import CalibrationError


def linspace32(stop: float, steps: int) -> np.ndarray:
    """``torch.linspace(0, stop, steps)`` in float32 (scalar kernel: the first half counts up from 0, the second
    half down from ``stop``)."""
    stop32 = np.float32(stop)
    step = np.float32(stop32 / np.float32(steps - 1))
    idx = np.arange(steps, dtype=np.float32)
    half = steps // 2
    out = np.empty(steps, np.float32)
    out[:half] = step * idx[:half]
    out[half:] = stop32 - step * (np.float32(steps - 1) - idx[half:])
    return out


def arange32(width: float, count: int) -> np.ndarray:
    """``torch.arange(0, end, width)`` in float32 with ``count`` elements: float32(i * double(width))."""
    return (np.arange(count, dtype=np.float64) * float(np.float32(width))).astype(np.float32)


def arange_count(end: float, width: float) -> int:
    """torch.arange's element count: ceil(double(end) / double(width))."""
    return int(math.ceil(float(end) / float(width)))


def histc32(a: np.ndarray, bins: int, top: float) -> np.ndarray:
    """``torch.histc(a, bins, min=0, max=top)`` for float32 |x| (values above ``top`` are left out), as float32."""
    top32 = np.float32(top)
    if a.size and a.max() > top32:
        a = a[a <= top32]
    pos = np.multiply(a, np.float32(bins), dtype=np.float32)
    np.divide(pos, top32, out=pos)
    idx = pos.astype(np.intp)  # truncation: floor for these non-negative values
    del pos
    np.minimum(idx, bins - 1, out=idx)
    return np.bincount(idx, minlength=bins).astype(np.float32)


@dataclass
class GrowingHistogram:
    """One tensor's TensorRT/ModelOpt histogram. ``counts`` float32; the edges are ``linspace(0, top, n + 1)``
    until the first growth, then ``arange`` of ``width`` with ``num_edges`` elements."""

    num_bins: int = 2048
    counts: np.ndarray | None = None
    top: float = 0.0  # the last edge: histc's max
    width: float = 0.0  # edges[1] - edges[0]
    num_edges: int = 0
    grown: bool = False
    low: float = math.inf  # min |x| seen (ONNX Runtime's percentile grid starts there)
    batches: int = 0

    @property
    def edges(self) -> np.ndarray:
        if self.counts is None:
            return np.zeros(0, np.float32)
        if not self.grown:
            return linspace32(self.top, self.counts.size + 1)
        return arange32(self.width, self.num_edges)

    def update(self, values: np.ndarray) -> GrowingHistogram:
        """Add one batch (finite values only; any float dtype)."""
        a = np.abs(np.asarray(values, dtype=np.float32).reshape(-1))
        if a.size == 0:
            return self
        self.batches += 1
        self.low = min(self.low, float(a.min()))
        m = float(a.max())
        if self.counts is None or self.width == 0.0:
            old = self.counts
            self._start(a, m)
            if old is not None:  # first batches all zero: keep their zeros in bin 0
                self.counts[0] += np.float32(old.sum())
            return self
        if m > self.top:
            w = self.width
            self.num_bins = int(np.ceil(np.float32(m) / np.float32(w)))
            self.num_edges = arange_count(np.float32(np.float32(m) + np.float32(w)), w)
            self.grown = True
            self.top = float(arange32(w, self.num_edges)[-1])
        hist = histc32(a, self.num_bins, self.top)
        hist[:self.counts.size] += self.counts
        self.counts = hist
        return self

    def _start(self, a: np.ndarray, m: float) -> None:
        n = self.num_bins
        if m == 0.0:
            self.counts = np.zeros(n, np.float32)
            self.counts[0] = np.float32(a.size)
            self.top = self.width = 0.0
            self.num_edges = n + 1
            return
        self.counts = histc32(a, n, m)
        self.top = m
        edges = linspace32(m, n + 1)
        self.width = float(edges[1] - edges[0])
        self.num_edges = n + 1
        self.grown = False

    def int_counts(self) -> np.ndarray:
        """Counts as ModelOpt's compute_amax reads them (``.int()``: int32)."""
        if self.counts is None:
            return np.zeros(0, np.int32)
        return self.counts.astype(np.int32)

    def to_json(self) -> dict:
        from .histogram import _sparse

        counts = np.zeros(0, np.int64) if self.counts is None else self.counts.astype(np.int64)
        return {"num_bins": int(counts.size), "top": self.top, "width": self.width, "num_edges": self.num_edges,
                "grown": self.grown, "low": self.low if math.isfinite(self.low) else None,
                "batches": self.batches, "counts": _sparse(counts)}

    @classmethod
    def from_json(cls, d: dict) -> GrowingHistogram:
        from .histogram import _dense

        n = int(d.get("num_bins", 0))
        if n < 0 or n > 1 << 26:
            raise CalibrationError(f"TensorRT histogram with {n} bins is out of range")
        counts = _dense(d["counts"], n).astype(np.float32) if n else None
        low = d.get("low")
        return cls(n, counts, float(d.get("top", 0.0)), float(d.get("width", 0.0)), int(d.get("num_edges", 0)),
                   bool(d.get("grown", False)), math.inf if low is None else float(low), int(d.get("batches", 0)))
