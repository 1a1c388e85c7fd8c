"""Impact of each culprit: what the outputs gain when that one node's output is fixed.

A node can introduce a large error that no output ever sees (a ReLU whose values underflow FP16 on a random
input, a branch the outputs barely use). For the top culprits the candidate runs again with each one's output
replaced by the reference's value held in the candidate's own type (for FP16: the exact value rounded to FP16,
what keeping the node in FP32 would deliver; for an INT8 Q/DQ view: the float value, what keeping that tensor
unquantized would deliver), and the outputs' metrics are compared with the unpatched run.

All culprits share ONE candidate session: each patched tensor becomes ``Where(use_k, patch_k, original)`` with
two extra graph inputs, and each feed runs once per culprit with one ``use_k`` set, plus once with none set.
The model is edited in place for the moment it takes to serialize it (no copy of the weights).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..core.budget import parse_size
from ..core.metrics import ErrorStats
from ..core.shapes import elem_type_of
from ..engines.outputs import edit_lock
from ..errors import EngineRunError
from .floor import excess_db
from .result import Culprit

log = logging.getLogger(__name__)

#: a fix that gains less than this (dB of the criterion's metric) on every output is harmless
IMPACT_MARGIN_DB = 3.0
_PREFIX = "wb_impact"


@dataclass
class _Patch:
    culprit: Culprit
    tensor: str  # candidate tensor
    elem_type: int
    use: str
    value: str


def _patches(culprits: list[Culprit], cand_model: onnx.ModelProto, types: dict, candidate_name) -> tuple[
        list[_Patch], dict[str, str]]:
    produced = {o for n in cand_model.graph.node for o in n.output if o}
    patches, skipped, seen = [], {}, set()
    for k, c in enumerate(culprits):
        name = candidate_name(c.tensor)
        et = elem_type_of(types, name)
        if name in seen:
            continue
        if name not in produced:
            skipped[c.node] = "its candidate tensor is not produced by a top-level node"
        elif et not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE):
            skipped[c.node] = "its output is not a float tensor"
        else:
            seen.add(name)
            patches.append(_Patch(c, name, et, f"{_PREFIX}_use_{k}", f"{_PREFIX}_value_{k}"))
    return patches, skipped


@contextlib.contextmanager
def patched(model: onnx.ModelProto, patches: list[_Patch], ranks: dict[str, int]) -> Iterator[onnx.ModelProto]:
    """``model`` with each patch's tensor routed through ``Where(use, value, original)`` until the block ends."""
    g = model.graph
    with edit_lock(model):
        n_nodes, n_inputs = len(g.node), len(g.input)
        renamed: list[tuple[onnx.NodeProto, int, str]] = []
        producer = {o: (n, i) for n in g.node for i, o in enumerate(n.output) if o}
        try:
            for p in patches:
                node, index = producer[p.tensor]
                orig = f"{p.tensor}::{_PREFIX}_orig"
                node.output[index] = orig
                renamed.append((node, index, p.tensor))
                vtype = TensorProto.FLOAT if p.elem_type == TensorProto.BFLOAT16 else p.elem_type
                dims = [f"{p.value}_{d}" for d in range(ranks.get(p.tensor, 0))] if p.tensor in ranks else None
                g.input.append(helper.make_tensor_value_info(p.use, TensorProto.BOOL, []))
                g.input.append(helper.make_tensor_value_info(p.value, vtype, dims))
                if p.elem_type == TensorProto.BFLOAT16:  # ORT's CPU Where has no bfloat16 kernel
                    wide, mixed = f"{orig}::wide", f"{orig}::mixed"
                    g.node.extend([
                        helper.make_node("Cast", [orig], [wide], to=TensorProto.FLOAT, name=f"{_PREFIX}/{p.use}/in"),
                        helper.make_node("Where", [p.use, p.value, wide], [mixed], name=f"{_PREFIX}/{p.use}"),
                        helper.make_node("Cast", [mixed], [p.tensor], to=TensorProto.BFLOAT16,
                                         name=f"{_PREFIX}/{p.use}/out")])
                else:
                    g.node.append(helper.make_node("Where", [p.use, p.value, orig], [p.tensor],
                                                   name=f"{_PREFIX}/{p.use}"))
            yield model
        finally:
            del g.node[n_nodes:]
            del g.input[n_inputs:]
            for node, index, name in renamed:
                node.output[index] = name


