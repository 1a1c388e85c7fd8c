"""INT8 calibration diagnostics: streaming histograms of every activation, ranges by max / percentile /
entropy (TensorRT's) / mse, their quantization error from the histograms, tensors ranked by sensitivity, a sweep
on the model's outputs, representativeness of the calibration data, TensorRT caches and ORT tables, QDQ models.

    from workbench.calibrate import calibrate
    report = calibrate("model.onnx", "calib_feeds/", eval_data="eval_feeds/", sweep=True)
    report.sensitivity_frame(); report.write_trt_cache("model.cache", "entropy"); report.save_qdq("m.int8.onnx")
"""

from __future__ import annotations

from .._lazy import callable_package, lazy_exports

_LAZY = {
    "calibrate": "workbench.calibrate.api",
    "CalibrationReport": "workbench.calibrate.report",
    "ImportedThresholds": "workbench.calibrate.report",
    "TensorHistogram": "workbench.calibrate.histogram",
    "QuantError": "workbench.calibrate.errors",
    "SensitivityEntry": "workbench.calibrate.errors",
    "Representativeness": "workbench.calibrate.represent",
    "SweepResult": "workbench.calibrate.sweep",
    "SweepEntry": "workbench.calibrate.sweep",
    "TrtCache": "workbench.calibrate.formats",
    "CalibrationError": "workbench.calibrate.exceptions",
    "CacheFormatError": "workbench.calibrate.exceptions",
    "METHODS": "workbench.calibrate.methods",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
callable_package(__name__, "workbench.calibrate.api", "calibrate")  # workbench.calibrate(...)
