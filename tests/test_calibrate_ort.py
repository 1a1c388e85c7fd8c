"""Our ONNX Runtime rules against ONNX Runtime's own calibrators (create_calibrator / collect_data /
compute_data) on the same model and feeds: ort-entropy and ort-percentile must give ORT's ranges bit for bit,
max ORT's MinMax. TensorRT's entropy (``entropy``) is a different rule: on an isolated outlier cluster ORT's
smoothed KL clips it and TensorRT's keeps it.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.calibrate import calibrate
from workbench.variants.calibration import data_reader

OUTLIER = "/mlp/fc2/Add_output_0"


def _recipe() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(32)]


def _ort_calibrate(model: Path, feeds, method, tmp_path, **extra) -> dict[str, tuple[float, float]]:
    """{tensor: (lowest, highest)} from ORT's calibrator (float32 values as Python floats)."""
    from onnxruntime.quantization.calibrate import create_calibrator

    with contextlib.redirect_stdout(io.StringIO()):
        calibrator = create_calibrator(model, None, augmented_model_path=str(tmp_path / f"aug_{method.name}.onnx"),
                                       calibrate_method=method, extra_options=extra)
        calibrator.collect_data(data_reader(feeds))
        data = calibrator.compute_data()
    return {name: (float(np.ravel(td.range_value[0])[0]), float(np.ravel(td.range_value[1])[0]))
            for name, td in data.data.items()}


def _amax(bounds: tuple[float, float]) -> float:
    return max(abs(bounds[0]), abs(bounds[1]))


@pytest.fixture(scope="module")
def outlier_report():
    return calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), ort_entropy_bins=2048)


def test_minmax_equals_ort_exactly(outlier_report, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    ort = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.MinMax, tmp_path)
    assert set(outlier_report.tensors) <= set(ort)
    for t in outlier_report.tensors:
        assert outlier_report.ranges["max"][t] == _amax(ort[t]), t


def test_ort_percentile_is_ort_calibrators_range(outlier_report, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    ort = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.Percentile, tmp_path)
    assert {t: outlier_report.bounds["ort-percentile"][t] for t in outlier_report.tensors} == {
        t: ort[t] for t in outlier_report.tensors}
    other = calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), methods=("ort-percentile",), percentile=99.9)
    ort = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.Percentile, tmp_path,
                         percentile=99.9)
    assert all(other.bounds["ort-percentile"][t] == ort[t] for t in other.tensors)


@pytest.mark.parametrize("bins", [128, 2048])
def test_ort_entropy_is_ort_calibrators_range(outlier_report, tmp_path, bins):
    from onnxruntime.quantization import CalibrationMethod

    report = outlier_report if bins == 2048 else calibrate(SAMPLES / "int8_outlier.onnx", _recipe(),
                                                           methods=("ort-entropy",))
    ort = _ort_calibrate(SAMPLES / "int8_outlier.onnx", _recipe(), CalibrationMethod.Entropy, tmp_path,
                         num_bins=bins, num_quantized_bins=128)
    assert {t: report.bounds["ort-entropy"][t] for t in report.tensors} == {t: ort[t] for t in report.tensors}
    if bins == 128:  # a single window: ORT's default entropy is its min/max
        assert all(_amax(ort[t]) == report.histograms[t].amax for t in report.tensors)


def test_tensorrt_entropy_keeps_the_outlier_cluster_that_ort_entropy_clips(outlier_report):
    """The isolated outlier column (0.05% of values): ORT's smoothed KL clips it, TensorRT's rule cannot."""
    assert outlier_report.ranges["ort-entropy"][OUTLIER] < 50 < 300 < outlier_report.ranges["entropy"][OUTLIER]


@pytest.mark.slow
def test_ppocr_rec_ort_rules_equal_ort_calibrators(fetch_model, tmp_path):
    from onnxruntime.quantization import CalibrationMethod

    from workbench.inputs import random_feeds
    from workbench.model.load import load_model

    path = fetch_model("ppocr-rec")
    loaded = load_model(path)
    feeds = random_feeds(loaded.proto, seed=0, count=2, shapes={"x": [1, 3, 48, 320]})
    report = calibrate(loaded, feeds, methods=("max", "ort-entropy", "ort-percentile"))
    assert len(report.tensors) > 350
    ort = _ort_calibrate(path, feeds, CalibrationMethod.MinMax, tmp_path)
    rel = [abs(report.ranges["max"][t] - _amax(ort[t])) / _amax(ort[t]) for t in report.tensors if _amax(ort[t])]
    assert len(rel) >= len(report.tensors) - 2 and max(rel) < 1e-5
    for method, rule in ((CalibrationMethod.Entropy, "ort-entropy"), (CalibrationMethod.Percentile, "ort-percentile")):
        ort = _ort_calibrate(path, feeds, method, tmp_path)
        names = [t for t in report.tensors if t in ort]
        assert len(names) >= len(report.tensors) - 2
        off = [t for t in names if report.bounds[rule][t] != ort[t]]
        assert not off, (rule, [(t, report.bounds[rule][t], ort[t]) for t in off[:5]])


def test_ort_entropy_equals_ort_histogram_collector_on_varied_data():
    """Bin counts 256..2048, heavy tails, ReLU zeros: the float64 screen plus float32 re-scoring picks ORT's
    window every time."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    from workbench.calibrate.ort_rules import OrtHistograms, entropy_range

    rng = np.random.default_rng(1)
    for trial in range(16):
        n = int(rng.integers(50, 5000))
        feeds = [(rng.standard_normal((1, 3, n)) ** int(rng.integers(1, 4)) * rng.uniform(0.1, 5)).astype(np.float32)
                 for _ in range(2)]
        if trial % 3 == 0:
            feeds = [np.maximum(f, 0) for f in feeds]
        bins = [2048, 512, 1024, 256][trial % 4]
        collector = HistogramCollector("entropy", False, bins, 128, 99.999, "same")
        with contextlib.redirect_stdout(io.StringIO()):
            collector.collect({"t": feeds})
            lo, hi = collector.compute_collection_result()["t"][:2]
        values = np.concatenate([f.ravel() for f in feeds])
        h = OrtHistograms(values.min(), values.max(), np.abs(values).min(), entropy_bins=bins)
        for f in feeds:
            h.update(f)
        assert entropy_range(h) == (float(lo), float(hi)), trial


def test_fixed_histogram_is_numpys_histogram():
    """Our fast binning against np.histogram itself, with values placed exactly on and one ulp around every edge."""
    from workbench.calibrate.ort_rules import fixed_histogram

    rng = np.random.default_rng(0)
    for trial in range(60):
        x = (rng.standard_normal(int(rng.integers(1, 200000))) ** int(rng.integers(1, 4))
             * rng.uniform(1e-3, 1e3)).astype(np.float32)
        if trial % 3 == 0:
            x = np.abs(x)
        bins = int(rng.choice([128, 1000, 2048, 4096]))
        top = np.array(np.abs(x).max(), dtype=np.float32)
        lo = -top if trial % 3 else np.float32(x.min())
        _, edges = np.histogram(x, bins, range=(lo, top))
        near = [edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))]
        values = np.concatenate([x, *(e.astype(np.float32) for e in near)])
        expected, _ = np.histogram(values, bins, range=(lo, top))
        np.testing.assert_array_equal(fixed_histogram(values, edges), expected)
