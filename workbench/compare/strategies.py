"""Layer-wise strategies: mark everything (chunked under a memory budget) or bisect over tensors.

``all``: every paired tensor is marked on both engines, in chunks whose estimated size fits the memory
budget; each chunk also runs the isolation model, so every node's introduced error is measured.
``bisect``: one extra marked tensor per candidate build, binary search for the first divergent tensor
in topological order (TensorRT, where marking everything changes fusions and memory).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ..engines.base import Engine
from ..errors import EngineRunError, WorkbenchError
from .budget import chunks, tensor_bytes
from .criterion import Criterion
from .isolate import build_isolation, set_input_ranks
from .metrics import ErrorStats
from .pairs import TensorPair

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]


class Cancelled(WorkbenchError):
    """The user cancelled a comparison."""

    default_hint = "run it again when ready"


@dataclass
class Context:
    """What a strategy needs: the two engines and models, the feeds, the pairs and the criterion."""

    ref_engine: Engine
    cand_engine: Engine
    ref_model: onnx.ModelProto
    cand_model: onnx.ModelProto  # shape-inferred, so isolation inputs carry types
    feeds: list[dict[str, np.ndarray]]
    cand_feeds: list[dict[str, np.ndarray]]
    pairs: list[TensorPair]
    criterion: Criterion
    ref_inputs: set[str]
    known: dict[str, str]  # candidate tensor -> reference tensor, for isolation boundaries
    isolate: bool = True
    budget: int = 1 << 30
    progress: Progress | None = None
    cancel: threading.Event | None = None
    builds: int = 0
    notes: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)

    def step(self, fraction: float, message: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("comparison cancelled")
        if self.progress is not None:
            self.progress(max(0.0, min(1.0, fraction)), message)

    def prepare_candidate(self, model: onnx.ModelProto, outputs: list[str]):
        self.builds += 1
        return self.cand_engine.prepare(model, outputs)


@dataclass
class Measured:
    """Per reference tensor: error of the candidate's full run, and of the node run alone."""

    full: dict[str, ErrorStats] = field(default_factory=dict)
    introduced: dict[str, ErrorStats] = field(default_factory=dict)
    probed: list[str] = field(default_factory=list)  # bisect: the tensors evaluated, in order


_POOL: ThreadPoolExecutor | None = None


def update_many(jobs: list[tuple[ErrorStats, np.ndarray, np.ndarray]]) -> None:
    """Update many accumulators at once on a thread pool (numpy releases the GIL; one job per accumulator,
    so every sum is accumulated in the same order as sequentially: results are deterministic)."""
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


def _iso_dtype(vi: onnx.ValueInfoProto) -> np.dtype | None:
    et = vi.type.tensor_type.elem_type
    if not et:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(et))


def _ref_values(ctx: Context, session, feed: dict) -> dict[str, np.ndarray]:
    values = dict(session.run(feed)) if session is not None else {}
    values.update({k: v for k, v in feed.items() if k in ctx.ref_inputs})
    return values


