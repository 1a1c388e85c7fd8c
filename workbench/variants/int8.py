"""The INT8 variant: ONNX Runtime's static QDQ quantizer (TensorRT convention: symmetric int8 activations,
symmetric per-channel int8 weights), made robust to old opsets, pre-processing failures and -inf masks.

Placement: ``"all"`` (the default) puts Q/DQ pairs where ONNX Runtime's quantizer does, on the inputs and outputs
of every op it quantizes (Add, Mul, Sigmoid, Concat, ... as well as Conv and MatMul); ``"weighted"`` on the inputs
of the weighted ops alone (Conv, ConvTranspose, MatMul, Gemm: their activations and weights), which is TensorRT's
recommended Q/DQ placement (quantize the inputs of weighted layers, not their outputs; the pointwise ops between
them fuse into the layers and need no pair of their own). As ONNX Runtime's quantizer writes it, another reader of
a tensor a weighted op quantizes (a residual Add) reads the same DequantizeLinear output."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..core.scratch import temporary_dir
from ..errors import VariantError
from ..inputs import check_feeds
from .calibration import data_reader, histogram_ranges, minmax_ranges, quiet_stdout, range_overrides
from .graph_names import check_node_names, copy_model, map_tensors, opset_version
from .nonfinite import nodes_touching, scan_tensors
from .ort_session import first_line, ort_session
from .quantizer_speed import fast_quantizer
from .result import VariantResult

log = logging.getLogger(__name__)

METHODS = ("minmax", "percentile", "entropy")
PLACEMENTS = ("all", "weighted")
#: the ops TensorRT's recommended placement quantizes the inputs of ("weighted")
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
_QDQ_OPSET = 13  # DequantizeLinear gained the per-channel `axis` attribute in opset 13


def to_int8(
    model: onnx.ModelProto,
    calibration_feeds: list[dict[str, np.ndarray]],
    per_channel: bool = True,
    method: str = "minmax",
    ranges: dict[str, tuple[float, float]] | None = None,
    exclude_nodes: Sequence[str] = (),
    op_types: Sequence[str] | None = None,
    *,
    activation_type: str = "int8",
    percentile: float = 99.999,
    placement: str = "all",
    validate: bool = True,
) -> VariantResult:
    """QDQ INT8 copy of ``model`` calibrated on ``calibration_feeds`` with ``method`` (minmax | percentile |
    entropy). ``ranges`` ({tensor: (lo, hi)}) override calibrated activation ranges. Nodes that read or produce
    tensors holding NaN/+-inf on the feeds are excluded from quantization, with the reason recorded. ``placement``:
    ``"all"`` or ``"weighted"`` (the module docstring); ``op_types`` narrows either. ``validate``: run the
    quantized model once on ONNX Runtime (CPU) and raise a VariantError when it cannot; False for a caller that
    runs it next and handles the engine's error itself."""
    method = method.lower()
    if placement not in PLACEMENTS:
        raise VariantError(f"unknown Q/DQ placement '{placement}'", f"use one of {', '.join(PLACEMENTS)}")
    if method not in METHODS:
        raise VariantError(f"unknown calibration method '{method}'", f"use one of {', '.join(METHODS)}")
    if activation_type not in ("int8", "uint8"):
        raise VariantError(f"unknown activation type '{activation_type}'", "use int8 (TensorRT) or uint8")
    original = copy_model(getattr(model, "proto", model))
    _refuse_quantized(original)
    feeds = check_feeds(original, calibration_feeds)
    if not feeds:
        raise VariantError("INT8 calibration needs at least one feed", "pass --inputs/--data or a calibration set")
    excluded = [{"node": n, "reason": "excluded on request"}
                for n in check_node_names(original, exclude_nodes, "exclude_nodes")]
    notes: list[str] = []
    details: dict[str, Any] = {"calibration_method": method, "calibration_feeds": len(feeds),
                               "per_channel": per_channel, "activation_type": activation_type, "weight_type": "int8",
                               "symmetric": True, "quant_format": "QDQ", "placement": placement, "opset_upgrade": None}
    work = _upgrade_opset(original, details, notes)
    if placement == "weighted":
        op_types = [t for t in (op_types or WEIGHTED_OPS) if t in WEIGHTED_OPS]
        if not op_types:
            raise VariantError("the weighted placement quantizes the inputs of Conv, ConvTranspose, MatMul and Gemm "
                               "alone, and none of these op types was asked for", "use placement='all'")

    # the weighted placement calibrates the tensors around the weighted ops alone: only those are scanned (106 of
    # a PP-OCRv4 recognizer's 511)
    only = ({t for n in work.graph.node if n.op_type in op_types for t in [*n.input, *n.output] if t}
            if placement == "weighted" else None)
    scan = scan_tensors(work, feeds, keep_ranges=method == "minmax", only=only)
    if scan.nonfinite and method != "minmax":  # ORT's histogram calibrators fail on inf: collect finite ones here
        scan = scan_tensors(work, feeds, keep_values=True, only=only)
    for entry in nodes_touching(work, scan.nonfinite):
        if entry["node"] not in {e["node"] for e in excluded}:
            excluded.append(entry)
    if scan.nonfinite:
        details["nonfinite_tensors"] = dict(scan.nonfinite)
        notes.append(f"{len(scan.nonfinite)} tensor(s) hold NaN/inf on the calibration feeds "
                     f"({', '.join(list(scan.nonfinite)[:4])}); the nodes around them stay float")

    quantized = _quantize(work, feeds, scan, method, percentile, per_channel, activation_type, ranges,
                          [e["node"] for e in excluded], op_types, details, notes, inputs_only=placement == "weighted")
    if validate:
        _validate(quantized, feeds[0])
    counts = {op: sum(n.op_type == op for n in quantized.graph.node) for op in ("QuantizeLinear", "DequantizeLinear")}
    details.update({"quantize_nodes": counts["QuantizeLinear"], "dequantize_nodes": counts["DequantizeLinear"],
                    "qdq_outputs": qdq_outputs(quantized, work)})
    if not counts["QuantizeLinear"] and not counts["DequantizeLinear"]:
        _nothing_quantized(work, scan.nonfinite, excluded, op_types)
    tensor_map = map_tensors(original, quantized)
    if tensor_map:
        notes.append(f"{len(tensor_map)} original tensor name(s) differ in the INT8 model (see tensor_map)")
    return VariantResult(model=quantized, variant="int8", converter="onnxruntime.quantization.quantize_static",
                         tensor_map=tensor_map, excluded_nodes=excluded, notes=notes, details=details)


