"""Range rules, each named after the toolchain whose threshold it reproduces, and one dispatch over them.

=============== ======================================================== ================================
name            whose rule                                               histogram it reads
=============== ======================================================== ================================
max             max |x| (TensorRT MinMaxCalibration, ModelOpt max)       exact min/max
entropy         TensorRT EntropyCalibration2 as ModelOpt ports it        TensorRT/ModelOpt |x| (grown)
percentile      ModelOpt percentile (99.99 by default)                   TensorRT/ModelOpt |x| (grown)
mse             ModelOpt mse                                             TensorRT/ModelOpt |x| (grown)
ort-entropy     ONNX Runtime quantize_static, CalibrationMethod.Entropy  ORT signed, fixed range
ort-percentile  ONNX Runtime quantize_static, Percentile (99.999)        ORT |x|, fixed range
=============== ======================================================== ================================

The rules themselves live in trt_rules.py and ort_rules.py. Each returns (lowest, highest); every rule but
the ORT ones is symmetric (-amax, amax). ``percentile=None`` means each rule's own default.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ort_rules, trt_rules
from .exceptions import CalibrationError
from .histogram import TensorHistogram


@dataclass(frozen=True)
class Rule:
    name: str
    toolchain: str
    label: str
    reads: str  # "exact", "trt" or "ort"


RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("max", "TensorRT/ModelOpt/ONNX Runtime", "max |x| (MinMax)", "exact"),
    Rule("entropy", "TensorRT", "TensorRT EntropyCalibration2 (ModelOpt's port: KL search, last minimum)", "trt"),
    Rule("percentile", "ModelOpt", "ModelOpt percentile (lower bin edge, 99.99 by default)", "trt"),
    Rule("mse", "ModelOpt", "ModelOpt mse (bin centre with the least fake-quant error)", "trt"),
    Rule("ort-entropy", "ONNX Runtime", "ONNX Runtime quantize_static entropy (smoothed KL, signed histogram)",
         "ort"),
    Rule("ort-percentile", "ONNX Runtime", "ONNX Runtime quantize_static percentile (99.999 by default)", "ort"),
)}
METHODS = tuple(RULES)
#: the rule TensorRT applies when a user asks it for INT8 calibration
DEFAULT_METHOD = "entropy"
DEFAULT_PERCENTILES = {"percentile": trt_rules.DEFAULT_PERCENTILE, "ort-percentile": ort_rules.DEFAULT_PERCENTILE}
#: kept for callers that want one number: ModelOpt's default
DEFAULT_PERCENTILE = trt_rules.DEFAULT_PERCENTILE
_RENAMED = {"ort_entropy": "ort-entropy", "ort_percentile": "ort-percentile"}


def check_methods(methods) -> tuple[str, ...]:
    """Validated, de-duplicated method names (``ort_entropy`` is read as ``ort-entropy``)."""
    if isinstance(methods, str):
        methods = (methods,)
    out = tuple(dict.fromkeys(_RENAMED.get(str(m).lower(), str(m).lower()) for m in methods))
    bad = [m for m in out if m not in RULES]
    if bad or not out:
        raise CalibrationError(f"unknown calibration method(s) {', '.join(bad) or '(none)'}",
                               f"use {', '.join(METHODS)}")
    return out


def check_percentile(p: float | None) -> float | None:
    if p is None:
        return None
    p = float(p)
    if not 0 < p <= 100:
        raise CalibrationError(f"percentile {p} is outside (0, 100]", "use e.g. 99.99 or 99.9")
    return p


def needs(methods) -> set[str]:
    """The histograms ``methods`` read: a subset of {"trt", "ort"}."""
    return {RULES[m].reads for m in methods} & {"trt", "ort"}


def percentile_of(method: str, percentile: float | None) -> float:
    return DEFAULT_PERCENTILES.get(method, DEFAULT_PERCENTILE) if percentile is None else float(percentile)


def compute_range(method: str, h: TensorHistogram, *, trt=None, ort=None, percentile: float | None = None,
                  ort_levels: int = ort_rules.QUANTIZED_BINS) -> tuple[float, float]:
    """(lowest, highest) of one tensor under ``method``; (0.0, 0.0) for a tensor without finite values.
    ``trt``: its GrowingHistogram; ``ort``: its OrtHistograms (needed by the rules that read them)."""
    if method not in RULES:
        raise CalibrationError(f"unknown calibration method {method!r}", f"use {', '.join(METHODS)}")
    if h.count == 0:
        return 0.0, 0.0
    reads = RULES[method].reads
    if (reads == "trt" and trt is None) or (reads == "ort" and ort is None):
        raise CalibrationError(f"method {method!r} needs the {reads.upper()} histogram, which was not collected",
                               "calibrate again with this method selected")
    if method == "max":
        amax = h.amax
    elif method == "entropy":
        amax = trt_rules.amax_entropy(trt)
    elif method == "percentile":
        amax = trt_rules.amax_percentile(trt, percentile_of(method, percentile))
    elif method == "mse":
        amax = trt_rules.amax_mse(trt)
    elif method == "ort-entropy":
        return ort_rules.entropy_range(ort, ort_levels)
    else:
        return ort_rules.percentile_range(ort, percentile_of(method, percentile))
    return -amax, amax


def compute_amax(method: str, h: TensorHistogram, **kwargs) -> float:
    """max(|lowest|, |highest|) of :func:`compute_range`."""
    lo, hi = compute_range(method, h, **kwargs)
    return max(abs(lo), abs(hi))
