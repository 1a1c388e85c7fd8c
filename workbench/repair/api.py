"""``repair()``: the smallest set of nodes to keep in reference precision so that the candidate meets a target.

Steps: compare (culprits ranked, impact measured) -> pool of culprits -> search (grow, binary search, shrink to
1-minimal) -> build the repaired model -> verify it on the candidate engine and on an independent one -> check
it with onnx's checker -> save it atomically.

Feeds may be a dataset (a folder of .npz, a folder of images with ``preprocess``, a generator, a DataLoader): every
candidate build runs on all of them, so they are read into memory once, and refused with the numbers when they
exceed the memory budget. The search's candidate evaluations may run on local worker processes or Ray
(``workers``/``executor``; see :mod:`workbench.repair.parallel` and :mod:`workbench.repair.search`) with the
serial result.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from ..compare.plan import ComparisonPlan
from ..core.arguments import checked
from ..core.progress import Progress, Steps
from ..core.scratch import temporary_dir
from ..errors import EngineRunError, EngineUnavailableError, InputError, WorkbenchError
from .evaluate import Evaluator
from .graph import RepairError
from .islands import IslandBuilder
from .result import RepairResult
from .rewrites import describe, rewrite_first
from .search import best_unmet, candidate_pool, search
from .target import Target
from .weights import precision_share

log = logging.getLogger(__name__)

#: compare() options repair uses unless given: a long culprit list, impact measured on the top ones
COMPARE_DEFAULTS = {"max_culprits": 64, "impact": 8, "inline_branches": False}
#: the comparison's marked tensors, without a memory budget given: repair needs its culprits, not the fastest
#: comparison (FP16 repair of the PP-OCR detectors and recognizers: peak RSS 0.87-1.21 GiB -> 0.56-0.69 GiB, time
#: +0.1-1.3 s; compare's own default budget is a quarter of RAM, at most 4G)
MARKED_BUDGET = 512 << 20
#: the share of the progress bar the first search gets when a second one, in FP16 arithmetic, may follow
#: (:func:`_fp16_arithmetic_engine`)
FIRST_PASS = 0.6
#: Q/DQ candidates whose weights and the reference's pass this are built with their big weights mapped from this
#: run's scratch (:meth:`IslandBuilder.spill_weights`): INT8 repair of a 2-layer BERT (~190 MB of both) 36.6 s ->
#: 20.0 s, the same repaired file byte for byte (peak RSS unchanged, ~1.0 GiB: the plan keeps both models)
SPILL_BYTES = 32 << 20
#: a garbage collection after the search: only when the two models' weights pass this many bytes
COLLECT_BYTES = 64 << 20
#: the tensors moved then: those of at least this many bytes
SPILL_TENSOR_BYTES = 1 << 20
BATCH = ("auto", "switch", "build")


@checked()
def repair(model: Any, reference: str = "ort", candidate: str = "ort:fp16", *, cand_model: Any = None,
           feeds: Any = None, target: str | None = None, metric: Any = None, out: str | os.PathLike | None = None,
           nodes: Sequence[str] | None = None, max_builds: int = 40, max_pool: int = 64, batch: str = "auto",
           verify: str | None = "auto", preprocess: str | Callable | None = None, calibration: Any = None,
           workers: int = 1, executor: str | None = None, rewrites: bool = True, keep_placement: bool = False,
           progress: Progress | None = None, cancel: threading.Event | None = None, **compare_options: Any
           ) -> RepairResult:
    """Find a small set of nodes to keep in reference precision so that ``candidate`` meets ``target``.

    ``target``: without ``metric``, a criterion text (``"sqnr_db<40"``: an output fails when it matches; default:
    the candidate precision's criterion) that every output of every feed must pass beyond its precision floor.
    ``metric``: ``module:function`` (or ``file.py:function``, or a callable) called per feed as
    ``fn(reference_outputs, candidate_outputs)`` with dicts keyed by output name, returning a number (``target``
    then is ``">=0.99"``-style, judged on the worst feed, or ``"mean>=0.95"``, on the mean over the feeds) or a
    bool. ``cand_model``: a user's own FP16/QDQ file (the repaired model is that file with the minimal edits).
    ``out``: where to save the repaired model.
    ``nodes``: search among these nodes (reference names, best first) instead of the comparison's culprits.
    ``max_builds``: cap on candidate builds by the search. ``batch``: "auto" (one switchable model for FP16/BF16
    candidates, a build per set for Q/DQ ones), "switch" or "build". ``verify``: the independent engine the
    repaired model is checked on besides the candidate's ("auto": ``ref``, numpy in the model's own types, for
    FP16/BF16 candidates, and ONNX Runtime with graph optimizations off, Q/DQ unfused, for Q/DQ ones; "ref", or any
    engine name; None/"none": skip).
    ``feeds``: feeds as compare() takes them, or a dataset (a folder of .npz, a folder of images with
    ``preprocess`` -- ``module:function`` or ``file.py:function`` taking an image path --, a
    :class:`~workbench.dataset.source.Dataset`, a generator, a DataLoader), read into memory within the memory
    budget. ``calibration``: INT8 calibration data for an ``:int8`` candidate (N random feeds, a file, a folder
    of .npz or of images with ``preprocess``; default: ``feeds``; :mod:`workbench.repair.calibration`).
    ``workers``/``executor``: evaluate the search's candidate sets on N local processes or on Ray
    (``"ray"``, ``"ray://HOST:PORT"``); the result is the serial one. ``rewrites``: for FP16 candidates, first
    try rewrites that keep culprits in the candidate precision (:mod:`workbench.repair.rewrites`: a clamped constant
    restored, a BatchNormalization folded or rescaled), islands only for what they leave; for the INT8 variant of an
    FP32 model that misses the target, first the FP32 model quantized again with Q/DQ pairs on the inputs of its
    weighted ops alone, TensorRT's recommended placement, its depthwise Convs' inputs equalized per channel first
    (:mod:`workbench.repair.qdq_placement`, :mod:`workbench.variants.equalize`: the repaired model
    when it meets the target, the one searched when it fails no more feeds), else its BatchNormalizations folded
    into their Convs and the model quantized again (:mod:`workbench.repair.qdq_fold`). ``keep_placement``: keep
    the INT8 variant's own Q/DQ placement (ONNX Runtime's, every op it quantizes): no re-quantization with
    TensorRT's, no equalization. Other keywords are
    compare() options (``feed_count``, ``seed``, ``input_shapes``, ``max_culprits``, ``impact``, ``memory_budget``,
    ...).
    Raises :class:`~workbench.repair.graph.RepairError` (a WorkbenchError) on bad input.
    """
    from ..calibrate.feeds import is_dataset
    from ..dataset.executors import ExecutorSpec

    t0 = time.perf_counter()
    steps = Steps(progress, cancel)
    spec = ExecutorSpec.parse(executor, workers)
    if spec.kind == "ray":
        _check_ray()
    if batch not in BATCH:
        raise RepairError(f"unknown batch mode {batch!r}", f"use one of {', '.join(BATCH)}")
    _check_verify(verify)
    if isinstance(max_builds, bool) or not isinstance(max_builds, int) or max_builds < 1:
        raise RepairError(f"max_builds must be a whole number >= 1, not {max_builds!r}")
    out_path = _check_out(out, model, cand_model)
    if metric is None and target:
        from .target import criterion_target

        criterion_target(target)  # a bad criterion, or a task threshold without a metric, fails before the comparison
    if metric is not None:
        from .target import load_metric

        load_metric(metric)  # an unknown module fails before the comparison
    for key, value in COMPARE_DEFAULTS.items():
        compare_options.setdefault(key, value)
    source = None
    if feeds is None and preprocess is not None and calibration is None:
        raise RepairError("preprocess applies to a dataset, and no feeds were given",
                          "pass feeds= a folder of images (--inputs DIR), or drop preprocess")
    if feeds is not None and is_dataset(feeds, preprocess):
        model, source, feeds = _dataset_feeds(model, feeds, preprocess, compare_options, steps.check)
    if calibration is not None:
        from .calibration import resolve

        model, compare_options["calibration_feeds"] = resolve(model, calibration, preprocess, compare_options,
                                                              steps.check)
    plan = ComparisonPlan(model, reference, candidate, feeds=feeds, cand_model=cand_model, **compare_options)
    try:
        if source is not None:
            plan.feed_info = source
        _refuse_qoperator(plan.cand_model)
        if nodes is not None:  # unknown names fail before the comparison
            nodes = IslandBuilder(plan.cand_model, plan.ref_model).check(nodes)
        again_possible = _may_search_again(plan, verify)
        # a first pass that may be searched again writes nothing: an interrupt during the second search would
        # leave the first pass's model, which failed in FP16 arithmetic, at --out
        res = _repair(plan, steps.span(0.0, FIRST_PASS) if again_possible else steps, t0, target=target,
                      metric=metric, out_path=None if again_possible else out_path, nodes=nodes,
                      max_builds=max_builds, max_pool=max_pool, batch=batch, verify=verify, cancel=cancel, spec=spec,
                      rewrites=rewrites, keep_placement=keep_placement)
    finally:
        plan.close()
    arith = _fp16_arithmetic_engine(res, plan)
    if arith is None:
        if again_possible:
            _write(res, out_path)
            steps(1.0, "done")
        return res
    # ONNX Runtime's CPU provider computes most FP16 operators in FP32: a model it passes can still overflow where
    # FP16 arithmetic runs as written (a GPU: torch, TensorRT). Search again where that arithmetic shows.
    first = res.verification["independent"]
    log.info("repair met on %s but not in FP16 arithmetic (%s): searching again on %s", plan.cand_spec,
             first.get("engine"), arith)
    try:
        # the model as the first pass loaded it: its weights are held once, not loaded again beside it
        again = repair(plan.original, reference, arith, feeds=feeds, cand_model=cand_model, target=target,
                       metric=metric,
                       out=out, nodes=nodes, max_builds=max_builds, max_pool=max_pool, batch=batch, verify="ort",
                       workers=workers, executor=executor, rewrites=rewrites, keep_placement=keep_placement,
                       progress=_second_pass(steps, arith),
                       cancel=cancel, **compare_options)
    except WorkbenchError as e:  # the first result stands, said to fail in FP16 arithmetic
        res.notes.insert(0, f"the model passes on {plan.cand_spec} but fails in FP16 arithmetic "
                            f"({first.get('engine')}), as a GPU computes; searching again on {arith} failed: {e}")
        _write(res, out_path)
        return res
    kept = ", ".join(res.kept) or "nothing"
    again.notes.insert(0, f"on {plan.cand_spec} the target was met keeping {kept}, but that model failed in FP16 "
                          f"arithmetic ({first.get('engine')}: {first.get('failing')} failing feed(s)); "
                          f"{plan.cand_spec.engine}'s CPU provider computes most FP16 operators in FP32, while a GPU "
                          f"(TensorRT, torch) runs them as written: repaired again on {arith}, which computes in "
                          "FP16, and verified on ort")
    again.timing["first_pass_s"] = res.timing.get("total_s")
    again.timing["total_s"] = round(time.perf_counter() - t0, 3)
    return again


def _write(res: RepairResult, out_path) -> None:
    """Write the repaired model of a first pass that was not searched again (``out_path`` None: nothing)."""
    if out_path is not None:
        res.model_path = str(save_model(res.model, out_path))


def _may_search_again(plan, verify: str | None) -> bool:
    """Whether :func:`_fp16_arithmetic_engine` can ask for a second search after this one (then the first pass
    reports progress up to :data:`FIRST_PASS` only, so the bar never starts over)."""
    return plan.cand_spec.engine == "ort" and str(verify or "") in ("auto", "ref") \
        and plan.cand_precision.family in ("fp16", "bf16")


def _second_pass(steps: Steps, engine: str) -> Progress:
    """Progress of the second search: the rest of the bar after :data:`FIRST_PASS`, its messages saying so."""
    rest = steps.span(FIRST_PASS, 1.0)
    return lambda fraction, message: rest(fraction, f"again in FP16 arithmetic ({engine}): {message}")


def _fp16_arithmetic_engine(res: RepairResult, plan) -> str | None:
    """``ref:<variant>`` when ``res`` met its target on ONNX Runtime's CPU provider (which hides FP16 arithmetic
    overflow) but its model failed the independent check in the model's own FP16/BF16 arithmetic; else None."""
    independent = res.verification.get("independent") or {}
    if res.kind != "float" or not res.met or plan.cand_spec.engine != "ort" \
            or not str(independent.get("engine", "")).startswith("ref") or independent.get("met") is not False:
        return None
    variant = plan.cand_spec.variant if plan.cand_spec.variant != "fp32" else plan.cand_precision.family
    return f"ref:{variant}" if variant in ("fp16", "bf16") else None