#: how a user keeps nodes out of quantization, in the CLI and in Python
KEEP_FLOAT_HINT = "keep the failing nodes in float (--keep-fp32 NODE ... on the command line; keep_fp32= in Python)"


def _refuse_quantized(model: onnx.ModelProto) -> None:
    """A model that already holds Q/DQ nodes would be quantized a second time (and fail on duplicate names)."""
    found = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    if found:
        raise VariantError(f"the model is quantized already: it holds {found} QuantizeLinear/DequantizeLinear "
                           "node(s), and INT8 would quantize it a second time",
                           "give the FP32 model to make an INT8 variant of it, or run this file as it is "
                           "(compare/repair: --cand ort --cand-model THIS_FILE)")


def _nothing_quantized(model: onnx.ModelProto, nonfinite: dict, excluded: list[dict],
                       op_types: Sequence[str] | None) -> None:
    """The quantizer inserted no Q/DQ node: an "INT8" variant would be the FP32 model, and every comparison of it
    a pass. One error that says why."""
    inputs = [i.name for i in model.graph.input if i.name in nonfinite]
    if nonfinite:
        where = (f"the calibration data itself holds NaN/inf in input(s) {', '.join(inputs)}" if inputs else
                 f"{len(nonfinite)} tensor(s) hold NaN/inf on the calibration feeds ({', '.join(list(nonfinite)[:4])})")
        raise VariantError(f"nothing was quantized: {where}, and every node that reads or writes a non-finite "
                           f"tensor stays float ({len(excluded)} node(s))",
                           "calibrate on finite data (drop or fix the samples that hold NaN/inf)")
    ops = sorted({n.op_type for n in model.graph.node})
    what = f"node of the op types asked for ({', '.join(op_types)})" if op_types else \
        "op that ONNX Runtime's quantizer quantizes"
    raise VariantError(f"nothing was quantized: the model has no {what} outside the nodes kept in float "
                       f"({len(excluded)}); its ops: {', '.join(ops[:12])}{' ...' if len(ops) > 12 else ''}",
                       "compare it in FP16 instead, or keep fewer nodes in float")


