"""One sample through both sides: output metrics, the judged metric of every compared layer, its first divergence.

The same :class:`Evaluator` runs in the caller's process (serial), in local worker processes and in Ray workers,
so every executor computes the same numbers. A :class:`Job` says everything a worker needs (picklable): the two
engine specs and options, where to get each model (a file path, or bytes / a Ray object reference for workers on
other machines), the tensors to compare, their number formats (floors) and the criterion.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compare.criterion import Criterion
from ..core.feeds import cast_to
from ..core.metrics import ErrorStats

log = logging.getLogger(__name__)

#: fault injection for tests: a worker exits hard once, the first time it finds it can create this file
FAULT_ENV = "WORKBENCH_FAULT_EXIT_ONCE"


@dataclass(frozen=True)
class ModelRef:
    """Where a worker finds a model: ``path`` (same machine) or ``blob`` (serialized bytes, or a Ray reference
    to them)."""

    path: str | None = None
    blob: Any = None

    def load(self):
        import onnx

        if self.path is not None:  # read like every model file: a regular file, capped
            from .._files import read_capped
            from ..model.load import MAX_MODEL_BYTES, read_external_data

            model = onnx.load_model_from_string(read_capped(self.path, MAX_MODEL_BYTES, "model file"))
            # its weights read in, or past the inline limit left in their files, mapped, as the caller's loader does
            # (a worker read a 1.3 GB decoder's weights whole: 5.1 GB)
            read_external_data(model, os.path.dirname(os.path.abspath(self.path)))
            return model
        blob = self.blob
        if type(blob).__name__ == "ObjectRef":
            import ray

            blob = ray.get(blob)
        return onnx.load_model_from_string(blob)


@dataclass
class Job:
    """What every worker needs to evaluate samples of one comparison (picklable)."""

    key: str
    ref_engine: str
    cand_engine: str
    ref_model: ModelRef
    cand_model: ModelRef
    tensors: list[str]  # reference tensors compared, in topological order (graph outputs included)
    cand_names: list[str]  # the candidate tensor standing for each
    outputs: list[str]  # the graph outputs among ``tensors``
    criterion: Criterion
    formats: dict = field(default_factory=dict)  # reference tensor -> NumberFormat (floors)
    ref_options: dict = field(default_factory=dict)
    cand_options: dict = field(default_factory=dict)


@dataclass
class SampleRecord:
    """What one sample gives back. ``values``: the judged metric per compared tensor (``Job.tensors`` order,
    float64, NaN where not comparable); ``first``: index of the first diverged tensor or -1; ``ref``/``cand``:
    the graph outputs (for task metrics, dropped once those are computed)."""

    index: int
    outputs: dict[str, dict]
    output_diverged: dict[str, bool]
    values: np.ndarray
    diverged_layers: np.ndarray
    first: int
    ref: dict[str, np.ndarray] | None = None
    cand: dict[str, np.ndarray] | None = None
    seconds: float = 0.0

    @property
    def diverged(self) -> bool:
        return any(self.output_diverged.values())


class Evaluator:
    """Sessions of both sides with every compared tensor marked, and the per-sample arithmetic. Built from the
    job's model references (workers), or from the caller's engines and models (serial: the plan's); either way
    :meth:`close` closes the sessions it prepared."""

    def __init__(self, job: Job, *, engines=None, models=None):
        from ..core.feeds import input_dtypes
        from ..engines import get_engine

        self.job = job
        if engines is None:
            engines = (get_engine(job.ref_engine, **job.ref_options), get_engine(job.cand_engine, **job.cand_options))
        ref_proto = models[0] if models else job.ref_model.load()
        self.ref_session = engines[0].prepare(ref_proto, job.tensors)
        del ref_proto
        cand_proto = models[1] if models else job.cand_model.load()
        self.cand_session = engines[1].prepare(cand_proto, job.cand_names)
        self._cand_dtypes = input_dtypes(cand_proto)

    def evaluate(self, index: int, feed: dict[str, np.ndarray]) -> SampleRecord:
        import time

        t0 = time.perf_counter()
        job, crit = self.job, self.job.criterion
        ref = self.ref_session.run(feed)
        cand = self.cand_session.run(cast_to(self._cand_dtypes, feed))
        n = len(job.tensors)
        values = np.full(n, np.nan)
        diverged = np.zeros(n, dtype=bool)
        outputs, out_div = {}, {}
        outs = set(job.outputs)
        for i, (t, c) in enumerate(zip(job.tensors, job.cand_names)):
            r, k = ref.get(t), cand.get(c)
            if r is None or k is None:
                continue
            metrics = ErrorStats().update(r, k, rel=t in outs).metrics()
            fmt = job.formats.get(t)
            # the floor only matters where the criterion fails (see Criterion.at_floor): measured only there
            floor = _floor(r, fmt) if fmt is not None and crit.fails(metrics) else None
            values[i] = _number(metrics.get(crit.metric))
            diverged[i] = crit.diverged(metrics, floor)
            if t in outs:
                outputs[t] = metrics
                out_div[t] = bool(diverged[i])
        first = int(np.argmax(diverged)) if diverged.any() else -1
        return SampleRecord(index, outputs, out_div, values, diverged, first,
                            ref={o: ref[o] for o in job.outputs if o in ref},
                            cand={o: cand[c] for o, c in zip(job.tensors, job.cand_names) if o in outs and c in cand},
                            seconds=time.perf_counter() - t0)

    def close(self) -> None:
        for session in (self.ref_session, self.cand_session):
            session.close()


def _floor(ref: np.ndarray, fmt) -> dict:
    from ..compare.floor import FloorStats

    return FloorStats().add(ref, fmt).summary()


def _number(value) -> float:
    return np.nan if value is None else float(value)


# --- worker side ----------------------------------------------------------------------------------------------
_CACHE: dict[str, Evaluator] = {}


def fault_point() -> None:
    """Fault injection for tests (:data:`FAULT_ENV`): the first worker to get here exits hard, once."""
    marker = os.environ.get(FAULT_ENV)
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            os._exit(17)
        except FileExistsError:
            pass


def worker_state(cache: dict, key: str, build):
    """This worker's state for job ``key`` (sessions and the like), built on first use; the state of an earlier
    job is closed and dropped (a worker serves one job at a time)."""
    state = cache.get(key)
    if state is None:
        for old in cache.values():
            old.close()
        cache.clear()
        state = cache[key] = build()
    return state


def evaluate_chunk(job: Job, chunk: list[tuple[int, dict]]) -> list[SampleRecord]:
    """Evaluate ``chunk`` ((index, feed) pairs) in this worker, building the sessions on the worker's first chunk
    of ``job`` (kept for the next ones)."""
    fault_point()
    ev = worker_state(_CACHE, job.key, lambda: Evaluator(job))
    return [ev.evaluate(i, feed) for i, feed in chunk]
