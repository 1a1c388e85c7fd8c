"""Cross-checks against ONNX Runtime's own calibrators (create_calibrator / HistogramCollector) on the same data.

What is genuinely equal, and what is not:
- MinMax: amax = max(|min|, |max|) is the same number (exactly where both run the same kernels).
- Percentile (ORT: |x| histogram of 2048 bins over [min |x|, max |x|], threshold = lower edge of the bin where
  the CDF reaches p, clamped to the observed range): our function on ORT's histogram gives ORT's threshold
  exactly; on our own (power-of-two) grid the two differ by less than one bin of either grid.
- Entropy: a different algorithm. ORT (MXNet's) uses a SIGNED histogram, windows of 2i+1 bins symmetric around
  zero merged into 128 levels (64 per side: a 7-bit search where TensorRT's is 8-bit), and smooths zeros with
  eps=1e-4, so a window whose last bin is empty is not infinitely bad. Thresholds agree on dense tensors to
  within tens of percent, not bins; on an isolated outlier cluster ORT clips it and TensorRT's rule keeps it.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.calibrate import calibrate
from workbench.calibrate.methods import amax_percentile
from workbench.variants.calibration import data_reader

OUTLIER = "/mlp/fc2/Add_output_0"


def _recipe() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(32)]


def _ort_calibrate(model: Path, feeds, method, tmp_path, **extra):
    from onnxruntime.quantization.calibrate import create_calibrator

    with contextlib.redirect_stdout(io.StringIO()):
        calibrator = create_calibrator(model, None, augmented_model_path=str(tmp_path / f"aug_{method.name}.onnx"),
                                       calibrate_method=method, extra_options=extra)
        calibrator.collect_data(data_reader(feeds))
        data = calibrator.compute_data()
    amax = {}
    for name, td in data.data.items():
        lo, hi = td.range_value
        amax[name] = max(abs(float(np.ravel(lo)[0])), abs(float(np.ravel(hi)[0])))
    return amax, calibrator


@pytest.fixture(scope="module")
def outlier_report():
    return calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), percentile=99.99)


def test_minmax_equals_ort_exactly(outlier_report, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    ort, _ = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.MinMax, tmp_path)
    assert set(outlier_report.tensors) <= set(ort)
    for t in outlier_report.tensors:
        assert outlier_report.ranges["max"][t] == ort[t], t


def test_percentile_equals_ort_on_its_histogram_and_within_a_bin_on_ours(outlier_report, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    ort, calibrator = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.Percentile,
                                     tmp_path, percentile=99.99, num_bins=2048, symmetric=True)
    for t in outlier_report.tensors:
        counts, edges, lo, hi = calibrator.collector.histogram_dict[t]
        assert amax_percentile(counts, edges, 99.99, max(abs(float(lo)), abs(float(hi)))) == pytest.approx(
            ort[t], rel=1e-7), t
        ours = outlier_report.ranges["percentile"][t]
        assert abs(ours - ort[t]) <= outlier_report.histograms[t].abs_width + float(edges[1] - edges[0]), t


def test_entropy_against_ort_with_2048_bins(outlier_report, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    ort, _ = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.Entropy, tmp_path,
                            num_bins=2048, num_quantized_bins=128)
    ours = outlier_report.ranges["entropy"]
    dense = [t for t in outlier_report.tensors if t not in (OUTLIER, "/mlp/relu2/Relu_output_0")]
    ratios = {t: ours[t] / ort[t] for t in dense}
    assert all(0.7 < r < 1.4 for r in ratios.values()), ratios
    # the isolated outlier column (0.05% of values): ORT's smoothed KL clips it, TensorRT's rule cannot
    assert ort[OUTLIER] < 50 < 300 < ours[OUTLIER]


@pytest.mark.slow
def test_ppocr_rec_against_ort_minmax_percentile_entropy(fetch_model, tmp_path):
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import HistogramCollector

    from workbench.engines import get_engine
    from workbench.inputs import random_feeds
    from workbench.model.load import load_model

    path = fetch_model("ppocr-rec")
    loaded = load_model(path)
    feeds = random_feeds(loaded.proto, seed=0, count=2, shapes={"x": [1, 3, 48, 320]})
    report = calibrate(loaded, feeds, percentile=99.99)
    assert len(report.tensors) > 350

    ort, _ = _ort_calibrate(path, feeds, CalibrationMethod.MinMax, tmp_path)
    # ORT's calibrator runs without graph optimisation, ours with it: float rounding may differ in the last digits
    rel = [abs(report.ranges["max"][t] - ort[t]) / ort[t] for t in report.tensors if ort[t] > 0]
    assert len(rel) >= len(report.tensors) - 2 and max(rel) < 1e-5

    names = report.tensors[1::24]
    with get_engine("ort").prepare(loaded.proto, names) as session:
        values = [session.run(f) for f in feeds]
    arrays = {n: [v[n] for v in values] for n in names}
    percentile = HistogramCollector("percentile", True, 2048, 128, 99.99, "same")
    entropy = HistogramCollector("entropy", False, 2048, 128, 99.99, "same")
    with contextlib.redirect_stdout(io.StringIO()):
        percentile.collect(arrays)
        ort_percentile = percentile.compute_collection_result()
        entropy.collect(arrays)
        ort_entropy = entropy.compute_collection_result()
    def amax(result):
        return max(abs(float(result[0])), abs(float(result[1])))

    for n in names:
        counts, edges, lo, hi = percentile.histogram_dict[n]
        top = max(abs(float(lo)), abs(float(hi)))
        assert amax_percentile(counts, edges, 99.99, top) == pytest.approx(amax(ort_percentile[n]), rel=1e-7)
        assert abs(report.ranges["percentile"][n] - amax(ort_percentile[n])) <= (
            report.histograms[n].abs_width + float(edges[1] - edges[0]))
    log_ratios = np.array([abs(math.log(report.ranges["entropy"][n] / amax(ort_entropy[n]))) for n in names])
    assert np.median(log_ratios) < 0.15 and np.mean(log_ratios < math.log(1.5)) >= 0.75, log_ratios