def _check_ray() -> None:
    """Ray missing fails before the comparison, in one line."""
    import importlib.util

    from ..dataset.executors import RAY_HINT

    if importlib.util.find_spec("ray") is None:
        raise InputError("Ray is not installed", RAY_HINT)


def _dataset_feeds(model: Any, data: Any, preprocess: Any, options: dict,
                   check: Callable[[], None] = lambda: None) -> tuple[Any, dict, list[dict]]:
    """(model, feed provenance, checked feeds) of a dataset, read into memory sample by sample and refused (one
    InputError with the numbers) as soon as the feeds exceed the memory budget. A model file is loaded once here
    and handed on loaded."""
    from .._files import human_size
    from ..core.budget import parse_size
    from ..dataset.source import Prefetch, open_dataset
    from ..inputs import check_feeds
    from ..model.load import LoadedModel, is_torch_module, load_model

    loaded = model if isinstance(model, LoadedModel) else load_model(model, example_inputs=options.get(
        "example_inputs"))
    initializers = {t.name for t in loaded.proto.graph.initializer}
    names = [i.name for i in loaded.proto.graph.input if i.name not in initializers]
    dataset = open_dataset(data, preprocess=preprocess, input_names=names)
    given = options.get("memory_budget")
    budget = parse_size(given)
    feeds: list[dict] = []
    total = 0
    for sample in Prefetch(dataset, check):  # Cancel ends the read even while one sample's preprocessing blocks
        try:
            feed = check_feeds(loaded.proto, [sample.feed])[0]
        except InputError as e:
            raise InputError(f"sample {sample.index} ({sample.source}): {e.message}", e.hint) from None
        feeds.append(feed)
        total += sum(int(v.nbytes) for v in feed.values())
        if total > budget:
            size = dataset.size
            whole = f"; all {size} would take about {human_size(total * size // len(feeds))}" if size else ""
            raise InputError(
                f"repair holds every feed in memory (each candidate build runs on all of them): the first "
                f"{len(feeds)}{f' of {size}' if size else ''} samples already take {human_size(total)}, over the "
                f"memory budget of {human_size(budget)}{'' if given is not None else ' (default)'}{whole}",
                "repair on a subset of the dataset (a folder with fewer samples), or raise --memory-budget "
                "(memory_budget=)")
    if not feeds:
        raise InputError("the dataset holds no samples", "check the folder or the iterable")
    source = {"source": dataset.describe.get("folder") or dataset.describe.get("type") or "dataset",
              "count": len(feeds), "dataset": dataset.describe}
    return (model if is_torch_module(model) else loaded), source, feeds