def _upgrade_opset(model: onnx.ModelProto, details: dict, notes: list[str]) -> onnx.ModelProto:
    version = opset_version(model)
    if version is None or version >= _QDQ_OPSET:
        return model
    from onnx import version_converter

    try:
        upgraded = version_converter.convert_version(model, _QDQ_OPSET)
    except Exception as e:  # noqa: BLE001 - the version converter raises assorted C++ errors
        raise VariantError(
            f"cannot upgrade the model from opset {version} to {_QDQ_OPSET} for QDQ: {first_line(e)[:300]}",
            f"re-export the model with opset >= {_QDQ_OPSET}",
        ) from None
    details["opset_upgrade"] = [version, _QDQ_OPSET]
    notes.append(f"opset upgraded {version} -> {_QDQ_OPSET} (per-channel DequantizeLinear needs `axis`)")
    from ..model.load import name_nodes

    name_nodes(upgraded)  # the converter's new nodes (e.g. a Softmax's Reshape) are unnamed: repair keeps by name
    return upgraded


def _quantize(
    model: onnx.ModelProto, feeds: list[dict], scan: Any, method: str, percentile: float, per_channel: bool,
    activation_type: str, ranges: dict | None, exclude: list[str], op_types: Sequence[str] | None, details: dict,
    notes: list[str], inputs_only: bool = False,
) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    extra: dict[str, Any] = {"ActivationSymmetric": True, "WeightSymmetric": True}
    if inputs_only and op_types:  # TensorRT's placement: no pair on the outputs of the ops quantized, a pair of
        # its own on each weighted op's input edge
        extra.update(OpTypesToExcludeOutputQuantization=list(op_types), DedicatedQDQPair=True)
    if method == "percentile":
        extra["CalibPercentile"] = percentile
    if ranges:
        _add_overrides(model, ranges, activation_type == "uint8", extra, details, notes)
    kwargs: dict[str, Any] = {}
    from ..model.mapped import has_mapped

    mapped = has_mapped(model)
    with _work_dir(mapped) as tmp:
        source = Path(tmp) / "model.onnx"
        if mapped:  # weights left in their files: copied file to file, never read into memory here
            from ..model.mapped import save_model

            save_model(model, source)
            kwargs["use_external_data_format"] = True
            details["preprocessing"] = "none (weights left in their files: quant_pre_process would load them whole)"
            prepared, typed = source, None
        else:
            typed = _typed_by_onnx(model)
            if typed is not None:  # quant_pre_process would add nothing the quantizer reads (and import torch)
                from onnxruntime.quantization.quant_utils import add_pre_process_metadata

                add_pre_process_metadata(typed)  # what quant_pre_process(skip_symbolic_shape=True) marks it with
                details["preprocessing"] = ("ONNX shape inference (it types every tensor: symbolic inference not "
                                            "needed), no graph optimisation")
                prepared = source
            else:
                onnx.save_model(copy_model(model), source, save_as_external_data=model.ByteSize() > 2**30,
                                location="model.data")
                prepared = _preprocess(source, Path(tmp), details, notes)
        cache = "calibration_cache_path" in inspect.signature(quantize_static).parameters
        # ranges handed to quantize_static as its calibration cache (it then runs no calibrator of its own)
        given = (minmax_ranges(typed, scan.ranges, op_types)
                 if cache and typed is not None and method == "minmax" and not scan.nonfinite else None)
        if given is not None:  # the scan already ran every tensor: its min/max are ORT's MinMax ranges, bit for bit
            details["calibrator"] = "ORT minmax ranges from the tensor scan (the values ORT's MinMax calibrator reads)"
        elif method != "minmax" and scan.nonfinite:
            if not cache:
                raise VariantError(f"{method} calibration cannot histogram the non-finite tensors "
                                   f"{', '.join(scan.nonfinite)} with this onnxruntime", "use method='minmax'")
            given = histogram_ranges(scan.values, method, percentile)
            details["calibrator"] = f"ORT HistogramCollector ({method}) over finite tensors only"
            notes.append(f"{method} ranges computed with ORT's HistogramCollector over finite tensors only "
                         "(ORT's calibrator cannot histogram NaN/inf)")
        else:
            details["calibrator"] = f"ORT {method} calibrator"
        hand_over = typed is not None and given is not None and _can_hand_over()  # no calibrator reads the file
        if typed is not None and not hand_over:
            onnx.save_model(typed, source)
        if given is not None:
            from onnxruntime.quantization.calibrate import save_tensors_data

            kwargs["calibration_cache_path"] = Path(tmp) / "ranges.json"
            save_tensors_data(given, kwargs["calibration_cache_path"])
        output = Path(tmp) / "model.int8.onnx"
        act = QuantType.QUInt8 if activation_type == "uint8" else QuantType.QInt8
        calib = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
                 "entropy": CalibrationMethod.Entropy}[method]
        try:
            with quiet_stdout(), _handed_over(prepared, typed if hand_over else None), fast_quantizer():
                quantize_static(
                    str(prepared), str(output), data_reader(feeds), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(op_types) if op_types else None, per_channel=per_channel,
                    reduce_range=False, activation_type=act, weight_type=QuantType.QInt8,
                    nodes_to_exclude=exclude, calibrate_method=calib, extra_options=extra, **kwargs,
                )
        except Exception as e:  # noqa: BLE001 - the quantizer raises assorted errors; report one line
            raise VariantError(f"ONNX Runtime's quantize_static failed: {first_line(e)[:300]}",
                               f"{KEEP_FLOAT_HINT}, or try method='minmax'"
                               ) from None
        if mapped:  # the quantized model's weights stay in this run's scratch folder, mapped
            from ..model.mapped import map_files

            quantized = onnx.load(str(output), load_external_data=False)
            map_files(quantized, Path(tmp))
            return quantized
        return onnx.load(str(output))


