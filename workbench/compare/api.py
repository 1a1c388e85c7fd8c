"""``compare()``: where (first divergent tensor) and why (which node introduces the error) two runs part ways."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .. import __version__
from ..engines import get_engine, should_isolate
from ..engines.base import Engine
from ..engines.spec import EngineSpec
from ..errors import SpecError
from ..model.graph import GraphInfo
from ..model.load import LoadedModel, load_model
from .budget import parse_size
from .criterion import Criterion
from .explain import explain
from .metrics import ErrorStats
from .pairs import pair_tensors
from .result import CompareResult, Culprit, TensorResult
from .strategies import Context, Measured, Progress, run_all, run_bisect

log = logging.getLogger(__name__)

MODES = ("auto", "all", "bisect")


def make_engine(spec: EngineSpec, *, isolate: bool | None = None, options: dict | None = None,
                timeout_s: float | None = None) -> Engine:
    """The engine for ``spec``, in a worker process where it may crash the caller (TensorRT, GPU providers)."""
    opts = dict(options or {})
    if spec.engine == "ref" and spec.variant != "fp32":
        opts.setdefault("precision", "native")
    if isolate is None:
        isolate = should_isolate(spec.engine)
    if isolate:
        from ..engines.isolated import IsolatedEngine

        return IsolatedEngine(spec.engine, opts, timeout_s=timeout_s or 600)
    return get_engine(spec.engine, **opts)


def _is_torch_module(obj: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _feeds(model: onnx.ModelProto, feeds: Any, seed: int, shapes, ranges, count: int) -> tuple[list[dict], dict]:
    from ..inputs import check_feeds, feeds_from, random_feeds

    if feeds is None:
        made = random_feeds(model, seed=seed, count=count, shapes=shapes, ranges=ranges)
        return made, {"source": "random", "seed": seed, "count": len(made), "shapes": shapes, "ranges": ranges}
    source = str(feeds) if isinstance(feeds, (str, bytes)) or hasattr(feeds, "__fspath__") else type(feeds).__name__
    given = check_feeds(model, feeds_from(feeds))
    return given, {"source": source, "count": len(given)}


def cast_feeds(model: onnx.ModelProto, feeds: list[dict]) -> list[dict]:
    """Cast feeds to a candidate's own input dtypes (a user's FP16 export may take float16 inputs)."""
    dtypes = {}
    for vi in model.graph.input:
        et = vi.type.tensor_type.elem_type
        if et:
            dtypes[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
    return [{k: (v.astype(dtypes[k]) if k in dtypes and v.dtype != dtypes[k] else v) for k, v in f.items()
             if k in dtypes or not dtypes} for f in feeds]


def infer_shapes_lenient(model: onnx.ModelProto) -> onnx.ModelProto:
    """A shape-inferred copy of ``model``, or ``model`` itself where inference fails (types are a best effort)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - types for isolation inputs are a best effort
        return model