def _repair(plan, steps: Steps, t0: float, *, target, metric, out_path, nodes, max_builds, max_pool, batch, verify,
            cancel, spec, rewrites=True, keep_placement=False) -> RepairResult:
    timing: dict[str, float] = {}
    notes: list[str] = []
    measured = False
    if nodes is None:
        from .qdq_order import measured_pool_only

        measured = measured_pool_only(plan, notes)
    _bound_marked_tensors(plan)
    if measured and not _format_floors(plan):  # the baseline evaluation judges the same outputs on the same feeds
        result, floors = None, {}
        notes.append("no comparison before the search: its outputs' errors are the baseline evaluation's")
    else:
        result = plan.run(progress=steps.span(0.0, 0.45), cancel=cancel)
        floors = {t.tensor: t.floor for t in result.output_results}
        if measured:
            notes.append("the comparison before the search is of the outputs alone (their FP16/BF16 floors)")
    builder = IslandBuilder(plan.cand_model, plan.ref_model)  # after the run: it indexes the candidate's nodes
    timing["compare_s"] = time.perf_counter() - t0
    goal = Target.build(plan.criterion, target, metric, floors)
    cand_outputs = {o.name for o in plan.cand_model.graph.output}
    outputs = [(o, o if o in cand_outputs else plan.candidate_name(o)) for o in plan.ref_graph.outputs]
    t1 = time.perf_counter()
    workers = scratch = spill = spill_placed = None
    ev = Evaluator(plan, builder, goal, outputs, max_builds=max_builds, batch=batch, step=steps.span(0.45, 0.85))
    rewritten: list = []
    try:
        spill = _spill_weights(builder)  # a folded candidate is returned as judged, never built from
        before = ev.evaluate([], model=plan.cand_model, role="baseline")
        pool = list(nodes) if nodes is not None else [] if result is None else \
            candidate_pool(result, plan, set(builder.idx.by_name), limit=max_pool, notes=notes)
        start, pool0 = 1, pool
        folds, base, placed = [], before, None
        if rewrites and nodes is None and not keep_placement:  # INT8: the FP32 model quantized again, TensorRT's
            # Q/DQ placement
            from .qdq_placement import placement_first

            folds, base, placed = placement_first(ev, plan, before, notes, timing)
            if placed is not None and not base.met:  # searched from: its big weights mapped too
                spill_placed = _spill_weights(placed)
        if rewrites and nodes is None and placed is None:  # INT8: BatchNormalizations folded, the FP32 model
            from .qdq_fold import fold_first  # quantized again; kept only when that meets the target

            folds, base = fold_first(ev, plan, before, notes, timing)
        if builder.kind == "qdq" and nodes is None and not base.met:
            pool, start = _order_qdq(ev, ev.builder, pool, base, notes, timing)
        island_pool = pool
        if rewrites:  # rewrites first: they keep the nodes in the candidate precision
            rewritten, island_pool, base = rewrite_first(ev, pool, base, notes)
        rewritten = folds + rewritten
        if spec.kind != "serial":
            from .parallel import RepairWorkers

            scratch = temporary_dir("workbench-repair-")
            workers = RepairWorkers(plan, ev.builder, [c for _, c in outputs], spec, scratch.name)
            ev.workers = workers
        kept, minimal = search(ev, island_pool, base, start)
        if kept is None and rewritten:
            notes.append("no island set met the target on the rewritten model: searched the candidate as converted")
            rewritten, island_pool = [], pool
            ev.rebase(builder)
            ev.workers = None  # the workers hold the rewritten model: serial from here
            if placed is not None:  # the pool was ordered on the other placement's pairs
                pool, start = _order_qdq(ev, builder, pool0, before, notes, timing)
                island_pool = pool
            kept, minimal = search(ev, pool, before, start if placed is not None else 1)
        builder = ev.builder
        weights = spill_placed if builder is placed else spill  # the searched model's mapped weights
        timing["search_s"] = time.perf_counter() - t1
        if kept is not None and not kept and not rewritten and before.met:  # the candidate as converted, judged
            final, repaired = before, plan.cand_model
        elif kept is not None and not kept and folds:  # the folded model as quantized, judged on every feed
            final, repaired = base, ev.builder.candidate
        else:
            final, repaired = _verify_on_candidate(ev, builder, kept, weights)
        if kept is not None and not final.met and any(e.how == "switch" for e in ev.evaluations):
            notes.append("the switchable model met the target but the repaired model does not on the candidate "
                         "engine (its fusions differ): searched again with one build per set")
            ev.drop_switch()
            kept, minimal = search(ev, island_pool, base if rewritten else before)
            final, repaired = _verify_on_candidate(ev, builder, kept, weights)
    finally:
        ev.close()
        if workers is not None:
            ev.notes += workers.notes
            workers.close()
            scratch.cleanup()
        for folder in (spill, spill_placed):
            if folder is not None:
                folder.cleanup()
    # the search's sessions and builds are gone but partly held in reference cycles (engines, closures): collected
    # now, before the independent check builds a session of its own (on a 0.9 GB decoder's FP16-arithmetic
    # search, 2.6 GB was garbage at that point; onnx's evaluators now free themselves on close). Only for big
    # models: a full collection costs ~0.2 s in a notebook's kernel (400k objects), more than a small model's repair
    if _weight_bytes(plan) >= COLLECT_BYTES:
        gc.collect()
    if kept is None:
        notes.append("no set of the pool met the target: reporting the closest set found")
        kept = final.kept
    notes += ev.notes
    if builder.kind == "qdq" and final.met:
        from .qdq_fold import unfolded_note

        unfolded = unfolded_note(plan, kept)
        if unfolded:
            notes.append(unfolded)
    t2 = time.perf_counter()
    independent = _independent(plan, repaired, ev, builder.kind, verify)
    if independent.get("note"):
        notes.append(independent["note"])
    timing["verify_s"] = time.perf_counter() - t2
    if final.met and independent.get("met") is False and builder.kind == "qdq":
        notes.insert(0, f"the repaired model meets the target on {plan.cand_spec.engine} but not on "
                        f"{independent.get('engine')} ({independent.get('failing')} failing feed(s)): engines compute "
                        "Q/DQ differently (fused INT8 kernels round where dequantize-compute-quantize does not), and "
                        "this target is close to that difference. Check it on the engine you deploy, or loosen the "
                        "target")
    checker = _check(repaired)
    family = plan.cand_precision.family
    weights = {"family": family, "before": precision_share(plan.cand_model, family),
               "after": precision_share(repaired, family)}
    undone = _mostly_undone(weights, plan, metric)
    if undone and final.met:
        notes.insert(0, undone)
    if final.met and kept and len(plan.feeds) < FEW_FEEDS:
        notes.append(f"the kept set was chosen to meet the target on these {len(plan.feeds)} feed(s): check the "
                     "repaired model on inputs the search did not see (workbench compare MODEL --ref ort --cand ort "
                     "--cand-model REPAIRED --inputs OTHER, with the same --metric) before deploying it")
    path = None
    if out_path is not None:
        path = str(save_model(repaired, out_path))
    timing["total_s"] = time.perf_counter() - t0
    steps(1.0, "done")
    by_role = dict(ev.builds_by_role)
    res = RepairResult(
        reference=str(plan.ref_spec), candidate=str(plan.cand_spec) if plan.cand_source is None
        else f"{plan.cand_spec} ({plan.variant_info.get('file')})", kept=list(kept), met=final.met,
        minimal=bool(minimal and final.met), builds=ev.total_builds, target=goal.to_json(),
        before=before.judgement.to_json(), after=final.judgement.to_json(),
        evaluations=[e.to_json() for e in ev.evaluations], pool=list(pool),
        verification={"candidate": {"engine": plan.cand_spec.engine, **final.judgement.to_json()},
                      "independent": independent},
        weights=weights, checker=checker, model_path=path, kind=builder.kind,
        timing={k: round(v, 3) for k, v in timing.items()}, notes=notes,
        builds_detail={"search": ev.search_builds, **by_role, "comparison": 0 if result is None else result.builds},
        executor=spec.describe(), model=repaired, plan=plan,
        repairs=describe([rw for rw in rewritten if rw.node not in set(kept)], kept, builder.kind))
    # (culprits it could not try are named in notes)
    if not pool and nodes is None and result is not None and not result.culprits:
        res.notes.append("the comparison flagged no culprit to keep")
    return res