def _ort_quantize_module():
    """onnxruntime.quantization's ``quantize`` module. Not ``import onnxruntime.quantization.quantize as m``: the
    package exports a function named ``quantize`` that shadows the module as an attribute, and that import binds
    the function."""
    import importlib

    return importlib.import_module("onnxruntime.quantization.quantize")


def _can_hand_over() -> bool:
    return callable(getattr(_ort_quantize_module(), "load_model_with_shape_infer", None))


_HAND_OVER = threading.Lock()


@contextlib.contextmanager
def _handed_over(path: Path, typed: onnx.ModelProto | None):
    """While quantize_static runs, its load of ``path`` returns a copy of ``typed`` (marked shape-inferred, as its
    loader marks what it loads) instead of saving, shape-inferring and reloading the file: ``typed`` is the result
    of that same ONNX shape inference (the quantized model is byte-identical; 0.9 s less on the 152 MB BERT-like
    encoder). Only with ranges given as its calibration cache (no calibrator of its own reads the file, which is not
    written). Other paths go through ORT's own loader."""
    if typed is None:
        yield
        return
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    ort_quantize = _ort_quantize_module()
    original = ort_quantize.load_model_with_shape_infer

    def load(model_path):
        if Path(model_path) != Path(path):
            return original(model_path)
        copy = onnx.ModelProto()
        copy.CopyFrom(typed)
        add_infer_metadata(copy)
        return copy

    with _HAND_OVER:
        ort_quantize.load_model_with_shape_infer = load
        try:
            yield
        finally:
            ort_quantize.load_model_with_shape_infer = original


@contextlib.contextmanager
def _work_dir(keep: bool):
    """A temporary folder: deleted after the block, or (``keep``: its files stay mapped by the result) one in this
    run's scratch folder, deleted with it."""
    if keep:
        from ..core.scratch import scratch_dir

        yield str(scratch_dir("workbench-int8-"))
        return
    with temporary_dir("workbench-int8-") as tmp:
        yield tmp


