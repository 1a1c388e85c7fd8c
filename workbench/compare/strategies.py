"""Layer-wise strategies: mark everything (chunked under a memory budget) or bisect over tensors.

``all``: every paired tensor is marked on both engines, in chunks whose estimated size fits the memory
budget; each chunk also runs the isolation model, so every node's introduced error is measured.
``bisect``: one extra marked tensor per candidate build, binary search for the first divergent tensor
in topological order (TensorRT, where marking everything changes fusions and memory).
Both accumulate each tensor's precision floor (:mod:`workbench.compare.floor`) from the reference values.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from ..core.budget import chunks, parse_size, tensor_bytes
from ..core.metrics import ErrorStats
from ..core.progress import Cancelled, Progress, Steps  # noqa: F401 - Cancelled and Progress are re-exported
from ..errors import EngineRunError
from .floor import Floors
from .isolate import build_isolation, set_input_ranks
from .pairs import TensorPair

log = logging.getLogger(__name__)


@dataclass
class Context:
    """A plan being run: its engines, models, feeds and pairs (``plan``), plus what the run accumulates."""

    plan: Any  # ComparisonPlan
    floors: Floors = field(default_factory=Floors)
    step: Steps = field(default_factory=Steps)
    builds: int = 0
    notes: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)

    def prepare_candidate(self, model: onnx.ModelProto, outputs: list[str]):
        self.builds += 1
        return self.plan.cand_engine.prepare(model, outputs)

    @property
    def budget(self) -> int:
        return parse_size(self.plan.options.memory_budget)


@dataclass
class Measured:
    """Per reference tensor: error of the candidate's full run, and of the node run alone."""

    full: dict[str, ErrorStats] = field(default_factory=dict)
    introduced: dict[str, ErrorStats] = field(default_factory=dict)
    probed: list[str] = field(default_factory=list)  # bisect: the tensors evaluated, in order


_POOL: ThreadPoolExecutor | None = None


def update_many(jobs: list[tuple[Any, np.ndarray, np.ndarray]]) -> None:
    """Run many ``(accumulator, a, b)`` updates (``accumulator.update(a, b)``) on a thread pool (numpy releases the
    GIL; one job per accumulator, so every sum is accumulated in the same order as sequentially)."""
    global _POOL
    big = [j for j in jobs if np.size(j[1]) >= 65536]
    for stats, ref, cand in (j for j in jobs if np.size(j[1]) < 65536):
        stats.update(ref, cand)
    if len(big) < 2 or (os.cpu_count() or 1) < 2:
        for stats, ref, cand in big:
            stats.update(ref, cand)
        return
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="workbench-metrics")
    list(_POOL.map(lambda j: j[0].update(j[1], j[2]), big))


class _FloorJob:
    """Adapts a floor accumulation to :func:`update_many`'s ``update(a, b)`` call."""

    def __init__(self, floors: Floors, tensor: str):
        self.floors, self.tensor = floors, tensor

    def update(self, ref: np.ndarray, _unused: Any) -> None:
        self.floors.add(self.tensor, ref)


def _iso_dtype(vi: onnx.ValueInfoProto) -> np.dtype | None:
    et = vi.type.tensor_type.elem_type
    if not et:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(et))


def _ref_values(plan, session, feed: dict) -> dict[str, np.ndarray]:
    values = dict(session.run(feed)) if session is not None else {}
    values.update({k: v for k, v in feed.items() if k in plan.ref_inputs})
    return values