#: a repair that kept nodes to meet its target on fewer feeds than this says to check it on other inputs (an INT8
#: repair searched on 8 crops kept nodes that fixed those 8 and left 1-8% of new crops misread)
FEW_FEEDS = 32
#: below this share of the candidate's own weight bytes left in its precision, the result says the target was met
#: mostly by undoing the conversion
UNDONE_SHARE = 0.5


def _mostly_undone(weights: dict, plan, metric) -> str | None:
    """A note when the repaired model keeps under :data:`UNDONE_SHARE` of the weight bytes the candidate held in
    its precision: the target was met by undoing most of the conversion, which with random feeds and an output
    criterion often says more about the inputs and the criterion than about the model."""
    before, after = (weights.get(k, {}).get("share") for k in ("before", "after"))
    if not before or after is None or after >= UNDONE_SHARE * before:
        return None
    family = str(weights.get("family") or "").upper()
    why, how = [], []
    if plan.feed_info.get("source") == "random":
        why.append("random inputs are far from what the model sees")
        how.append("real inputs (--inputs DIR" + (", and --calib DIR for the INT8 ranges" if family == "INT8" else "")
                   + ")")
    if metric is None:
        why.append("an output criterion asks for more than the task may need")
        how.append("a task metric (--metric, with --target) instead of the output criterion")
    advice = f": {', and '.join(why)}; give {' and '.join(how)}" if how else ""
    return (f"the target was met by undoing most of the {family} conversion: {100 * after:.1f}% of the weight bytes "
            f"stay {family} ({100 * before:.1f}% before){advice}")


