"""OpenVINO's engine graph: the runtime (executed) model of a compiled model, mapped to ONNX nodes, with each
executed node's runtime precision, kernel and performance counters.

Mapping (names, then topology): every executed node lists the friendly names of the operations it absorbed
(``originalLayersNames``). Before reading the model, each ONNX node is renamed to a private token, so a token in
that list names exactly one ONNX node (OpenVINO's own names, ``Multiply_123``, can never collide with it); a graph
output's tensor name names its producer. OpenVINO's transformations replace some operations by new ones with new
names (a Conv folded with a BatchNormalization's Multiply, an HSwish matched from Add/Clip/Mul/Div), so about half
of the ONNX nodes are not named by any executed node: they join the group of their consumers, or of their
producers when the consumers disagree (:meth:`OnnxGraph.fill`; ``mapped_by`` says ``topology``). An executed node
no name points to takes the first unnamed ONNX nodes between its neighbours (``neighbour``). ``Reorder`` nodes are
layout nodes. ONNX nodes named only by constant (never executed) nodes were folded while compiling.

Latency: the CPU plugin's performance counters hold each node's average over every inference since compiling, not
the last one's time, so each run's node times are recovered from the averages read after every run
(:func:`per_run`) and set against that run's time as OpenVINO measured it (``InferRequest.latency``; the Python
call around it is reported apart, in ``overhead``).
"""

from __future__ import annotations

import logging
import time

import onnx

from ..errors import EngineRunError, EngineUnavailableError
from .onnx_side import OnnxGraph
from .partition import map_runtime
from .result import EngineGraph, stats

log = logging.getLogger(__name__)

TOKEN = "wbnode.{}"
_NOT_COMPUTE = {"Const", "Input", "Output", "Parameter", "Result"}
_LAYOUT = {"Reorder"}
#: layer type -> the ONNX op types its main op comes from (when the engine renamed it, see OnnxGraph.main_op)
MAIN_OPS = {"Convolution": {"Conv"}, "GroupConvolution": {"Conv"}, "Deconvolution": {"ConvTranspose"},
            "FullyConnected": {"MatMul", "Gemm"}, "MatMul": {"MatMul", "Gemm"}, "Interpolate": {"Resize", "Upsample"},
            "Pooling": {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}, "Softmax": {"Softmax"},
            "Concatenation": {"Concat"}}


