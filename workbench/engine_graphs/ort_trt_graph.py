"""ONNX Runtime with the TensorRT execution provider (``ort-trt``): the engine graph from what ORT writes when the
TensorRT EP compiled subgraphs, without the optimized model (ORT cannot save one once an EP compiled nodes).

Records read (ORT's own formats; recorded examples and how they were made: ``tests/data/ort_trt/README.md``):

* **the profiler trace** (``SessionOptions.enable_profiling``; the file ``session.end_profiling()`` names): a JSON
  list of Chrome-trace events, one per line. A run is a ``{"cat": "Session", "name": "model_run"}`` event; each
  executed node writes a ``{"cat": "Node", "name": "<node name>_kernel_time", "ts", "dur"}`` event (microseconds)
  whose ``args`` hold ``op_name`` (the node's op type), ``provider`` (``TensorrtExecutionProvider``,
  ``CUDAExecutionProvider``, ``CPUExecutionProvider``) and ``output_type_shape`` (``_fence_before``/``_fence_after``
  events are skipped). ORT's TensorRT perf tool reads it the same way
  (microsoft/onnxruntime: onnxruntime/python/tools/tensorrt/perf/perf_utils.py, ``parse_single_file``).
* **a TensorRT EP fused node**: ORT's partitioner names the node it fuses an EP's subgraph into
  ``<provider type>_<MetaDef name>_<unique id>`` and gives it the MetaDef name as op type
  (onnxruntime/core/framework/graph_partitioner.cc, ``PlaceNode``); the TensorRT EP names its MetaDef
  ``TRTKernel_<graph|subgraph>_<graph name>_<model hash>_<subgraph index>``
  (onnxruntime/core/providers/tensorrt/tensorrt_execution_provider.cc, ``GetSubGraph``), so a fused node's events
  read ``TensorrtExecutionProvider_TRTKernel_graph_main_graph_<hash>_0_0_kernel_time`` with ``op_name``
  ``TRTKernel_graph_main_graph_<hash>_0``. The EP also registers its own ``MemcpyFromHost``/``MemcpyToHost``
  kernels: those are copies (layout nodes), not subgraphs.
* **the dumped subgraphs**: TensorRT EP provider option ``trt_dump_subgraphs`` (``ORT_TENSORRT_DUMP_SUBGRAPHS=1``
  where the EP reads environment variables) makes the EP write, while it compiles each fused node, the ONNX model
  it hands to TensorRT's parser to ``<fused node name>.onnx`` by a *relative* path, i.e. into the process's current
  working directory (tensorrt_execution_provider.cc: ``std::fstream dump(fused_node.Name() + ".onnx", ...)``; ORT's
  perf tool ``onnxruntime/python/tools/tensorrt/perf/benchmark.py`` chdirs into a temporary folder and reads the
  ``*.onnx`` there back, ``fill_trt_subgraphs``). The model is the GraphViewer of the subgraph's nodes
  (``GraphViewer::ToProto``): the original nodes with their names, inputs and outputs (tensor names kept), the
  subgraph's boundary tensors as graph inputs/outputs. ``GetSupportedList`` may also dump the candidate graph it
  parses as ``TensorrtExecutionProvider_TRT_Subgraph.onnx``: not a fused node, skipped.

Mapping: a TensorRT EP fused node runs the ONNX nodes of its dumped subgraph, by node name; a dumped node whose name
the model lacks (an unnamed node) by the ONNX node that writes one of its output tensors; a dump that names nothing
of the model, by the ONNX nodes that compute its outputs from its inputs (``tensors``). CUDA and CPU nodes are the
ONNX nodes they are named after (ORT's ``InsertedPrecisionFreeCast_`` prefix and ``<node>/<Name>Fusion/`` names
as :mod:`workbench.engine_graphs.ort_graph` reads them); ``Memcpy*`` nodes are layout nodes. ONNX nodes no record
names (ORT's level-1 rewrites, level-2 fusions on CUDA/CPU) are placed by topology
(:func:`workbench.engine_graphs.partition.map_runtime`), with the executed nodes chained in the order the first
profiled run ran them (the trace has no edges). Latency, dispatch, provider and precision per node come from the
kernel_time events (:func:`workbench.engine_graphs.ort_graph._profile` / ``_apply_profile``). A fused node's
precision is the type of the tensor it writes: TensorRT picks its layers' precisions inside
(``trt_fp16_enable``/``trt_int8_enable``).

Alternatives looked at: the EP context model (``ep.context_enable``) replaces each partition with an ``EPContext``
node holding the serialized engine and its ``partition_name``, but not the original nodes; the EP's verbose log
prints the MetaDef names and node counts, not the nodes. The dumped subgraphs name the nodes, so they are used.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx

from .._files import read_capped
from ..core.scratch import temporary_dir
from ..errors import EngineRunError, EngineUnavailableError, WorkbenchError
from .onnx_side import OnnxGraph
from .ort_graph import _ELEM, LAYOUT_OPS, _apply_profile, _hints, _profile, _strip, summarize_profile
from .partition import map_runtime
from .result import EngineGraph, stats

log = logging.getLogger(__name__)

TRT_EP = "TensorrtExecutionProvider"
#: what TensorRT EP's GetSupportedList dumps (the candidate graph it parses, not a fused node)
CANDIDATE_DUMP = "TensorrtExecutionProvider_TRT_Subgraph"
_TRACE_HINT = ("pass the JSON file onnxruntime wrote with SessionOptions.enable_profiling = True "
               "(the path session.end_profiling() returns), unedited")
_DUMP_HINT = ("pass the <fused node>.onnx files the TensorRT EP wrote into its working directory with "
              "trt_dump_subgraphs=True, from the same session as the trace")


# --- records -----------------------------------------------------------------------------------------------------
def from_ort_trt_records(onnx_model: Any, profile_events: Any, subgraphs: Any, *, warmup: int = 0,
                         onnx_graph: OnnxGraph | None = None, details: dict | None = None) -> EngineGraph:
    """The ``ort-trt`` engine graph of ``onnx_model`` (a ModelProto or a path) from ORT's profiler trace
    (``profile_events``: the events as ORT writes them, or the trace file's path) and the TensorRT EP's dumped
    subgraphs (``subgraphs``: fused node name -> ModelProto, or the folder they were dumped into). The first
    ``warmup`` runs of the trace are dropped. ``details``: extra entries for the graph's details."""
    model = _model(onnx_model)
    og = onnx_graph or OnnxGraph.build(model)
    events = normalize_events(read_events(profile_events) if isinstance(profile_events, (str, Path))
                              else profile_events)
    subs = load_subgraphs(subgraphs) if isinstance(subgraphs, (str, Path)) else _check_subgraphs(subgraphs)
    profile = _profile(events, warmup)
    if not profile["model_run"]:
        raise WorkbenchError(f"the ONNX Runtime trace has no model_run event after the {warmup} warm-up run(s) "
                             "(no profiled run)", _TRACE_HINT + ", with at least one session.run after warm-up")
    executed = _executed(events, warmup)
    if not executed:
        raise WorkbenchError("the ONNX Runtime trace has no kernel_time events inside its runs (no executed node)",
                             _TRACE_HINT)
    entries, used, notes = [], set(), []
    claimed: dict[str, str] = {}  # ONNX node -> the dumped subgraph that runs it
    last, last_compute = None, None  # the chain: a node follows the one run before it (a copy is skipped)
    for k, (name, args) in enumerate(executed):
        provider, op = args.get("provider"), args.get("op_name") or ""
        if not provider:
            raise WorkbenchError(f"the kernel_time event of node {_short(name)} has no provider in its args",
                                 _TRACE_HINT)
        layout = op in LAYOUT_OPS or (not op and name.startswith("Memcpy"))
        before = last if layout else last_compute
        entry = {"name": name, "kind": op or "?", "origin": [], "preds": [before] if before else [], "order": k,
                 "provider": provider}
        last, last_compute = name, last_compute if layout else name
        if layout:
            entry["role"] = "layout"
        elif provider == TRT_EP:
            entry["kind"], entry["kernel"] = "TRTKernel", op or None
            key = _subgraph_key(name, op, subs)
            if key is None:
                notes.append(f"no dumped subgraph for TensorRT EP node {name}: its ONNX nodes were placed by "
                             "topology")
            else:
                used.add(key)
                entry["origin"], entry["mapped_by"] = subgraph_nodes(og, subs[key], key)
                twice = [o for o in entry["origin"] if o in claimed]
                if twice:  # TensorRT EP subgraphs are disjoint: dumps of two sessions (or a copied file) mixed
                    raise WorkbenchError(f"dumped subgraphs {_short(claimed[twice[0]])} and {_short(key)} both run "
                                         f"ONNX node {_short(twice[0])} ({len(twice)} node(s) in common)",
                                         _DUMP_HINT + " (only that session's dumps, in an empty folder)")
                claimed.update(dict.fromkeys(entry["origin"], key))
        else:
            entry["origin"] = _named(og, name, op)
        entries.append(entry)
    stray = sorted(set(subs) - used)
    if stray:
        raise WorkbenchError(f"dumped subgraph(s) {', '.join(_short(k) for k in stray[:5])}"
                             + (f" (+{len(stray) - 5} more)" if len(stray) > 5 else "")
                             + " match no TensorRT EP node of the trace",
                             _DUMP_HINT)
    mapped = map_runtime(og, entries, set(), static_shapes=False)
    graph = {"nodes": mapped["nodes"], "folded": mapped["folded"], "unmapped": mapped["unmapped"]}
    _apply_profile(graph, profile, _stand_in(model, graph["nodes"]))
    if not any(e["provider"] == TRT_EP and e.get("role") != "layout" for e in entries):
        notes.append("the TensorRT EP took no subgraph: every node ran on CUDA or CPU")
    summary = summarize_profile(profile)
    return EngineGraph(
        engine="ort-trt", nodes=graph["nodes"], end_to_end_ms=summary["end"]["median"],
        end_to_end_p90_ms=summary["end"]["p90"], end_to_end_mean_ms=summary["end"]["mean"],
        end_to_end_source="ORT profiler: model_run events of the profiled runs",
        latency_share=summary["share"], accounted_share=summary["accounted"], overhead=summary["overhead"],
        runs=len(profile["model_run"]), unmapped=graph["unmapped"], folded=graph["folded"], notes=notes,
        details={"requested_provider": TRT_EP, "trt_subgraphs": {k: len(subs[k].graph.node) for k in sorted(used)},
                 "executed_nodes": len(entries), "onnx_compute_nodes": len(og.nodes), "warmup": warmup,
                 **(details or {})},
    )


def subgraph_nodes(og: OnnxGraph, sub: onnx.ModelProto, key: str = "") -> tuple[list[str], str]:
    """(ONNX nodes a dumped TensorRT EP subgraph runs, how they were found: ``names`` or ``tensors``)."""
    found, how = [], "names"
    for node in sub.graph.node:
        if node.name and _strip(node.name) in og.op_types:
            found.append(_strip(node.name))
            continue
        made = [og.producer[o] for o in node.output if o in og.producer]
        if made:
            found += made
            how = "tensors"
    if not found:  # nothing named as in the model: what computes its outputs from its inputs
        outs = [o.name for o in sub.graph.output if o.name in og.producer]
        found, how = og.region(outs, {i.name for i in sub.graph.input}), "tensors"
    if not found:
        raise WorkbenchError(f"the dumped subgraph {key or sub.graph.name!r} names no node and no tensor of the model",
                             _DUMP_HINT + " (and the same model)")
    return og.sort(found), how


def _named(og: OnnxGraph, name: str, op: str) -> list[str]:
    """The ONNX node a CUDA/CPU node is named after: ORT keeps the names of the nodes it assigns; its rewrites name
    a node ``<node>/<Name>Fusion/`` or ``<tensor>_nchwc`` (:func:`ort_graph._hints`, read here from the name alone:
    the trace has no attributes, so a fused activation joins by topology)."""
    base = _strip(name)
    if base in og.op_types:
        return [base]
    return og.sort(og.producer[t] for t in _hints(og, onnx.helper.make_node(op or "Op", [], [], name))
                   if t in og.producer)


def _subgraph_key(name: str, op: str, subs: dict) -> str | None:
    for key in (name, op):
        if key and key in subs:
            return key
    return None


def _executed(events: list[dict], warmup: int) -> list[tuple[str, dict]]:
    """(node name, args of its first kernel_time event) in the order the first profiled run ran them, then the
    nodes only later runs ran."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")[warmup:]
    import bisect

    starts = [a for a, _ in runs]
    seen: dict[str, tuple[int, int, dict]] = {}
    kernels = sorted((e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")),
                     key=lambda e: e["ts"])
    for e in kernels:
        run = bisect.bisect_right(starts, e["ts"]) - 1
        name = e["name"][: -len("_kernel_time")]
        if run >= 0 and e["ts"] <= runs[run][1] and name not in seen:
            seen[name] = (run, e["ts"], e["args"])
    return [(name, args) for name, (_, _, args) in sorted(seen.items(), key=lambda kv: kv[1][:2])]


def _stand_in(model: onnx.ModelProto, nodes: list) -> onnx.ModelProto:
    """A model with one node per engine node writing its first ONNX output, with the model's inferred types: what
    :func:`ort_graph._apply_profile` reads a node's declared output type from (the real optimized model does not
    exist once the TensorRT EP compiled subgraphs)."""
    from ..core.shapes import infer_shapes_lenient, value_types

    types = value_types(infer_shapes_lenient(model))
    g = onnx.GraphProto()
    for n in nodes:
        g.node.append(onnx.helper.make_node("StandIn", [], (n.outputs or [""])[:1], n.name))
    for t in {o for n in nodes for o in n.outputs[:1]}:
        if t in types and types[t].tensor_type.elem_type in _ELEM:
            g.value_info.append(onnx.helper.make_value_info(t, types[t]))
    return onnx.helper.make_model(g)


# --- reading -----------------------------------------------------------------------------------------------------
def read_events(path: str | Path) -> list[dict]:
    """The events of ORT's profiler trace file (one JSON event per line, as ORT writes it; else read whole)."""
    import io

    from .._files import human_size, open_regular

    raw = open_regular(path, "ONNX Runtime trace")
    size = os.fstat(raw.fileno()).st_size
    if size > MAX_TRACE_BYTES:
        raw.close()
        raise WorkbenchError(f"the ONNX Runtime trace {path} is {human_size(size)}, over the "
                             f"{human_size(MAX_TRACE_BYTES)} limit", "profile fewer runs (a run adds ~0.5 MB per "
                             "1,000 nodes)")
    try:
        with io.TextIOWrapper(raw, encoding="utf-8") as fh:
            events = []
            for line in fh:
                text = line.strip().rstrip(",")
                if text in ("", "[", "]"):
                    continue
                try:
                    value = json.loads(text)
                except ValueError:
                    fh.seek(0)
                    return json.load(fh)
                if isinstance(value, list):  # the whole list on one line (a trace saved again with json.dump)
                    events.extend(value)
                else:
                    events.append(value)
            return events
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WorkbenchError(f"cannot read the ONNX Runtime trace {path} ({type(e).__name__}: {e})",
                             _TRACE_HINT) from None