def _iso_feed(iso, dtypes: dict[str, np.dtype | None], ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feed = {}
    for name, ref_name in iso.boundary.items():
        value = np.asarray(ref[ref_name])
        dtype = dtypes.get(name) or (np.float32 if value.dtype == np.float64 else value.dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is measured, not an accident
            feed[name] = value.astype(dtype, copy=False)
    return feed


def run_all(ctx: Context) -> Measured:
    """Mark every paired tensor, chunked under the budget; isolate every node."""
    out = Measured()
    sizes = tensor_bytes(ctx.ref_model, ctx.feeds[0])
    # reference + candidate + isolation values of one feed are alive at once: ~4 copies of a chunk
    groups = list(chunks([p.tensor for p in ctx.pairs], sizes, max(1, ctx.budget // 4)))
    by_ref = {p.tensor: p for p in ctx.pairs}
    if len(groups) > 1:
        ctx.notes.append(f"{len(ctx.pairs)} tensors compared in {len(groups)} chunks to stay under the memory budget")
    for gi, group in enumerate(groups):
        pairs = [by_ref[t] for t in group]
        base = gi / len(groups)
        ctx.step(base, f"chunk {gi + 1}/{len(groups)}: building sessions")
        iso = None
        if ctx.isolate:
            iso = build_isolation(ctx.cand_model, [p.candidate for p in pairs], ctx.known)
        if iso is not None and iso.skipped:
            log.info("%d tensors not isolated", len(iso.skipped))
        need = set(group) | (set(iso.boundary.values()) if iso else set())
        marked = sorted(need - ctx.ref_inputs)
        t0 = time.perf_counter()
        ref_sess = ctx.ref_engine.prepare(ctx.ref_model, marked) if marked else None
        cand_sess = ctx.prepare_candidate(ctx.cand_model, [p.candidate for p in pairs])
        iso_sess, dtypes = None, {}
        ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        for fi, (feed, cfeed) in enumerate(zip(ctx.feeds, ctx.cand_feeds)):
            ctx.step(base + (fi + 0.5) / len(ctx.feeds) / len(groups), f"chunk {gi + 1}/{len(groups)}: feed {fi + 1}")
            ref = _ref_values(ctx, ref_sess, feed)
            if fi == 0 and iso is not None and iso.outputs:
                iso, iso_sess, dtypes = _prepare_isolation(ctx, iso, ref)
            cand = cand_sess.run(cfeed)
            update_many([(out.full.setdefault(p.tensor, ErrorStats()), ref[p.tensor], cand[p.candidate])
                         for p in pairs if p.tensor in ref and p.candidate in cand])
            del cand
            if iso_sess is not None:
                alone = iso_sess.run(_iso_feed(iso, dtypes, ref))
                jobs = []
                for iso_name, target in iso.outputs.items():
                    ref_name = ctx.known.get(target, target)
                    if ref_name in ref and iso_name in alone:
                        jobs.append((out.introduced.setdefault(ref_name, ErrorStats()), ref[ref_name], alone[iso_name]))
                update_many(jobs)
        ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0
        for s in (ref_sess, cand_sess, iso_sess):
            if s is not None:
                s.close()
    ctx.step(1.0, "done")
    return out


def _prepare_isolation(ctx: Context, iso, ref: dict[str, np.ndarray]):
    """Build the isolation session once the reference's first values are known: boundaries the reference did
    not produce (the torch engine returns only tensors it maps) are walked past, and every boundary gets the
    rank of its value. Returns (isolation model, session, input dtypes); session None if the engine refuses."""
    if any(r not in ref for r in iso.boundary.values()):
        have = {c: r for c, r in ctx.known.items() if r in ref}
        iso = build_isolation(ctx.cand_model, list(iso.outputs.values()), have)
    set_input_ranks(iso.model, {name: np.ndim(ref[r]) for name, r in iso.boundary.items()})
    try:
        session = ctx.prepare_candidate(iso.model, list(iso.outputs))
    except EngineRunError as e:
        ctx.notes.append(f"culprit isolation could not run on the candidate engine: {e}")
        log.warning("isolation model rejected: %s", e)
        return iso, None, {}
    return iso, session, {vi.name: _iso_dtype(vi) for vi in iso.model.graph.input}


def _evaluate(ctx: Context, pairs: list[TensorPair], out: Measured) -> list[bool]:
    """One candidate build marking ``pairs``' tensors; compare them over all feeds; return diverged flags."""
    need = sorted({p.tensor for p in pairs} - ctx.ref_inputs)
    ref_sess = ctx.ref_engine.prepare(ctx.ref_model, need) if need else None
    cand_sess = ctx.prepare_candidate(ctx.cand_model, [p.candidate for p in pairs])
    stats = {p.tensor: ErrorStats() for p in pairs}
    for feed, cfeed in zip(ctx.feeds, ctx.cand_feeds):
        ref = _ref_values(ctx, ref_sess, feed)
        cand = cand_sess.run(cfeed)
        for p in pairs:
            stats[p.tensor].update(ref[p.tensor], cand[p.candidate])
    flags = []
    for p in pairs:
        out.full[p.tensor] = stats[p.tensor]
        out.probed.append(p.tensor)
        flags.append(ctx.criterion.diverged(stats[p.tensor].metrics()))
    return flags


def run_bisect(ctx: Context, outputs: list[str]) -> Measured:
    """Binary search for the first divergent tensor: at most ceil(log2 N) + 2 candidate builds."""
    out = Measured()
    index = {p.tensor: i for i, p in enumerate(ctx.pairs)}
    n = len(ctx.pairs)
    limit = math.ceil(math.log2(max(n, 2))) + 2
    ctx.step(0.0, "bisect: graph outputs")
    out_pairs = [ctx.pairs[index[o]] for o in outputs if o in index]
    flags = _evaluate(ctx, out_pairs, out) if out_pairs else []  # the model's own outputs: no extra tensor
    diverged_at = min((index[p.tensor] for p, bad in zip(out_pairs, flags) if bad), default=None)
    if diverged_at is None:
        ctx.step(1.0, "outputs agree: nothing to bisect")
        return out
    lo, hi = -1, diverged_at  # invariant: pairs[lo] agrees (or lo = -1), pairs[hi] diverged
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ctx.step(ctx.builds / limit, f"bisect: probing tensor {mid + 1}/{n} ({ctx.pairs[mid].tensor})")
        if _evaluate(ctx, [ctx.pairs[mid]], out)[0]:
            hi = mid
        else:
            lo = mid
    ctx.notes.append(
        f"bisection: {ctx.builds} candidate builds for {n} tensors; first divergent tensor #{hi} "
        f"({ctx.pairs[hi].tensor}), its predecessor #{lo} agrees" + ("" if lo >= 0 else " (it reads graph inputs)")
        + ". Bisection assumes divergence persists downstream; use --mode all where marking is cheap."
    )
    if ctx.isolate:
        _isolate_one(ctx, ctx.pairs[hi], out)
    ctx.step(1.0, "done")
    return out


def _isolate_one(ctx: Context, pair: TensorPair, out: Measured) -> None:
    """Run the first divergent node alone on the candidate with reference inputs (one more build)."""
    iso = build_isolation(ctx.cand_model, [pair.candidate], ctx.known)
    if not iso.outputs:
        ctx.notes.append(f"could not isolate {pair.node}: {iso.skipped.get(pair.candidate, 'unknown reason')}")
        return
    need = sorted((set(iso.boundary.values()) | {pair.tensor}) - ctx.ref_inputs)
    ref_sess = ctx.ref_engine.prepare(ctx.ref_model, need) if need else None
    stats, iso_sess, dtypes = ErrorStats(), None, {}
    for feed in ctx.feeds:
        ref = _ref_values(ctx, ref_sess, feed)
        if iso_sess is None:
            iso, iso_sess, dtypes = _prepare_isolation(ctx, iso, ref)
            if iso_sess is None:
                return
        alone = iso_sess.run(_iso_feed(iso, dtypes, ref))
        stats.update(ref[pair.tensor], next(iter(alone.values())))
    out.introduced[pair.tensor] = stats
