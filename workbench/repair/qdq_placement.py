"""The INT8 rewrite of placement: the FP32 model quantized again with Q/DQ pairs on the inputs of its weighted ops
alone (Conv, ConvTranspose, MatMul, Gemm), TensorRT's recommended placement, before any pair is removed.

The tool's own INT8 variant places pairs where ONNX Runtime's quantizer does: on the inputs and outputs of every op
it quantizes, the Adds, Muls, HardSigmoids and Concats between the weighted layers included. TensorRT's guide
places them on the inputs of the weighted layers only (their outputs stay unquantized; the pointwise ops after
them fuse into the layer), so each pointwise op's rounding is not added to the error. On held-out rendered pages
and crops it is the more faithful model of the two on 5 of the 7 PP-OCR models measured and as faithful on the
other two (v4/v3/v5 detectors: 8, 8 and 4 of 8 pages read as in FP32 instead of 0, 0 and 0; v4 and v5
recognizers: 5 of 8 crops instead of 2 and 0; v3 recognizer 0 and classifier 8 either way), with a fifth to a
third as many pairs (53-74 instead of 253-390), in a third to a half of the quantization time.

Before it is quantized, the inputs of the FP32 model's depthwise Convs are equalized per channel on the
calibration feeds (:mod:`workbench.variants.equalize`, ``equalize-depthwise`` in ``repairs``; the float function is
unchanged): per-tensor INT8 then holds the narrow channels that one scale per tensor rounds away. On the same
held-out sets (``python benchmarks/int8_placement.py``) the v3 recognizer reads 8 of 8 crops as in FP32 instead of
0, the v5 detector 8 of 8 pages instead of 4, the v5 recognizer 6 instead of 5; the others read as before, most
of them closer to FP32 below the task's verdict (the detectors' flipped mask pixels, the recognizers' CTC frames).

:func:`placement_first` tries it when the candidate as converted misses the target: the FP32 model quantized again
with the weighted placement (its depthwise inputs equalized; the same recipe and calibration feeds otherwise),
judged on every feed. When it meets the target it is the repaired model (``qdq-placement`` in ``repairs``, nothing
removed). When it misses on no more feeds than the candidate as converted, the search goes on from it, its units the
readers of activation pairs (:func:`pair_readers`: mostly one per weighted layer, its input pair removed and its
FP32 weight -- the equalized model's -- restored); else from the candidate as converted, as without it.
"""

from __future__ import annotations

import logging
import time

from ..variants.ort_session import first_line
from .requantize import quantize_and_judge
from .rewrites import Rewrite

log = logging.getLogger(__name__)

#: the kind this rewrite reports in ``repairs``, and the name it gives (no node: the whole model)
KIND = "qdq-placement"
MODEL_NODE = "(model)"
#: the kind of the depthwise inputs' equalization that comes with it (:mod:`workbench.variants.equalize`)
EQUALIZE_KIND = "equalize-depthwise"


def applies(plan) -> bool:
    """The candidate is the tool's own INT8 variant of an FP32 model in ONNX Runtime's placement."""
    return (plan.cand_source is None and plan.cand_spec.variant == "int8" and plan.ref_spec.variant == "fp32"
            and _details(plan).get("placement", "all") == "all")


def _details(plan) -> dict:
    return plan.variant_info.get("details") or {}


def placement_first(ev, plan, baseline, notes: list[str], timing: dict):
    """For the tool's own INT8 variant of an FP32 model, missing the target: the FP32 model quantized with the
    weighted placement (see the module docstring). -> (rewrites, their evaluation, the new base's builder or None):
    ``ev`` rebased onto the new candidate when the builder is returned; else ([], ``baseline``, None), unchanged."""
    from ..variants.int8 import WEIGHTED_OPS
    from .islands import IslandBuilder

    if ev.builder.kind != "qdq" or baseline.met or not applies(plan):
        return [], baseline, None
    model, equalized = _equalized(plan, notes, timing)
    variant, evaluation, why = quantize_and_judge(ev, plan, model, [KIND], "placement_s", timing,
                                                  placement="weighted")
    if variant is None:
        notes.append(f"quantizing the inputs of the weighted ops alone (TensorRT's placement) was not tried: the "
                     f"model could not be quantized or run that way ({why}); searched the candidate as converted")
        return [], baseline, None
    pairs = variant.details.get("quantize_nodes", 0)
    before = baseline.judgement.failing
    if not evaluation.met and evaluation.judgement.failing > before:
        notes.append(f"quantizing the inputs of the weighted ops alone (TensorRT's placement, {pairs} Q/DQ pairs) "
                     f"fails {evaluation.judgement.failing} feed(s), the candidate as converted {before}: searched "
                     "the candidate as converted")
        return [], baseline, None
    ops = "/".join(t for t in WEIGHTED_OPS if any(n.op_type == t for n in plan.ref_model.graph.node))
    detail = (f"the FP32 model quantized again with Q/DQ on the inputs of its weighted ops alone ({ops}: "
              f"TensorRT's recommended placement), {pairs} QuantizeLinear nodes instead of "
              f"{_details(plan).get('quantize_nodes', '?')}")
    rewrites = [Rewrite(MODEL_NODE, EQUALIZE_KIND, equalized.describe())] if equalized.convs else []
    rewrites.append(Rewrite(MODEL_NODE, KIND, detail))
    builder = IslandBuilder(variant.model, model)  # a unit removed: its FP32 weight is the equalized model's
    builder.units = pair_readers(builder)
    ev.rebase(builder)
    if evaluation.met:
        log.info("repair: the weighted Q/DQ placement meets the target")
    else:
        notes.append(f"quantized again with Q/DQ on the inputs of the weighted ops alone (TensorRT's placement, "
                     f"{pairs} pairs): {evaluation.judgement.failing} failing feed(s) instead of {before}; the "
                     "search removed pairs from that model")
    return rewrites, evaluation, builder


def _equalized(plan, notes: list[str], timing: dict):
    """(the FP32 model with its depthwise Convs' inputs equalized on the calibration feeds, what was done): the
    model itself where there is nothing to equalize or it cannot be measured (said in ``notes``)."""
    from ..variants.equalize import Equalization, equalize_depthwise

    t0 = time.perf_counter()
    try:
        return equalize_depthwise(plan.ref_model, plan.calibration_feeds)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's (assorted) on the model with its inputs marked
        log.info("equalizing the depthwise inputs failed", exc_info=True)
        notes.append(f"the depthwise Convs' inputs were not equalized before quantizing ({first_line(e)[:200]})")
        return plan.ref_model, Equalization(0.0)
    finally:
        timing["equalize_s"] = round(time.perf_counter() - t0, 3)


def pair_readers(builder) -> list[str]:
    """The search's units in this placement, in graph order: the named nodes that read an activation's
    DequantizeLinear output -- the weighted nodes the pairs are for, and any other reader ONNX Runtime's
    quantizer hands the same output (a residual Add beside a MatMul). Removing a weighted node's pairs (its input
    read before the pair, its FP32 weight restored) is TensorRT's one choice per layer: INT8 or float; with every
    unit removed the model is the FP32 one. The producers of the quantized tensors are not units: removing a pair
    around one would measure the same pair again, at twice the ordering cost."""
    idx = builder.idx
    consts = set(idx.consts)

    def activation_pair(name: str) -> bool:
        dq = idx.producer.get(name)
        q = idx.producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        return q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in consts

    return [n.name for n in idx.nodes if n.name and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and n.name not in idx.sub_names and any(activation_pair(i) for i in n.input)]