def _short(value: Any, limit: int = 80) -> str:
    """``value``'s repr cut to ``limit`` characters (a message names a hostile field, not all of it)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"<{value.bit_length()}-bit int>"
    return text if len(text) <= limit else text[:limit] + "..."


def normalize_events(events: Any) -> list[dict]:
    """Trace events cut to what the mapping reads: cat, name, ts, dur and args provider, op_name and output type
    (the first type of ``output_type_shape``, as :func:`ort_graph.read_trace` keeps it)."""
    if not isinstance(events, list):
        raise WorkbenchError(f"the ONNX Runtime trace is not a list of events ({type(events).__name__})", _TRACE_HINT)
    out = []
    for k, e in enumerate(events):
        if not isinstance(e, dict):
            raise WorkbenchError(f"event {k} of the ONNX Runtime trace is not an object", _TRACE_HINT)
        if e.get("cat") not in ("Session", "Node"):
            continue
        name, ts, dur = e.get("name"), e.get("ts"), e.get("dur", 0)
        if not isinstance(name, str) or not _number(ts) or not _number(dur):
            raise WorkbenchError(f"event {k} of the ONNX Runtime trace lacks a name, a ts or a dur (finite "
                                 f"microseconds from 0 to {MAX_TRACE_US:.0e}) (name={_short(name)}, ts={_short(ts)}, "
                                 f"dur={_short(dur)})", _TRACE_HINT)
        args = e.get("args") or {}
        if not isinstance(args, dict):
            raise WorkbenchError(f"event {k} ({_short(name)}) of the ONNX Runtime trace has args that are not an "
                                 "object", _TRACE_HINT)
        shapes = args.get("output_type_shape") or []
        first = (next(iter(shapes[0]), None) if isinstance(shapes, list) and shapes and isinstance(shapes[0], dict)
                 else args.get("output_type"))
        for key, value in (("provider", args.get("provider")), ("op_name", args.get("op_name")),
                           ("output type", first)):
            if value is not None and not isinstance(value, str):
                raise WorkbenchError(f"event {k} ({_short(name)}) of the ONNX Runtime trace: its {key} is not a "
                                     f"string ({_short(value)})", _TRACE_HINT)
        out.append({"cat": e["cat"], "name": name, "ts": ts, "dur": dur,
                    "args": {"provider": args.get("provider"), "op_name": args.get("op_name"), "output_type": first}})
    return out


#: the largest ts or dur read, in microseconds (~116 days): past it a value is not a profiler's
MAX_TRACE_US = 1e13


def _number(v: Any) -> bool:
    """A finite, non-negative microsecond count (a trace edited to ``Infinity``, ``1e999`` or a huge integer would
    turn every median and share into inf or nan)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= MAX_TRACE_US  # nan fails too


