"""Calibration helpers around ONNX Runtime's quantizer: the data reader, histogram ranges over finite
tensors only, and explicit range overrides."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def data_reader(feeds: list[dict[str, np.ndarray]]) -> Any:
    """A CalibrationDataReader yielding ``feeds`` once."""
    from onnxruntime.quantization import CalibrationDataReader

    class _FeedReader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

        def __len__(self) -> int:
            return len(feeds)

    return _FeedReader()


@contextlib.contextmanager
def quiet_stdout():
    """ORT's quantization tools print progress and log warnings on the root logger (which, with no handler set, a
    notebook cell shows: ``WARNING:root:Axis 1 is out-of-range for weight ...``); route both to this module's log
    instead (info for the warnings, debug for the progress)."""
    buffer = io.StringIO()
    root = logging.getLogger()
    rerouted = _RootToLog()
    root.addFilter(rerouted)  # a logger filter sees the records logged on root itself only, not propagated ones
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        root.removeFilter(rerouted)
    if buffer.getvalue().strip():
        log.debug("onnxruntime.quantization: %s", buffer.getvalue().strip())


class _RootToLog(logging.Filter):
    """Drops records logged on the root logger, logging their text here at info level."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.info("onnxruntime.quantization: %s", record.getMessage())
        return False


def minmax_ranges(model: Any, ranges: dict, op_types: Any = None) -> Any:
    """TensorsData for ORT's MinMax calibrator from ``ranges`` ({tensor: (min, max)} over the feeds), for the
    tensors that calibrator would select on the shape-inferred ``model`` (float inputs/outputs of the nodes of
    ``op_types``, or of every node), or None when one of them has no range (not float32, not scanned)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorsData

    graph = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*graph.value_info, *graph.output, *graph.input]
             if vi.type.HasField("tensor_type")}
    initializers = {t.name for t in graph.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    wanted = {name for node in graph.node if not op_types or node.op_type in op_types
              for name in [*node.input, *node.output]
              if types.get(name) in floats and name not in initializers}
    ranges = {**_constant_ranges(graph, wanted - set(ranges)), **ranges}
    if not wanted or any(name not in ranges for name in wanted):
        return None
    return TensorsData(CalibrationMethod.MinMax, {name: ranges[name] for name in sorted(wanted)})


def _constant_ranges(graph: Any, names: set[str]) -> dict:
    """(min, max) of the float32 Constant-node outputs among ``names`` (a tensor scan does not mark them)."""
    from onnx import numpy_helper

    out = {}
    for node in graph.node:
        if node.op_type != "Constant" or not node.output or node.output[0] not in names:
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        array = numpy_helper.to_array(value) if value is not None else None
        if array is not None and array.dtype == np.float32 and np.isfinite(array).all():
            out[node.output[0]] = minmax_of(array)
    return out


def minmax_of(array: np.ndarray, bounds: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) of a float32 array as ORT's MinMax calibrator reduces it: float32 arrays of shape (1,); an
    empty array gives ReduceMin's and ReduceMax's identities, (inf, -inf). ``bounds``: ``(array.min(),
    array.max())`` when the caller has them already."""
    if not array.size:
        return np.array([np.inf], np.float32), np.array([-np.inf], np.float32)
    low, high = bounds if bounds is not None else (array.min(), array.max())
    return np.array([low], np.float32), np.array([high], np.float32)


def histogram_ranges(values: dict[str, list[np.ndarray]], method: str, percentile: float) -> Any:
    """TensorsData from ORT's own HistogramCollector (as its Percentile/Entropy calibrators configure it) over
    the given arrays: used when some tensors are non-finite, which ORT's calibrators cannot histogram."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import HistogramCollector, TensorsData

    usable = {k: v for k, v in values.items() if v and v[0].dtype in (np.float32, np.float16)}
    if method == "percentile":
        collector = HistogramCollector("percentile", True, 2048, 128, percentile, "same")
        calib = CalibrationMethod.Percentile
    else:
        collector = HistogramCollector("entropy", False, 128, 128, percentile, "same")
        calib = CalibrationMethod.Entropy
    with quiet_stdout():
        collector.collect(usable)
        return TensorsData(calib, collector.compute_collection_result())


def range_overrides(
    ranges: dict[str, tuple[float, float]], tensors: set[str], initializers: set[str], unsigned: bool,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """``TensorQuantOverrides`` with symmetric scale/zero-point from each tensor's amax (int8: scale amax/127,
    zero point 0; uint8: scale 2*amax/255, zero point 128), and notes on the ranges left out."""
    overrides: dict[str, list[dict[str, Any]]] = {}
    notes = []
    for name, (lo, hi) in ranges.items():
        amax = max(abs(float(lo)), abs(float(hi)))
        if name not in tensors:
            notes.append(f"range for {name} ignored: no such tensor in the model")
        elif name in initializers:
            notes.append(f"range for {name} ignored: it is a weight (weights are calibrated from their values)")
        elif not np.isfinite(amax) or amax <= 0:
            notes.append(f"range for {name} ignored: amax {amax} is not a positive finite number")
        elif unsigned:
            overrides[name] = [{"scale": np.array(2 * amax / 255, np.float32), "zero_point": np.array(128, np.uint8)}]
        else:
            overrides[name] = [{"scale": np.array(amax / 127, np.float32), "zero_point": np.array(0, np.int8)}]
    return overrides, notes