def _format_floors(plan) -> bool:
    """Whether a graph output of the candidate is held in FP16/BF16: only those formats' floors change a verdict
    (:meth:`~workbench.compare.criterion.Criterion.at_floor`), and only the comparison measures them."""
    formats = getattr(plan, "formats", {}) or {}
    return any(getattr(formats.get(o), "name", None) in ("fp16", "bf16") for o in plan.ref_graph.outputs)


def _bound_marked_tensors(plan) -> None:
    """Without a memory budget given, the comparison marks tensors in chunks of :data:`MARKED_BUDGET` (the feeds
    were checked against the default budget already)."""
    from ..core.budget import default_budget

    if plan.options.memory_budget is None:
        plan.options = plan.options.replace(memory_budget=min(MARKED_BUDGET, default_budget()))


def _order_qdq(ev: Evaluator, builder: IslandBuilder, pool: list[str], before, notes: list[str],
               timing: dict) -> tuple[list[str], int]:
    """(the Q/DQ pool ordered by measurement, the first prefix size for the search): node by node up to
    :data:`qdq_groups.SMALL` quantized nodes, by group testing above (:mod:`workbench.repair.qdq_groups`; the
    search starts with the first unit it found whole)."""
    from .qdq_groups import SMALL, order_by_groups
    from .qdq_order import order_pool, quantized_nodes

    if len(quantized_nodes(builder)) <= SMALL:
        ordered, ordering = order_pool(ev, builder, pool, before, notes)
        if ordering:
            notes.append(f"Q/DQ pool: {ordering['measured']} node(s) dequantized one at a time in one switchable "
                         f"session on {ordering['feeds']} failing feed(s); {ordering['helping']} help there, "
                         f"{ordering['met_there']} meet the target alone there"
                         + (f"; the first of those that holds on every feed: {ordering['holds']}" if ordering['holds']
                            else (", none of them on every feed" if ordering['met_there'] else "")))
    else:
        ordered, ordering = order_by_groups(ev, builder, pool, before, notes)
        if ordering.get("all_float_met"):
            at_once = f", {ordering['at_once']} at a time" if ordering.get("at_once", 1) > 1 else ""
            notes.append(f"Q/DQ pool: {ordering['nodes']} quantized node(s) ordered by group testing: "
                         f"{ordering['measured']} block build(s) on {ordering['probes']} probe feed(s)"
                         f"{at_once}, "
                         f"{ordering['isolated']} node(s) isolated, {ordering['helping']} in blocks that help")
    if ordering:
        timing["qdq_order_s"] = ordering["seconds"]
    return ordered, int(ordering.get("first_unit") or 1)


