"""Our TensorRT/ModelOpt rules against NVIDIA ModelOpt's own code (the oracle; a test-only dependency), and the
whole pipeline against ModelOpt and ONNX Runtime on a real model with rendered-text feeds.

ModelOpt 0.47's ``_compute_amax_mse`` passes ``num_bits`` into ``fake_tensor_quant``'s ``bias`` parameter (every
centre comes back as amax + 8); the oracle binds those arguments by name (see scripts/calibration_fidelity.py).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
from conftest import REPO

from workbench.calibrate.trt_histogram import GrowingHistogram
from workbench.calibrate.trt_rules import amax_entropy, amax_mse, amax_percentile

mo_hist = pytest.importorskip("modelopt.torch.quantization.calib.histogram",
                              reason="nvidia-modelopt (the oracle) is not installed: pip install nvidia-modelopt")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "scripts"))
import calibration_fidelity as fidelity  # noqa: E402


def _batches(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(int(rng.integers(1, 4))):
        x = (rng.standard_normal(int(rng.integers(2000, 30000))) ** 3 * rng.uniform(0.05, 20)).astype(np.float32)
        out.append(np.maximum(x, 0) if seed % 3 == 0 else x)
    return out


def _modelopt(batches: list[np.ndarray]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = mo_hist.HistogramCalibrator(num_bits=8, unsigned=False, num_bins=2048)
        for x in batches:
            cal.collect(torch.from_numpy(x))
    return cal


def test_growing_histogram_counts_are_modelopts():
    """Counts equal ModelOpt's bit for bit. The one allowed difference: after a growth, torch's CPU arange
    rounds some vector lanes one float32 ulp away from its scalar (and CUDA) formula, which we follow; then the
    last edge differs by an ulp and a value on a bin boundary may land one bin over."""
    lane_rounded = 0
    for seed in range(40):
        batches = _batches(seed)
        cal, g = _modelopt(batches), GrowingHistogram()
        for x in batches:
            g.update(x)
        theirs = cal._calib_hist.numpy()
        if float(cal._calib_bin_edges[-1]) != g.top:
            lane_rounded += 1
            assert theirs.size == g.counts.size and theirs.sum() == g.counts.sum()
            assert np.abs(theirs - g.counts).sum() <= 0.001 * theirs.sum() + 4
            continue
        np.testing.assert_array_equal(theirs, g.counts)
        np.testing.assert_array_equal(cal._calib_bin_edges.numpy()[[0, 1, -1]], g.edges[[0, 1, -1]])
    assert lane_rounded <= 4


@pytest.mark.slow
def test_rules_on_our_histogram_are_modelopts_functions():
    """ModelOpt's entropy search is slow (Python loops over every window): histograms up to 3,000 bins."""
    checked = 0
    for seed in range(12):
        g = GrowingHistogram()
        for x in _batches(seed):
            g.update(x)
        counts, edges = g.int_counts(), g.edges
        assert amax_percentile(g, 99.99) == float(mo_hist._compute_amax_percentile(counts.copy(), edges, 99.99))
        if counts.size > 3000 or checked == 5:
            continue
        checked += 1
        assert amax_entropy(g) == fidelity.modelopt_entropy_on(counts, edges), seed
        if checked <= 2:  # ModelOpt's mse loop is slow too (one torch call per candidate)
            theirs = _modelopt_mse(counts, edges)
            assert abs(amax_mse(g) - theirs) <= g.width * 1.0001, seed
    assert checked >= 3


def _modelopt_mse(counts, edges) -> float:
    from modelopt.torch.quantization.tensor_quant import FakeTensorQuantFunction

    original = mo_hist.fake_tensor_quant
    mo_hist.fake_tensor_quant = lambda x, amax, num_bits=8, unsigned=False: FakeTensorQuantFunction.apply(
        x, amax, None, num_bits, unsigned)
    try:
        return float(mo_hist._compute_amax_mse(counts.copy(), edges, 8, False))
    finally:
        mo_hist.fake_tensor_quant = original


@pytest.mark.slow
def test_real_model_thresholds_are_the_toolchains(fetch_model):
    """PP-OCR direction classifier, 4 rendered-text crops: ModelOpt entropy/percentile/mse within one bin of
    ours (entropy exact on our own histogram), ONNX Runtime's entropy and percentile identical."""
    fetch_model("ppocr-cls")
    result = fidelity.run("ppocr-cls", entropy_sample=5, mse_sample=2, ort_2048_sample=0)
    big = result["tensors_1000"]
    assert big > 150
    assert result["histograms_identical"] >= 0.99 * big
    on_ours = result["entropy_on_our_histogram"]
    assert on_ours["exact"] == on_ours["tensors"] == 5, on_ours["off"]
    for rule in ("entropy", "percentile", "mse"):
        row = result[f"modelopt_{rule}"]
        assert row["share_within_one_bin"] >= 0.99, (rule, row["off"])
    for label in ("ort_entropy_default", "ort_percentile_default"):
        assert result[label]["identical"] == result[label]["tensors"] == big, (label, result[label]["off"])
