"""The FP16 variant: ONNX Runtime's float16 converter, falling back to onnxconverter-common's, with clamp records."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Sequence

import onnx

from ..core.shapes import infer_shapes_lenient, strip_weights
from ..errors import VariantError
from ..model.graph import sort_nodes
from ..model.walk import iter_nodes
from .clamps import find_clamps
from .fp16_fast import ClampCounter, fill_weights
from .graph_names import check_node_names, elem_types, map_tensors
from .ort_session import first_line
from .result import VariantResult

log = logging.getLogger(__name__)

CONVERTERS = {
    "ort": "onnxruntime.transformers.float16",
    "onnxconverter_common": "onnxconverter_common.float16",
}
#: (min_positive_val, max_finite_val) each converter uses by default.
DEFAULT_LIMITS = {"ort": (5.96e-08, 65504.0), "onnxconverter_common": (1e-07, 1e4)}
_ALIASES = {"onnxruntime": "ort", "occ": "onnxconverter_common", "onnxconverter-common": "onnxconverter_common"}


def to_fp16(
    model: onnx.ModelProto,
    keep_fp32: Sequence[str] = (),
    converter: str = "auto",
    *,
    min_positive_val: float | None = None,
    max_finite_val: float | None = None,
) -> VariantResult:
    """FP16 copy of ``model`` (graph inputs/outputs stay float32); nodes named in ``keep_fp32`` stay float32.

    ``converter``: "auto" (ORT's, then onnxconverter-common's when ORT's raises or yields a model ORT
    rejects), "ort" or "onnxconverter_common". The limits default to the converter's own.
    """
    key = _ALIASES.get(converter, converter)
    if key != "auto" and key not in CONVERTERS:
        raise VariantError(f"unknown FP16 converter '{converter}'", "use auto, ort or onnxconverter_common")
    original = getattr(model, "proto", model)  # read only: each converter works on its own copy
    keep = check_node_names(original, keep_fp32, "keep_fp32")
    typed = infer_shapes_lenient(original)  # once, weight-free: the converters need not infer shapes again
    checkable = _type_problem(typed) is None
    order = list(CONVERTERS) if key == "auto" else [key]
    skipped: dict[str, str] = {}
    for name in order:
        limits = (
            DEFAULT_LIMITS[name][0] if min_positive_val is None else min_positive_val,
            DEFAULT_LIMITS[name][1] if max_finite_val is None else max_finite_val,
        )
        try:
            converted, clamped = _convert(name, original, typed, keep, limits)
        except Exception as e:  # noqa: BLE001 - converters raise anything from AssertionError to C++ errors
            skipped[name] = f"it raised {first_line(e)[:300]}"
            log.info("FP16 converter %s failed: %s", name, skipped[name])
            continue
        problem = _type_problem(infer_source(converted)) if checkable else None
        if problem:
            skipped[name] = f"its model is rejected by onnx type and shape inference: {problem[:300]}"
            log.info("FP16 converter %s: %s", name, skipped[name])
            continue
        return _result(original, converted, name, limits, keep, skipped, forced=key != "auto", clamped=clamped)
    reasons = "; ".join(f"{CONVERTERS[n]}: {why}" for n, why in skipped.items())
    raise VariantError(
        f"no FP16 converter produced a model ONNX Runtime accepts ({reasons})",
        "keep the failing nodes in float32 with keep_fp32 / --keep-fp32, or try the other converter",
    )


def infer_source(model: onnx.ModelProto) -> onnx.ModelProto:
    """A weight-free copy of ``model`` for type checks."""
    return strip_weights(model)


def _type_problem(skeleton: onnx.ModelProto) -> str | None:
    """What onnx's strict type and shape inference objects to in a weight-free model (None: nothing). This is the
    check a runtime makes on load (a converter that retypes a Cast's output but not its ``to`` fails it), without
    building a session over the weights."""
    from ..model.validate import check_skeleton

    try:
        check_skeleton(skeleton)
        onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, check_type=True)
    except Exception as e:  # noqa: BLE001 - the checker and inference raise assorted C++ errors
        return first_line(e)
    return None


def _convert(name: str, original: onnx.ModelProto, typed: onnx.ModelProto, keep: list[str],
             limits: tuple[float, float]) -> tuple[onnx.ModelProto, int]:
    """(the converted model, the rule's record of what it clamped).

    The converter runs on a weight-free copy (typed by one shape inference, ``typed``): it decides which tensors
    become float16 and where Casts go, and changes only the type of a tensor without data. The weights are then
    filled in from ``original`` one tensor at a time, by the converters' own rule (:mod:`.fp16_fast`), so the
    float32 model is never copied and the float16 one is built once."""
    out, counter = convert_weight_free(name, original, typed, keep, limits)
    fill_weights(out, original, limits, counter)
    return out, counter


def convert_weight_free(name: str, original: onnx.ModelProto, typed: onnx.ModelProto, keep: list[str],
                        limits: tuple[float, float]) -> tuple[onnx.ModelProto, ClampCounter]:
    """The converter ``name``'s decisions on a weight-free copy of ``original`` (tensors over a few KB are stubs
    whose type it changes, external-data references too), nodes sorted: :func:`_convert` without the weights (a
    segment-streamed comparison fills them one segment at a time)."""
    import importlib

    work = strip_weights(original)
    del work.graph.value_info[:]
    work.graph.value_info.extend(typed.graph.value_info)
    module = importlib.import_module(CONVERTERS[name])
    counter = ClampCounter()  # the converters' rule: small tensors kept with their data are converted by it
    with warnings.catch_warnings(record=True) as caught, _patched(module, counter):
        warnings.simplefilter("always")
        out = module.convert_float_to_float16(
            work, min_positive_val=limits[0], max_finite_val=limits[1], keep_io_types=True,
            node_block_list=list(keep), disable_shape_infer=True,
        )
    for w in caught:
        log.debug("%s: %s", CONVERTERS[name], w.message)
    sort_nodes(out)  # the converters append Casts out of order; checkers and evaluators want topological order
    return out, counter


@contextlib.contextmanager
def _patched(module, counter: ClampCounter):
    """While a converter runs on a weight-free copy: its clamp rule is :class:`ClampCounter` (same values, and a
    count), and the value info it declares for a tensor takes the shape from the dims (it would read the data)."""
    from onnx import helper

    saved = module.make_value_info_from_tensor, module.convert_np_to_float16
    module.make_value_info_from_tensor = lambda t: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    module.convert_np_to_float16 = counter
    try:
        yield
    finally:
        module.make_value_info_from_tensor, module.convert_np_to_float16 = saved


def _result(
    original: onnx.ModelProto, converted: onnx.ModelProto, name: str, limits: tuple[float, float],
    keep: list[str], skipped: dict[str, str], forced: bool, clamped: ClampCounter | None = None,
) -> VariantResult:
    notes = []
    if forced:
        notes.append(f"converter forced to {CONVERTERS[name]}")
    for other, why in skipped.items():
        notes.append(f"{CONVERTERS[other]} skipped: {why}")
    if not forced and not skipped:
        notes.append(f"{CONVERTERS['onnxconverter_common']} not tried: {CONVERTERS[name]}'s model was accepted")
    # diff the constants only when the converter clamped something (a transformer's weights rarely need it)
    clamped = find_clamps(original, converted, max_finite=limits[1], min_positive=limits[0],
                          only=clamped.names if clamped is not None else None) \
        if clamped is None or clamped.clamped else []
    for c in clamped:
        log.info("FP16 %s of %s: %s -> %s (%d of %d values; used by %s)", c.kind, c.name, c.original, c.converted,
                 c.count, c.size, ", ".join(c.consumers) or "-")
    tensor_map = map_tensors(original, converted)
    lost = [k for k, v in tensor_map.items() if v is None]
    if lost:
        notes.append(f"{len(lost)} intermediate tensor(s) have no counterpart in the FP16 model: {', '.join(lost[:5])}")
    kept, problems = _verify_kept(converted, keep)
    notes += problems
    before = {n.name for n in iter_nodes(original.graph)}
    inserted = [n for n in iter_nodes(converted.graph) if n.name not in before]
    details = {
        "converter_module": CONVERTERS[name],
        "min_positive_val": limits[0],
        "max_finite_val": limits[1],
        "inserted_nodes": len(inserted),
        "inserted_casts": sum(n.op_type == "Cast" for n in inserted),
        "skipped_converters": dict(skipped),
    }
    return VariantResult(
        model=converted, variant="fp16", converter=name, clamped=clamped, tensor_map=tensor_map, kept_fp32=kept,
        notes=notes, details=details,
    )


def _verify_kept(model: onnx.ModelProto, keep: list[str]) -> tuple[list[str], list[str]]:
    """Nodes of ``keep`` whose float inputs and outputs are all float32 in ``model``, and notes on the others."""
    if not keep:
        return [], []
    types = elem_types(infer_source(model))
    nodes = {n.name: n for n in iter_nodes(model.graph)}
    kept, problems = [], []
    for name in keep:
        node = nodes.get(name)
        if node is None:
            problems.append(f"keep_fp32 node {name} is missing from the FP16 model")
            continue
        half = [t for t in list(node.input) + list(node.output) if t and types.get(t) == onnx.TensorProto.FLOAT16]
        if half:
            problems.append(f"keep_fp32 node {name} still has float16 tensors: {', '.join(half)}")
        else:
            kept.append(name)
    return kept, problems
