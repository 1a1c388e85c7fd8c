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
import time
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..model.mapped import tensor_array
from .graph import PREFIX, Names, constants, prune, use_counts
from .rewrites import Rewrite

log = logging.getLogger(__name__)


def foldable_batchnorms(model: onnx.ModelProto, skip: Iterable[str] = ()
                        ) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(BatchNormalization, the Conv before it) pairs of the main graph that fold: an inference-mode
    BatchNormalization (one output, no ``training_mode``) whose four parameters are float constants of one value per
    output channel, reading the output of a Conv (or a group-1 ConvTranspose) of the standard domain with a float
    constant weight (and bias), an output that nothing else reads and that is no graph output. ``skip``: node names
    (BatchNormalization or Conv) left as they are (nodes the user keeps in FP32)."""
    g = model.graph
    consts = constants(model)
    producer = {o: n for n in g.node for o in n.output if o}
    uses = use_counts(g)
    skip = set(skip)

    def const(name: str, dims: list[int] | None = None) -> bool:
        t = consts.get(name)
        return t is not None and t.data_type == TensorProto.FLOAT and (dims is None or list(t.dims) == dims)

    pairs = []
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or not bn.name or bn.name in skip:
            continue
        if len(bn.input) < 5 or len([o for o in bn.output if o]) != 1 or \
                any(a.name == "training_mode" and a.i for a in bn.attribute):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx") \
                or len(conv.input) < 2 or not conv.name or conv.name in skip:
            continue
        if conv.op_type == "ConvTranspose" and next((a.i for a in conv.attribute if a.name == "group"), 1) != 1:
            continue
        if uses.get(bn.input[0], 0) != 1 or not const(conv.input[1]):
            continue
        w = consts[conv.input[1]]
        if len(w.dims) < 3:
            continue
        channels = int(w.dims[1 if conv.op_type == "ConvTranspose" else 0])
        if not all(const(t, [channels]) for t in bn.input[1:5]):
            continue
        if len(conv.input) > 2 and conv.input[2] and not const(conv.input[2], [channels]):
            continue
        pairs.append((bn, conv))
    return pairs


def fold_batchnorms(model: onnx.ModelProto, pairs) -> tuple[onnx.ModelProto, list[Rewrite]]:
    """A copy of ``model`` with each (BatchNormalization, Conv) of ``pairs`` (nodes of ``model``'s main graph)
    folded: the Conv reads new constants and takes the BatchNormalization's output name; every other name is kept,
    and constants nothing reads any more are removed. -> (the copy, the rewrites done)."""
    from ..model.graph import sort_nodes

    position = {id(n): i for i, n in enumerate(model.graph.node)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    before = use_counts(g)
    consts = constants(out)
    names = Names({t.name for t in g.initializer} | {o for n in g.node for o in n.output} |
                  {i.name for i in g.input})
    rewrites, gone, stale = [], set(), set()
    for bn_src, conv_src in pairs:
        bn, conv = g.node[position[id(bn_src)]], g.node[position[id(conv_src)]]
        scale, beta, mean, var = (tensor_array(consts[t]).astype(np.float64) for t in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        s = scale / np.sqrt(var + eps)
        w = tensor_array(consts[conv.input[1]]).astype(np.float64)
        axis = 1 if conv.op_type == "ConvTranspose" else 0
        shape = [1] * w.ndim
        shape[axis] = -1
        b = (tensor_array(consts[conv.input[2]]).astype(np.float64).ravel()
             if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[axis]))
        new_w, new_b = names(f"{conv.input[1]}::{PREFIX}_fold"), names(f"{conv.name}/bias::{PREFIX}_fold")
        g.initializer.append(numpy_helper.from_array((w * s.reshape(shape)).astype(np.float32), new_w))
        g.initializer.append(numpy_helper.from_array(((b - mean) * s + beta).astype(np.float32), new_b))
        conv.input[:] = [conv.input[0], new_w, new_b]
        stale.add(conv.output[0])  # the Conv's own output: no tensor any more
        conv.output[0] = bn.output[0]
        gone.add(position[id(bn_src)])
        rewrites.append(Rewrite(bn.name, "fold-bn", f"folded into {conv.name} before quantization", into=conv.name,
                                remove=bn.name))
    kept_info = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(kept_info)
    kept = [n for i, n in enumerate(g.node) if i not in gone]
    del g.node[:]
    g.node.extend(kept)
    prune(g, before)  # the old weights, biases and BatchNormalization parameters, initializers or Constant nodes
    sort_nodes(out)
    return out, rewrites


def fold_first(ev, plan, baseline, notes: list[str], timing: dict):
    """For the tool's own INT8 variant of an FP32 model, missing the target: the folded model quantized again
    (see the module docstring). -> (rewrites, their evaluation, which meets the target): ``ev`` rebased onto the
    folded candidate; or ([], ``baseline``) with nothing changed."""
    from .islands import IslandBuilder

    if ev.builder.kind != "qdq" or baseline.met or plan.cand_source is not None \
            or plan.cand_spec.variant != "int8" or plan.ref_spec.variant != "fp32":
        return [], baseline
    pairs = foldable_batchnorms(plan.ref_model, skip=plan.options.keep_fp32 or ())
    if not pairs:
        return [], baseline
    t0 = time.perf_counter()
    folded, rewrites = fold_batchnorms(plan.ref_model, pairs)
    try:
        candidate = plan.variant_of(folded, plan.cand_spec).model
        evaluation = ev.evaluate([f"fold-bn:{rw.node}" for rw in rewrites], model=candidate, role="rewrite")
    except Exception as e:  # noqa: BLE001 - the quantizer's (assorted) or the engine's error on the folded graph
        log.info("fold before quantization failed", exc_info=True)
        timing["fold_s"] = round(time.perf_counter() - t0, 3)
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        notes.append(f"folding {len(pairs)} BatchNormalization(s) before quantization was not tried: the folded "
                     f"model could not be quantized or run ({why}); searched the candidate as converted")
        return [], baseline
    timing["fold_s"] = round(time.perf_counter() - t0, 3)
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
    found = [(bn.name, conv.name) for bn, conv in foldable_batchnorms(plan.ref_model) if bn.name in set(kept)]
    if not found:
        return None
    shown = ", ".join(f"{bn} (after {conv})" for bn, conv in found[:3]) + (", ..." if len(found) > 3 else "")
    return (f"kept {len(found)} BatchNormalization(s) that follow their Conv unfused: {shown}. Folded before "
            "quantizing (ONNX Runtime's quant_pre_process with its graph optimisation, or `workbench repair FP32.onnx "
            "--cand ort:int8 --calib DATA`, which tries it) they may stay INT8")
