"""``engine_graph()``: what an engine made of a model (fusions, providers, precisions) and what each node costs."""

from __future__ import annotations

import logging
from typing import Any

import onnx

from ..core.arguments import checked
from ..engines.spec import EngineSpec
from ..errors import SpecError, WorkbenchError
from .onnx_side import OnnxGraph
from .result import EngineGraph

log = logging.getLogger(__name__)

#: engine name -> (builder module, ORT provider)
BUILDERS = {"ort": ("ort", "cpu"), "ort-cuda": ("ort", "cuda"), "ort-trt": ("ort", "trt"),
            "openvino": ("openvino", None), "trt": ("tensorrt", None)}
MAX_RUNS = 100_000


@checked()
def engine_graph(model: Any, engine: str | EngineSpec = "ort", *, feeds: Any = None,
                 input_shapes: dict[str, list[int]] | None = None, runs: int = 10, warmup: int = 1, seed: int = 0,
                 optimization: str | None = None, threads: int | None = None, options: dict | None = None,
                 outputs: list[str] | None = None) -> EngineGraph:
    """The engine graph of ``model`` on ``engine`` (``ENGINE[:VARIANT]``: ``ort``, ``ort:fp16``, ``openvino``,
    ``trt``...): every executed node with the ONNX nodes it computes, its provider, precision and latency (median,
    p90 and mean over ``runs`` profiled runs after ``warmup``; ``runs=0``: structure only).

    ``feeds``: a dict, a list of dicts or a .npz/folder/Polygraphy JSON (default: seeded random feeds shaped by
    ``input_shapes``). ``optimization``: ONNX Runtime's graph optimization level (all, extended, basic, disable;
    default all). ``threads``: intra-op threads (ORT) or inference threads (OpenVINO). ``options``: the engine's
    own options (as in ``compare(engine_options=...)``). ``outputs``: extra tensors marked as graph outputs.
    """
    from ..core.feeds import cast_feeds
    from ..model.load import LoadedModel, is_torch_module, load_model
    from ..model.validate import check_structure

    spec = EngineSpec.parse(engine)
    if spec.engine not in BUILDERS:
        what = {"torch": "it runs the nn.Module itself", "torch-cuda": "it runs the nn.Module itself",
                "ref": "it runs the ONNX graph node by node, as written"}.get(spec.engine, "it builds no engine graph "
                                                                            "the workbench can read")
        raise SpecError(f"the {spec.engine!r} engine has no engine graph ({what})",
                        f"inspect one of {', '.join(BUILDERS)}")
    for name, value, lo in (("runs", runs, 0), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= MAX_RUNS:
            from ..core.arguments import BadArgumentValue

            raise BadArgumentValue(f"engine_graph(): {name} must be a whole number from {lo} to {MAX_RUNS}, "
                                   f"not {value!r}")
    if is_torch_module(model):
        raise WorkbenchError("engine_graph needs an ONNX model", "export the module first (workbench.load_model)")
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    check_structure(loaded.proto)
    proto = loaded.proto
    given = _feeds(proto, feeds, input_shapes, seed)
    if spec.variant != "fp32":
        from ..variants import make_variant

        proto = make_variant(proto, spec.variant, calibration_feeds=given).model
    opts = _options(spec.engine, optimization, threads, options)
    graph = build(spec.engine, proto, cast_feeds(proto, given), runs=runs, warmup=warmup, options=opts,
                  outputs=outputs)
    graph.engine = str(spec)
    graph.model = {"name": loaded.name, "sha256": loaded.fingerprint, "path": str(loaded.path) if loaded.path else None,
                   "variant": spec.variant}
    graph.details["input_shapes"] = {k: list(v.shape) for k, v in given[0].items()}
    _notes(graph)
    return graph


def build(engine: str, model: onnx.ModelProto, feeds: list[dict], *, runs: int = 10, warmup: int = 1,
          options: dict | None = None, outputs: list[str] | None = None,
          onnx_graph: OnnxGraph | None = None) -> EngineGraph:
    """The engine graph of an already prepared model (a variant, feeds cast to its inputs) on ``engine`` (a name of
    :data:`BUILDERS`); ``options`` are the engine's own."""
    kind, provider = BUILDERS[engine]
    og = onnx_graph or OnnxGraph.build(model)
    if kind == "ort":
        from .ort_graph import ort_engine_graph

        return ort_engine_graph(model, feeds, runs=runs, warmup=warmup,
                                options={"provider": provider, **(options or {})}, outputs=outputs, onnx_graph=og)
    if kind == "openvino":
        from .openvino_graph import openvino_engine_graph

        return openvino_engine_graph(model, feeds, runs=runs, warmup=warmup, options=options, outputs=outputs,
                                     onnx_graph=og)
    from .tensorrt_graph import tensorrt_engine_graph

    return tensorrt_engine_graph(model, feeds, runs=runs, warmup=warmup, options=options, outputs=outputs,
                                 onnx_graph=og)


def _feeds(model: onnx.ModelProto, feeds: Any, input_shapes: dict | None, seed: int) -> list[dict]:
    from ..inputs import check_feeds, feeds_from, random_feeds

    if feeds is None:  # within compare's default budget (a quarter of RAM, at most 4G): refused before allocating
        from ..core.budget import default_budget

        return random_feeds(model, seed=seed, shapes=input_shapes, max_bytes=default_budget(),
                            budget_hint="use smaller --input-shapes (input_shapes=): an engine graph runs random "
                                        "feeds of at most a quarter of RAM, 4G at most")
    given = check_feeds(model, feeds_from(feeds))
    if not given:
        raise WorkbenchError("no feeds given", "pass at least one feed, or none for random feeds")
    return given


def _options(engine: str, optimization: str | None, threads: int | None, options: dict | None) -> dict:
    opts = dict(options or {})
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise WorkbenchError(f"threads must be a whole number >= 1, not {threads!r}")
    if BUILDERS[engine][0] == "ort":
        if optimization is not None:
            opts["graph_optimization"] = optimization
        if threads:
            opts["threads"] = threads
    else:
        if optimization is not None:
            raise SpecError(f"optimization levels are ONNX Runtime's; the {engine} engine has none",
                            "drop --optimization, or inspect with --engine ort")
        if threads and engine == "openvino":
            opts["config"] = {**opts.get("config", {}), "INFERENCE_NUM_THREADS": threads}
    return opts


def _notes(graph: EngineGraph) -> None:
    """What a reader should know about the numbers: fallbacks, unmapped nodes, then :func:`timing_notes`."""
    falls = graph.fallbacks()
    if falls:
        graph.notes.append(f"{len(falls)} node(s) fell back from {graph.details.get('requested_provider')} to another "
                           f"provider: {', '.join(sorted({n.provider for n in falls}))} (e.g. {falls[0].name})")
    if graph.unmapped:
        graph.notes.append(f"{len(graph.unmapped)} ONNX node(s) mapped to no executed node (see 'unmapped')")
    graph.notes.extend(timing_notes(graph))


#: the profiler's cost per run, as a share of an unprofiled run, above which a note says so
PROFILER_COST_NOTED = 0.15
#: per-node times adding up to less (more) than this share of a run get a note (the engine's overhead; overlap)
SHARE_NOTED = (0.85, 1.05)


def timing_notes(graph: EngineGraph) -> list[str]:
    """The notes derived from the graph's measured times alone (the profiler's cost, node times against the run):
    which appear depends on the machine's load, and each follows from the numbers the graph holds."""
    notes = []
    plain, cost = graph.details.get("unprofiled_wall_ms"), graph.overhead.get("profiler_ms")
    if plain and cost is not None and cost > PROFILER_COST_NOTED * plain:
        per_node = 1e3 * cost / max(1, len(graph.nodes))
        notes.append(f"the profiler made each run {cost:.3g} ms slower ({(plain + cost) / plain:.2f}x the "
                     f"unprofiled {plain:.3g} ms): each node's time includes about {per_node:.1f} us of its "
                     "cost, which matters for short kernels")
    share = graph.latency_share
    if share is not None and not graph.compute_nodes:  # an Identity-only model: nothing ran, 0% says nothing
        notes.append("the engine executed no compute node (the graph was folded away while building): a run "
                     "is all the engine's own overhead; see 'overhead'")
    elif share is not None and share > SHARE_NOTED[1]:
        notes.append(f"per-node times add up to {share:.0%} of a run: the engine ran nodes concurrently (more "
                     "than one thread), so they overlap")
    elif share is not None and share < SHARE_NOTED[0]:
        with_dispatch = (f"; with the dispatch time before each node (dispatch_ms) they account for "
                         f"{graph.accounted_share:.0%}" if graph.accounted_share else "")
        notes.append(f"per-node times add up to {share:.0%} of a run: the rest is the engine's own overhead "
                     f"between nodes (and the profiler's){with_dispatch}; see 'overhead'")
    return notes
