"""Reference and candidate values of ONE tensor, for a detail view (histograms, scatter, per-channel error).

A comparison keeps statistics, never arrays; this runs the two sides again, from the comparison's own
:class:`~workbench.compare.plan.ComparisonPlan` (same variant, candidate naming, feed casting and engines).
Marking a tensor as an output changes what an engine may fuse (ONNX Runtime folds a BatchNormalization into the
Conv before it unless the Conv's output is wanted), so ``mark="all"`` marks every paired tensor as the "all"
strategy does (one run per feed then serves every layer; used while the values fit the memory budget) and
``mark="one"`` marks only the wanted tensor, as bisection does.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .errors import WorkbenchError

log = logging.getLogger(__name__)


class TensorProbe:
    """Values of single tensors on ``reference`` and ``candidate`` (``ENGINE[:VARIANT]``) for one feed list.
    ``plan``: an existing comparison plan to reuse (its model, variant, feeds and engines); otherwise one is
    built from the arguments (``options``: :class:`~workbench.compare.options.CompareOptions` fields)."""

    def __init__(self, model: Any = None, reference: str = "ort", candidate: str = "ort:fp16", *, feeds: Any = None,
                 cand_model: Any = None, mark: str = "all", plan: Any = None, **options: Any) -> None:
        if mark not in ("all", "one"):
            raise WorkbenchError(f"unknown mark {mark!r}", "use 'all' or 'one'")
        if plan is None:
            from .compare.plan import ComparisonPlan

            plan = ComparisonPlan(model, reference, candidate, feeds=feeds, cand_model=cand_model, impact=0,
                                  **options)
        self.plan = plan
        self.mark = mark
        self._pairs: dict[str, str] | None = None
        self._cached: tuple[int, dict, dict] | None = None

    @property
    def feeds(self) -> list[dict[str, np.ndarray]]:
        return self.plan.feeds

    def candidate_name(self, tensor: str) -> str:
        """The candidate tensor standing for reference ``tensor`` (renamed or quantized view)."""
        return self.plan.candidate_name(tensor)

    def values(self, tensor: str, feed_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(reference values, candidate values) of ``tensor`` for feed ``feed_index``."""
        plan = self.plan
        if not 0 <= feed_index < len(plan.feeds):
            raise WorkbenchError(f"feed {feed_index} does not exist ({len(plan.feeds)} feeds)", "pick another feed")
        cand_name = self.candidate_name(tensor)
        pairs = self._all_pairs() if self.mark == "all" else None
        feed, cfeed = plan.feeds[feed_index], plan.cand_feeds[feed_index]
        if pairs is None or tensor not in pairs:
            ref = _run(plan.ref_engine, plan.ref_model, [tensor], feed, "reference")[tensor]
            cand = _run(plan.cand_engine, plan.cand_model, [cand_name], cfeed, "candidate")[cand_name]
            return np.asarray(ref), np.asarray(cand)
        if self._cached is None or self._cached[0] != feed_index:
            self._cached = None  # free the previous feed's values first
            ref = _run(plan.ref_engine, plan.ref_model, list(pairs), feed, "reference")
            cand = _run(plan.cand_engine, plan.cand_model, list(pairs.values()), cfeed, "candidate")
            self._cached = (feed_index, ref, cand)
        _, ref, cand = self._cached
        return np.asarray(ref[tensor]), np.asarray(cand[pairs[tensor]])

    def _all_pairs(self) -> dict[str, str] | None:
        """Reference tensor -> candidate tensor for every pair compare() marks; None if they exceed the budget."""
        if self._pairs is None:
            from .core.budget import parse_size, tensor_bytes

            plan = self.plan
            sizes = tensor_bytes(plan.ref_model, plan.feeds[0])
            total = 2 * sum(sizes.get(p.tensor) or 0 for p in plan.pairs)
            if total > parse_size(plan.options.memory_budget):
                log.info("all %d tensors need ~%d MB: marking one tensor at a time", len(plan.pairs), total >> 20)
                self._pairs = {}
            else:
                self._pairs = {p.tensor: p.candidate for p in plan.pairs}
        return self._pairs or None


def _run(engine, proto, tensors: list[str], feed: dict[str, np.ndarray], side: str) -> dict[str, np.ndarray]:
    produced = {o for node in proto.graph.node for o in node.output}
    missing = [t for t in tensors if t not in feed and t not in produced]
    if missing:
        raise WorkbenchError(f"the {side} model has no tensor {missing[0]!r}",
                             "it may sit inside an If branch the comparison inlined; pick another layer")
    values = {t: feed[t] for t in tensors if t in feed}
    marked = [t for t in tensors if t not in feed]
    if marked:
        with engine.prepare(proto, marked) as session:
            values.update(session.run(feed))
    return values


def tensor_values(model: Any, reference: str, candidate: str, tensor: str, feeds: Any = None, *,
                  feed_index: int = 0, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """(reference values, candidate values) of ``tensor``; ``options`` as :class:`TensorProbe`'s."""
    return TensorProbe(model, reference, candidate, feeds=feeds, **options).values(tensor, feed_index)


def probe_for(result: Any, model: Any = None) -> TensorProbe:
    """A :class:`TensorProbe` for ``result``'s comparison: its own plan when the result came from compare() in
    this session, else a plan rebuilt from what the result records (model, specs, feeds, options)."""
    mark = "one" if result.mode == "bisect" else "all"
    plan = getattr(result, "plan", None)
    if plan is not None and model is None:
        return TensorProbe(plan=plan, mark=mark)
    opts = dict(getattr(result, "run_options", None) or {})
    model = model if model is not None else (opts.get("model") or result.model.get("path"))
    if model is None:
        raise WorkbenchError("this comparison does not say which model it ran on", "pass the model")
    options = opts.get("options")
    feeds = getattr(result, "used_feeds", None)
    kwargs: dict[str, Any] = {}
    if feeds is None:
        info = result.feeds or {}
        if info.get("source") != "random":
            raise WorkbenchError("the comparison's feeds were not kept with its result",
                                 "open it from its bundle (workbench.report.load_bundle) or run it again")
        kwargs = {"seed": int(info.get("seed", 0)), "feed_count": int(info.get("count", 1)),
                  "input_shapes": info.get("shapes"), "val_ranges": info.get("ranges")}
    if options is None:
        kwargs.update({k: opts[k] for k in ("keep_fp32", "calibration_feeds", "engine_options", "isolate",
                                            "memory_budget") if opts.get(k) is not None})
    else:
        kwargs["options"] = options
    return TensorProbe(model, result.reference, result.candidate, feeds=feeds, cand_model=opts.get("cand_model"),
                       mark=mark, **kwargs)