def openvino_engine_graph(model: onnx.ModelProto, feeds: list[dict], *, runs: int = 10, warmup: int = 1,
                          options: dict | None = None, outputs: list[str] | None = None,
                          onnx_graph: OnnxGraph | None = None) -> EngineGraph:
    """Compile ``model`` (``options``: OpenVinoEngine's device, inference_precision, config) at the feeds' shapes,
    run ``warmup`` + ``runs`` times with performance counters on (one run at least: OpenVINO says which nodes
    executed only after a run; ``runs=0`` reports no latency), and map its runtime model."""
    from ..engines.openvino_engine import OpenVinoEngine

    opts = dict(options or {})
    engine = OpenVinoEngine(device=opts.get("device", "CPU"),
                            inference_precision=opts.get("inference_precision", "f32"), config=opts.get("config"))
    ok, reason = engine.availability()
    if not ok:
        raise EngineUnavailableError(*reason.split(" -- ", 1))
    og = onnx_graph or OnnxGraph.build(model)
    feeds, other = _one_shape(feeds)
    compiled, request, names = _compile(engine, model, og, feeds[0], outputs)
    walls, natives, averages = [], [], []
    taken = _inputs(compiled)  # OpenVINO drops inputs it folded away
    try:
        for i in range(warmup + max(runs, 1)):
            feed = {k: v for k, v in feeds[i % len(feeds)].items() if k in taken}
            t0 = time.perf_counter()
            request.infer(feed)
            walls.append((time.perf_counter() - t0) * 1e3)
            natives.append(_native_ms(request))
            averages.append({p.node_name: (p.real_time.total_seconds() * 1e3, str(p.status).endswith("EXECUTED"))
                             for p in request.profiling_info})
    except Exception as e:
        raise EngineRunError(f"OpenVINO failed while running the model: {' '.join(str(e).split())[:300]}",
                             "check the feeds' names, shapes and dtypes (--input-shapes for dynamic inputs)") from e
    if other:
        log.info("OpenVINO engine graph: %d feed(s) of other shapes left out", other)
    counters, walls, natives = per_run(averages)[warmup:], walls[warmup:], natives[warmup:]
    # the run as OpenVINO timed it (not the Python call around it), where this OpenVINO says
    native = all(v is not None and v > 0 for v in natives) and bool(natives)
    totals = natives if native else walls
    # a node counts as executed when any run (the warm-up included) says so: OpenVINO reports a node NOT_RUN once its
    # running average, in whole microseconds, truncates to 0 (sub-microsecond nodes drop out after a few runs)
    ever = {name for a in averages for name, (_, ran) in a.items() if ran}
    nodes, executed_names, folded_by_engine = _runtime_nodes(compiled, ever, names, og)
    mapped = map_runtime(og, nodes, folded_by_engine, main_ops=MAIN_OPS, layout_kinds=tuple(_LAYOUT))
    raw = {e["name"]: e["raw"] for e in nodes}
    for node in mapped["nodes"]:
        node.provider = engine.device
    if runs:
        for node in mapped["nodes"]:
            key = raw[node.name]
            values = [c[key] for c in counters if key in c] if key in executed_names else []
            if values:
                st = stats(values)
                node.latency_ms, node.latency_p90_ms, node.latency_mean_ms = st["median"], st["p90"], st["mean"]
    end = stats(totals if runs else [])
    shares = [sum(c.values()) / total for c, total in zip(counters, totals) if total > 0]
    outside = [max(0.0, total - sum(c.values())) for c, total in zip(counters, totals)]
    counted = len(executed_names)
    overhead = {"outside_nodes_ms": stats(outside)["median"], "outside_nodes_mean_ms": stats(outside)["mean"],
                "python_call_ms": stats([w - t for w, t in zip(walls, totals)])["median"] if native else None,
                "counter_resolution_ms": counted * 1e-3,
                "source": "OpenVINO's run time less its per-node performance counters (its dispatch between "
                          "nodes, input and output copies); OpenVINO reports no node start times, and counts whole "
                          "microseconds per node: up to counter_resolution_ms of a run hides in that truncation"
                } if runs else {}
    import openvino as ov

    left_out = [f"{other} feed(s) of other input shapes than the first were left out: the engine is compiled at "
                "one shape"] if other else []
    return EngineGraph(
        engine="openvino", notes=left_out, nodes=mapped["nodes"], end_to_end_ms=end["median"],
        end_to_end_p90_ms=end["p90"],
        end_to_end_mean_ms=end["mean"], latency_share=stats(shares)["median"] if runs else None,
        overhead=overhead,
        end_to_end_source=("" if not runs else "OpenVINO's own time of each infer() on the profiled runs "
                           "(InferRequest.latency)" if native else "wall time of InferRequest.infer() on the "
                           "profiled runs"), runs=runs,
        unmapped=mapped["unmapped"], folded=mapped["folded"],
        details={"openvino": ov.get_version(), "device": engine.device,
                 "inference_precision": _type_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
                 "requested_provider": engine.device, "executed_nodes": len(mapped["nodes"]),
                 "onnx_compute_nodes": len(og.nodes), "warmup": warmup,
                 "wall_ms": stats(walls)["median"] if runs else None,
                 "input_shapes": {k: list(v.shape) for k, v in feeds[0].items()}},
    )


def per_run(averages: list[dict[str, tuple[float, bool]]]) -> list[dict[str, float]]:
    """Each inference's node times, from the counters read after each: OpenVINO's CPU plugin reports every node's
    average over all inferences since compiling (its PerfCount), so the k-th inference took k * avg_k - (k - 1) *
    avg_(k-1) (microsecond resolution: up to k us of rounding per node)."""
    out, before, seen = [], {}, set()
    for k, now in enumerate(averages, 1):
        seen |= {name for name, (_, ran) in now.items() if ran}  # a sub-microsecond node's average truncates to 0
        out.append({name: max(0.0, k * avg - (k - 1) * before.get(name, 0.0)) for name, (avg, _) in now.items()
                    if name in seen})  # and it is reported NOT_RUN from then on: it still ran
        before = {name: avg for name, (avg, _) in now.items()}
    return out


def _one_shape(feeds: list[dict]) -> tuple[list[dict], int]:
    """The feeds with the first feed's input shapes (the engine is compiled at one shape), and how many others."""
    first = {k: tuple(v.shape) for k, v in feeds[0].items()}
    kept = [f for f in feeds if {k: tuple(v.shape) for k, v in f.items()} == first]
    return kept, len(feeds) - len(kept)


def _native_ms(request) -> float | None:
    """OpenVINO's own time of the last infer() in ms (``InferRequest.latency``), None where it has none."""
    try:
        value = float(request.latency)
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value == value else None


