"""TensorRT's engine graph: the engine inspector's layer information (JSON, ``ProfilingVerbosity.DETAILED``) and a
per-layer profile, mapped to ONNX nodes.

Formats read (as documented by NVIDIA; recorded examples in ``tests/data/trt/``):

* layer information: ``{"Layers": [...], "Bindings": [...]}`` (TensorRT <= 10) or ``{"Layers": [...],
  "I/O Tensors": [...]}`` (11). A layer is a name (``LAYER_NAMES_ONLY``) or an object with ``Name``, ``LayerType``,
  ``Inputs``/``Outputs`` (each ``{"Name", "Dimensions", "Format/Datatype"}``, or ``"Format"`` and ``"DataType"``
  since 11), ``TacticName`` and ``Metadata`` (``[ONNX Layer: <node>]`` per fused ONNX node, separated by ``\\x1f``);
  from ``IEngineInspector.getEngineInformation(kJSON)`` or ``trtexec --exportLayerInfo``;
* profile: ``trtexec --exportProfile``: ``[{"count": N}, {"name", "timeMs", "averageMs", "medianMs",
  "percentage"}, ...]``;
* times (optional): ``trtexec --exportTimes``: one object per iteration with ``"computeMs"`` (and ``latencyMs``).

A layer's ONNX nodes come from, in order: its ``Metadata`` (``metadata``); a Myelin ``ForeignNode[first...last]``
name: the ONNX nodes between those two in topological order that no other layer names (``range``); the ONNX node
or tensor names in its own name, which joins fused nodes with `` + `` and wraps point-wise fusions in ``PWN(...)``
(``names``); otherwise topology (:mod:`workbench.engine_graphs.partition`). ``Reformat`` layers (and "Reformatting
CopyNode ...") are layout nodes.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import onnx

from .._files import read_json as read_json_file
from ..errors import EngineRunError, EngineUnavailableError, WorkbenchError
from .onnx_side import OnnxGraph
from .partition import map_runtime
from .result import EngineGraph, stats

log = logging.getLogger(__name__)

_META = re.compile(r"\[ONNX Layer: ([^|\]]+?)\s*(?:\|[^\]]*)?\]")
_FOREIGN = re.compile(r"ForeignNode\[(.+?)\.\.\.(.+?)\]")
_REFORMAT = re.compile(r"^Reformatting CopyNode for (?:Input|Output) Tensor \d+ to (.+)$")
_SPLIT = re.compile(r"\s+\+\s+|PWN\(|\)|,\s+|\{|\}")
#: TensorRT layer type -> ONNX op types of its main op
MAIN_OPS = {"CaskConvolution": {"Conv"}, "Convolution": {"Conv"}, "CaskDeconvolution": {"ConvTranspose"},
            "Deconvolution": {"ConvTranspose"}, "CaskGemmMatrixMultiply": {"MatMul", "Gemm"},
            "MatrixMultiply": {"MatMul", "Gemm"}, "CaskPooling": {"MaxPool", "AveragePool", "GlobalAveragePool"},
            "Pooling": {"MaxPool", "AveragePool", "GlobalAveragePool"}, "Resize": {"Resize"}, "SoftMax": {"Softmax"}}
LAYOUT_KINDS = ("Reformat", "NoOp")


def precision_of(tensor: dict) -> str | None:
    """Short precision name of a layer input/output entry (``DataType`` since TRT 11, ``Format/Datatype`` before)."""
    text = str(tensor.get("DataType") or tensor.get("Format/Datatype") or "")
    for needle, short in (("BF16", "bf16"), ("FP16", "f16"), ("Half", "f16"), ("FP8", "f8"), ("FP4", "f4"),
                          ("FP32", "f32"), ("Float", "f32"), ("Int8", "i8"), ("INT8", "i8"), ("Int64", "i64"),
                          ("Int32", "i32"), ("INT32", "i32"), ("Bool", "boolean"), ("Int4", "i4")):
        if needle in text:
            return short
    return None


def read_json(source: Any, what: str) -> Any:
    """A JSON document from a path, a JSON string or an already parsed object."""
    if isinstance(source, (dict, list)):
        return source
    text = os.fspath(source) if isinstance(source, os.PathLike) else str(source)
    hint = f"pass the JSON file TensorRT wrote ({_HOW[what]})"
    if isinstance(source, os.PathLike) or not text.lstrip().startswith(("{", "[")):
        return read_json_file(text, f"the TensorRT {what}", hint=hint)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise WorkbenchError(f"cannot read the TensorRT {what} JSON text: {e}", hint) from None


_HOW = {"layer information": "trtexec --exportLayerInfo=FILE --profilingVerbosity=detailed",
        "profile": "trtexec --exportProfile=FILE", "times": "trtexec --exportTimes=FILE"}


def parse_layers(info: Any, og: OnnxGraph) -> list[dict]:
    """Layers of an engine inspector document as executed-node dicts (see :mod:`workbench.engine_graphs.partition`)."""
    doc = read_json(info, "layer information")
    layers = doc.get("Layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        raise WorkbenchError("the TensorRT layer information has no 'Layers' list",
                             f"pass the JSON file TensorRT wrote ({_HOW['layer information']})")
    out, writer = [], {}
    for k, raw in enumerate(layers):
        layer = {"Name": raw} if isinstance(raw, str) else dict(raw)
        name = str(layer.get("Name", f"layer {k}"))
        outs = [o for o in layer.get("Outputs", []) if isinstance(o, dict)]
        kind = str(layer.get("LayerType") or ("Reformat" if _REFORMAT.match(name) else "unknown"))
        entry = {"name": name, "kind": kind, "kernel": layer.get("TacticName") or layer.get("Tactic"),
                 "precision": precision_of(outs[0]) if outs else None, "order": k, "provider": "TensorRT",
                 "reads": [str(i.get("Name")) for i in layer.get("Inputs", []) if isinstance(i, dict)],
                 "origin": [], "mapped_by": "names"}
        if kind in LAYOUT_KINDS or _REFORMAT.match(name):
            entry["role"] = "layout"
        else:
            meta = _META.findall(str(layer.get("Metadata") or ""))
            if meta:
                entry["origin"], entry["mapped_by"] = [m for m in meta if m in og.op_types], "metadata"
            if not entry["origin"]:
                entry["origin"] = _named(name, og)
        for o in outs:
            writer[str(o.get("Name"))] = name
        out.append(entry)
    claimed = {o for e in out for o in e["origin"]}
    for e in out:
        found = _FOREIGN.search(e["name"])
        if found and e.get("role") != "layout" and e["mapped_by"] != "metadata":
            e["origin"], e["mapped_by"] = _range(og, found.group(1), found.group(2), claimed), "range"
            claimed |= set(e["origin"])
        e["preds"] = [writer[r] for r in e.pop("reads") if r in writer and writer[r] != e["name"]]
    return out


def _node_of(token: str, og: OnnxGraph) -> str | None:
    token = token.strip()
    if token in og.op_types:
        return token
    for t in (token, token.removeprefix("node_of_")):
        if t in og.producer:
            return og.producer[t]
    return None


def _named(name: str, og: OnnxGraph) -> list[str]:
    """ONNX nodes a layer's own name points to (`` + `` joins, ``PWN(...)`` wrappers, tensor names)."""
    whole = _node_of(name, og)
    if whole:
        return [whole]
    return list(dict.fromkeys(n for n in (_node_of(t, og) for t in _SPLIT.split(name) if t.strip()) if n))


