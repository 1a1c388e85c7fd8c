"""ONNX Runtime's engine graph: the optimized model the session runs, mapped to the ONNX nodes it replaced, with
per-node execution provider, precision and latency from ORT's profiler.

Mapping (tensors, not names): ORT keeps the name of every tensor that survives its rewrites (a fused node writes
the output name of the last node it absorbed). A tensor of the optimized graph stands for an ONNX tensor when

1. it has the same name;
2. it is that name with ORT's ``InsertedPrecisionFreeCast_`` prefix (FP16 models on CPU run in FP32);
3. a layout node (``ReorderInput``/``ReorderOutput`` of the NCHWc transformer, ``Memcpy*``, inserted Casts) converts
   it to or from such a tensor (same values, other layout or type);
4. it is the output of an NCHWc kernel named ``<tensor>_nchwc`` (ORT names them after the output they replace),
   checked against the kernel's fused activation and sum input;
5. it is the output of a node that kept the name and op type of an ONNX node (e.g. an Add the NCHWc transformer
   rewired between its own Reshapes).

Layout nodes are ORT's own ``ReorderInput``/``ReorderOutput``/``Memcpy*``, inserted Casts, and shape-only ops
(Reshape, Transpose, ...) that no ONNX node is named after; one whose input and output stand for two different
ONNX tensors computes something and counts as compute.

Optimized nodes linked by tensors with no ONNX counterpart form one group; the group's ONNX nodes are those that
compute its ONNX output tensors from tensors the optimized graph also holds (:meth:`OnnxGraph.region`). A layout
node maps to the ONNX node whose tensor it converts. ONNX nodes no kernel runs are either folded (constant
folding: their outputs became initializers) or reported as unmapped with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict

import onnx

from ..core.scratch import temporary_dir
from ..errors import EngineRunError, EngineUnavailableError
from .onnx_side import OnnxGraph
from .partition import uncovered
from .result import EngineGraph, EngineNode, stats

log = logging.getLogger(__name__)

LAYOUT_OPS = {"ReorderInput", "ReorderOutput", "MemcpyToHost", "MemcpyFromHost"}
#: shape-only ops: layout nodes when ORT inserted them (no ONNX node of that name)
_SHAPE_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_PREFIXES = ("InsertedPrecisionFreeCast_",)
#: ORT's profiler type names -> short precision names
PRECISIONS = {"float": "f32", "float16": "f16", "bfloat16": "bf16", "double": "f64", "int8": "i8", "uint8": "u8",
              "int32": "i32", "int64": "i64", "bool": "boolean", "float8e4m3fn": "f8e4m3", "int4": "i4"}
_ELEM = {onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16", onnx.TensorProto.BFLOAT16: "bf16",
         onnx.TensorProto.DOUBLE: "f64", onnx.TensorProto.INT8: "i8", onnx.TensorProto.UINT8: "u8",
         onnx.TensorProto.INT32: "i32", onnx.TensorProto.INT64: "i64", onnx.TensorProto.BOOL: "boolean"}


def ort_engine_graph(model: onnx.ModelProto, feeds: list[dict], *, runs: int = 10, warmup: int = 1,
                     options: dict | None = None, outputs: list[str] | None = None,
                     onnx_graph: OnnxGraph | None = None) -> EngineGraph:
    """Build an ORT session on ``model`` (``options``: OrtEngine's: provider, graph_optimization, threads), save its
    optimized graph, run ``warmup`` + ``runs`` times on ``feeds`` (cycled) with the profiler on, and map it all.
    ``outputs``: extra tensors marked as graph outputs (to check that marking them leaves the fusions alone)."""
    from ..engines.ort import PROVIDERS, OrtEngine
    from ..engines.serialize import model_payload

    opts = dict(options or {})
    if opts.get("provider") == "trt":  # no optimized model once the TensorRT EP compiled: its dumps and the trace
        from .ort_trt_graph import ort_trt_engine_graph

        return ort_trt_engine_graph(model, feeds, runs=runs, warmup=warmup, options=opts, outputs=outputs,
                                    onnx_graph=onnx_graph)
    engine = OrtEngine(provider=opts.get("provider"), threads=opts.get("threads"),
                       graph_optimization=opts.get("graph_optimization", "all"))
    og = onnx_graph or OnnxGraph.build(model)
    marked = list(dict.fromkeys([o.name for o in model.graph.output] + list(outputs or [])))
    with temporary_dir("workbench-engine-graph-") as tmp:
        optimized, events, walls, providers = _run(engine, model_payload(model, marked if outputs else None),
                                                   feeds, tmp, runs, warmup)
    graph = map_optimized(og, optimized)
    profile = _profile(events, warmup, {n.name for n in optimized.graph.node}) if runs else None
    _apply_profile(graph, profile, optimized)
    if not runs:  # no profiler: the declared type of what each node writes
        from ..core.shapes import infer_shapes_lenient, value_types

        types = value_types(infer_shapes_lenient(model))
        for node in graph["nodes"]:
            first = next((t for t in node.outputs if t in types), None)
            if node.precision is None and first is not None:
                node.precision = _ELEM.get(types[first].tensor_type.elem_type)
    summary = summarize_profile(profile) if profile else {"end": stats([]), "share": None, "accounted": None,
                                                           "overhead": {}}
    end = summary["end"]
    profiled_ms, plain_ms = stats(walls["profiled"])["median"], stats(walls["plain"])["median"]
    if profiled_ms is not None and plain_ms is not None:
        summary["overhead"]["profiler_ms"] = profiled_ms - plain_ms
    import onnxruntime as ort

    return EngineGraph(
        engine=engine.name, nodes=graph["nodes"], end_to_end_ms=end["median"], end_to_end_p90_ms=end["p90"],
        end_to_end_mean_ms=end["mean"], latency_share=summary["share"],
        accounted_share=summary["accounted"], overhead=summary["overhead"],
        end_to_end_source="ORT profiler: model_run events of the profiled runs" if runs else "",
        runs=runs, unmapped=graph["unmapped"], folded=graph["folded"],
        details={"onnxruntime": ort.__version__, "graph_optimization": engine.graph_optimization,
                 "requested_provider": PROVIDERS[engine.provider], "session_providers": providers,
                 "wall_ms": profiled_ms, "unprofiled_wall_ms": plain_ms, "optimized_nodes": len(optimized.graph.node),
                 "onnx_compute_nodes": len(og.nodes), "warmup": warmup},
    )


def _run(engine, payload, feeds: list[dict], tmp: str, runs: int, warmup: int):
    """(optimized model without weights, profiler events, wall ms per profiled run, session providers)."""
    import onnxruntime as ort

    from ..engines.ort import _unavailable

    problem = _unavailable(engine.provider)
    if problem:
        payload.close()
        raise EngineUnavailableError(f"{engine.name}: {problem[0]}", problem[1])
    options = engine._session_options(0)
    path = os.path.join(tmp, "optimized.onnx")
    options.optimized_model_filepath = path
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.bin")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "64")
    if runs:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
    try:
        session = ort.InferenceSession(payload.source, options, providers=engine._providers())
    except Exception as e:
        from ..engines.ort import _error

        raise _error("onnxruntime could not create a session for the engine graph", e,
                     "check that this onnxruntime runs the model (workbench inspect MODEL)") from e
    finally:
        payload.close()
    providers = session.get_providers()
    engine._check_fallback(providers)
    walls = []
    try:
        for i in range(warmup + runs if runs else 0):
            feed = feeds[i % len(feeds)]
            t0 = time.perf_counter()
            session.run(None, feed)
            if i >= warmup:
                walls.append((time.perf_counter() - t0) * 1e3)
    except Exception as e:
        from ..engines.ort import _error

        raise _error("onnxruntime failed while running the model", e,
                     "check the feeds' names, shapes and dtypes (--input-shapes for dynamic inputs)") from e
    events = read_trace(session.end_profiling()) if runs else []
    if not os.path.exists(path):
        raise EngineRunError("onnxruntime did not write its optimized model",
                             "execution providers that compile subgraphs (TensorRT EP) cannot save one")
    plain = []  # the same session with its profiler ended runs as an unprofiled one: what profiling cost per run
    try:
        for i in range(runs):
            feed = feeds[i % len(feeds)]
            t0 = time.perf_counter()
            session.run(None, feed)
            plain.append((time.perf_counter() - t0) * 1e3)
    except Exception as e:  # noqa: BLE001 - it ran profiled just before: the baseline is only missing
        log.info("unprofiled runs failed: %s", e)
        plain = []
    return onnx.load(path, load_external_data=False), events, {"profiled": walls, "plain": plain}, providers


# --- mapping ---------------------------------------------------------------------------------------------------
def _layout_op(og: OnnxGraph, node: onnx.NodeProto) -> bool:
    """A node ORT inserted to move a tensor between layouts, devices or types (values unchanged)."""
    if node.op_type in LAYOUT_OPS or (node.op_type == "Cast" and node.name.startswith("Inserted")):
        return True
    return node.op_type in _SHAPE_OPS and node.name not in og.op_types


def _converts(node: onnx.NodeProto, alias: dict[str, str], inits: set[str]) -> bool:
    """Its data input and its output stand for two different ONNX tensors (it computes something)."""
    data = [i for i in node.input if i and i not in inits][:1]
    return bool(data and node.output and data[0] in alias and node.output[0] in alias
                and alias[data[0]] != alias[node.output[0]])


def _strip(name: str) -> str:
    for p in _PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def constants(g: onnx.GraphProto) -> set[str]:
    """Initializers of the optimized graph and what nodes compute from them alone (Casts ORT inserted)."""
    found = {t.name for t in g.initializer}
    for node in g.node:  # saved in topological order
        data = [i for i in node.input if i]
        if data and all(i in found for i in data):
            found.update(o for o in node.output if o)
    return found


def aliases(og: OnnxGraph, optimized: onnx.ModelProto) -> dict[str, str]:
    """Optimized-graph tensor -> the ONNX tensor it holds (rules 1-5 of the module docstring)."""
    g = optimized.graph
    inits = constants(g)
    names = set(og.producer) | set(og.graph_inputs)
    alias: dict[str, str] = {}
    every = {i.name for i in g.input} | {o.name for o in g.output}
    every |= {t for n in g.node for t in list(n.input) + list(n.output) if t}
    for t in every - inits:
        if t in names:
            alias[t] = t
        elif _strip(t) in names:
            alias[t] = _strip(t)
    folded = inits & set(og.producer)
    changed = True
    while changed:
        changed = False
        for node in g.node:
            data = [i for i in node.input if i and i not in inits]
            if _layout_op(og, node) and data and len(node.output) == 1:
                src, dst = data[0], node.output[0]
                if src in alias and dst not in alias:
                    alias[dst], changed = alias[src], True
                elif dst in alias and src not in alias:
                    alias[src], changed = alias[dst], True
            elif len(node.output) == 1 and node.output[0] not in alias and all(i in alias for i in data):
                reads = {alias[i] for i in data}
                for tensor in _hints(og, node):
                    if _computes(og, tensor, reads, folded | set(alias.values())):
                        alias[node.output[0]], changed = tensor, True
                        break
    return alias


def _hints(og: OnnxGraph, node: onnx.NodeProto) -> list[str]:
    """ONNX tensors a node's name suggests it writes: ``<tensor>_nchwc`` (NCHWc kernels, after their fused sum and
    activation), ``<node>/<Name>Fusion/`` and a kept node name (that node's output)."""
    name = _strip(node.name)
    found = []
    if name.endswith("_nchwc") and name[:-6] in og.producer:
        found.append(_after_fusions(og, node, name[:-6]))
    base = name.split("/", 1)[0] if name.endswith("Fusion/") else name
    if base in og.outputs and len(og.outputs[base]) == 1:
        found.append(og.outputs[base][0])
    return [t for t in found if t]


def _after_fusions(og: OnnxGraph, node: onnx.NodeProto, tensor: str) -> str | None:
    """The tensor an NCHWc Conv named after ``tensor`` writes once its fused sum (4th input) and activation ran."""
    def next_op(t: str | None, op: str) -> str | None:
        users = og.consumers.get(t, []) if t else []
        return og.outputs[users[0]][0] if len(users) == 1 and og.op_types[users[0]] == op else None

    if node.op_type == "Conv" and len(node.input) > 3 and node.input[3]:
        tensor = next_op(tensor, "Add")
    act = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "activation"), None)
    if act is not None and tensor is not None:
        act = act.decode() if isinstance(act, bytes) else str(act)
        if og.op_types.get(og.producer.get(tensor, ""), "") != act:
            tensor = next_op(tensor, act)
    return tensor