def _verify_on_candidate(ev: Evaluator, builder: IslandBuilder, kept, spill=None):
    """(the evaluation of the repaired model on the candidate engine, that model: its weights read back from
    ``spill``'s files)."""
    if kept is None:
        best = best_unmet(ev)
        kept = best.kept if best is not None else ()
    repaired = builder.build(kept)
    judged = ev.built_on_every_feed(kept) if builder is ev.builder else None
    # the search built this set on the candidate engine and ran every feed: the same model, judged already
    evaluation = judged if judged is not None else ev.evaluate(kept, model=repaired, role="verify")
    if spill is not None:
        from ..model.mapped import materialized

        repaired = materialized(repaired, under=Path(spill.name))
    return evaluation, repaired


def _weight_bytes(plan) -> int:
    """The bytes of the reference's and the candidate's constants: initializers (mapped or in memory) and
    Constant nodes."""
    from ..core.shapes import tensor_nbytes
    from .graph import constants

    return sum(tensor_nbytes(t) for m in (plan.ref_model, plan.cand_model) for t in constants(m).values())


def _spill_weights(builder: IslandBuilder):
    """For a Q/DQ candidate whose weights (with the reference's) pass :data:`SPILL_BYTES`: a folder of this run's
    scratch holding its big weights, which every build maps instead of copying
    (:meth:`IslandBuilder.spill_weights`); else None."""
    from ..core.shapes import tensor_nbytes

    if builder.kind != "qdq":
        return None
    total = sum(tensor_nbytes(t) for t in builder.candidate.graph.initializer)
    total += sum(tensor_nbytes(t) for t in builder.ref_consts.values())
    if total < SPILL_BYTES:
        return None
    folder = temporary_dir("workbench-repair-weights-")
    try:
        moved = builder.spill_weights(folder.name, SPILL_TENSOR_BYTES)
    except OSError as e:  # no room in the scratch folder: builds copy the weights, as for smaller models
        log.warning("repair's weights stay in memory (%s)", e)
        folder.cleanup()
        return None
    log.info("repair: %.0f MB of weights mapped from %s for the builds", moved / 1e6, folder.name)
    return folder


