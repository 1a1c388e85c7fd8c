"""Repair's candidate evaluations on local worker processes or Ray.

A worker gets a :class:`RepairJob` once (both models, the candidate engine and its options, the candidate feeds)
and then sets of nodes to keep: for each it builds the candidate with that set kept (or, in switch mode, runs the
switchable model of the search pool with that set's switches on), runs it on every feed and sends back the raw
outputs. The caller judges them against the reference outputs it computed once, with the same code as a serial
evaluation, so every executor gives the same numbers. A set the worker cannot evaluate comes back as a failure,
and the caller evaluates it itself only if the search asks for it (the error then is the serial one).

The processes and Ray machinery (start, ordered results, one retry when a worker dies, Cancel) is
:class:`workbench.dataset.executors.WorkerPool`.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dataset.evaluate import ModelRef, fault_point, worker_state
from ..dataset.executors import ExecutorSpec, WorkerPool, worker_threads

log = logging.getLogger(__name__)


@dataclass
class RepairJob:
    """What a worker needs to evaluate kept sets (picklable). ``feeds``: a folder of .npz (local processes) or
    the feeds themselves (Ray: shipped once with the job)."""

    key: str
    engine: str  # the candidate's engine spec
    options: dict
    ref_model: ModelRef
    cand_model: ModelRef
    kind: str  # island kind: "float" or "qdq"
    outputs: list[str]  # candidate output names
    feeds: Any


@dataclass
class Outcome:
    """One set's raw outputs per feed (candidate names) and the worker's seconds, or the worker's error."""

    results: list[dict[str, np.ndarray]] | None
    seconds: float
    error: str | None = None


class RepairWorkers:
    """Evaluates batches of kept sets of one repair on a :class:`WorkerPool` (see the module docstring). The
    workers start, and the models and feeds are written to ``folder``, on the first batch: a search that needs no
    evaluation starts nothing."""

    def __init__(self, plan, builder, outputs: list[str], spec: ExecutorSpec, folder: str):
        self.spec, self.notes = spec, []
        self._setup = (plan, builder, outputs, folder)
        self.pool: WorkerPool | None = None
        self.job: RepairJob | None = None

    @property
    def width(self) -> int:
        return self.spec.workers

    def run(self, sets: list[tuple[tuple[str, ...], tuple[str, ...] | None]], steps) -> list[Outcome]:
        """Outcomes of ``sets`` ((kept, switch pool or None) each), in order."""
        if self.pool is None:
            plan, builder, outputs, folder = self._setup
            self.job = _job(plan, builder, outputs, self.spec, folder)
            self.pool = WorkerPool(self.spec, evaluate_sets, what="candidate sets")
        chunks = [[(i, item)] for i, item in enumerate(sets)]
        return list(self.pool.map(self.job, chunks, steps, self.notes))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _job(plan, builder, outputs: list[str], spec: ExecutorSpec, folder: str) -> RepairJob:
    import json

    import onnx

    from ..model.mapped import has_mapped, save_model

    refs = {}
    # the builder's own reference: the FP32 model the search restores weights from may be a rewrite of the plan's
    # (its depthwise inputs equalized, its BatchNormalizations folded)
    reference = builder.reference if builder.reference is not None else plan.ref_model
    for side, model in (("reference", reference), ("candidate", builder.candidate)):
        files = plan._files.get(side)
        path = os.path.join(folder, f"{side}.onnx")
        if has_mapped(model):  # weights left in their files: copied file to file beside the graph
            save_model(model, path)
            refs[side] = ModelRef(path=path)
            continue
        model = files.materialize(model) if files is not None and model is files.skeleton else model
        large = model.ByteSize() > 1_900_000_000
        onnx.save(model, path, save_as_external_data=large, location=f"{side}.weights" if large else None)
        refs[side] = ModelRef(path=path)
    if spec.kind == "processes":
        feeds: Any = os.path.join(folder, "feeds")
        os.makedirs(feeds)
        for i, feed in enumerate(plan.cand_feeds):
            np.savez(os.path.join(feeds, f"{i:06d}.npz"), **feed)
    else:
        feeds = [dict(f) for f in plan.cand_feeds]
    options = {}
    for k, v in (plan.engine_options.get(plan.cand_spec.engine) or {}).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        options[k] = v
    if plan.cand_spec.engine == "ort":
        options["threads"] = worker_threads(spec.workers)
    return RepairJob(uuid.uuid4().hex, str(plan.cand_spec), options, refs["reference"], refs["candidate"],
                     builder.kind, list(outputs), feeds)


# --- worker side ----------------------------------------------------------------------------------------------
class _State:
    """A worker's builder, engine, feeds and switchable sessions for one job."""

    def __init__(self, job: RepairJob):
        from ..compare.plan import make_engine
        from ..engines.spec import EngineSpec
        from .islands import IslandBuilder

        self.builder = IslandBuilder(job.cand_model.load(), job.ref_model.load(), job.kind)
        self.engine = make_engine(EngineSpec.parse(job.engine), isolate=False, options=job.options)
        self.feeds = _load_feeds(job.feeds)
        self.switches: dict[tuple[str, ...], tuple[Any, dict]] = {}

    def switch(self, pool: tuple[str, ...], outputs: list[str]):
        if pool not in self.switches:
            for session, _ in self.switches.values():
                session.close()
            self.switches.clear()
            model, flags = self.builder.switchable(list(pool))
            self.switches[pool] = (self.engine.prepare(model, outputs), flags)
        return self.switches[pool]

    def close(self) -> None:
        for session, _ in self.switches.values():
            session.close()
        self.switches.clear()


def _load_feeds(feeds: Any) -> list[dict[str, np.ndarray]]:
    if not isinstance(feeds, str):
        return feeds
    out = []
    for name in sorted(os.listdir(feeds)):
        with np.load(os.path.join(feeds, name), allow_pickle=False) as npz:
            out.append({k: npz[k] for k in npz.files})
    return out


_STATE: dict[str, _State] = {}


def evaluate_sets(job: RepairJob, chunk: list[tuple[int, tuple]]) -> list[Outcome]:
    """Evaluate ``chunk`` ((index, (kept, switch pool or None)) pairs) in this worker."""
    fault_point()  # tests: a worker exits hard once, as evaluate_chunk's does
    state = worker_state(_STATE, job.key, lambda: _State(job))
    return [_evaluate(state, job, kept, pool) for _, (kept, pool) in chunk]


def _evaluate(state: _State, job: RepairJob, kept: tuple[str, ...], pool: tuple[str, ...] | None) -> Outcome:
    t0 = time.perf_counter()
    try:
        if pool is not None:
            session, flags = state.switch(pool, job.outputs)
            extra = {f: np.array(name in kept) for name, f in flags.items()}
            results = [session.run({**feed, **extra}) for feed in state.feeds]
        else:
            model = state.builder.build(list(kept))
            with state.engine.prepare(model, job.outputs) as session:
                results = [session.run(feed) for feed in state.feeds]
    except Exception as e:  # noqa: BLE001 - reported to the caller, which evaluates the set itself if it needs it
        log.info("worker could not evaluate %s: %s", list(kept)[:4], e)
        return Outcome(None, time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    return Outcome(results, time.perf_counter() - t0)
