"""The INT8 rewrite: BatchNormalizations folded into the Conv before them, then the FP32 model quantized again.

A BatchNormalization left after its Conv (exporters leave some) makes the quantizer put a Q/DQ pair on the Conv's
raw output, a tensor on the scale of the unnormalised values, with one per-tensor INT8 scale set by its widest
channel; the normalisation then scales each channel by its own ``gamma / sqrt(var + eps)``, narrow channels and
their rounding alike. (A PP-OCRv4 detector's head: the Conv writes +-1.6e4, running variances up to 9.8e7; one INT8
step there is a tenth of a normalised channel's spread, and its ONNX Runtime INT8 model reads no held-out page's
text mask as the FP32 model does; folded, all of them.) Folded (``W' = W * s``, ``B' = (B - mean) * s + beta``,
``s = gamma / sqrt(var + eps)``, in float64 from the FP32 values), the Conv writes the normalised tensor itself and
its weights take the scales per output channel, where per-channel weight quantization holds them. ONNX Runtime's
``quant_pre_process`` (with its graph optimisation) and TensorRT fold the same way before quantizing; the
workbench's INT8 variant keeps the nodes unfused so that a comparison can name them.

:func:`fold_first` tries it before any Q/DQ pair is removed: every foldable pair of the FP32 model folded at once
(the folded model computes the FP32 function to float32 rounding, so a fold is no cost to minimise), the folded
model quantized again with the candidate's own recipe and calibration feeds, and judged on every feed. It replaces
the candidate only when it meets the target with nothing removed; the result then names each fold (``fold-bn``).
Else the search goes on from the candidate as converted, as without it: searching from a folded model that merely
failed fewer feeds left more float weight bytes on a recognizer (10 MB instead of 5.4 MB), and a cheaper test of
whether the fold can pay was not found (with the Q/DQ pairs around both of the detector's BatchNormalizations
removed, more float than the fold leaves, one page still fails; the fold heals every page). The attempt costs a
quantization and a run on every feed (1.5-3 s on the PP-OCR models) where it does not pay. Pairs the user keeps in
FP32 (``keep_fp32``) are left unfolded.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto

from .graph import GraphIndex
from .requantize import quantize_and_judge
from .rewrites import Rewrite, RewriteFinder, apply_rewrites

log = logging.getLogger(__name__)


def foldable_batchnorms(model: onnx.ModelProto, skip: Iterable[str] = (), only: Iterable[str] | None = None
                        ) -> list[Rewrite]:
    """The ``fold-bn`` rewrite of every BatchNormalization of ``model``'s main graph that folds into the Conv
    before it (:meth:`.rewrites.RewriteFinder.fold_bn` on the FP32 constants: inference mode, parameters one per
    output channel, a Conv or group-1 ConvTranspose of the standard domain with constant weights whose output
    nothing else reads and that is no graph output). ``skip``: node names (BatchNormalization or Conv) left as they
    are (nodes the user keeps in FP32); ``only``: the BatchNormalizations to look at (default: all). Nodes whose
    name is not unique are left too (the workbench's loader names every node uniquely). Each rewrite holds its
    folded constants in float32 (one copy of the folded weights)."""
    g = model.graph
    count = Counter(n.name for n in g.node)
    skip, only = set(skip), set(only) if only is not None else None
    index = GraphIndex(model)
    finder = RewriteFinder(model, index.consts, index, formats=(TensorProto.FLOAT,))  # its own reference values
    found = []
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or not bn.name or bn.name in skip or count[bn.name] > 1 or \
                (only is not None and bn.name not in only):
            continue
        rw = finder.fold_bn(bn, np.float32)
        if rw is None or rw.into in skip or count[rw.into] > 1:
            continue
        rw.detail = f"folded into {rw.into} before quantization"
        rw.values = {k: v.astype(np.float32) for k, v in rw.values.items()}  # computed in float64, held in float32
        found.append(rw)
    return found


def fold_batchnorms(model: onnx.ModelProto, rewrites: list[Rewrite]) -> onnx.ModelProto:
    """A copy of ``model`` with ``rewrites`` (:func:`foldable_batchnorms`) applied: each Conv reads new FP32
    constants and takes its BatchNormalization's output name; every other name is kept, and constants nothing reads
    any more are removed. The rewrites keep their tensor names only (the values live in the copy)."""
    folded = apply_rewrites(model, rewrites, default=TensorProto.FLOAT)
    for rw in rewrites:
        rw.values = dict.fromkeys(rw.values)
    return folded


def fold_first(ev, plan, baseline, notes: list[str], timing: dict):
    """For the tool's own INT8 variant of an FP32 model, missing the target: the folded model quantized again
    (see the module docstring). -> (rewrites, their evaluation, which meets the target): ``ev`` rebased onto the
    folded candidate; or ([], ``baseline``) with nothing changed."""
    from .islands import IslandBuilder

    if ev.builder.kind != "qdq" or baseline.met or plan.cand_source is not None \
            or plan.cand_spec.variant != "int8" or plan.ref_spec.variant != "fp32":
        return [], baseline
    rewrites = foldable_batchnorms(plan.ref_model, skip=plan.options.keep_fp32 or ())
    if not rewrites:
        return [], baseline
    folded = fold_batchnorms(plan.ref_model, rewrites)
    variant, evaluation, why = quantize_and_judge(ev, plan, folded, [f"fold-bn:{rw.node}" for rw in rewrites],
                                                  "fold_s", timing)
    if variant is None:
        notes.append(f"folding {len(rewrites)} BatchNormalization(s) before quantization was not tried: the folded "
                     f"model could not be quantized or run ({why}); searched the candidate as converted")
        return [], baseline
    candidate = variant.model
    if not evaluation.met:
        names = ", ".join(rw.node for rw in rewrites[:4]) + (", ..." if len(rewrites) > 4 else "")
        notes.append(f"{len(rewrites)} BatchNormalization(s) folded into their Conv before quantization ({names}) "
                     f"still miss the target ({evaluation.judgement.failing} failing feed(s)): not applied")
        return [], baseline
    ev.rebase(IslandBuilder(candidate, folded))
    log.info("repair: %d BatchNormalization(s) folded before quantization meet the target", len(rewrites))
    return rewrites, evaluation


def unfolded_note(plan, kept) -> str | None:
    """For a user's own Q/DQ file: a note naming the kept BatchNormalizations that a fold before quantization
    could keep in INT8 (this repair cannot quantize the user's file again with their recipe)."""
    if plan.cand_source is None or plan.ref_spec.variant != "fp32" or not kept:
        return None
    found = [(rw.node, rw.into) for rw in foldable_batchnorms(plan.ref_model, only=kept)]
    if not found:
        return None
    shown = ", ".join(f"{bn} (after {conv})" for bn, conv in found[:3]) + (", ..." if len(found) > 3 else "")
    return (f"kept {len(found)} BatchNormalization(s) that follow their Conv unfused: {shown}. Folded before "
            "quantizing (ONNX Runtime's quant_pre_process with its graph optimisation, or `workbench repair FP32.onnx "
            "--cand ort:int8 --calib DATA`, which tries it) they may stay INT8")