#: ops of ONNX Runtime's QOperator format: they compute in integers, with no float node left to restore
QOPERATOR_OPS = ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QLinearAdd", "QLinearMul",
                 "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu",
                 "QLinearAveragePool", "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere", "QGemm", "QAttention",
                 "DynamicQuantizeMatMul")


def _refuse_qoperator(model) -> None:
    """Refuse, before the comparison, a candidate quantized in the QOperator format (QLinearConv...): repair
    removes the Q/DQ pairs around float nodes, and such a model's integer nodes have none (it was searched, found
    nothing to remove and said the target could not be reached)."""
    from collections import Counter

    found = Counter(n.op_type for n in model.graph.node if n.op_type in QOPERATOR_OPS)
    if found:
        ops = ", ".join(f"{count} {op}" for op, count in found.most_common(4))
        raise RepairError(f"the candidate is quantized in the QOperator format ({ops}): repair removes Q/DQ pairs "
                          "around float nodes, and its integer nodes have none",
                          "quantize it in the QDQ format (quantize_static(..., quant_format=QuantFormat.QDQ)), or "
                          "repair from the FP32 model: workbench repair MODEL.onnx --cand ort:int8 --calib DATA")


def _check_verify(verify: str | None) -> None:
    """Refuse, before any work, an independent engine that cannot run the repaired ONNX file here."""
    if not verify or verify in ("none", "auto"):
        return
    from ..engines.registry import class_for
    from ..engines.spec import EngineSpec

    spec = EngineSpec.parse(verify)
    if spec.variant != "fp32":
        raise RepairError(f"--verify {verify}: the independent check runs the repaired model as written",
                          f"name the engine alone (--verify {spec.engine})")
    cls = class_for(spec.engine)
    if getattr(cls, "runs_module", False):
        raise RepairError(f"--verify {verify}: the {spec.engine} engine runs a torch module, and the repaired model is "
                          "an ONNX file", "verify on an ONNX engine: ref, ort or openvino (or none)")
    available = getattr(cls, "availability", None)
    ok, why = available() if callable(available) else (True, "")
    if not ok:
        raise RepairError(f"--verify {verify}: {why}", "verify on an engine this machine runs: ref, ort or openvino "
                          "(or none)")


