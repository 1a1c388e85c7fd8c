"""Streaming histograms: exact against numpy on the final grid, independent of feed order, non-finite aware."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from workbench.calibrate.exceptions import CalibrationError
from workbench.calibrate.histogram import TensorHistogram


def _feeds(seed: int = 0) -> list[np.ndarray]:
    """Batches whose ranges grow by orders of magnitude (several re-binnings), with zeros and repeated values."""
    rng = np.random.default_rng(seed)
    feeds = [rng.standard_normal(5000).astype(np.float32) * s for s in (0.01, 1.0, 3.0, 700.0, 0.5)]
    feeds[1][:100] = 0.0
    feeds[2][:50] = 2.0  # exactly on a bin edge of every grid finer than 2
    return feeds


def _reference(values: np.ndarray, exponent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    r = math.ldexp(1.0, exponent)
    abs_counts, _ = np.histogram(np.abs(values), bins=n, range=(0.0, r))
    signed_counts, _ = np.histogram(values, bins=n, range=(-r, r))
    return abs_counts, signed_counts


def test_streamed_histogram_equals_one_numpy_histogram_of_all_data():
    feeds = _feeds()
    h = TensorHistogram.empty(2048)
    for f in feeds:
        h.update(f)
    data = np.concatenate(feeds)
    assert h.range > np.abs(data).max() >= h.range / 2  # the smallest power of two above max |x|
    abs_ref, signed_ref = _reference(data, h.exponent, 2048)
    np.testing.assert_array_equal(h.abs_counts, abs_ref)
    np.testing.assert_array_equal(h.signed_counts, signed_ref)
    assert h.count == data.size and h.zeros == int(np.sum(data == 0)) and h.nonfinite == 0
    assert (h.min, h.max) == (float(data.min()), float(data.max()))
    np.testing.assert_array_equal(h.abs_edges, np.linspace(0, h.range, 2049))


def test_feed_order_and_batching_do_not_change_the_result():
    feeds = _feeds(1)
    results = []
    for order in itertools.islice(itertools.permutations(range(len(feeds))), 0, 120, 17):
        h = TensorHistogram.empty(1024)
        for i in order:
            h.update(feeds[i])
        results.append(h)
    whole = TensorHistogram.empty(1024).update(np.concatenate(feeds))
    split = TensorHistogram.empty(1024)
    for part in np.array_split(np.concatenate(feeds[::-1]), 37):
        split.update(part)
    for h in [*results, split]:
        np.testing.assert_array_equal(h.abs_counts, whole.abs_counts)
        np.testing.assert_array_equal(h.signed_counts, whole.signed_counts)
        assert (h.exponent, h.count, h.zeros, h.min, h.max) == (whole.exponent, whole.count, whole.zeros,
                                                                 whole.min, whole.max)


def test_nonfinite_values_are_counted_apart_and_excluded():
    x = np.array([1.5, -np.inf, np.nan, -2.0, np.inf, 0.0, -np.inf], np.float32)
    h = TensorHistogram.empty(256).update(x).update(np.full(3, -np.inf, np.float32))
    assert h.nonfinite == 7 and h.count == 3 and h.zeros == 1
    assert (h.min, h.max, h.amax) == (-2.0, 1.5, 2.0)
    assert h.abs_counts.sum() == h.signed_counts.sum() == 3
    assert h.range == 4.0  # from the finite values only


def test_merge_and_regrid_are_exact():
    a, b = _feeds(2)[:2], _feeds(3)[2:]
    ha, hb = TensorHistogram.empty(512), TensorHistogram.empty(512)
    for f in a:
        ha.update(f)
    for f in b:
        hb.update(f)
    both = TensorHistogram.empty(512).update(np.concatenate(a + b))
    merged = ha.merge(hb)
    np.testing.assert_array_equal(merged.abs_counts, both.abs_counts)
    np.testing.assert_array_equal(merged.signed_counts, both.signed_counts)
    coarse = ha.regrid(ha.exponent + 3)
    abs_ref, signed_ref = _reference(np.concatenate(a), ha.exponent + 3, 512)
    np.testing.assert_array_equal(coarse.abs_counts, abs_ref)
    np.testing.assert_array_equal(coarse.signed_counts, signed_ref)
    with pytest.raises(CalibrationError):
        ha.regrid(ha.exponent - 1)


def test_float16_float64_and_json_round_trip():
    x16 = np.array([0.1, -3.5, 65504.0], np.float16)
    h = TensorHistogram.empty(64).update(x16).update(np.array([1e-3, -70000.0]))
    assert h.dtype == "float16" and h.count == 5 and h.max == 65504.0 and h.min == -70000.0
    doc = json.loads(json.dumps(h.to_json(), allow_nan=False))
    back = TensorHistogram.from_json(doc)
    np.testing.assert_array_equal(back.abs_counts, h.abs_counts)
    np.testing.assert_array_equal(back.signed_counts, h.signed_counts)
    assert (back.exponent, back.min, back.max, back.count, back.zeros) == (h.exponent, h.min, h.max, h.count, h.zeros)
    empty = TensorHistogram.from_json(TensorHistogram.empty(64).to_json())
    assert empty.count == 0 and empty.exponent is None and empty.amax == 0.0


def test_bad_bins_and_dtypes_are_refused():
    with pytest.raises(CalibrationError, match="power of two"):
        TensorHistogram.empty(2000)
    with pytest.raises(CalibrationError, match="int64"):
        TensorHistogram.empty(16).update(np.arange(4))