def compare(
    model: Any,
    reference: str | EngineSpec = "ort",
    candidate: str | EngineSpec = "ort:fp16",
    *,
    feeds: Any = None,
    cand_model: Any = None,
    mode: str = "auto",
    criterion: Criterion | str | None = None,
    memory_budget: str | int | None = None,
    seed: int = 0,
    feed_count: int = 1,
    input_shapes: dict[str, list[int]] | None = None,
    val_ranges: dict[str, tuple[float, float]] | None = None,
    keep_fp32: Sequence[str] = (),
    calibration_feeds: Any = None,
    inline_branches: bool = True,
    example_inputs: Any = None,
    isolate: bool | None = None,
    culprits: bool = True,
    engine_options: dict[str, dict] | None = None,
    timeout_s: float | None = None,
    max_culprits: int = 10,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    reference_engine: Engine | None = None,
    candidate_engine: Engine | None = None,
) -> CompareResult:
    """Compare ``reference`` and ``candidate`` (``ENGINE[:VARIANT]`` specs) on ``model`` layer by layer.

    ``feeds``: a dict, a list of dicts, a .npz, a folder of .npz or a Polygraphy inputs JSON (random seeded
    feeds when None). ``cand_model``: the candidate runs this file instead (the user's own FP16/QDQ export;
    tensors matched by name). ``mode``: "all" marks every tensor (chunked under ``memory_budget``), "bisect"
    binary-searches with one extra marked tensor per candidate build, "auto" picks all unless the candidate
    engine makes marking expensive (TensorRT). ``criterion``: when a tensor counts as diverged (default per
    candidate precision, see :class:`Criterion`). A ``torch.nn.Module`` model needs ``example_inputs``: it is
    exported (legacy exporter, opset 17) and the ``torch`` engine runs the module eagerly.
    Culprits: every node is also run alone on the candidate with
    the reference's inputs, and nodes are ranked by the error they introduce.
    ``reference_engine``/``candidate_engine``: an :class:`Engine` instance used instead of the one the spec names
    (the spec still picks the variant), e.g. a recorded Polygraphy run (:mod:`workbench.report.recorded`).
    The result keeps the feeds used (``result.used_feeds``) and the options (``result.run_options``) for bundles.
    """
    t_start = time.perf_counter()
    timing: dict[str, float] = {}
    ref_spec, cand_spec = EngineSpec.parse(reference), EngineSpec.parse(candidate)
    if mode not in MODES:
        raise SpecError(f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    module = model if _is_torch_module(model) else None
    if module is None and "torch" in (ref_spec.engine, cand_spec.engine):
        raise SpecError("the 'torch' engine runs a torch.nn.Module: pass the module itself as the model",
                        "compare(module, 'torch', 'ort', example_inputs=(x,)) exports it and runs both")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, example_inputs=example_inputs)
    if module is not None:  # the torch engine runs the module itself
        engine_options = {**(engine_options or {}), "torch": {"module": module, "example_inputs": example_inputs,
                                                            **(engine_options or {}).get("torch", {})}}
    crit = Criterion.parse(criterion) if isinstance(criterion, str) else (
        criterion or Criterion.default_for(cand_spec.variant))
    engine_options = engine_options or {}
    feeds_list, feed_info = _feeds(loaded.proto, feeds, seed, input_shapes, val_ranges, feed_count)
    notes: list[str] = []
    original, loaded = loaded, (_inline_decided_ifs(loaded, feeds_list, notes) if inline_branches else loaded)

    t0 = time.perf_counter()
    ref_variant = _variant(loaded, ref_spec, feeds_list, keep_fp32, calibration_feeds) if ref_spec.variant != "fp32" \
        else None
    ref_model = ref_variant.model if ref_variant else loaded.proto
    ref_graph = GraphInfo.build(infer_shapes_lenient(ref_model)) if ref_variant else loaded.graph
    if cand_model is not None:
        if cand_spec.variant != "fp32":
            raise SpecError(f"--cand-model is already the candidate's variant; drop ':{cand_spec.variant}' from "
                            f"{candidate!r}", f"use --cand {cand_spec.engine}")
        cand_loaded = load_model(cand_model)
        cand_proto, views, variant_info = cand_loaded.proto, {}, {
            "variant": "user model", "file": cand_loaded.name, "sha256": cand_loaded.fingerprint}
        clamps: list[dict] = []
    else:
        var = _variant(loaded, cand_spec, feeds_list, keep_fp32, calibration_feeds)
        cand_proto = var.model
        views = {**var.tensor_map, **var.details.get("qdq_outputs", {})}
        variant_info = var.to_json()
        clamps = variant_info.get("clamped", [])
    timing["variant_s"] = time.perf_counter() - t0

    cand_inferred = infer_shapes_lenient(cand_proto)
    pairs = pair_tensors(ref_graph, cand_inferred, views)
    ref_inputs = set(ref_graph.inputs)
    known = {p.candidate: p.tensor for p in pairs}
    known |= {i.name: i.name for i in cand_inferred.graph.input if i.name in ref_inputs}

    t0 = time.perf_counter()
    ref_engine = reference_engine or make_engine(ref_spec, isolate=isolate,
                                                 options=engine_options.get(ref_spec.engine), timeout_s=timeout_s)
    cand_engine = candidate_engine or make_engine(cand_spec, isolate=isolate,
                                                  options=engine_options.get(cand_spec.engine), timeout_s=timeout_s)
    chosen = mode if mode != "auto" else ("all" if getattr(cand_engine, "marks_all_cheaply", True) else "bisect")
    cand_feeds = cast_feeds(cand_inferred, feeds_list)
    ctx = Context(
        ref_engine=ref_engine, cand_engine=cand_engine, ref_model=ref_model, cand_model=cand_inferred,
        feeds=feeds_list, cand_feeds=cand_feeds, pairs=pairs, criterion=crit,
        ref_inputs=ref_inputs, known=known, isolate=culprits, budget=parse_size(memory_budget),
        progress=progress, cancel=cancel, notes=notes,
    )
    if cand_spec.engine == "ort" and cand_spec.variant == "fp16":
        ctx.notes.append("ONNX Runtime's CPU provider runs most FP16 ops in FP32 (it inserts Casts), so FP16 "
                         "arithmetic overflow does not show on 'ort:fp16'; converter clamps and FP16 storage do. "
                         "Use 'ref:fp16' (FP16 arithmetic in numpy) or a GPU engine (ort-cuda:fp16, trt:fp16).")
    measured = run_all(ctx) if chosen == "all" else run_bisect(ctx, ref_graph.outputs)
    timing.update(ctx.timing)
    timing["layerwise_s"] = time.perf_counter() - t0

    tensors = _tensor_results(pairs, measured, crit)
    culprit_list = _culprits(ref_graph, pairs, measured, crit, cand_spec.variant, clamps, max_culprits)
    timing["total_s"] = time.perf_counter() - t_start
    result = CompareResult(
        reference=str(ref_spec), candidate=str(cand_spec), criterion=crit, tensors=tensors, culprits=culprit_list,
        mode=chosen, model={"name": original.name, "sha256": original.fingerprint,
                            "nodes": len(original.proto.graph.node),
                            "path": str(original.path) if original.path else None},
        engines={"reference": _describe(ref_engine), "candidate": _describe(cand_engine), "workbench": __version__},
        variant=variant_info, feeds=feed_info, timing={k: round(v, 4) for k, v in timing.items()},
        builds=ctx.builds, notes=ctx.notes, outputs=list(ref_graph.outputs),
    )
    # not serialised: what a bundle needs to rerun this comparison (workbench.report.bundle)
    result.used_feeds = feeds_list
    result.run_options = {
        "requested_mode": mode, "memory_budget": memory_budget, "keep_fp32": list(keep_fp32),
        "calibration_feeds": calibration_feeds, "inline_branches": inline_branches, "culprits": culprits,
        "max_culprits": max_culprits, "isolate": isolate, "timeout_s": timeout_s, "engine_options": engine_options,
        "cand_model": cand_model, "model": model, "seed": seed, "feed_count": feed_count,
        "input_shapes": input_shapes, "val_ranges": val_ranges,
        "custom_engines": [k for k, e in (("reference", reference_engine), ("candidate", candidate_engine)) if e],
    }
    return result