def _iso_feed(iso, dtypes: dict[str, np.dtype | None], ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feed = {}
    for name, ref_name in iso.boundary.items():
        value = np.asarray(ref[ref_name])
        dtype = dtypes.get(name) or (np.float32 if value.dtype == np.float64 else value.dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is measured, not an accident
            feed[name] = value.astype(dtype, copy=False)
    return feed


def _compare_jobs(ctx: Context, out: Measured, pairs: list[TensorPair], ref: dict, cand: dict) -> list:
    jobs: list = []
    for p in pairs:
        if p.tensor in ref and p.candidate in cand:
            jobs.append((out.full.setdefault(p.tensor, ErrorStats()), ref[p.tensor], cand[p.candidate]))
            if p.tensor in ctx.floors.formats:
                jobs.append((_FloorJob(ctx.floors, p.tensor), ref[p.tensor], None))
    return jobs


#: seconds between the progress reports that keep a long phase moving (see :class:`Ticker`)
TICK_S = 0.25


class Ticker:
    """Keeps the progress bar moving through one phase [lo, hi] of ``span`` while it waits in one long engine call
    that reports nothing (building or running the isolation model of a large graph: most of a comparison).

    Called like a :class:`Steps` (``ticker(fraction, message)``: a real step, reported at once); between real
    steps a helper thread reports every TICK_S seconds ``last + (hi - last) * t / (t + expected_s)`` (``t``: the
    seconds since the last real step), never reaching ``hi``, with the seconds spent in the message. The
    progress callback may thus be called from that helper thread; it stops when the phase ends or on Cancel."""

    def __init__(self, span: Steps, lo: float, hi: float, message: str, expected_s: float = 2.0):
        self.span, self.hi, self.expected = span, hi, max(0.25, float(expected_s))
        self._base, self._message, self._since = lo, message, time.monotonic()
        self._started = self._since
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, fraction: float, message: str) -> None:
        with self._lock:
            self._base, self._message, self._since = max(self._base, fraction), message, time.monotonic()
        self.span(fraction, message)

    def __enter__(self) -> Ticker:
        self.span(self._base, self._message)
        if self.span.progress is not None:
            self._thread = threading.Thread(target=self._tick, name="workbench-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def _tick(self) -> None:
        cancel = self.span.cancel
        while not self._stop.wait(TICK_S):
            if cancel is not None and cancel.is_set():
                return
            with self._lock:
                t = time.monotonic() - self._since
                f = self._base + (self.hi - self._base) * t / (t + self.expected)
                message = f"{self._message} ({time.monotonic() - self._started:.0f} s)"
            try:
                self.span.progress(self.span.lo + (self.span.hi - self.span.lo) * f, message)
            except Exception:  # noqa: BLE001 - a failing progress callback must not kill the comparison
                log.debug("progress callback failed", exc_info=True)
                return


def run_all(ctx: Context) -> Measured:
    """Mark every paired tensor, chunked under the budget; isolate every node.

    One session is alive at a time: per chunk the reference runs every feed (its values kept), then the candidate
    runs and is compared, then the isolation model runs on the kept reference values. Sessions of engines that read
    files map the weights written once (:mod:`workbench.engines.files`), so building one per step is cheap."""
    plan = ctx.plan
    out = Measured()
    sizes = tensor_bytes(plan.ref_model, plan.feeds[0])
    n_feeds = len(plan.feeds)
    # the reference values of every feed are kept through a chunk, plus one feed's candidate values
    groups = list(chunks([p.tensor for p in plan.pairs], sizes, max(1, ctx.budget // (n_feeds + 2))))
    total = sum(sizes.get(p.tensor) or 0 for p in plan.pairs)  # one feed's values of every tensor
    every = _mark_every_chunk(ctx, len(groups), total)
    if every:  # one feed's values of every tensor (a run's, then dropped), plus each chunk's kept over the feeds
        groups = list(chunks([p.tensor for p in plan.pairs], sizes, max(1, (ctx.budget - total) // (n_feeds + 1))))
    by_ref = plan.pair_by_tensor
    if len(groups) > 1:
        ctx.notes.append(f"{len(plan.pairs)} tensors compared in {len(groups)} chunks to stay under the memory "
                         "budget")
    isolate = plan.options.culprits and plan.isolates_candidate
    outputs = _outputs_to_rerun(ctx, sizes)
    kept: list[dict[str, np.ndarray]] = [{} for _ in plan.feeds]  # the reference's outputs, for that second look
    for gi, group in enumerate(groups):
        pairs = [by_ref[t] for t in group]
        span = ctx.step.span(gi / len(groups), (gi + 1) / len(groups))
        where = f"chunk {gi + 1}/{len(groups)}" if len(groups) > 1 else "all tensors"
        iso = build_isolation(plan.isolation_source, [p.candidate for p in pairs], plan.known, plan.cand_types) \
            if isolate else None
        if iso is not None and iso.skipped:
            log.info("%d tensors not isolated", len(iso.skipped))
        need = set(group) | (set(iso.boundary.values()) if iso else set())
        marked = sorted((need | ({p.tensor for p in plan.pairs} if every else set())) - plan.ref_inputs)
        with Ticker(span, 0.0, 0.3, f"{where}: reference engine") as tick:
            refs = _run_side(ctx, plan.ref_engine, plan.ref_model, marked, plan.feeds, reference=True,
                             step=_FeedSteps(tick, 0.0, 0.3, f"{where}: reference", n_feeds),
                             keep=need if every else None)
        ref_s = tick.elapsed
        for fi, values in enumerate(refs):
            kept[fi].update({p.tensor: values[p.tensor] for p in outputs if p.tensor in values})
        with Ticker(span, 0.3, 0.6, f"{where}: candidate engine", ref_s) as tick:
            t0 = time.perf_counter()
            with ctx.prepare_candidate(plan.cand_model, [p.candidate for p in (plan.pairs if every else pairs)]) \
                    as cand_sess:
                ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
                t0 = time.perf_counter()
                for fi, cfeed in enumerate(plan.cand_feeds):
                    tick(0.3 + 0.3 * fi / n_feeds, f"{where}: candidate, feed {fi + 1}/{n_feeds}")
                    cand = cand_sess.run(cfeed)
                    update_many(_compare_jobs(ctx, out, pairs, refs[fi], cand))
                    del cand
                ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0
        cand_s = tick.elapsed
        if iso is not None and iso.outputs:
            # every node alone: one model as large as the graph, built and run in single engine calls
            with Ticker(span, 0.6, 1.0, f"{where}: every node alone on the candidate (culprit search)",
                        2 * (ref_s + cand_s)) as tick:
                _run_isolation(ctx, iso, refs, out,
                               _FeedSteps(tick, 0.6, 0.4, f"{where}: every node alone (culprit search)", n_feeds))
        del refs
    if outputs and _failing(ctx, out, outputs):
        ctx.step(1.0, "the failing outputs once more, with nothing else marked")
        _unmarked_outputs(ctx, out, outputs, kept)
    ctx.step(1.0, "layer-wise comparison done")
    return out


def _mark_every_chunk(ctx: Context, n_chunks: int, total: int) -> bool:
    """Whether every chunk's runs mark every paired tensor (on both sides), as one chunk would, keeping only the
    chunk's own: when the comparison is chunked and an engine's arithmetic depends on what is marked
    (:attr:`Engine.marking_changes_outputs`: ONNX Runtime's CPU provider computes unmarked FP16 stretches in FP32
    and fuses unmarked FP32 ones), so that the numbers and the verdict do not depend on ``--memory-budget``. Not
    when one feed's values of every tensor (``total`` bytes) would take more than half the budget (said in a
    note)."""
    plan = ctx.plan
    if n_chunks < 2 or not any(getattr(e, "marking_changes_outputs", False)
                               for e in (plan.ref_engine, plan.cand_engine)):
        return False
    if total > ctx.budget // 2:
        from .._files import human_size

        ctx.notes.append(f"each chunk marks only its own tensors (one feed's values of every tensor, "
                         f"{human_size(total)}, exceed half the memory budget); these engines "
                         "compute differently with fewer tensors marked, so the numbers and the verdict may differ "
                         "from a run with a larger --memory-budget")
        return False
    return True


def _outputs_to_rerun(ctx: Context, sizes: dict[str, int | None]) -> list[TensorPair]:
    """The output pairs to look at again on an unmarked candidate run when they fail: where the candidate's engine
    may compute its outputs differently once intermediates are marked (:attr:`Engine.marking_changes_outputs`), the
    candidate is in a lossier precision than FP32, and intermediates are marked at all. Empty when their reference
    values over every feed would take more than a quarter of the memory budget."""
    plan = ctx.plan
    if not getattr(plan.cand_engine, "marking_changes_outputs", False) or plan.cand_precision.family == "fp32":
        return []
    names = set(plan.ref_graph.outputs)
    outputs = [p for p in plan.pairs if p.tensor in names]
    if not outputs or len(outputs) == len(plan.pairs):
        return []
    held = sum(sizes.get(p.tensor) or 0 for p in outputs) * len(plan.feeds)
    if held > ctx.budget // 4:
        log.info("outputs not run again unmarked: their values over the feeds (%d bytes) exceed a quarter of the "
                 "memory budget", held)
        return []
    return outputs


def _failing(ctx: Context, out: Measured, outputs: list[TensorPair]) -> bool:
    crit = ctx.plan.criterion
    return any(p.tensor in out.full and crit.diverged(out.full[p.tensor].metrics()) for p in outputs)


def _unmarked_outputs(ctx: Context, out: Measured, outputs: list[TensorPair], kept: list[dict]) -> None:
    """The failing outputs from one candidate run that marks nothing but them, as the file runs when deployed on
    this engine. The verdict stays the marked run's, where every tensor is held in the model's own types (as a GPU
    stores FP16 intermediates); where the unmarked outputs pass, a note says so with their figures."""
    plan = ctx.plan
    plain = {p.tensor: ErrorStats() for p in outputs}
    t0 = time.perf_counter()
    with ctx.prepare_candidate(plan.cand_model, [p.candidate for p in outputs]) as session:
        ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        for fi, cfeed in enumerate(plan.cand_feeds):
            cand = session.run(cfeed)
            update_many([(plain[p.tensor], kept[fi][p.tensor], cand[p.candidate]) for p in outputs
                         if p.tensor in kept[fi] and p.candidate in cand])
            del cand
        ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0
    crit = plan.criterion
    passing = [f"{p.tensor} ({_said(out.full[p.tensor].metrics())} marked, {_said(plain[p.tensor].metrics())} "
               "unmarked)" for p in outputs if p.tensor in out.full and plain[p.tensor].count
               and crit.diverged(out.full[p.tensor].metrics()) and not crit.diverged(plain[p.tensor].metrics())]
    if passing:
        ctx.notes.append(
            f"on {plan.cand_engine.name} as deployed (nothing but the outputs marked) the failing output(s) pass: "
            f"{'; '.join(passing)}. Marked, every tensor is held in the model's own types, as a GPU holds them; "
            f"unmarked, {plan.cand_engine.name} keeps intermediates in higher precision or fuses across them (ONNX "
            "Runtime's CPU provider computes FP16 nodes in FP32 between its Casts). The verdict is the marked "
            "run's; --mode bisect judges the outputs unmarked")


def _said(m: dict) -> str:
    bad = m.get("nonfinite_mismatch") or 0
    db = m.get("sqnr_db")
    return f"{bad} inf/NaN" if bad else f"{db:.1f} dB" if isinstance(db, (int, float)) else "no SQNR"


class _FeedSteps:
    """Progress of one phase over the feeds: ``step(feed index)``."""

    def __init__(self, span: Steps, lo: float, width: float, label: str, n: int):
        self.span, self.lo, self.width, self.label, self.n = span, lo, width, label, n

    def __call__(self, fi: int) -> None:
        self.span(self.lo + self.width * fi / self.n, f"{self.label}, feed {fi + 1}/{self.n}")


def _run_side(ctx: Context, engine, model, marked: list[str], feeds: list[dict], *, reference: bool,
              step=None, keep: set[str] | None = None) -> list[dict[str, np.ndarray]]:
    """Every feed through one session marking ``marked``; the values (plus the feeds' own inputs) per feed, only
    those of ``keep`` (and the inputs) when given."""
    plan = ctx.plan
    t0 = time.perf_counter()
    values: list[dict[str, np.ndarray]] = []
    session = engine.prepare(model, marked) if marked else None
    ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        for fi, feed in enumerate(feeds):
            if step is not None:
                step(fi)
            got = _ref_values(plan, session, feed) if reference else dict(session.run(feed))
            if keep is not None:
                got = {k: v for k, v in got.items() if k in keep or k in feed}
            values.append(got)
    finally:
        if session is not None:
            session.close()
    ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0
    return values


def _run_isolation(ctx: Context, iso, refs: list[dict[str, np.ndarray]], out: Measured, step) -> None:
    """The isolation model on every feed's reference values: each node's introduced error."""
    plan = ctx.plan
    t0 = time.perf_counter()
    iso, session, dtypes = _prepare_isolation(ctx, iso, refs[0])
    ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
    if session is None:
        return
    t0 = time.perf_counter()
    try:
        for fi, ref in enumerate(refs):
            step(fi)
            alone = session.run(_iso_feed(iso, dtypes, ref))
            jobs = []
            for iso_name, target in iso.outputs.items():
                ref_name = plan.known.get(target, target)
                if ref_name in ref and iso_name in alone:
                    jobs.append((out.introduced.setdefault(ref_name, ErrorStats()), ref[ref_name], alone[iso_name]))
            update_many(jobs)
            del alone
    finally:
        session.close()
    ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0


def _prepare_isolation(ctx: Context, iso, ref: dict[str, np.ndarray]):
    """Build the isolation session once the reference's first values are known: boundaries the reference did
    not produce (the torch engine returns only tensors it maps) are walked past, and every boundary gets the
    rank of its value. Returns (isolation model, session, input dtypes); session None if the engine refuses."""
    plan = ctx.plan
    if any(r not in ref for r in iso.boundary.values()):
        have = {c: r for c, r in plan.known.items() if r in ref}
        iso = build_isolation(plan.isolation_source, list(iso.outputs.values()), have, plan.cand_types)
    set_input_ranks(iso.model, {name: np.ndim(ref[r]) for name, r in iso.boundary.items()})
    try:
        with plan.derived(iso.model) as model:
            session = ctx.prepare_candidate(model, list(iso.outputs))
    except EngineRunError as e:
        ctx.notes.append(f"culprit isolation could not run on the candidate engine: {e}")
        log.warning("isolation model rejected: %s", e)
        return iso, None, {}
    return iso, session, {vi.name: _iso_dtype(vi) for vi in iso.model.graph.input}


def _evaluate(ctx: Context, pairs: list[TensorPair], out: Measured) -> list[bool]:
    """One candidate build marking ``pairs``' tensors; compare them over all feeds; return diverged flags."""
    plan = ctx.plan
    need = sorted({p.tensor for p in pairs} - plan.ref_inputs)
    ref_sess = plan.ref_engine.prepare(plan.ref_model, need) if need else None
    cand_sess = ctx.prepare_candidate(plan.cand_model, [p.candidate for p in pairs])
    try:
        for feed, cfeed in zip(plan.feeds, plan.cand_feeds):
            ref = _ref_values(plan, ref_sess, feed)
            cand = cand_sess.run(cfeed)
            update_many(_compare_jobs(ctx, out, pairs, ref, cand))
    finally:
        for s in (ref_sess, cand_sess):
            if s is not None:
                s.close()
    flags = []
    for p in pairs:
        out.probed.append(p.tensor)
        floor = ctx.floors.stats.get(p.tensor)
        flags.append(plan.criterion.diverged(out.full[p.tensor].metrics(), floor.summary() if floor else None))
    return flags


def run_bisect(ctx: Context, outputs: list[str]) -> Measured:
    """Binary search for the first divergent tensor: at most ceil(log2 N) + 2 candidate builds."""
    plan = ctx.plan
    out = Measured()
    index = {p.tensor: i for i, p in enumerate(plan.pairs)}
    n = len(plan.pairs)
    limit = math.ceil(math.log2(max(n, 2))) + 2
    ctx.step(0.0, "bisect: graph outputs")
    out_pairs = [plan.pairs[index[o]] for o in outputs if o in index]
    flags = _evaluate(ctx, out_pairs, out) if out_pairs else []  # the model's own outputs: no extra tensor
    diverged_at = min((index[p.tensor] for p, bad in zip(out_pairs, flags) if bad), default=None)
    if diverged_at is None:
        ctx.step(1.0, "outputs agree: nothing to bisect")
        return out
    lo, hi = -1, diverged_at  # invariant: pairs[lo] agrees (or lo = -1), pairs[hi] diverged
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ctx.step(ctx.builds / limit, f"bisect: probing tensor {mid + 1}/{n} ({plan.pairs[mid].tensor})")
        if _evaluate(ctx, [plan.pairs[mid]], out)[0]:
            hi = mid
        else:
            lo = mid
    ctx.notes.append(
        f"bisection: {ctx.builds} candidate builds for {n} tensors; first divergent tensor #{hi} "
        f"({plan.pairs[hi].tensor}), its predecessor #{lo} agrees" + ("" if lo >= 0 else " (it reads graph inputs)")
        + ". Bisection assumes divergence persists downstream; use --mode all where marking is cheap."
    )
    if plan.options.culprits:
        _isolate_one(ctx, plan.pairs[hi], out)
    ctx.step(1.0, "done")
    return out


def _isolate_one(ctx: Context, pair: TensorPair, out: Measured) -> None:
    """Run the first divergent node alone on the candidate with reference inputs (one more build)."""
    plan = ctx.plan
    iso = build_isolation(plan.isolation_source, [pair.candidate], plan.known, plan.cand_types)
    if not iso.outputs:
        ctx.notes.append(f"could not isolate {pair.node}: {iso.skipped.get(pair.candidate, 'unknown reason')}")
        return
    need = sorted((set(iso.boundary.values()) | {pair.tensor}) - plan.ref_inputs)
    ref_sess = plan.ref_engine.prepare(plan.ref_model, need) if need else None
    stats, iso_sess, dtypes = ErrorStats(), None, {}
    try:
        for feed in plan.feeds:
            ref = _ref_values(plan, ref_sess, feed)
            if iso_sess is None:
                iso, iso_sess, dtypes = _prepare_isolation(ctx, iso, ref)
                if iso_sess is None:
                    return
            alone = iso_sess.run(_iso_feed(iso, dtypes, ref))
            stats.update(ref[pair.tensor], next(iter(alone.values())))
    finally:
        for s in (ref_sess, iso_sess):
            if s is not None:
                s.close()
    out.introduced[pair.tensor] = stats
