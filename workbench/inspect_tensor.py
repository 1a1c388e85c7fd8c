"""Reference and candidate values of ONE tensor, for a detail view (histograms, scatter, per-channel error).

A comparison keeps statistics, never arrays; this runs the two sides again. It mirrors
:func:`workbench.compare.compare`: same specs, same precision variant (keep_fp32, calibration feeds), same
candidate tensor naming, same feed casting, and the same marked outputs: marking a tensor as an output changes
what an engine may fuse (ONNX Runtime folds a BatchNormalization into the Conv before it unless the Conv's output
is wanted), so ``mark="all"`` marks every paired tensor as the "all" strategy does (one run per feed then serves
every layer; used while the values fit the memory budget) and ``mark="one"`` marks only the wanted tensor, as
bisection does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import WorkbenchError

log = logging.getLogger(__name__)


class TensorProbe:
    """Values of single tensors on ``reference`` and ``candidate`` (``ENGINE[:VARIANT]``) for one feed list."""

    def __init__(self, model: Any, reference: str = "ort", candidate: str = "ort:fp16", *, feeds: Any = None,
                 cand_model: Any = None, seed: int = 0, feed_count: int = 1,
                 input_shapes: dict[str, list[int]] | None = None,
                 val_ranges: dict[str, tuple[float, float]] | None = None, keep_fp32: Sequence[str] = (),
                 calibration_feeds: Any = None, engine_options: dict[str, dict] | None = None,
                 isolate: bool | None = None, mark: str = "all", memory_budget: str | int | None = None) -> None:
        from .compare.api import cast_feeds, make_engine
        from .engines.spec import EngineSpec
        from .inputs import check_feeds, feeds_from, random_feeds
        from .model.load import load_model

        self.ref_spec, self.cand_spec = EngineSpec.parse(reference), EngineSpec.parse(candidate)
        self.model = load_model(model)
        proto = self.model.proto
        if feeds is None:
            self.feeds = random_feeds(proto, seed=seed, count=feed_count, shapes=input_shapes, ranges=val_ranges)
        else:
            self.feeds = check_feeds(proto, feeds_from(feeds))
        calib = calibration_feeds if calibration_feeds is not None else self.feeds
        self.ref_model = self._variant(self.ref_spec.variant, calib, keep_fp32).model \
            if self.ref_spec.variant != "fp32" else proto
        self.views: dict[str, str | None] = {}
        if cand_model is not None:
            if self.cand_spec.variant != "fp32":
                raise WorkbenchError(f"a candidate model is already the candidate's variant; drop "
                                     f"':{self.cand_spec.variant}' from {candidate!r}")
            self.cand_model = load_model(cand_model).proto
        else:
            variant = self._variant(self.cand_spec.variant, calib, keep_fp32)
            self.cand_model = variant.model
            self.views = {**variant.tensor_map, **variant.details.get("qdq_outputs", {})}
        self.cand_feeds = cast_feeds(self.cand_model, self.feeds)
        if mark not in ("all", "one"):
            raise WorkbenchError(f"unknown mark {mark!r}", "use 'all' or 'one'")
        self.mark = mark
        self.budget = memory_budget
        self._pairs: dict[str, str] | None = None
        self._cached: tuple[int, dict, dict] | None = None
        options = engine_options or {}
        self.ref_engine = make_engine(self.ref_spec, isolate=isolate, options=options.get(self.ref_spec.engine))
        self.cand_engine = make_engine(self.cand_spec, isolate=isolate, options=options.get(self.cand_spec.engine))

    def _variant(self, name: str, calib: Any, keep_fp32: Sequence[str]):
        from .variants import make_variant

        return make_variant(self.model.proto, name, calibration_feeds=calib, keep_fp32=keep_fp32)

    def candidate_name(self, tensor: str) -> str:
        """The candidate tensor standing for reference ``tensor`` (renamed or quantized view)."""
        if tensor in self.views and self.views[tensor] is None:
            raise WorkbenchError(f"tensor {tensor!r} has no counterpart in the {self.cand_spec.variant} variant",
                                 "pick another layer")
        return self.views.get(tensor) or tensor

    def values(self, tensor: str, feed_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(reference values, candidate values) of ``tensor`` for feed ``feed_index``."""
        if not 0 <= feed_index < len(self.feeds):
            raise WorkbenchError(f"feed {feed_index} does not exist ({len(self.feeds)} feeds)", "pick another feed")
        cand_name = self.candidate_name(tensor)
        pairs = self._all_pairs() if self.mark == "all" else None
        if pairs is None or tensor not in pairs:
            ref = _run(self.ref_engine, self.ref_model, [tensor], self.feeds[feed_index], "reference")[tensor]
            cand = _run(self.cand_engine, self.cand_model, [cand_name], self.cand_feeds[feed_index],
                        "candidate")[cand_name]
            return np.asarray(ref), np.asarray(cand)
        if self._cached is None or self._cached[0] != feed_index:
            self._cached = None  # free the previous feed's values first
            ref = _run(self.ref_engine, self.ref_model, list(pairs), self.feeds[feed_index], "reference")
            cand = _run(self.cand_engine, self.cand_model, list(pairs.values()), self.cand_feeds[feed_index],
                        "candidate")
            self._cached = (feed_index, ref, cand)
        _, ref, cand = self._cached
        return np.asarray(ref[tensor]), np.asarray(cand[pairs[tensor]])

    def _all_pairs(self) -> dict[str, str] | None:
        """Reference tensor -> candidate tensor for every pair compare() marks; None if they exceed the budget."""
        if self._pairs is None:
            from .compare.api import infer_shapes_lenient
            from .compare.budget import parse_size, tensor_bytes
            from .compare.pairs import pair_tensors
            from .model.graph import GraphInfo

            ref_graph = GraphInfo.build(infer_shapes_lenient(self.ref_model))
            pairs = pair_tensors(ref_graph, infer_shapes_lenient(self.cand_model), self.views)
            sizes = tensor_bytes(self.ref_model, self.feeds[0])
            total = 2 * sum(sizes.get(p.tensor) or 0 for p in pairs)
            if total > parse_size(self.budget):
                log.info("all %d tensors need ~%d MB: marking one tensor at a time", len(pairs), total >> 20)
                self._pairs = {}
            else:
                self._pairs = {p.tensor: p.candidate for p in pairs}
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
    """A :class:`TensorProbe` that reruns ``result``'s comparison setup (model, specs, feeds, variant options)."""
    opts = dict(getattr(result, "run_options", None) or {})
    model = model if model is not None else (opts.get("model") or result.model.get("path"))
    if model is None:
        raise WorkbenchError("this comparison does not say which model it ran on", "pass the model")
    feeds = getattr(result, "used_feeds", None)
    kwargs: dict[str, Any] = {}
    if feeds is None:
        info = result.feeds or {}
        if info.get("source") != "random":
            raise WorkbenchError("the comparison's feeds were not kept with its result",
                                 "run the comparison again in this session")
        kwargs = {"seed": int(info.get("seed", 0)), "feed_count": int(info.get("count", 1)),
                  "input_shapes": info.get("shapes"), "val_ranges": info.get("ranges")}
    return TensorProbe(model, result.reference, result.candidate, feeds=feeds, cand_model=opts.get("cand_model"),
                       keep_fp32=opts.get("keep_fp32") or (), calibration_feeds=opts.get("calibration_feeds"),
                       engine_options=opts.get("engine_options"), isolate=opts.get("isolate"),
                       mark="one" if result.mode == "bisect" else "all", memory_budget=opts.get("memory_budget"),
                       **kwargs)
