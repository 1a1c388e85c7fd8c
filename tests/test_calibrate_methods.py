"""Range rules and histogram-based errors against slow, plainly written references, torch.histc and direct
fake-quant (ModelOpt and ONNX Runtime themselves are the oracles in test_calibrate_fidelity.py and
test_calibrate_ort.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.calibrate.errors import bulk_bound, rank_sensitivity, tensor_errors
from workbench.calibrate.fakequant import fake_quant
from workbench.calibrate.histogram import TensorHistogram
from workbench.calibrate.methods import METHODS, check_methods, compute_amax, compute_range
from workbench.calibrate.ort_rules import OrtHistograms
from workbench.calibrate.trt_histogram import GrowingHistogram, histc32, linspace32
from workbench.calibrate.trt_rules import amax_entropy, amax_mse, amax_percentile, entropy_divergences, level_bounds


def _samples() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    relu = np.maximum(rng.standard_normal(60000), 0)
    outliers = np.concatenate([rng.standard_normal(60000), rng.uniform(300, 400, 30)])
    sparse = np.concatenate([rng.standard_normal(3000), [40.0, 41.0, 90.0]])
    return {"normal": rng.standard_normal(80000), "laplace": rng.laplace(size=50000), "relu": relu,
            "outliers": outliers, "sparse": sparse, "few": rng.standard_normal(200),
            "uniform": rng.uniform(-1, 1, 40000)}


def _hists(x: np.ndarray, batches: int = 1, bins: int = 2048):
    """Our histogram, TensorRT/ModelOpt's (``batches`` batches) and ONNX Runtime's, of the same values."""
    x = np.asarray(x, np.float32)
    h, g = TensorHistogram.empty(2048), GrowingHistogram(bins)
    parts = np.array_split(x, batches)
    for part in parts:
        h.update(part)
        g.update(part)
    o = OrtHistograms(np.float32(h.min), np.float32(h.max), np.float32(g.low))
    for part in parts:
        o.update(part)
    return h, g, o


def _amax(x, method, percentile=None):
    h, g, o = _hists(x)
    return compute_amax(method, h, trt=g, ort=o, percentile=percentile)


# --- slow references: one candidate at a time, the rule as ModelOpt documents it ----------------------------------

def slow_entropy(counts: np.ndarray, edges: np.ndarray, nq: int = 128) -> tuple[dict[int, float], float]:
    """({window: KL}, amax) of ModelOpt's entropy search written plainly: bins[0] = bins[1]; for each window i,
    levels by np.digitize over np.linspace(0, i, nq + 1); P with the tail in its last bin; Q spread over
    the non-zero bins of each level; KL with P > 0 = Q infinite; the LAST minimum; amax = edges[i]."""
    b = np.asarray(counts, dtype=np.int64).copy()
    b[0] = b[1]
    out = {}
    for i in range(nq, b.size + 1):
        level = np.digitize(range(i), np.linspace(0, i, num=nq + 1)) - 1
        p = b[:i].astype(np.float64)
        p[-1] += b[i:].sum()
        q = np.zeros(i)
        for k in range(nq):
            members = [j for j in np.flatnonzero(level == k) if b[j] != 0]
            for j in members:
                q[j] = b[members].sum() / len(members)
        if np.any((p > 0) & (q == 0)):
            out[i] = math.inf
            continue
        pn, qn = p / p.sum(), q / q.sum()
        used = pn > 0
        out[i] = float(np.sum(pn[used] * np.log(pn[used] / qn[used])))
    best = min(out.values())
    return out, float(edges[max(i for i, v in out.items() if v == best)])


def slow_percentile(counts: np.ndarray, edges: np.ndarray, p: float) -> float:
    total, running = counts.sum(), 0.0
    for k, c in enumerate(counts):
        running += c / total
        if running >= p / 100:
            return float(edges[k])
    return float(edges[len(counts)])


def slow_mse(counts: np.ndarray, edges: np.ndarray, start: int = 128) -> dict[float, float]:
    """ModelOpt's mse criterion written plainly in float64: {bin centre: mean squared fake-quant error}."""
    centers = ((edges[1:] + edges[:-1]) / np.float32(2)).astype(np.float64)  # float32 centres, as ModelOpt's
    out = {}
    for i in range(start, centers.size):
        scale = 127 / centers[i]
        fake = np.clip(np.rint(centers * scale), -127, 127) / scale
        out[float(centers[i])] = float(np.mean((fake - centers) ** 2 * counts))
    return out


def test_level_bounds_are_numpys_digitize_of_linspace():
    for i in list(range(128, 700)) + list(range(2040, 2100)) + [4093, 4674, 8191]:
        level = np.digitize(range(i), np.linspace(0, i, num=129)) - 1
        bounds = level_bounds(np.array([i]))[0]
        np.testing.assert_array_equal(np.repeat(np.arange(128), np.diff(bounds)), level)


