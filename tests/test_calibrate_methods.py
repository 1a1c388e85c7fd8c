"""Range methods and histogram-based errors against slow, plainly written references and direct fake-quant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.calibrate.errors import bulk_bound, rank_sensitivity, tensor_errors
from workbench.calibrate.fakequant import HistogramErrorModel, fake_quant
from workbench.calibrate.histogram import TensorHistogram
from workbench.calibrate.methods import (
    amax_entropy,
    amax_mse,
    amax_percentile,
    compute_amax,
    entropy_divergences,
)


def _samples() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    relu = np.maximum(rng.standard_normal(60000), 0)
    outliers = np.concatenate([rng.standard_normal(60000), rng.uniform(300, 400, 30)])
    sparse = np.concatenate([rng.standard_normal(3000), [40.0, 41.0, 90.0]])
    return {"normal": rng.standard_normal(80000), "laplace": rng.laplace(size=50000), "relu": relu,
            "outliers": outliers, "sparse": sparse, "few": rng.standard_normal(200),
            "uniform": rng.uniform(-1, 1, 40000)}


def _hist(x: np.ndarray, bins: int = 2048) -> TensorHistogram:
    return TensorHistogram.empty(bins).update(np.asarray(x, np.float32))


# --- slow references: one candidate at a time, the algorithm as written in the papers/anchors -------------------

def slow_entropy_kl(counts: np.ndarray, nq: int = 128) -> dict[int, float]:
    """KL(P || Q) for every window i, one window at a time with explicit P and Q: P = the first i bins with the
    tail added to its last bin; Q = the i bins merged into 128 levels (bin j -> level j*128//i), each level's
    mass spread evenly over its non-zero bins."""
    b = np.asarray(counts, dtype=np.float64)
    last = int(np.flatnonzero(b)[-1]) + 1
    out = {}
    for i in range(nq, last + 1):
        p = b[:i].copy()
        p[i - 1] += b[i:].sum()
        level = np.arange(i) * nq // i
        level_mass = np.bincount(level, weights=b[:i], minlength=nq)
        level_nonzero = np.bincount(level, weights=(b[:i] > 0).astype(float), minlength=nq)
        q = np.where(b[:i] > 0, level_mass[level] / np.maximum(level_nonzero[level], 1), 0.0)
        if q.sum() == 0 or np.any((p > 0) & (q == 0)):
            out[i] = math.inf
            continue
        pn, qn = p / p.sum(), q / q.sum()
        used = pn > 0
        out[i] = float(np.sum(pn[used] * np.log(pn[used] / qn[used])))
    return out


def slow_percentile(counts: np.ndarray, edges: np.ndarray, p: float) -> float:
    total, running = counts.sum(), 0.0
    for k, c in enumerate(counts):
        running += c / total
        if running >= p / 100:
            return float(edges[k]) if edges[k] > 0 else float(edges[k + 1])
    return float(edges[-2])


def slow_expected_error(counts: np.ndarray, width: float, zeros: int, top: float, amax: float, sub: int = 64) -> float:
    """Expected squared fake-quant error, integrating each bin numerically (midpoint rule, ``sub`` points)."""
    total = 0.0
    for k, c in enumerate(counts):
        mass = c - (zeros if k == 0 else 0)
        if mass <= 0:
            continue
        lo, hi = k * width, min((k + 1) * width, top) if k == np.flatnonzero(counts)[-1] else (k + 1) * width
        x = lo + (np.arange(sub) + 0.5) / sub * (hi - lo)
        total += mass * float(np.mean((fake_quant(x, amax) - x) ** 2))
    return total


@pytest.mark.parametrize("name", ["normal", "laplace", "relu", "outliers", "sparse", "few"])
def test_entropy_matches_the_slow_reference(name):
    h = _hist(_samples()[name], 512)
    windows, kl = entropy_divergences(h.abs_counts)
    ref = slow_entropy_kl(h.abs_counts)
    assert list(windows) == sorted(ref)
    expected = np.array([ref[int(i)] for i in windows])
    assert np.array_equal(np.isinf(kl), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(kl[finite], expected[finite], rtol=1e-9, atol=1e-12)
    best = min(ref, key=lambda i: (ref[i], i))
    assert amax_entropy(h.abs_counts, h.abs_width) == pytest.approx((best + 0.5) * h.abs_width)
    assert compute_amax(h, "entropy") == pytest.approx(min((best + 0.5) * h.abs_width, h.amax))


def test_entropy_on_2048_bins_and_ort_kl_function():
    """The full TensorRT grid against the reference, and KL values against ONNX Runtime's own entropy() where it
    is defined (its rel_entr returns inf wherever P or Q is 0, so only windows without empty bins)."""
    from onnxruntime.quantization.calibrate import entropy as ort_entropy

    h = _hist(_samples()["laplace"], 2048)
    windows, kl = entropy_divergences(h.abs_counts)
    ref = slow_entropy_kl(h.abs_counts)
    finite = [int(i) for i in windows if math.isfinite(ref[int(i)])]
    np.testing.assert_allclose([kl[i - 128] for i in finite], [ref[i] for i in finite], rtol=1e-9)
    b = h.abs_counts.astype(np.float64)
    dense = [i for i in finite if np.all(b[:i] > 0)]
    assert len(dense) >= 20
    for i in dense[:: max(1, len(dense) // 10)]:
        p = b[:i].copy()
        p[-1] += b[i:].sum()
        q = np.zeros(i)
        for level in range(128):
            idx = np.array([j for j in range(i) if j * 128 // i == level])
            q[idx] = b[idx].sum() / idx.size
        assert kl[i - 128] == pytest.approx(float(ort_entropy(p, q)), rel=1e-3, abs=1e-7)


def test_entropy_never_clips_into_an_empty_bin():
    """A dense bulk and an isolated outlier cluster: every window ending in an empty bin has infinite KL (P > 0
    where Q = 0), so TensorRT's entropy keeps the cluster; ONNX Runtime's smoothed variant does not (see
    test_calibrate_ort.py)."""
    h = _hist(_samples()["outliers"])
    windows, kl = entropy_divergences(h.abs_counts)
    empty_last = h.abs_counts[windows - 1] == 0
    tail = np.array([h.abs_counts[i:].sum() for i in windows]) > 0
    assert np.all(np.isinf(kl[empty_last & tail])) and np.all(np.isfinite(kl[~empty_last]))
    assert compute_amax(h, "entropy") > 299


@pytest.mark.parametrize("p", [50.0, 99.0, 99.9, 99.99, 100.0])
def test_percentile_matches_the_slow_reference(p):
    for x in _samples().values():
        h = _hist(x)
        expected = min(slow_percentile(h.abs_counts, h.abs_edges, p), h.amax)
        amax = compute_amax(h, "percentile", p)
        assert amax == expected
        assert amax_percentile(h.abs_counts, h.abs_edges, p) >= expected
        # on the raw values: fewer than p% lie below amax, at least p% below amax + one bin
        a = np.abs(x.astype(np.float32))
        if h.abs_counts[0] < p / 100 * h.count and amax < h.amax:  # not bin 0 (amax = its upper edge), not clamped
            assert np.mean(a < amax) < p / 100 + 1e-12 <= np.mean(a < amax + h.abs_width) + 2e-12


def test_max_is_the_exact_observed_max():
    for x in _samples().values():
        assert compute_amax(_hist(x), "max") == float(np.abs(x.astype(np.float32)).max())


@pytest.mark.parametrize("name", ["normal", "relu", "outliers", "uniform"])
def test_mse_minimises_the_expected_error_of_the_slow_reference(name):
    h = _hist(_samples()[name], 256)
    top = h.amax
    chosen = amax_mse(h.abs_counts, h.abs_width, h.zeros, top)
    grid = [i * h.abs_width for i in range(16, 257) if i * h.abs_width < top] + [top]
    errors = [slow_expected_error(h.abs_counts, h.abs_width, h.zeros, top, a) for a in grid]
    best = min(errors)
    assert chosen in grid
    assert slow_expected_error(h.abs_counts, h.abs_width, h.zeros, top, chosen) <= best * 1.002
    model = HistogramErrorModel(h.abs_counts, h.abs_width, h.zeros, top)
    np.testing.assert_allclose(model.squared_error(np.array(grid)), errors, rtol=2e-3)


@pytest.mark.parametrize("name", ["normal", "laplace", "relu", "outliers", "sparse", "few"])
def test_histogram_errors_match_direct_fake_quant_on_raw_values(name):
    x = _samples()[name].astype(np.float32)
    h = _hist(x)
    amax = {m: compute_amax(h, m, 99.9) for m in ("max", "percentile", "entropy", "mse")}
    errors = tensor_errors(h, amax)
    xd = x.astype(np.float64)
    bulk = np.abs(xd) <= bulk_bound(h)
    assert bulk.mean() >= 0.999
    for method, a in amax.items():
        d = fake_quant(xd, a) - xd
        total = 10 * math.log10(np.sum(xd**2) / np.sum(d**2))
        bulk_db = 10 * math.log10(np.sum(xd[bulk] ** 2) / np.sum(d[bulk] ** 2))
        e = errors[method]
        assert e.sqnr_db == pytest.approx(total, abs=0.1), method
        assert e.bulk_sqnr_db == pytest.approx(bulk_db, abs=0.1), method
        assert e.clipped_fraction == pytest.approx(np.mean(np.abs(xd) > a), abs=2e-4 + 2 / x.size), method
    assert errors["max"].clipped_fraction == 0.0


def test_fake_quant_convention():
    scale = 1.0 / 127
    x = np.array([0.5, 1.5, 2.5, -2.5, 200.0, -200.0]) * scale
    np.testing.assert_allclose(fake_quant(x, 1.0) / scale, [0, 2, 2, -2, 127, -127])  # half to even, +-127


def test_sensitivity_ranks_worst_first_with_topological_ties():
    hs = {"a": _hist(_samples()["normal"]), "b": _hist(_samples()["outliers"]), "c": _hist(_samples()["normal"])}
    errors = {t: tensor_errors(h, {"max": compute_amax(h, "max"), "percentile": compute_amax(h, "percentile", 99.9)})
              for t, h in hs.items()}
    ranked = rank_sensitivity(errors, "max", ["c", "b", "a"])
    assert [e.tensor for e in ranked] == ["b", "c", "a"]
    assert ranked[0].worst_sqnr_db == errors["b"]["max"].bulk_sqnr_db < 5
    # percentile(99.9) saves the bulk but clips the outliers' energy: by worst_sqnr_db, max stays best here
    assert errors["b"]["percentile"].bulk_sqnr_db > 30 and errors["b"]["percentile"].sqnr_db < 5
    assert ranked[0].best_method == max(errors["b"], key=lambda m: errors["b"][m].worst_sqnr_db) == "max"