#: the largest trace and dumped subgraph read (a 30-run trace of a 400-node model is ~20 MB)
MAX_TRACE_BYTES = 2 * 1024**3
MAX_DUMP_BYTES = 2 * 1024**3


def load_subgraphs(folder: str | Path) -> dict[str, onnx.ModelProto]:
    """The TensorRT EP's dumped subgraphs in ``folder``: ``<fused node name>.onnx`` -> its model (graph only: newer
    EPs may write the weights beside it); the candidate graph ``GetSupportedList`` dumps is skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"{folder} is not a folder of dumped TensorRT EP subgraphs", _DUMP_HINT)
    subs = {}
    for path in sorted(folder.glob("*.onnx")):
        if path.stem == CANDIDATE_DUMP:
            continue
        data = read_capped(path, MAX_DUMP_BYTES, "dumped subgraph", size_hint="a dump holds a subgraph's nodes "
                           "(its weights beside it): this is not one")
        try:
            subs[path.stem] = onnx.load_from_string(data)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends: one clear error
            raise WorkbenchError(f"the dumped subgraph {path.name} is not an ONNX model ({type(e).__name__})",
                                 _DUMP_HINT) from None
    return subs


def _check_subgraphs(subs: Any) -> dict[str, onnx.ModelProto]:
    if not isinstance(subs, dict):
        raise WorkbenchError(f"subgraphs must map fused node names to ONNX models, not {type(subs).__name__}",
                             _DUMP_HINT)
    for key, sub in subs.items():
        if not isinstance(sub, onnx.ModelProto):
            raise WorkbenchError(f"the dumped subgraph {key!r} is a {type(sub).__name__}, not an ONNX ModelProto",
                                 _DUMP_HINT + " (onnx.load each)")
    return dict(subs)


def _model(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    from ..model.load import load_model

    return load_model(model).proto


# --- live --------------------------------------------------------------------------------------------------------
def ort_trt_engine_graph(model: onnx.ModelProto, feeds: list[dict], *, runs: int = 10, warmup: int = 1,
                         options: dict | None = None, outputs: list[str] | None = None,
                         onnx_graph: OnnxGraph | None = None, timeout_s: float | None = None) -> EngineGraph:
    """Run ``model`` on ONNX Runtime's TensorRT EP (``options``: OrtEngine's: threads, graph_optimization,
    provider_options) ``warmup`` + ``runs`` times on ``feeds`` (cycled) with the profiler on and
    ``trt_dump_subgraphs``, and map the records (:func:`from_ort_trt_records`). The EP dumps into the current
    working directory, so the session runs in a child process whose working directory is a private temporary
    folder (this process never changes directory); the folder goes with the trace and dumps once they are read."""
    from ..engines.ort import OrtEngine, _unavailable
    from ..engines.serialize import model_payload

    problem = _unavailable("trt")
    if problem:
        raise EngineUnavailableError(f"ort-trt: {problem[0]}", problem[1])
    opts = dict(options or {})
    engine = OrtEngine(provider="trt", threads=opts.get("threads"),
                       graph_optimization=opts.get("graph_optimization", "all"),
                       provider_options={**(opts.get("provider_options") or {}), "trt_dump_subgraphs": "True"})
    og = onnx_graph or OnnxGraph.build(model)
    marked = list(dict.fromkeys([o.name for o in model.graph.output] + list(outputs or [])))
    with temporary_dir("workbench-ort-trt-") as tmp:
        work, dumps = Path(tmp, "in"), Path(tmp, "dump")
        work.mkdir()
        dumps.mkdir()
        payload = model_payload(model, marked if outputs else None)
        try:
            if payload.is_file:
                model_path = payload.source
            else:
                model_path = str(work / "model.onnx")
                Path(model_path).write_bytes(payload.source)
            # runs=0 (structure only): the nodes are only known from a trace, so one run is profiled and its times
            # dropped below
            job = _write_job(work, model_path, feeds, engine, max(runs, 1), warmup)
            result = _child(job, dumps, timeout_s)
        finally:
            payload.close()
        import onnxruntime as ort

        graph = from_ort_trt_records(
            model, result["trace"], dumps, warmup=warmup, onnx_graph=og,
            details={"onnxruntime": ort.__version__, "graph_optimization": engine.graph_optimization,
                     "session_providers": result["providers"], "wall_ms": stats(result["walls"])["median"],
                     "trt_options": {k: v for k, v in engine.provider_options.items()
                                     if k.startswith("trt_") and k != "trt_dump_subgraphs"}})
    if not runs:
        _drop_times(graph)
    return graph


def _drop_times(graph: EngineGraph) -> None:
    """Structure only (``runs=0``), as the other engines give it: no latency anywhere."""
    for n in graph.nodes:
        n.latency_ms = n.latency_p90_ms = n.latency_mean_ms = n.dispatch_ms = None
    graph.end_to_end_ms = graph.end_to_end_p90_ms = graph.end_to_end_mean_ms = None
    graph.latency_share = graph.accounted_share = None
    graph.overhead, graph.end_to_end_source, graph.runs = {}, "", 0
    graph.details.pop("wall_ms", None)


def _write_job(work: Path, model_path: str, feeds: list[dict], engine, runs: int, warmup: int) -> Path:
    import numpy as np

    arrays, index = {}, []
    for i, feed in enumerate(feeds):
        index.append({name: f"f{i}_{j}" for j, name in enumerate(feed)})
        arrays.update({f"f{i}_{j}": np.asarray(v) for j, v in enumerate(feed.values())})
    np.savez(work / "feeds.npz", **arrays)
    job = work / "job.json"
    job.write_text(json.dumps({"model": model_path, "feeds": str(work / "feeds.npz"), "index": index,
                               "runs": runs, "warmup": warmup, "threads": engine.threads,
                               "graph_optimization": engine.graph_optimization,
                               "provider_options": engine.provider_options, "trace_prefix": str(work / "profile"),
                               "result": str(work / "result.json")}), encoding="utf-8")
    return job


def _child(job: Path, cwd: Path, timeout_s: float | None) -> dict:
    """Run the job in a child Python whose working directory is ``cwd`` (where the EP dumps)."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "ORT_TENSORRT_DUMP_SUBGRAPHS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-m", "workbench.engine_graphs.ort_trt_graph", str(job)], cwd=cwd,
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EngineRunError(f"the ort-trt session did not finish within {timeout_s} s",
                             "TensorRT builds its engines on the first session: allow more time") from None
    result_path = Path(json.loads(job.read_text(encoding="utf-8"))["result"])
    result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.exists() else None
    if done.returncode != 0 or result is None or "error" in result:
        why = (result or {}).get("error") or " ".join((done.stderr or "").split()[-60:]) or f"exit {done.returncode}"
        if (result or {}).get("unavailable"):
            raise EngineUnavailableError(why, result.get("hint"))
        raise EngineRunError(f"the ort-trt session failed: {why[:600]}",
                             (result or {}).get("hint") or "check that this onnxruntime-gpu runs the model on the "
                             "TensorRT EP (workbench inspect MODEL --engine ort-trt)")
    return result


