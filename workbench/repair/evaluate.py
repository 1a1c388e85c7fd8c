"""Evaluating a set of kept nodes: run the candidate with that set kept in reference precision on every feed and
judge its outputs against the reference's (computed once per feed).

Two ways to run a set: build a model for it (one candidate build each), or, for FP16/BF16 candidates, one
*switchable* model holding every pool node's island beside the original, where a set is a choice of boolean
inputs (:meth:`IslandBuilder.switchable`): a search then costs one build and a run per set. Q/DQ candidates
always build: engines fuse Q/DQ patterns (ORT's QLinear kernels, TensorRT's INT8 layers) and the switch's
selections would break those fusions, so a switchable model would not compute what the repaired one does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.metrics import ErrorStats
from ..errors import EngineRunError
from .islands import IslandBuilder
from .target import Judgement, Target

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """One evaluated set: its judgement, how it ran ("build" or "switch") and how long it took."""

    kept: tuple[str, ...]
    judgement: Judgement
    how: str
    seconds: float
    per_feed: list[dict[str, dict]] = field(default_factory=list, repr=False)

    @property
    def met(self) -> bool:
        return self.judgement.met

    def to_json(self) -> dict:
        return {"kept": list(self.kept), **self.judgement.to_json(), "how": self.how,
                "seconds": round(self.seconds, 3)}


class BudgetExhausted(Exception):
    """No candidate build left (``max_builds``)."""


class Evaluator:
    """Evaluates sets of kept nodes of ``plan``'s candidate against ``target``; counts candidate builds.

    ``batch``: "auto" (switchable model for FP16/BF16 candidates, a build per set for Q/DQ), "switch" or
    "build". ``outputs``: (reference name, candidate name) of the graph outputs judged."""

    def __init__(self, plan, builder: IslandBuilder, target: Target, outputs: list[tuple[str, str]], *,
                 max_builds: int = 40, batch: str = "auto", step=None):
        self.plan, self.builder, self.target, self.outputs = plan, builder, target, outputs
        self.max_builds = max_builds
        self.batch = batch if batch != "auto" else ("switch" if builder.kind == "float" else "build")
        self.step = step
        self.builds = 0  # search builds (switchable model included), bounded by max_builds
        self.builds_by_role: dict[str, int] = {}  # baseline and verification builds
        self.evaluations: list[Evaluation] = []
        self._cache: dict[frozenset, Evaluation] = {}
        self._switch = None  # (session, flags)
        self._pool: tuple[str, ...] = ()
        self.notes: list[str] = []
        self.ref_outputs = self._reference()

    # --- reference ------------------------------------------------------------------------------------------
    def _reference(self) -> list[dict[str, np.ndarray]]:
        names = [r for r, _ in self.outputs]
        with self.plan.ref_engine.prepare(self.plan.ref_model, names) as session:
            return [session.run(feed) for feed in self.plan.feeds]

    # --- running -----------------------------------------------------------------------------------------
    def _spend(self) -> None:
        if self.builds >= self.max_builds:
            raise BudgetExhausted
        self.builds += 1

    def use_switch(self, pool: Sequence[str]) -> bool:
        """Build the switchable model for ``pool`` (one build); False (and per-set builds from now on) when the
        engine refuses it or the search is set to build."""
        if self.batch != "switch" or not pool:
            return False
        self._spend()
        try:
            model, flags = self.builder.switchable(pool)
            session = self.plan.cand_engine.prepare(model, [c for _, c in self.outputs])
        except EngineRunError as e:
            self.notes.append(f"the candidate engine refused the switchable model ({e}); one build per set instead")
            log.warning("switchable model refused: %s", e)
            self.batch = "build"
            return False
        self._switch, self._pool = (session, flags), tuple(pool)
        return True

    def evaluate(self, kept: Sequence[str], *, model=None, role: str = "search") -> Evaluation:
        """Judge ``kept`` (cached by set). ``model``: run this model (the repaired one) with a build of its own;
        ``role`` labels the build ("search" builds count against ``max_builds``; "baseline"/"verify" do not)."""
        key = frozenset(kept)
        if model is None and key in self._cache:
            return self._cache[key]
        t0 = time.perf_counter()
        if model is None and self._switch is not None and key <= set(self._pool):
            mode = "switch"
            session, flags = self._switch
            extra = {f: np.array(name in key) for name, f in flags.items()}
            results = [session.run({**cfeed, **extra}) for cfeed in self.plan.cand_feeds]
        else:
            mode = "build"
            if role == "search":
                self._spend()
            else:
                self.builds_by_role[role] = self.builds_by_role.get(role, 0) + 1
            model = model if model is not None else self.builder.build(list(kept))
            with self.plan.cand_engine.prepare(model, [c for _, c in self.outputs]) as session:
                results = [session.run(cfeed) for cfeed in self.plan.cand_feeds]
        ev = self._judge(tuple(kept), results, mode if role == "search" else role, time.perf_counter() - t0)
        self._cache.setdefault(key, ev)
        self.evaluations.append(ev)
        if self.step is not None:
            self.step(min(0.95, len(self.evaluations) / 40), f"evaluation {len(self.evaluations)}: "
                      f"{len(kept)} node(s) kept, target {'met' if ev.met else 'not met'}")
        log.info("repair: %d kept %s -> %s (%s, %.2fs)", len(kept), list(kept)[:4], "met" if ev.met else "not met",
                 ev.how, ev.seconds)
        return ev

    def drop_switch(self) -> None:
        """Evaluate by building from now on (forget what the switchable model said)."""
        self.close()
        self.batch = "build"
        self._cache = {k: e for k, e in self._cache.items() if e.how != "switch"}

    @property
    def search_builds(self) -> int:
        return self.builds

    @property
    def total_builds(self) -> int:
        return self.builds + sum(self.builds_by_role.values())

    def judge_outputs(self, results: list[dict[str, np.ndarray]], candidate_names: bool = True) -> Judgement:
        """Judge raw outputs (per feed, keyed by candidate names, or by reference names)."""
        return self._judge((), results, "", 0.0, candidate_names).judgement

    def _judge(self, kept, results, mode, seconds, candidate_names: bool = True) -> Evaluation:
        per_feed, task = [], []
        for ref, got in zip(self.ref_outputs, results):
            cand = {r: got[c if candidate_names else r] for r, c in self.outputs}
            per_feed.append({r: ErrorStats().update(ref[r], cand[r]).metrics() for r, _ in self.outputs})
            if self.target.metric is not None:
                task.append(self.target.task_value(ref, cand))
        return Evaluation(kept, self.target.judge(per_feed, task), mode, seconds, per_feed)

    def close(self) -> None:
        if self._switch is not None:
            self._switch[0].close()
            self._switch = None