def _computes(og: OnnxGraph, tensor: str, reads: set[str], held: set[str]) -> bool:
    """The ONNX nodes that compute ``tensor`` from tensors the optimized graph holds read exactly ``reads``: a
    name hint is taken only when the data flow agrees with it."""
    if tensor in held or tensor not in og.producer:
        return False
    return set(og.boundary(set(og.region([tensor], held)))[0]) == reads


def map_optimized(og: OnnxGraph, optimized: onnx.ModelProto) -> dict:
    """Engine nodes (unprofiled) for every node of ``optimized``, plus unmapped and folded ONNX nodes."""
    g = optimized.graph
    inits = constants(g)
    alias = aliases(og, optimized)
    held = set(alias.values()) | (inits & set(og.producer))  # tensors the optimized graph holds (or folded)
    parent = list(range(len(g.node)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    layout = [_layout_op(og, n) and not _converts(n, alias, inits) for n in g.node]
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    for k, node in enumerate(g.node):
        for t in node.input:
            if t and t not in inits and t not in alias and t in producer:
                parent[find(k)] = find(producer[t])
    members: dict[int, list[int]] = defaultdict(list)
    for k in range(len(g.node)):
        members[find(k)].append(k)
    region: dict[int, list[str]] = {}
    for root, ks in members.items():
        compute = [k for k in ks if not layout[k]]
        outs = [alias[o] for k in compute for o in g.node[k].output if o in alias]
        region[root] = og.region(outs, held - set(outs)) if compute else []
    nodes = []
    for k, node in enumerate(g.node):
        root = find(k)
        moves = layout[k] or not region[root]
        outs = list(dict.fromkeys(alias[o] for o in node.output if o in alias))
        ins = list(dict.fromkeys(alias[i] for i in node.input if i in alias and alias[i] not in outs))
        nodes.append(EngineNode(name=node.name or f"{node.op_type}_{k}", kind=_kind(node), onnx_nodes=region[root],
                                role="layout" if moves else "compute", inputs=ins,
                                outputs=[] if moves else [t for t in outs if t in og.producer],
                                mapped_by="tensors", order=k))
    _map_layout(og, g, nodes, alias)
    folded, unmapped = uncovered(og, {o for n in nodes for o in n.onnx_nodes}, inits)
    return {"nodes": nodes, "folded": folded, "unmapped": unmapped}


def _map_layout(og: OnnxGraph, g: onnx.GraphProto, nodes: list[EngineNode], alias: dict[str, str]) -> None:
    """A layout node runs the ONNX node whose tensor it converts; a converted graph input or constant belongs to
    the ONNX nodes that read it, among those of the compute nodes the converted tensor reaches."""
    readers: dict[str, list[int]] = defaultdict(list)
    for k, node in enumerate(g.node):
        for t in node.input:
            readers[t].append(k)
    for k, node in enumerate(g.node):
        n = nodes[k]
        if n.role != "layout" or n.onnx_nodes:
            continue
        tensors = [alias[t] for t in list(node.output) + list(node.input) if t in alias]
        made = [og.producer[t] for t in tensors if t in og.producer]
        if made:
            n.onnx_nodes = og.sort(made[:1])
            continue
        source = next((t for t in tensors), None) or next((_strip(t) for t in node.input if _strip(t) in og.constants),
                                                          "")
        reached, seen, stack = set(), {k}, [k]
        while stack:  # follow the converted tensor through further layout nodes to the compute nodes
            for out in g.node[stack.pop()].output:
                for r in readers.get(out, []):
                    if r in seen:
                        continue
                    seen.add(r)
                    if nodes[r].role == "layout":
                        stack.append(r)
                    else:
                        reached.update(nodes[r].onnx_nodes)
        users = reached & set(og.consumers.get(source, []))
        n.onnx_nodes = og.sort(users or reached)


def _kind(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


# --- profile ---------------------------------------------------------------------------------------------------
def read_trace(path: str) -> list[dict]:
    """ORT's profiler trace, each event cut to what the mapping reads (cat, name, ts, dur, provider, output type).
    ORT writes one event per line: reading line by line keeps memory at the kept fields, not the whole trace
    (a PP-OCR recognizer's 30 runs write ~20 MB of JSON); any other layout is read whole."""
    def cut(e: dict) -> dict:
        args = e.get("args") or {}
        shapes = args.get("output_type_shape") or []
        first = next(iter(shapes[0]), None) if shapes and isinstance(shapes[0], dict) else None
        return {"cat": e.get("cat"), "name": e.get("name"), "ts": e.get("ts", 0), "dur": e.get("dur", 0),
                "args": {"provider": args.get("provider"), "output_type": first}}

    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text = line.strip().rstrip(",")
            if text in ("", "[", "]"):
                continue
            try:
                events.append(cut(json.loads(text)))
            except ValueError:  # not one event per line: read it whole
                fh.seek(0)
                return [cut(e) for e in json.load(fh) if isinstance(e, dict)]
    return events


def _profile(events: list[dict], warmup: int, top_level: set[str] | None = None) -> dict:
    """Per-run kernel times from ORT's profiler trace: {"model_run": [ms], "runs": [{name: [kernel ms]}],
    "dispatch": [{name: [ms]}], "between": [ms], "outside": [ms], "args": {name: last args}}; the first ``warmup``
    runs are dropped. A node's dispatch is the time from the previous kernel's end to its own start (the executor's
    allocation, scheduling and fences, and the profiler's bookkeeping); ``between`` sums them per run, ``outside``
    is the rest of the run (before the first kernel, after the last)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")[warmup:]
    kernels: list[list[tuple[int, int, str]]] = [[] for _ in runs]
    args: dict[str, dict] = {}
    starts = [r[0] for r in runs]
    import bisect

    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i < 0 or e["ts"] > runs[i][1]:
            continue
        name = e["name"][: -len("_kernel_time")]
        kernels[i].append((e["ts"], e["ts"] + e["dur"], name))
        args[name] = e.get("args", {})
    per_run: list[dict[str, list[float]]] = [defaultdict(list) for _ in runs]
    dispatch: list[dict[str, list[float]]] = [defaultdict(list) for _ in runs]
    between, outside = [], []
    for i, ((start, end), run) in enumerate(zip(runs, kernels)):
        run.sort()
        if top_level is not None:  # a Loop/If/Scan body's kernels run inside their node's own time: counted once
            run[:] = _outer(run, top_level)
        reached, gaps = None, 0.0  # reached: the latest kernel end so far (kernels may overlap with threads)
        for ts, te, name in run:
            per_run[i][name].append((te - ts) / 1e3)
            gap = max(0, ts - reached) / 1e3 if reached is not None else 0.0
            dispatch[i][name].append(gap)
            gaps += gap
            reached = te if reached is None else max(reached, te)
        between.append(gaps)
        outside.append(max(0, run[0][0] - start + end - reached) / 1e3 if run else (end - start) / 1e3)
    return {"model_run": [(b - a) / 1e3 for a, b in runs], "runs": per_run, "dispatch": dispatch,
            "between": between, "outside": outside, "args": args}


def _outer(run: list[tuple[int, int, str]], top_level: set[str]) -> list[tuple[int, int, str]]:
    """``run``'s kernels (sorted by start) less those of subgraph nodes: not a top-level node's name, and inside
    the time of a kernel before them."""
    kept: list[tuple[int, int, str]] = []
    for ts, te, name in run:
        if name not in top_level and any(a <= ts and te <= b for a, b, _ in kept):
            continue
        kept.append((ts, te, name))
    return kept


def summarize_profile(profile: dict) -> dict:
    """End to end ({median, p90, mean}), kernel share, share with dispatch, and the overhead of a :func:`_profile`
    result: medians over its runs."""
    shares = [sum(map(sum, run.values())) / total for run, total in zip(profile["runs"], profile["model_run"])
              if total > 0]
    accounted = [(sum(map(sum, run.values())) + gaps) / total for run, gaps, total
                 in zip(profile["runs"], profile["between"], profile["model_run"]) if total > 0]
    return {"end": stats(profile["model_run"]), "share": stats(shares)["median"],
            "accounted": stats(accounted)["median"],
            "overhead": {"between_nodes_ms": stats(profile["between"])["median"],
                         "outside_nodes_ms": stats(profile["outside"])["median"],
                         # means too: with the nodes' mean latencies they add up to the mean run
                         "between_nodes_mean_ms": stats(profile["between"])["mean"],
                         "outside_nodes_mean_ms": stats(profile["outside"])["mean"],
                         "source": "ORT profiler: the time between consecutive kernels of a run (allocation, "
                                   "scheduling, fences, the profiler's own bookkeeping), and before the first and "
                                   "after the last"}}


def _apply_profile(graph: dict, profile: dict | None, optimized: onnx.ModelProto) -> None:
    """Latency (median and p90 over runs), provider and precision of each node; nodes sharing a name (rare) take
    that name's events in execution order."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(optimized.graph.value_info) +
             list(optimized.graph.output)}
    by_name: dict[str, list[EngineNode]] = defaultdict(list)
    for k, n in enumerate(graph["nodes"]):
        by_name[n.name].append(n)
        first = next((o for o in optimized.graph.node[k].output if o), None)
        n.precision = _ELEM.get(types.get(first, 0))
    if not profile:
        return
    for name, nodes in by_name.items():
        series = [[] for _ in nodes]
        for run in profile["runs"]:
            times = run.get(name, [])
            for j, node_times in enumerate(_split(times, len(nodes))):
                series[j].append(sum(node_times))
        gaps = [[] for _ in nodes]
        for run in profile["dispatch"]:
            for j, node_gaps in enumerate(_split(run.get(name, []), len(nodes))):
                gaps[j].append(sum(node_gaps))
        for node, values, waits in zip(nodes, series, gaps):
            if any(v > 0 for v in values):
                st = stats(values)
                node.latency_ms, node.latency_p90_ms, node.latency_mean_ms = st["median"], st["p90"], st["mean"]
                node.dispatch_ms = stats(waits)["median"]
        args = profile["args"].get(name)
        for node in nodes:
            if args:
                node.provider = args.get("provider")
                node.precision = PRECISIONS.get(args.get("output_type"), node.precision)


def _split(times: list[float], k: int) -> list[list[float]]:
    if k == 1:
        return [times]
    return [times[j::k] for j in range(k)]
