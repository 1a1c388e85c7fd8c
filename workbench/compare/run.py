"""Running a :class:`~workbench.compare.plan.ComparisonPlan`: layer-wise strategy, floors, culprits, impact."""

from __future__ import annotations

import time

import numpy as np

from ..core.progress import Steps
from . import culprits as ranking
from . import qdq_impact
from .explain import explain, reconcile
from .floor import Floors
from .impact import measure_impact
from .result import CompareResult, Culprit, TensorResult
from .strategies import Context, Measured, Ticker, run_all, run_bisect


def _check_outputs_came_back(plan, measured: Measured) -> None:
    """Every compared graph output has values from both sides; an engine that returned none for one is named
    (exit 3), rather than a verdict of "ok" on nothing."""
    from ..errors import EngineCrashedError

    outputs = set(plan.ref_graph.outputs)
    missing = [p.tensor for p in plan.pairs if p.tensor in outputs and p.tensor not in measured.full]
    if missing:
        from .plan import names_list

        raise EngineCrashedError(
            f"no value came back for graph output(s) {names_list(missing)}: the reference ({plan.ref_spec}) or the "
            f"candidate ({plan.cand_spec}) engine returned fewer tensors than it was asked for",
            "check the engine's run() returns every requested name (a custom engine's mapping of output names)")


def run_plan(plan, steps: Steps) -> CompareResult:
    """Compare ``plan``'s two sides layer by layer; see :func:`workbench.compare.api.compare`."""
    opts = plan.options
    t0 = time.perf_counter()
    timing = dict(plan.timing)
    cand_engine = plan.cand_engine
    chosen = opts.mode if opts.mode != "auto" else ("all" if getattr(cand_engine, "marks_all_cheaply", True)
                                                    else "bisect")
    notes = list(plan.notes)
    ctx = Context(plan=plan, floors=Floors(formats=plan.formats), step=steps.span(0.0, 0.85), notes=notes)
    streamed = getattr(plan, "measure", None)  # a segment-streamed plan (workbench.compare.stream)
    measured = streamed(ctx) if streamed else run_all(ctx) if chosen == "all" else \
        run_bisect(ctx, plan.ref_graph.outputs)
    timing.update(ctx.timing)
    timing["layerwise_s"] = time.perf_counter() - t0
    crit = plan.criterion
    floors = {t: s.summary() for t, s in ctx.floors.stats.items()}
    tensors = []
    for p in plan.pairs:
        stats = measured.full.get(p.tensor)
        if stats is None:
            continue
        m, floor = stats.metrics(), floors.get(p.tensor)
        tensors.append(TensorResult(p.tensor, p.node, p.op_type, p.topo_index, m, crit.diverged(m, floor),
                                    p.candidate, floor, crit.at_floor(m, floor)))
    _check_outputs_came_back(plan, measured)
    culprits = _culprits(plan, measured, floors)
    _note_hidden_overflow(plan, tensors, notes)
    t1 = time.perf_counter()
    qdq = opts.impact > 0 and qdq_impact.is_qdq(plan)  # INT8: measure the deployable fix, Q/DQ removal
    flagged = [c for c in culprits if c.introduces_divergence][:qdq_impact.QDQ_IMPACT if qdq else opts.impact]
    if flagged and opts.culprits:
        with Ticker(steps.span(0.85, 1.0), 0.0, 1.0, f"measuring what fixing {len(flagged)} culprit(s) gains",
                    max(1.0, timing.get("layerwise_s", 1.0) / 2)) as tick:
            ctx.builds += (qdq_impact.measure_qdq_impact if qdq else measure_impact)(plan, flagged, notes, tick)
        for c in flagged:  # an explanation never blames the format for a node whose fix matters
            reconcile(c)
        culprits = qdq_impact.rank(culprits, crit) if qdq else ranking.rank(culprits, crit)
    timing["impact_s"] = time.perf_counter() - t1
    flagged = [c for c in culprits if c.introduces_divergence]
    shown = flagged[:opts.max_culprits] if flagged else culprits[:min(3, opts.max_culprits)]
    timing["total_s"] = time.perf_counter() - t0 + plan.timing.get("setup_s", 0.0)
    steps(1.0, "done")
    original = plan.original
    result = CompareResult(
        reference=str(plan.ref_spec), candidate=str(plan.cand_spec), criterion=crit, tensors=tensors,
        culprits=shown, mode=chosen,
        model={"name": original.name, "sha256": original.fingerprint, "nodes": len(original.proto.graph.node),
               "path": str(original.path) if original.path else None},
        engines=plan.describe_engines(), variant=plan.variant_info, feeds=plan.feed_info,
        timing={k: round(v, 4) for k, v in timing.items()}, builds=ctx.builds, notes=notes,
        outputs=list(plan.ref_graph.outputs), precision=plan.precision_json(),
        fail_on_internal_dips=opts.fail_on_internal_dips,
    )
    if getattr(plan, "granularity", None):  # fused: errors attributed to the engine's groups
        from ..engine_graphs.granularity import attribute

        attribute(result, plan)
    result.used_feeds = plan.feeds
    result.plan = plan
    result.run_options = _run_options(plan)
    return result