def _value(ref: np.ndarray, elem_type: int) -> np.ndarray:
    dtype = np.float32 if elem_type in (TensorProto.FLOAT, TensorProto.BFLOAT16) else (
        np.float16 if elem_type == TensorProto.FLOAT16 else np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(np.asarray(ref).astype(dtype))


def measure_impact(plan, culprits: list[Culprit], notes: list[str], step=None) -> int:
    """Set ``impact`` on (up to all of) ``culprits``; returns the candidate builds used (0, or 1 per group of feeds
    whose reference values fit in half the memory budget)."""
    if not culprits:
        return 0
    outputs = [p for p in plan.pairs if p.tensor in set(plan.ref_graph.outputs)]
    if not outputs:
        notes.append("impact not measured: no graph output is compared")
        return 0
    patches, skipped = _patches(culprits, plan.cand_model, plan.cand_types, plan.candidate_name)
    for node, why in skipped.items():
        notes.append(f"impact of {node} not measured: {why}")
    if not patches:
        return 0
    metric = plan.criterion.metric
    need = sorted({p.culprit.tensor for p in patches} | {o.tensor for o in outputs})
    ref_inputs = set(plan.ref_graph.inputs)
    marked = [n for n in need if n not in ref_inputs]
    base = {o.tensor: ErrorStats() for o in outputs}
    fixed = {id(p): {o.tensor: ErrorStats() for o in outputs} for p in patches}
    builds = 0
    cand_session = None
    try:
        for group in reference_groups(plan, marked, step, f"impact of {len(patches)} culprits"):
            ranks = {p.tensor: np.ndim(group[0][1][p.culprit.tensor]) for p in patches}
            with patched(plan.cand_model, patches, ranks) as model:
                cand_session = plan.cand_engine.prepare(model, [o.candidate for o in outputs])
            builds += 1
            for fi, ref in group:
                values = {p.value: _value(ref[p.culprit.tensor], p.elem_type) for p in patches}
                off = {p.use: np.array(False) for p in patches}
                run = {**plan.cand_feeds[fi], **values}
                got = cand_session.run({**run, **off})
                for o in outputs:
                    base[o.tensor].update(ref[o.tensor], got[o.candidate])
                for p in patches:
                    got = cand_session.run({**run, **off, p.use: np.array(True)})
                    for o in outputs:
                        fixed[id(p)][o.tensor].update(ref[o.tensor], got[o.candidate])
            cand_session.close()
            cand_session = None
    except EngineRunError as e:
        notes.append(f"impact of the culprits not measured: the candidate engine refused the patched model ({e})")
        log.warning("impact not measured: %s", e)
        return max(1, builds)
    finally:
        if cand_session is not None:
            cand_session.close()
    before = {o: s.metrics() for o, s in base.items()}
    for p in patches:
        after = {o: s.metrics() for o, s in fixed[id(p)].items()}
        p.culprit.impact = impact_record(metric, before, after)
        if ((p.culprit.floor or {}).get("share_over_max") or 0) > 0:  # the exact value itself overflows the format
            p.culprit.impact.update(harmless=False, note="its reference values exceed the format's range, so a "
                                    "fix must keep it and its consumers wider; the patched value overflows too")
    return builds


def reference_groups(plan, tensors: list[str], step=None, label: str = "") -> Iterator[list[tuple[int, dict]]]:
    """The reference's values of ``tensors`` and each feed's own inputs, as (feed index, values) in groups of feeds
    whose values fit in half the memory budget (at least one feed each). The reference session is closed before a
    group is yielded: the candidate's session that reads it is never held together with it (each holds a copy of
    the weights, prepacked or cast to its kernels' type: on a 0.9 GB decoder, 2.5 GB at the peak together)."""
    limit = max(1, parse_size(plan.options.memory_budget) // 2)
    inputs = set(plan.ref_graph.inputs)
    done = 0
    while done < len(plan.feeds):
        group: list[tuple[int, dict]] = []
        held = 0
        session = plan.ref_engine.prepare(plan.ref_model, tensors) if tensors else None
        try:
            while done + len(group) < len(plan.feeds) and (not group or held < limit):
                fi = done + len(group)
                if step is not None:
                    step(fi / len(plan.feeds), f"{label}: feed {fi + 1}/{len(plan.feeds)}")
                feed = plan.feeds[fi]
                ref = dict(session.run(feed)) if session is not None else {}
                ref.update({k: v for k, v in feed.items() if k in inputs})
                group.append((fi, ref))
                held += sum(np.asarray(v).nbytes for v in ref.values())
        finally:
            if session is not None:
                session.close()
        done += len(group)
        yield group


def impact_record(metric: str, before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Per-output gain (dB) of a fix; harmless when no output gains :data:`IMPACT_MARGIN_DB` or loses inf/NaN."""
    gain: dict[str, float] = {}
    nonfinite_fixed = 0
    for out, b in before.items():
        a = after[out]
        g = excess_db(metric, b, a)
        gain[out] = 0.0 if g is None or math.isnan(g) else g
        nonfinite_fixed += max(0, (b.get("nonfinite_mismatch") or 0) - (a.get("nonfinite_mismatch") or 0))
    best = max(gain.values()) if gain else 0.0
    return {"gain": gain, "best_gain_db": best, "nonfinite_fixed": nonfinite_fixed,
            "harmless": best < IMPACT_MARGIN_DB and nonfinite_fixed == 0,
            "after": {o: {metric: a.get(metric), "nonfinite_mismatch": a.get("nonfinite_mismatch")}
                      for o, a in after.items()}}