def _range(og: OnnxGraph, first: str, last: str, claimed: set[str]) -> list[str]:
    """A Myelin ``ForeignNode[first...last]``: the unclaimed ONNX nodes from ``first`` to ``last`` in topological
    order (either end may be a node or a tensor name)."""
    a, b = _node_of(first, og), _node_of(last, og)
    if a is None or b is None:
        return [n for n in (a, b) if n]
    lo, hi = sorted((og.topo[a], og.topo[b]))
    return [n for n in og.nodes[lo:hi + 1] if n not in claimed or n in (a, b)]


def parse_profile(profile: Any) -> dict[str, dict]:
    """trtexec's per-layer profile: layer name -> {"median", "mean", "count"} in milliseconds per run."""
    doc = read_json(profile, "profile")
    if not isinstance(doc, list):
        raise WorkbenchError("the TensorRT profile is not a list of layers", f"pass {_HOW['profile']}'s file")
    count = next((int(e["count"]) for e in doc if isinstance(e, dict) and "count" in e), None)
    out = {}
    for e in doc:
        if not isinstance(e, dict) or "name" not in e:
            continue
        mean = e.get("averageMs")
        if mean is None and e.get("timeMs") is not None and count:
            mean = float(e["timeMs"]) / count
        out[str(e["name"])] = {"median": e.get("medianMs", mean), "mean": mean, "count": count}
    return out