def _inline_decided_ifs(loaded: LoadedModel, feeds: list[dict], notes: list[str]) -> LoadedModel:
    """Inline the If branches every feed takes (see :mod:`workbench.compare.inline`)."""
    from .inline import decide_branches, if_conditions, inline_ifs

    conditions = if_conditions(loaded.proto)
    if not conditions:
        return loaded
    needed = sorted(set(conditions.values()) - {i.name for i in loaded.proto.graph.input})
    values = [dict(f) for f in feeds]
    if needed:
        with get_engine("ort").prepare(loaded.proto, needed) as session:
            for v in values:
                v.update(session.run(v))
    taken, undecided = decide_branches(conditions, values)
    for node, branch in taken.items():
        notes.append(f"If node {node}: every feed takes its {'then' if branch else 'else'} branch, so that branch "
                     "was inlined and its nodes compared one by one")
    for node, why in undecided.items():
        notes.append(f"If node {node} compared as one node ({why})")
    return load_model(inline_ifs(loaded.proto, taken)) if taken else loaded


def _describe(engine: Engine) -> dict:
    try:
        return engine.describe()
    except Exception as e:  # noqa: BLE001 - a description must never fail a finished comparison
        return {"error": str(e)}


def _variant(loaded: LoadedModel, spec: EngineSpec, feeds: list[dict], keep_fp32, calibration_feeds):
    from ..variants import make_variant

    return make_variant(loaded.proto, spec.variant, calibration_feeds=calibration_feeds or feeds,
                        keep_fp32=keep_fp32)


def _tensor_results(pairs, measured: Measured, crit: Criterion) -> list[TensorResult]:
    out = []
    for p in pairs:
        stats = measured.full.get(p.tensor)
        if stats is None:
            continue
        m = stats.metrics()
        out.append(TensorResult(p.tensor, p.node, p.op_type, p.topo_index, m, crit.diverged(m), p.candidate))
    return out


def _received(node_inputs, measured: Measured, crit: Criterion) -> dict:
    worst = None
    for name in node_inputs:
        stats = measured.full.get(name)
        if stats is None:
            continue
        m = stats.metrics()
        if worst is None or crit.badness(m) > crit.badness(worst):
            worst = m
    if worst is None:  # fed by graph inputs (or by nothing compared): the same feed reaches both sides
        worst = ErrorStats().update(np.zeros(1), np.zeros(1)).metrics()
    return worst


def _own_error(introduced: dict, received: dict) -> dict:
    """Inf/NaN a node produces alone are its own only if its inputs were finite: an input the candidate
    precision cannot represent (reference 3e5 fed as FP16) is the producer's fault, already charged there."""
    if (received.get("nonfinite_mismatch") or 0) > 0 and (introduced.get("nonfinite_mismatch") or 0) > 0:
        return dict(introduced, nonfinite_mismatch=0)
    return introduced


def _culprits(ref_graph: GraphInfo, pairs, measured: Measured, crit: Criterion, variant: str, clamps: list[dict],
              limit: int) -> list[Culprit]:
    ranked = []
    for p in pairs:
        stats = measured.introduced.get(p.tensor)
        if stats is None:
            continue
        m = stats.metrics()
        node = ref_graph.node(p.node)
        received = _received([i for i in node.inputs if i], measured, crit)
        judged = _own_error(m, received)
        ranked.append(Culprit(p.node, p.op_type, p.tensor, p.topo_index, m, received, crit.diverged(judged),
                              explain(p.node, variant, stats, received, clamps, tensor=p.tensor)))
    ranked.sort(key=lambda c: (-crit.badness(_own_error(c.introduced, c.received)), c.topo_index))
    flagged = [c for c in ranked if c.introduces_divergence]
    return flagged[:limit] if flagged else ranked[: min(3, limit)]