def _independent(plan, model: onnx.ModelProto, ev: Evaluator, kind: str, verify: str | None) -> dict:
    """The repaired model on another engine than the candidate's, judged against the same reference outputs."""
    from ..engines import get_engine

    if not verify or verify == "none":
        return {"skipped": "not requested"}
    requested = None  # an engine the user named, when another one checks instead
    if verify == "auto" and kind == "qdq":  # Q/DQ unfused (dequantize, compute, quantize), as the ONNX spec reads it:
        name, options = "ort", {"graph_optimization": "disable"}  # what `ref` computes, ~100x faster on convolutions
    else:
        name = "ref" if verify == "auto" else verify
        if name == plan.cand_spec.engine:
            requested = None if verify == "auto" else name
            name = "ort" if name == "ref" else "ref"
        from ..model.mapped import has_mapped

        if name == "ref" and has_mapped(model):
            return {"skipped": "the weights stay in their files (over the inline limit) and onnx's ReferenceEvaluator "
                               "would hold every one in memory; verify on another engine (--verify openvino)"}
        options = {"precision": "native"} if name == "ref" else {}
    t0 = time.perf_counter()
    try:
        with get_engine(name, **options).prepare(model, [c for _, c in ev.outputs]) as session:
            results = [session.run(f) for f in plan.cand_feeds]
    except (EngineRunError, EngineUnavailableError) as e:
        log.warning("independent verification on %s failed: %s", name, e)
        return {"engine": name, "error": f"{name}: {e}"}
    label = name + "".join(f" ({k}={v})" for k, v in options.items())
    out = {"engine": label, **ev.judge_outputs(results).to_json(), "seconds": round(time.perf_counter() - t0, 3)}
    if requested is not None:
        out["note"] = (f"--verify {verify} is the candidate's own engine, which the candidate check ran already: "
                       f"verified on {name} instead")
    return out


def _check(model: onnx.ModelProto) -> dict:
    from ..model.validate import validate

    _, problems = validate(model)
    errors = [p.message for p in problems if p.severity == "error"]
    if errors:
        log.warning("onnx's checker: %s", errors[0])
    return {"ok": not errors, "errors": errors}


def _paths_of(source: Any) -> list[Path]:
    from ..model.load import LoadedModel

    if isinstance(source, LoadedModel):
        source = source.path
    if isinstance(source, (str, os.PathLike)):
        return [Path(source).expanduser().resolve()]
    return []


def _check_out(out: Any, model: Any, cand_model: Any) -> Path | None:
    """The output path, refused when it is an input model (or a folder)."""
    if out is None:
        return None
    path = Path(out).expanduser()
    if path.is_dir():
        raise RepairError(f"--out {out} is a folder", "give a file name, e.g. fixed.onnx")
    resolved = path.resolve()
    for source in _paths_of(model) + _paths_of(cand_model):
        if resolved == source:
            raise RepairError(f"--out {out} is an input model; refusing to overwrite it",
                              "write the repaired model to a new file")
    return path


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Save atomically: one file when it fits in a protobuf (< 2 GB), else the weights beside it in
    ``NAME.data`` (written and renamed into place first; weights left mapped are copied file to file:
    :func:`workbench.model.mapped.save_model`)."""
    from ..model.mapped import save_model as save

    return save(model, path)[0]