@pytest.mark.parametrize("name", ["normal", "laplace", "relu", "outliers", "sparse", "few"])
def test_entropy_matches_the_slow_reference(name):
    _, g, _ = _hists(_samples()[name], bins=384)
    counts = g.int_counts()
    ref, amax = slow_entropy(counts, g.edges)
    bins = counts.copy()
    bins[0] = bins[1]
    windows, kl = entropy_divergences(bins)
    assert list(windows) == sorted(ref)
    expected = np.array([ref[int(i)] for i in windows])
    assert np.array_equal(np.isinf(kl), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(kl[finite], expected[finite], rtol=1e-9, atol=1e-12)
    assert amax_entropy(g) == amax


def test_entropy_never_clips_into_an_empty_bin():
    """A dense bulk and an isolated outlier cluster: every window ending in an empty bin has infinite KL (P > 0
    where Q = 0), so TensorRT's entropy keeps the cluster; ONNX Runtime's smoothed variant does not (see
    test_calibrate_ort.py)."""
    _, g, _ = _hists(_samples()["outliers"])
    bins = g.int_counts().copy()
    bins[0] = bins[1]
    windows, kl = entropy_divergences(bins)
    empty_last = bins[windows - 1] == 0
    tail = np.array([bins[i:].sum() for i in windows]) > 0
    assert np.all(np.isinf(kl[empty_last & tail])) and np.all(np.isfinite(kl[~empty_last]))
    assert _amax(_samples()["outliers"], "entropy") > 299


def test_zero_bin_is_replaced_so_relu_zeros_do_not_set_the_range():
    """ModelOpt's port replaces bins[0] by bins[1]: with 60% exact zeros, the KL search sees the positive bulk."""
    rng = np.random.default_rng(3)
    x = np.maximum(rng.standard_normal(200000) - 0.25, 0) ** 2
    _, g, _ = _hists(x, bins=256)
    counts = g.int_counts()
    assert counts[0] > 0.5 * counts.sum()
    assert amax_entropy(g) == slow_entropy(counts, g.edges)[1]


@pytest.mark.parametrize("p", [50.0, 99.0, 99.9, 99.99, 100.0])
def test_percentile_matches_the_slow_reference(p):
    for x in _samples().values():
        _, g, _ = _hists(x)
        assert amax_percentile(g, p) == slow_percentile(g.int_counts(), g.edges, p)
        assert _amax(x, "percentile", p) == amax_percentile(g, p)


def test_max_is_the_exact_observed_max():
    for x in _samples().values():
        assert _amax(x, "max") == float(np.abs(x.astype(np.float32)).max())


@pytest.mark.parametrize("name", ["normal", "relu", "outliers", "uniform"])
def test_mse_matches_the_slow_reference(name):
    _, g, _ = _hists(_samples()[name], batches=3, bins=512)
    ours, errors = amax_mse(g), slow_mse(g.int_counts(), g.edges)
    # float32 terms (ours, ModelOpt's) vs float64 here: only near-ties on a flat error curve may differ
    assert ours in errors and errors[ours] <= min(errors.values()) * (1 + 1e-5)


def test_grown_histogram_bins_like_torch_histc():
    """First batch: torch.histc over [0, max]; the grid then grows by whole bins of the first width."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    for scale in (0.01, 1.0, 37.0):
        a = np.abs(rng.standard_normal(50000) * scale).astype(np.float32)
        ref = torch.histc(torch.from_numpy(a), bins=2048, min=0, max=float(a.max())).numpy()
        np.testing.assert_array_equal(histc32(a, 2048, float(a.max())), ref)
        edges = torch.linspace(0, torch.tensor(a.max()), 2049).numpy()
        assert np.max(np.abs(linspace32(a.max(), 2049).view(np.int32) - edges.view(np.int32))) <= 1
    g = GrowingHistogram()
    g.update(np.float32([0.5, 1.0]))
    first_width = g.width
    g.update(np.float32([3.0, 0.25]))
    assert g.grown and g.width == first_width and g.counts.size == int(np.ceil(np.float32(3.0) / first_width))
    assert g.counts.sum() == 4 and g.counts[0] == 0 and g.low == 0.25


def test_method_names_are_checked():
    assert check_methods(["entropy", "ort_entropy", "entropy"]) == ("entropy", "ort-entropy")
    assert set(METHODS) == {"max", "entropy", "percentile", "mse", "ort-entropy", "ort-percentile"}
    from workbench.calibrate.exceptions import CalibrationError

    with pytest.raises(CalibrationError, match="unknown calibration method"):
        check_methods(["kl"])
    h = TensorHistogram.empty(2048).update(np.float32([1, 2]))
    with pytest.raises(CalibrationError, match="needs the TRT histogram"):
        compute_range("entropy", h)


@pytest.mark.parametrize("name", ["normal", "laplace", "relu", "outliers", "sparse", "few"])
def test_histogram_errors_match_direct_fake_quant_on_raw_values(name):
    x = _samples()[name].astype(np.float32)
    h = _hists(x)[0]
    amax = {m: _amax(x, m, 99.9) for m in METHODS}
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
    xs = {"a": _samples()["normal"], "b": _samples()["outliers"], "c": _samples()["normal"]}
    errors = {t: tensor_errors(_hists(x)[0], {"max": _amax(x, "max"), "percentile": _amax(x, "percentile", 99.9)})
              for t, x in xs.items()}
    ranked = rank_sensitivity(errors, "max", ["c", "b", "a"])
    assert [e.tensor for e in ranked] == ["b", "c", "a"]
    assert ranked[0].worst_sqnr_db == errors["b"]["max"].bulk_sqnr_db < 5
    # percentile(99.9) saves the bulk but clips the outliers' energy: by worst_sqnr_db, max stays best here
    assert errors["b"]["percentile"].bulk_sqnr_db > 30 and errors["b"]["percentile"].sqnr_db < 5
    assert ranked[0].best_method == max(errors["b"], key=lambda m: errors["b"][m].worst_sqnr_db) == "max"