def _inputs(compiled) -> set[str]:
    return {name for port in compiled.inputs for name in port.get_names()}


def _compile(engine, model: onnx.ModelProto, og: OnnxGraph, feed: dict, outputs: list[str] | None):
    """Compile ``model`` serialized with its nodes renamed to tokens (restored right after, under the edit lock),
    each token also set as the operation's ``originalLayersNames``; (compiled, request, token -> ONNX node)."""
    import openvino as ov

    from ..engines.outputs import edit_lock
    from ..engines.serialize import model_payload

    names: dict[str, str] = {}
    marked = list(dict.fromkeys([o.name for o in model.graph.output] + list(outputs or []))) if outputs else None
    with edit_lock(model):
        saved = [n.name for n in model.graph.node]
        try:
            for i, node in enumerate(model.graph.node):
                if node.op_type != "Constant":
                    names[TOKEN.format(i)] = node.name or f"{node.op_type}_{i}"
                    node.name = TOKEN.format(i)
            payload = model_payload(model, marked)
        finally:
            for node, name in zip(model.graph.node, saved):
                node.name = name
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": engine.inference_precision, **engine.config, "PERF_COUNT": True}
    try:
        ov_model = core.read_model(payload.source) if payload.is_file else core.read_model(payload.source, b"")
        for op in ov_model.get_ordered_ops():  # carried by copy_runtime_info through many rewrites
            if op.get_friendly_name().startswith(TOKEN.format("")):
                op.get_rt_info()["originalLayersNames"] = op.get_friendly_name()
        shapes = {p.get_any_name(): list(feed[p.get_any_name()].shape) for p in ov_model.inputs
                  if p.get_any_name() in feed}
        if shapes:
            ov_model.reshape(shapes)
        compiled = core.compile_model(ov_model, engine.device, config)
    except Exception as e:
        raise EngineRunError(f"OpenVINO could not read or compile the model: {' '.join(str(e).split())[:300]}",
                             "check that every op is supported by OpenVINO's ONNX frontend") from e
    finally:
        payload.close()
    return compiled, compiled.create_infer_request(), names


def _info(op, key: str) -> str:
    info = op.get_rt_info()
    return info[key].astype(str) if key in info else ""


def _runtime_nodes(compiled, ran: set[str], names: dict[str, str], og: OnnxGraph):
    """Executed runtime nodes (``ran``: the names OpenVINO reported EXECUTED) as dicts (name, kind, kernel,
    precision, order, origin: ONNX nodes named, preds: names of the executed nodes it reads, through non-executed
    ones), their names, and ONNX nodes that only non-executed nodes name (folded while compiling)."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    nodes, by_name, folded, taken = [], {}, set(), set()
    for op in ops:
        name, kind = op.get_friendly_name(), _info(op, "layerType")
        origin = []
        for entry in filter(None, _info(op, "originalLayersNames").split(",")):
            node = names.get(entry) or names.get(entry.split("/", 1)[0]) or og.producer.get(entry)
            if node is not None:
                origin.append(node)
        preds = [i.get_source_output().get_node().get_friendly_name() for i in op.inputs()]
        if kind in _NOT_COMPUTE or name not in ran:
            folded.update(origin)
            by_name[name] = {"preds": preds, "executed": False}
            continue
        shown = names.get(name, name)
        shown = shown if shown not in taken else f"{shown}#{len(nodes)}"
        taken.add(shown)
        entry = {"name": shown, "raw": name, "kind": kind, "kernel": _info(op, "primitiveType") or None,
                 "precision": _info(op, "runtimePrecision") or None, "order": len(nodes), "origin": origin,
                 "preds": preds, "executed": True}
        nodes.append(entry)
        by_name[name] = entry
    for entry in nodes:  # executed predecessors, looking through constants and non-executed (in-place) nodes
        found, stack, seen = [], list(entry["preds"]), set()
        while stack:
            p = stack.pop()
            if p in seen or p not in by_name:
                continue
            seen.add(p)
            if by_name[p]["executed"]:
                found.append(by_name[p]["name"])
            else:
                stack += by_name[p]["preds"]
        entry["preds"] = found
    folded -= {o for e in nodes for o in e["origin"]}
    return nodes, ran, folded


def _type_name(value) -> str:
    """OpenVINO's element type as it names it (``f32``), not the Python repr (``<Type: 'float32'>``)."""
    name = getattr(value, "get_type_name", None)
    return name() if callable(name) else str(value)