def parse_times(times: Any) -> list[float]:
    """GPU compute time per iteration (ms) from ``trtexec --exportTimes``."""
    doc = read_json(times, "times")
    values = [float(e.get("computeMs", e.get("latencyMs"))) for e in doc if isinstance(e, dict)
              and (e.get("computeMs") is not None or e.get("latencyMs") is not None)] if isinstance(doc, list) else []
    if not values:
        raise WorkbenchError("the TensorRT times file has no computeMs entries", f"pass {_HOW['times']}'s file")
    return values


def from_records(model: Any, layer_info: Any, profile: Any = None, times: Any = None) -> EngineGraph:
    """The engine graph of ``model`` from TensorRT's recorded layer information (and per-layer ``profile``, per
    iteration ``times``): what ``workbench inspect MODEL --engine trt --layer-info FILE`` reads."""
    from ..model.load import LoadedModel, load_model

    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    og = OnnxGraph.build(loaded.proto)
    graph = _assemble(og, parse_layers(layer_info, og), parse_profile(profile) if profile is not None else None,
                      parse_times(times) if times is not None else None, source="trtexec --exportTimes computeMs")
    graph.model = {"name": loaded.name, "sha256": loaded.fingerprint, "path": str(loaded.path) if loaded.path else None}
    graph.details["recorded"] = True
    return graph


def _assemble(og: OnnxGraph, layers: list[dict], profile: dict | None, ends: list[float] | None,
              source: str) -> EngineGraph:
    mapped = map_runtime(og, layers, set(), main_ops=MAIN_OPS, layout_kinds=LAYOUT_KINDS)
    for node in mapped["nodes"]:
        p = (profile or {}).get(node.name)
        if p:
            node.latency_ms, node.latency_mean_ms = p["median"], p["mean"]
    missing = sorted(set(profile or {}) - {n.name for n in mapped["nodes"]})
    end = stats(ends or [])
    graph = EngineGraph(engine="trt", nodes=mapped["nodes"], end_to_end_ms=end["median"], end_to_end_p90_ms=end["p90"],
                        end_to_end_mean_ms=end["mean"], end_to_end_source=source if ends else "",
                        runs=(next(iter(profile.values()))["count"] or 0) if profile else len(ends or []),
                        unmapped=mapped["unmapped"], folded=mapped["folded"],
                        details={"requested_provider": "TensorRT", "layers": len(layers),
                                 "onnx_compute_nodes": len(og.nodes)})
    if graph.latency_sum_ms and graph.end_to_end_mean_ms:  # per-run sums are not recorded: the means' ratio
        graph.latency_share = graph.latency_sum_ms / graph.end_to_end_mean_ms
    if missing:
        graph.notes.append(f"{len(missing)} profiled layer(s) are not in the layer information (e.g. {missing[0]})")
    if profile is not None and ends is None:
        graph.notes.append("no per-iteration times given: end-to-end latency unknown (trtexec --exportTimes)")
    return graph


