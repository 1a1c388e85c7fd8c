"""Evaluating a set of kept nodes: run the candidate with that set kept in reference precision on every feed and
judge its outputs against the reference's (computed once per feed).

Two ways to run a set: build a model for it (one candidate build each), or, for FP16/BF16 candidates, one
*switchable* model holding every pool node's island beside the original, where a set is a choice of boolean
inputs (:meth:`IslandBuilder.switchable`): a search then costs one build and a run per set. Q/DQ candidates
always build: engines fuse Q/DQ patterns (ORT's QLinear kernels, TensorRT's INT8 layers) and the switch's
selections would break those fusions, so a switchable model would not compute what the repaired one does.

A search evaluation stops at the first feed that misses the target when the target is judged feed by feed (a
criterion, or a task metric on the worst feed: one failing feed decides it), running the feeds in the order they
last failed in (move to front): most sets a search tries miss, and most miss on the same few feeds, so an unmet
set costs a run or two instead of one per feed. Its judgement then counts the feeds run. A mean over the feeds is
decided early only when the metric returns bools (each feed's best is then known): once so many feeds missed that
the mean cannot reach the threshold. The baseline and the verification run every feed.

With workers (:mod:`workbench.repair.parallel`), :meth:`Evaluator.prefetch` evaluates the sets the search may ask
for next side by side (every feed; the same stop is applied when the outcome is committed, so the numbers are
the serial ones); :meth:`Evaluator.evaluate` then commits a prefetched outcome when the search asks for its set,
in the search's own order, counting builds and judging exactly as a serial evaluation. Sets the search never asks
for are dropped uncounted: the evaluations, builds and verdicts are the serial ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.metrics import ErrorStats
from ..errors import EngineRunError
from .islands import IslandBuilder
from .target import _OPS, Judgement, Target

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """One evaluated set: its judgement, how it ran ("build" or "switch") and how long it took."""

    kept: tuple[str, ...]
    judgement: Judgement
    how: str
    seconds: float
    per_feed: list[dict[str, dict]] = field(default_factory=list, repr=False)
    feed_met: dict[int, bool] = field(default_factory=dict, repr=False)  # by feed index, the feeds run
    values: list = field(default_factory=list, repr=False)  # the task metric's results, the feeds run

    @property
    def met(self) -> bool:
        return self.judgement.met

    def to_json(self) -> dict:
        return {"kept": list(self.kept), **self.judgement.to_json(), "how": self.how,
                "seconds": round(self.seconds, 3), "feeds": len(self.feed_met)}


def _came_back(got: dict, names: list[str], side: str) -> dict:
    """``got`` when it holds every one of ``names``; else one error naming what the engine left out."""
    missing = [n for n in names if n not in got]
    if missing:
        from ..errors import EngineCrashedError

        raise EngineCrashedError(
            f"no value came back for graph output(s) {', '.join(missing[:4])}: the {side} engine returned fewer "
            "tensors than it was asked for",
            "check the engine's run() returns every requested name (a custom engine's mapping of output names)")
    return got


class BudgetExhausted(Exception):
    """No candidate build left (``max_builds``)."""


class Evaluator:
    """Evaluates sets of kept nodes of ``plan``'s candidate against ``target``; counts candidate builds.

    ``batch``: "auto" (switchable model for FP16/BF16 candidates, a build per set for Q/DQ), "switch" or
    "build". ``outputs``: (reference name, candidate name) of the graph outputs judged."""

    def __init__(self, plan, builder: IslandBuilder, target: Target, outputs: list[tuple[str, str]], *,
                 max_builds: int = 40, batch: str = "auto", step=None, workers=None):
        self.plan, self.builder, self.target, self.outputs = plan, builder, target, outputs
        self.max_builds = max_builds
        self.batch = batch if batch != "auto" else ("switch" if builder.kind == "float" else "build")
        self._batch0 = self.batch
        self.step = step
        self.builds = 0  # search builds (switchable model included), bounded by max_builds
        self.builds_by_role: dict[str, int] = {}  # baseline and verification builds
        self.evaluations: list[Evaluation] = []
        self._cache: dict[frozenset, Evaluation] = {}
        self._switch = None  # (session, flags)
        self._pool: tuple[str, ...] = ()
        self.notes: list[str] = []
        self.workers = workers  # RepairWorkers, or None: evaluate here
        self._ahead: dict[tuple[frozenset, str], Any] = {}  # prefetched outcomes by (set, how), not yet committed
        self.ref_outputs = self._reference()
        self.feed_order = list(range(len(self.plan.cand_feeds)))  # failing feeds first (move to front)
        self.stops_early = target.metric is None or target.aggregate != "mean"
        self.bool_mean = False  # a mean target over a metric that returned bools: stops once out of reach

    @property
    def width(self) -> int:
        """How many sets one prefetch evaluates side by side (1: serial)."""
        return self.workers.width if self.workers is not None else 1

    # --- reference ------------------------------------------------------------------------------------------
    def _reference(self) -> list[dict[str, np.ndarray]]:
        names = [r for r, _ in self.outputs]
        with self.plan.ref_engine.prepare(self.plan.ref_model, names) as session:
            side = f"reference ({self.plan.ref_spec})"
            return [_came_back(session.run(feed), names, side) for feed in self.plan.feeds]

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

    def _how(self, key: frozenset) -> str:
        return "switch" if self._switch is not None and key <= set(self._pool) else "build"

    def prefetch(self, sets: Sequence[Sequence[str]]) -> None:
        """With workers: evaluate those of ``sets`` (what the search asks next, then what it may ask after) not yet
        known, side by side, within the build budget left; :meth:`evaluate` commits them when asked. Nothing while
        the next set is known already (the last batch is still being read), or without workers."""
        if self.workers is None or not sets:
            return
        wanted = [frozenset(s) for s in sets]
        if wanted[0] in self._cache or (wanted[0], self._how(wanted[0])) in self._ahead:
            return
        self._ahead = {k: v for k, v in self._ahead.items() if k[0] in wanted}  # the rest went stale
        budget = self.max_builds - self.builds - sum(1 for _, how in self._ahead if how == "build")
        todo, seen = [], set()
        for kept, key in zip(sets, wanted):
            how = self._how(key)
            if key in self._cache or key in seen or (key, how) in self._ahead:
                continue
            if how == "build":
                if budget <= 0:
                    continue
                budget -= 1
            seen.add(key)
            todo.append((tuple(kept), self._pool if how == "switch" else None))
        if not todo:
            return
        from ..core.progress import Steps

        outcomes = self.workers.run(todo, self.step if self.step is not None else Steps(None, None))
        for (kept, pool), outcome in zip(todo, outcomes):
            self._ahead[(frozenset(kept), "switch" if pool is not None else "build")] = outcome

    def evaluate(self, kept: Sequence[str], *, model=None, role: str = "search") -> Evaluation:
        """Judge ``kept`` (cached by set). ``model``: run this model (the repaired one) with a build of its own;
        ``role`` labels the build ("search" builds count against ``max_builds``; "baseline"/"verify" do not)."""
        key = frozenset(kept)
        if model is None and key in self._cache:
            return self._cache[key]
        t0 = time.perf_counter()
        ahead = self._ahead.pop((key, self._how(key)), None) if model is None and role == "search" else None
        if ahead is not None and ahead.error is not None:  # evaluate it here: the serial error, or its result
            log.info("a worker could not evaluate %s (%s): evaluating it here", list(kept)[:4], ahead.error)
            ahead = None
        if model is None and self._switch is not None and key <= set(self._pool):
            mode = "switch"
            if ahead is not None:
                judged = self._judged_feeds(ahead.results.__getitem__, role)
            else:
                session, flags = self._switch
                extra = {f: np.array(name in key) for name, f in flags.items()}
                feeds = self.plan.cand_feeds
                judged = self._judged_feeds(lambda i: session.run({**feeds[i], **extra}), role)
        else:
            mode = "build"
            if role == "search":
                self._spend()
            else:
                self.builds_by_role[role] = self.builds_by_role.get(role, 0) + 1
            if ahead is not None:
                judged = self._judged_feeds(ahead.results.__getitem__, role)
            else:
                model = model if model is not None else self.builder.build(list(kept))
                with self.plan.cand_engine.prepare(model, [c for _, c in self.outputs]) as session:
                    feeds = self.plan.cand_feeds
                    judged = self._judged_feeds(lambda i: session.run(feeds[i]), role)
        seconds = ahead.seconds if ahead is not None else time.perf_counter() - t0
        ev = self._evaluation(tuple(kept), judged, mode if role == "search" else role, seconds)
        if role == "baseline":
            self._note_baseline(ev)
        self._move_to_front(ev)
        self._cache.setdefault(key, ev)
        self.evaluations.append(ev)
        if self.step is not None:
            self.step(min(0.95, len(self.evaluations) / 40), f"evaluation {len(self.evaluations)}: "
                      f"{len(kept)} node(s) kept, target {'met' if ev.met else 'not met'}")
        log.info("repair: %d kept %s -> %s (%s, %.2fs)", len(kept), list(kept)[:4], "met" if ev.met else "not met",
                 ev.how, ev.seconds)
        return ev

    def _judged_feeds(self, outputs, role: str) -> dict[int, tuple]:
        """Each feed judged (:meth:`_feed`; ``outputs(i)``: the candidate's outputs on feed ``i``, run or read from
        a worker's results), by feed index: every feed, or (a search set) in :attr:`feed_order` up to the feed that
        decides it misses the target (:meth:`_decided`)."""
        early = role == "search" and (self.stops_early or self.bool_mean)
        out: dict[int, tuple] = {}
        missed = 0
        for i in (self.feed_order if early else range(len(self.plan.cand_feeds))):
            out[i] = self._feed(i, outputs(i))
            missed += not out[i][2]
            if early and self._decided(missed):
                break
        return out

    def _feed(self, i: int, got: dict, candidate_names: bool = True) -> tuple[dict, Any, bool]:
        """Feed ``i`` judged: (output -> metrics, the task metric's value or None, whether it meets the target)."""
        ref = self.ref_outputs[i]
        _came_back(got, [c if candidate_names else r for r, c in self.outputs], f"candidate ({self.plan.cand_spec})")
        cand = {r: got[c if candidate_names else r] for r, c in self.outputs}
        metrics = {r: ErrorStats().update(ref[r], cand[r]).metrics() for r, _ in self.outputs}
        value = self.target.task_value(ref, cand) if self.target.metric is not None else None
        return metrics, value, self.target.judge([metrics], None if value is None else [value]).met

    def _decided(self, missed: int) -> bool:
        """Whether ``missed`` feeds missing the target decide the set misses it: one for a per-feed target; for a
        mean of bools, enough that the mean cannot reach the threshold even if every other feed passes."""
        if self.stops_early:
            return missed > 0
        n, target = len(self.plan.cand_feeds), self.target
        best = (n - missed) / n if target.op in (">=", ">") else missed / n
        return missed > 0 and not _OPS[target.op](best, target.threshold)

    def _note_baseline(self, ev: Evaluation) -> None:
        """After the baseline: a mean target over bool results may stop a search evaluation early; a metric that
        returned NaN, or a true/false metric with a threshold it can never reach, is refused (RepairError)."""
        t = self.target
        nan = [i for i, v in zip(sorted(ev.feed_met), ev.values) if isinstance(v, (float, np.floating)) and v != v]
        if t.metric is not None and nan:
            from .graph import RepairError

            raise RepairError(f"{t.metric_label} returned NaN on {len(nan)} feed(s) (first: feed {nan[0]}) of the "
                              "model as converted: a target cannot be judged on it", "make the metric return a number "
                              "for every feed (e.g. guard its divisions)")
        bools = bool(ev.values) and all(isinstance(v, (bool, np.bool_)) for v in ev.values)
        self.bool_mean = (t.metric is not None and t.aggregate == "mean" and t.op in (">=", ">", "<=", "<")
                          and bools)
        if t.metric is not None and bools and t.op in (">=", ">", "<=", "<") \
                and not any(_OPS[t.op](v, t.threshold) for v in (0.0, 1.0)):
            from .graph import RepairError

            raise RepairError(f"the target {t.describe()} can never be met: {t.metric_label} returns true/false, "
                              "which read as 1/0", "use >=1 (every feed passes) or mean>=X with X in [0, 1]")

    def _move_to_front(self, ev: Evaluation) -> None:
        failed = [i for i, ok in ev.feed_met.items() if not ok]
        if failed:
            self.feed_order = failed + [i for i in self.feed_order if i not in set(failed)]

    def rebase(self, builder: IslandBuilder) -> None:
        """Evaluate sets on another base from now on (the candidate with rewrites applied): forget the switchable
        model and every cached outcome."""
        self.close()
        self.builder = builder
        self.batch = self._batch0
        self._cache.clear()
        self._ahead.clear()
        self._pool = ()

    def built_on_every_feed(self, kept: Sequence[str]) -> Evaluation | None:
        """The search's evaluation of ``kept`` when it built that very set (not a switchable run) and ran every
        feed: the repaired model is that build, judged already."""
        found = self._cache.get(frozenset(kept))
        if found is None or found.how != "build" or len(found.feed_met) != len(self.plan.cand_feeds):
            return None
        return found

    def drop_switch(self) -> None:
        """Evaluate by building from now on (forget what the switchable model said)."""
        self.close()
        self.batch = "build"
        self._cache = {k: e for k, e in self._cache.items() if e.how != "switch"}
        self._ahead.clear()

    @property
    def search_builds(self) -> int:
        return self.builds

    @property
    def total_builds(self) -> int:
        return self.builds + sum(self.builds_by_role.values())

    def judge_outputs(self, results: list[dict[str, np.ndarray]], candidate_names: bool = True) -> Judgement:
        """Judge raw outputs (per feed, keyed by candidate names, or by reference names)."""
        return self.judge_feeds(dict(enumerate(results)), candidate_names).judgement

    def judge_feeds(self, results: dict[int, dict], candidate_names: bool = True) -> Evaluation:
        """Raw outputs of some feeds (by feed index) judged together, as a search set on those feeds."""
        return self._evaluation((), {i: self._feed(i, got, candidate_names) for i, got in results.items()}, "", 0.0)

    def _evaluation(self, kept, judged: dict[int, tuple], mode, seconds) -> Evaluation:
        """An Evaluation of the feeds in ``judged`` (:meth:`_judged_feeds`), in feed order."""
        items = sorted(judged.items())
        per_feed = [metrics for _, (metrics, _, _) in items]
        task = [value for _, (_, value, _) in items] if self.target.metric is not None else []
        return Evaluation(kept, self.target.judge(per_feed, task), mode, seconds, per_feed,
                          {i: ok for i, (_, _, ok) in items}, task)

    def close(self) -> None:
        if self._switch is not None:
            self._switch[0].close()
            self._switch = None
