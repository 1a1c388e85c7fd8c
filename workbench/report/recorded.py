"""A saved run standing in as an engine: ``RecordedEngine(run_results)`` replays the outputs a
``polygraphy run --save-results`` file (or :func:`workbench.report.interop.write_run_results`) recorded."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..engines.base import Engine, Feeds, Session
from ..errors import EngineRunError

log = logging.getLogger(__name__)


class RecordedEngine(Engine):
    """Replays one runner's recorded iterations. ``results``: a RunResults JSON path or a
    :class:`~workbench.report.interop.RunResults`; ``runner``: which runner (default: the only one, or the
    first); ``inputs``: the recorded feeds (a Polygraphy inputs JSON path or a list of dicts) to pick the
    iteration whose inputs equal the feeds; without them iterations are replayed in order."""

    name = "recorded"
    marks_all_cheaply = True

    def __init__(self, results: Any, *, runner: str | None = None, inputs: Any = None):
        from .interop import RunResults, read_run_results

        self.source = str(results) if isinstance(results, (str, os.PathLike)) else None
        self.results = results if isinstance(results, RunResults) else read_run_results(results)
        self.runner, self.iterations = self.results.pick(runner)
        if inputs is not None:
            from ..inputs import feeds_from

            inputs = feeds_from(inputs)
            if len(inputs) != len(self.iterations):
                log.warning("%d recorded inputs for %d iterations of %s", len(inputs), len(self.iterations),
                            self.runner)
        self.inputs: list[dict[str, np.ndarray]] | None = inputs

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        return RecordedSession(self, list(outputs))

    def iteration_for(self, feeds: Feeds, call: int) -> int:
        """Index of the recorded iteration for ``feeds`` (by inputs when known, else the ``call``-th)."""
        if self.inputs is None:
            if call >= len(self.iterations):
                raise EngineRunError(f"the recording of {self.runner} holds {len(self.iterations)} iteration(s); "
                                     f"run {call + 1} has none", "compare on as many feeds as were recorded")
            return call
        for i, recorded in enumerate(self.inputs):
            if _same_feed(recorded, feeds):
                return i
        raise EngineRunError(f"these feeds match none of the {len(self.inputs)} recorded inputs of {self.runner}",
                             "compare on the recorded inputs (polygraphy run --save-inputs)")

    def describe(self) -> dict:
        names = set()
        for it in self.iterations:
            names.update(it.outputs)
        return {"engine": "recorded", "runner": self.runner, "file": Path(self.source).name if self.source else None,
                "iterations": len(self.iterations), "tensors": len(names), "format": "polygraphy RunResults"}


def _same_feed(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    keys = set(a) & set(b)
    if not keys:
        return False
    for k in keys:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f" and y.dtype.kind == "f"):
            return False
    return True


class RecordedSession(Session):
    """Returns the recorded values of the requested tensors that the recording holds (others are absent, as
    with an engine that cannot produce them)."""

    def __init__(self, engine: RecordedEngine, outputs: list[str]):
        self.engine, self.outputs, self.calls = engine, outputs, 0

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        index = self.engine.iteration_for(feeds, self.calls)
        self.calls += 1
        if index >= len(self.engine.iterations):
            raise EngineRunError(f"recorded input {index} has no recorded outputs in {self.engine.runner}")
        recorded = self.engine.iterations[index].outputs
        return {name: recorded[name] for name in self.outputs if name in recorded}