def _culprits(plan, measured: Measured, floors: dict) -> list[Culprit]:
    crit = plan.criterion
    out = []
    for p in plan.pairs:
        stats = measured.introduced.get(p.tensor)
        if stats is None:
            continue
        m = stats.metrics()
        node = plan.ref_graph.node(p.node)
        received = ranking.received([i for i in node.inputs if i], measured.full, crit)
        floor = floors.get(p.tensor)
        c = Culprit(p.node, p.op_type, p.tensor, p.topo_index, m, received, False, floor=floor,
                    beyond_floor=ranking.beyond_floor(crit.metric, m, floor))
        c.introduces_divergence = crit.diverged(ranking.judged_metrics(c, crit.metric))
        c.explanation = explain(p.node, plan.family, stats, received, plan.clamps, tensor=p.tensor, floor=floor,
                                op_type=p.op_type, reduction=_reduction(plan, node), beyond=c.beyond_floor)
        full = measured.full.get(p.tensor)
        if not c.introduces_divergence and full is not None:
            _amplifier(c, full.metrics(), floor, crit)
        out.append(c)
    return ranking.rank(out, crit)


def _amplifier(c: Culprit, output: dict, floor: dict | None, crit) -> None:
    """A node whose output diverges in the full run although what it receives does not, and alone (reference
    inputs) it adds too little to diverge: it magnifies its inputs' small error past the criterion (a
    BatchNormalization or a subtraction whose output is a small difference of large values). That node is where
    the divergence starts, so it is flagged; its measured impact then says whether fixing it there helps (for INT8,
    its inputs read in float)."""
    from .text import fmt

    if not crit.diverged(output, floor) or crit.diverged(c.received):
        return
    m = crit.metric
    c.introduces_divergence = True
    said = (f"it amplifies the error it receives: its inputs arrive at {m} {fmt(c.received.get(m), m)} (under the "
            f"criterion) and its output is at {fmt(output.get(m), m)} in the full run, while alone, from reference "
            f"inputs, it adds only {fmt(c.introduced.get(m), m)}: its output is sensitive to small input errors "
            "(e.g. a small difference of large values)")
    c.explanation = f"{said}; {c.explanation}" if c.explanation else said


def _reduction(plan, node) -> int | None:
    """How many products each output of a MatMul/Gemm/Conv sums, or a Softmax/normalisation's axis length."""
    def dims(name):
        tp = plan.cand_types.get(plan.candidate_name(name)) or plan.cand_types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else None for d in tp.tensor_type.shape.dim]

    if not node.inputs:
        return None
    if node.op_type in ("MatMul", "Gemm"):
        d = dims(node.inputs[1])
        return d[-2] if d and len(d) >= 2 and d[-2] else None
    if node.op_type == "Conv":
        d = dims(node.inputs[1])
        return int(np.prod(d[1:])) if d and None not in d and len(d) > 2 else None
    if node.op_type in ("Softmax", "LayerNormalization", "ReduceMean", "ReduceSum", "LogSoftmax"):
        d = dims(node.inputs[0])
        return d[-1] if d and d[-1] else None
    return None


def _run_options(plan) -> dict:
    """What a bundle needs to rerun this comparison (``result.run_options``, not serialised)."""
    opts = plan.options
    return {"options": opts, "requested_mode": opts.mode, "memory_budget": opts.memory_budget,
            "keep_fp32": list(opts.keep_fp32), "calibration_feeds": opts.calibration_feeds,
            "inline_branches": opts.inline_branches, "culprits": opts.culprits, "max_culprits": opts.max_culprits,
            "isolate": opts.isolate, "timeout_s": opts.timeout_s, "engine_options": plan.engine_options,
            "cand_model": plan.cand_source, "model": plan.model_source, "seed": opts.seed,
            "feed_count": opts.feed_count, "input_shapes": opts.input_shapes, "val_ranges": opts.val_ranges,
            "custom_engines": plan.custom_engines}


def _note_hidden_overflow(plan, tensors: list[TensorResult], notes: list[str]) -> None:
    """On ONNX Runtime's CPU provider (FP16 ops computed in FP32), outputs that pass while reference values of
    some tensor lie past FP16's range: say that a GPU storing that tensor in FP16 gets inf there."""
    if plan.cand_spec.engine != "ort" or plan.cand_precision.family != "fp16":
        return
    outputs = set(plan.ref_graph.outputs)
    over = [t for t in tensors if ((t.floor or {}).get("share_over_max") or 0) > 0]
    if not over or any(t.diverged for t in tensors if t.tensor in outputs):
        return
    first = min(over, key=lambda t: t.topo_index)
    notes.append(f"the outputs pass on ONNX Runtime's CPU provider, but {len(over)} tensor(s) hold reference values "
                 f"past FP16's 65504 (first: {first.tensor}, node {first.node}): a GPU that stores them in FP16 as "
                 "written (TensorRT, torch) gets inf there; compare with --cand ref:fp16 (FP16 arithmetic), and "
                 "repair verifies there")