# --- live: needs tensorrt ------------------------------------------------------------------------------------------
def tensorrt_engine_graph(model: onnx.ModelProto, feeds: list[dict], *, runs: int = 10, warmup: int = 1,
                          options: dict | None = None, outputs: list[str] | None = None,
                          onnx_graph: OnnxGraph | None = None) -> EngineGraph:
    """Build a TensorRT engine with detailed profiling verbosity, read its inspector JSON, time each layer with an
    ``IProfiler`` over ``runs`` runs (after ``warmup``) through Polygraphy's runner, and map it all."""
    from ..engines.tensorrt import TensorRTEngine

    ok, reason = TensorRTEngine.availability()
    if not ok:
        raise EngineUnavailableError(reason, "record the layer information and profile with trtexec on a GPU machine "
                                     "and pass them: workbench inspect MODEL --engine trt --layer-info FILE")
    import tensorrt as trt
    from polygraphy.backend.trt import (
        CreateConfig,
        EngineFromBytes,
        EngineFromNetwork,
        NetworkFromOnnxBytes,
        TrtRunner,
    )

    from ..engines.serialize import model_payload

    og = onnx_graph or OnnxGraph.build(model)
    opts = dict(options or {})
    marked = list(dict.fromkeys([o.name for o in model.graph.output] + list(outputs or []))) if outputs else None
    payload = model_payload(model, marked)
    try:
        source = payload.source if isinstance(payload.source, bytes) else Path(payload.source).read_bytes()
        strongly = int(trt.__version__.split(".")[0]) >= 10 if opts.get("strongly_typed") is None \
            else bool(opts["strongly_typed"])
        network = NetworkFromOnnxBytes(source, strongly_typed=strongly)
        config = CreateConfig(profiling_verbosity=trt.ProfilingVerbosity.DETAILED)
        engine = EngineFromNetwork(network, config=config)()
        info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
        per_run, ends = _profile_runs(TrtRunner(EngineFromBytes(bytes(engine.serialize()))), trt, feeds, runs, warmup)
    except (RuntimeError, TypeError, ValueError) as e:
        raise EngineRunError(f"TensorRT could not build or profile the engine: {' '.join(str(e).split())[:300]}",
                             "see the TensorRT log above") from e
    finally:
        payload.close()
    profile = {name: {"median": stats(v)["median"], "mean": stats(v)["mean"], "count": len(v)}
               for name, v in per_run.items()} if runs else None
    graph = _assemble(og, parse_layers(json.loads(info), og), profile, ends if runs else None,
                      source="Polygraphy TrtRunner inference time of the profiled runs")
    graph.details["tensorrt"] = trt.__version__
    return graph


def _profile_runs(runner, trt, feeds: list[dict], runs: int, warmup: int) -> tuple[dict[str, list[float]], list]:
    """Per-layer times (ms per run) reported to an IProfiler, and the runner's inference time per run."""
    class Profiler(trt.IProfiler):
        def __init__(self):
            super().__init__()
            self.current: dict[str, float] = {}

        def report_layer_time(self, layer_name, ms):
            self.current[layer_name] = self.current.get(layer_name, 0.0) + ms

    per_layer: dict[str, list[float]] = {}
    ends = []
    with runner:
        profiler = Profiler()
        runner.context.profiler = profiler
        for i in range(warmup + max(runs, 1)):
            profiler.current = {}
            runner.infer(feeds[i % len(feeds)])
            if i >= warmup:
                ends.append(runner.last_inference_time() * 1e3)
                for name, ms in profiler.current.items():
                    per_layer.setdefault(name, []).append(ms)
    return per_layer, ends