def _job(path: str) -> None:
    """Child side: build the session in this (temporary) working directory, run, write the result JSON."""
    import time

    import numpy as np
    import onnxruntime as ort

    from ..engines.ort import OrtEngine, _error

    job = json.loads(Path(path).read_text(encoding="utf-8"))
    result: dict = {}
    try:
        engine = OrtEngine(provider="trt", threads=job["threads"], graph_optimization=job["graph_optimization"],
                           provider_options=job["provider_options"])
        options = engine._session_options(0)
        options.enable_profiling = True
        options.profile_file_prefix = job["trace_prefix"]
        with np.load(job["feeds"]) as data:
            feeds = [{name: data[key] for name, key in entry.items()} for entry in job["index"]]
        try:
            session = ort.InferenceSession(job["model"], options, providers=engine._providers())
        except Exception as e:
            raise _error("onnxruntime could not create a TensorRT EP session", e,
                         "check that this onnxruntime runs the model (workbench inspect MODEL)") from e
        providers = session.get_providers()
        engine._check_fallback(providers)
        walls = []
        for i in range(job["warmup"] + job["runs"]):
            t0 = time.perf_counter()
            session.run(None, feeds[i % len(feeds)])
            if i >= job["warmup"]:
                walls.append((time.perf_counter() - t0) * 1e3)
        result = {"trace": session.end_profiling(), "providers": providers, "walls": walls}
    except WorkbenchError as e:
        result = {"error": e.message, "hint": e.hint, "unavailable": isinstance(e, EngineUnavailableError)}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises EngineRunError
        result = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
    Path(job["result"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    _job(sys.argv[1])