def _typed_by_onnx(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` after ONNX shape inference when that gives every tensor of its one graph an element type (what
    ORT's quantizer reads from pre-processing), else None (subgraphs, >1 GiB, untyped tensors: quant_pre_process
    decides). Inference runs on a weight-free copy (same types and shapes; the weights are not serialized for it) and
    its value_info and outputs are put on a copy of ``model``."""
    from ..core.shapes import strip_weights, tensor_nbytes

    if sum(tensor_nbytes(t) for t in model.graph.initializer) > 2**30 - 2**26 or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for n in model.graph.node for a in n.attribute):
        return None
    try:
        skeleton = onnx.shape_inference.infer_shapes(strip_weights(model))
    except Exception as e:  # noqa: BLE001 - inference raises assorted C++ errors
        log.debug("ONNX shape inference failed (%s): quant_pre_process decides", e)
        return None
    inferred = onnx.ModelProto()
    inferred.CopyFrom(model)
    for field in ("value_info", "output"):
        getattr(inferred.graph, field).clear()
        getattr(inferred.graph, field).extend(getattr(skeleton.graph, field))
    typed = {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    typed |= {t.name for t in inferred.graph.initializer}
    untyped = [o for n in inferred.graph.node for o in n.output if o and o not in typed]
    if untyped:
        log.debug("ONNX shape inference leaves %d tensor(s) untyped (%s): quant_pre_process decides", len(untyped),
                  ", ".join(untyped[:3]))
        return None
    return inferred


def _preprocess(source: Path, tmp: Path, details: dict, notes: list[str]) -> Path:
    """quant_pre_process without graph optimisation (it would fuse nodes and lose tensor names); on failure
    again without symbolic shape inference, then none."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    attempts = [("symbolic + ONNX shape inference", False), ("ONNX shape inference (symbolic skipped)", True)]
    for i, (label, skip_symbolic) in enumerate(attempts):
        target = tmp / f"model.pre{i}.onnx"
        try:
            # inside tmp: a failing symbolic inference saves sym_shape_infer_temp.onnx to the working directory
            with quiet_stdout(), _working_directory(tmp):
                quant_pre_process(str(source), str(target), skip_optimization=True,
                                  skip_symbolic_shape=skip_symbolic)
        except Exception as e:  # noqa: BLE001 - shape inference raises assorted errors on real models
            notes.append(f"quant_pre_process ({label}) failed: {first_line(e)[:200]}")
            continue
        details["preprocessing"] = f"quant_pre_process: {label}, no graph optimisation"
        return target
    details["preprocessing"] = "none"
    return source


@contextlib.contextmanager
def _working_directory(path: Path):
    """chdir for the duration (process-wide; contextlib.chdir needs Python 3.11)."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _add_overrides(model: onnx.ModelProto, ranges: dict, unsigned: bool, extra: dict, details: dict,
                   notes: list[str]) -> None:
    if importlib.util.find_spec("onnxruntime.quantization.tensor_quant_overrides") is None:
        notes.append("this onnxruntime has no TensorQuantOverrides: the given ranges were not applied")
        return
    tensors = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output if o}
    initializers = {t.name for t in model.graph.initializer}
    overrides, skipped = range_overrides(ranges, tensors | initializers, initializers, unsigned)
    notes += skipped
    if overrides:
        extra["TensorQuantOverrides"] = overrides
        details["range_overrides"] = len(overrides)


def qdq_outputs(model: onnx.ModelProto, original: onnx.ModelProto) -> dict[str, str]:
    """Original activation tensor -> the output of its QuantizeLinear -> DequantizeLinear pair in ``model``
    (what consumers read: its int8 view)."""
    names = {i.name for i in original.graph.input} | {o for n in original.graph.node for o in n.output}
    producer = {o: n for n in model.graph.node for o in n.output}
    initializers = {t.name for t in model.graph.initializer}
    pairs = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or not node.input or not node.output:
            continue
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input and q.input[0] in names - initializers:
            pairs.setdefault(q.input[0], node.output[0])
    return pairs


def _validate(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    try:
        ort_session(model, optimize=True).run(None, feed)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises assorted pybind exception types
        raise VariantError(f"ONNX Runtime (CPU) cannot run the INT8 model: {first_line(e)[:300]}",
                           KEEP_FLOAT_HINT) from None
