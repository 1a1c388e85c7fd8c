"""Finding tensors that hold NaN or +-inf on calibration feeds (additive -inf masks), by running every
intermediate on ONNX Runtime; such tensors break calibration ranges."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..core.budget import chunks, tensor_bytes
from ..engines.outputs import mark_outputs
from ..errors import VariantError
from .calibration import minmax_of
from .graph_names import elem_types
from .ort_session import first_line, ort_session

log = logging.getLogger(__name__)

#: the most bytes of marked tensors one run of a tensor scan returns (estimated by shape inference for the first
#: feed; an unknown size counts as the largest known): a PP-OCRv4 recognizer's 511 tensors come back in 3 runs,
#: and its repair's peak RSS went from 737 to 327 MiB (ONNX Runtime's buffers for hundreds of outputs at once)
SCAN_BYTES = 256 << 20
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


@dataclass
class TensorScan:
    """``nonfinite``: tensor -> what it held ("-inf", "nan, +inf"). ``values``: per tensor, its arrays over the
    feeds (only when asked for, and only for tensors that stayed finite). ``ranges``: per float32 tensor that
    stayed finite, its (min, max) over the feeds as ONNX Runtime's MinMax calibrator reduces them (only when asked
    for)."""

    nonfinite: dict[str, str] = field(default_factory=dict)
    values: dict[str, list[np.ndarray]] = field(default_factory=dict)
    ranges: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def scan_tensors(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], keep_values: bool = False,
                 keep_ranges: bool = False, only: set[str] | None = None) -> TensorScan:
    """Run ``model`` over ``feeds`` with every main-graph float tensor (of ``only``, when given) marked as an
    output (``keep_values``: keep the finite tensors' arrays; ``keep_ranges``: their min/max), in groups of at most
    :data:`SCAN_BYTES` per run."""
    types = elem_types(model)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    produced = [o for n in model.graph.node for o in n.output if o and types.get(o, onnx.TensorProto.FLOAT) in _FLOATS
                and (only is None or o in only)]
    names = list(dict.fromkeys(o for o in produced if o not in inputs))
    # the marked tensors of a feed come back at once: in groups of at most SCAN_BYTES each (a session per group)
    groups = list(chunks(names, tensor_bytes(model, feeds[0]), SCAN_BYTES)) if names and feeds else [[]]
    scan = TensorScan()
    kinds: dict[str, set[str]] = {}
    for g, group in enumerate(groups):
        session = _scan_session(model, group) if group else None  # none: the graph inputs alone
        for feed in feeds:
            try:
                outputs = session.run(group, feed) if session is not None else []
            except Exception as e:  # noqa: BLE001 - onnxruntime raises assorted pybind exception types
                raise VariantError(f"ONNX Runtime failed on a calibration feed: {first_line(e)[:300]}",
                                   "check the calibration feeds against the model (workbench check-inputs)") from None
            arrays = dict(zip(group, outputs))
            if g == 0:  # the graph inputs, once
                arrays.update({k: v for k, v in feed.items() if k in inputs})
            for name, arr in arrays.items():
                if not isinstance(arr, np.ndarray) or arr.dtype.kind != "f":
                    continue
                bounds = (arr.min(), arr.max()) if arr.size else None  # NaN and +-inf come out of min/max
                if bounds is not None and not (np.isfinite(bounds[0]) and np.isfinite(bounds[1])):
                    kinds.setdefault(name, set()).update(_nonfinite_kinds(arr))
                    continue
                if keep_values and name not in kinds:
                    scan.values.setdefault(name, []).append(arr)
                if keep_ranges and arr.dtype == np.float32:
                    _widen(scan.ranges, name, *minmax_of(arr, bounds))
            del arrays, outputs
        del session
    scan.nonfinite = {name: ", ".join(sorted(k)) for name, k in kinds.items()}
    for name in scan.nonfinite:
        scan.values.pop(name, None)
        scan.ranges.pop(name, None)
    if scan.nonfinite:
        log.info("non-finite tensors on the calibration feeds: %s", scan.nonfinite)
    return scan


def _scan_session(model: onnx.ModelProto, names: list[str]):
    try:
        return ort_session(mark_outputs(model, names))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises assorted pybind exception types
        raise VariantError(
            f"ONNX Runtime cannot run the model to check tensor ranges before quantizing: {first_line(e)[:300]}",
            "check that the FP32 model runs on ONNX Runtime (workbench run --engine ort)",
        ) from None


def _widen(ranges: dict, name: str, low: np.ndarray, high: np.ndarray) -> None:
    """``ranges[name]`` widened to hold (``low``, ``high``): :func:`minmax_of` of one more array."""
    if name in ranges:
        low, high = np.minimum(ranges[name][0], low), np.maximum(ranges[name][1], high)
    ranges[name] = (low, high)


def _nonfinite_kinds(arr: np.ndarray) -> set[str]:
    if np.isfinite(arr).all():
        return set()
    found = set()
    if np.isnan(arr).any():
        found.add("nan")
    if np.isposinf(arr).any():
        found.add("+inf")
    if np.isneginf(arr).any():
        found.add("-inf")
    return found


def nodes_touching(model: onnx.ModelProto, tensors: dict[str, str]) -> list[dict[str, str]]:
    """``[{"node", "reason"}]`` for main-graph nodes that produce or read a tensor of ``tensors``."""
    reasons: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.output:
            if name in tensors:
                reasons.setdefault(node.name, []).append(f"produces {name} ({tensors[name]} on the calibration feeds)")
        for name in dict.fromkeys(node.input):
            if name in tensors:
                reasons.setdefault(node.name, []).append(f"reads {name} ({tensors[name]} on the calibration feeds)")
    return [{"node": node, "reason": "; ".join(why)} for node, why in reasons.items()]
