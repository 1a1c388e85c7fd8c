"""Segment-streamed comparison: a model larger than memory compared one segment at a time.

The graph is cut at single-tensor frontiers (:mod:`workbench.model.segments`; a transformer's block boundaries).
The model is read without its external data; the FP16 converter decides types and Casts once on that weight-free
graph, and each segment's weights are filled in (the converters' own rule, :mod:`workbench.variants.fp16_fast`)
from the external data memory-mapped for that segment only, then written to the segment's private weight files
(:class:`~workbench.engines.files.ModelFiles`) that its sessions map. Per segment: the reference sub-model runs on the
reference chain's frontier value; the candidate sub-model runs once on the candidate chain's frontier value (the
error as received, like the full run) and once on the reference's (the error the segment introduces by itself);
every node runs alone on reference inputs (the culprit search); then everything but the statistics and the two
frontier values is released. Peak memory follows the largest segment, not the model. The result is the same
:class:`~workbench.compare.result.CompareResult` as a whole-model comparison (impact measurement excepted: it
patches the whole candidate).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._files import human_size
from ..core.budget import parse_size
from ..core.feeds import cast_feeds
from ..core.metrics import ErrorStats
from ..core.progress import Progress, Steps
from ..core.shapes import KEEP_BYTES, infer_shapes_lenient, is_stub, tensor_nbytes, value_types
from ..engines.spec import EngineSpec
from ..errors import SpecError
from ..model.segments import Segment, node_reads, plan_segments
from .criterion import Criterion
from .floor import tensor_formats
from .options import CompareOptions
from .pairs import pair_tensors
from .plan import PlanEngines
from .strategies import Context, Measured, Ticker, _compare_jobs, _FeedSteps, _run_isolation, update_many

log = logging.getLogger(__name__)

STREAM_CHOICES = ("auto", "on", "off")


#: a model file larger than this holds its weights itself: its size is what counts (it is not parsed to check)
SMALL_GRAPH = 64 << 20


def model_bytes(path: Path) -> int:
    """The .onnx file plus every external data file it references (0 for what cannot be read). Only a small
    graph file is parsed (a weight-free graph), so the check never holds a model in memory."""
    from ..model.external_data import external_refs

    try:
        if path.stat().st_size > SMALL_GRAPH:
            return path.stat().st_size
        skeleton = onnx.load(str(path), load_external_data=False)
        names = {r.location for r in external_refs(skeleton)}
        return path.stat().st_size + sum((path.parent / n).stat().st_size for n in names
                                         if (path.parent / n).is_file())
    except Exception:  # noqa: BLE001 - a file the normal path will reject with its own message
        return 0


def model_path(model: Any) -> Path | None:
    """The file a model comes from: a path, or a loaded model's own file (a bundle's, on rerun); else None."""
    if isinstance(model, (str, os.PathLike)):
        return Path(model)
    path = getattr(model, "path", None)
    return path if isinstance(path, Path) and getattr(model, "source", None) == "path" else None


def unsupported(model: Any, reference: str | EngineSpec, candidate: str | EngineSpec, cand_model: Any,
                opts: CompareOptions) -> str | None:
    """Why this comparison cannot be streamed (None: it can)."""
    from ..engines.registry import class_for

    if model_path(model) is None:
        return "the model is not given as a file path"
    if cand_model is not None:
        return "--cand-model is given (the candidate's own file is compared whole)"
    ref, cand = EngineSpec.parse(reference), EngineSpec.parse(candidate)
    if ref.variant != "fp32" or cand.variant not in ("fp32", "fp16"):
        return f"streaming supports an FP32 reference and an FP32 or FP16 candidate, not {ref} vs {cand}"
    for spec in (ref, cand):
        try:
            reads_files = getattr(class_for(spec.engine), "reads_files", False)
        except Exception:  # noqa: BLE001 - an unknown engine fails later with its own message
            reads_files = False
        if not reads_files:
            return f"engine '{spec.engine}' does not build sessions from files"
    if opts.mode == "bisect":
        return "--mode bisect builds whole-model candidates"
    if opts.granularity != "all":
        return "--granularity fused reads the whole candidate engine graph"
    return None


def should_stream(model: Any, reference, candidate, cand_model, opts: CompareOptions) -> bool:
    """``opts.stream``: "on" streams (or says why it cannot), "off" never, "auto" when the model's files exceed
    the memory budget and streaming applies."""
    if opts.stream == "off":
        return False
    why = unsupported(model, reference, candidate, cand_model, opts)
    if opts.stream == "on":
        if why:
            raise SpecError(f"cannot stream this comparison: {why}", "drop --stream on")
        return True
    if why:
        return False
    path = model_path(model)
    return path.is_file() and model_bytes(path) > parse_size(opts.memory_budget)


# --- weights ------------------------------------------------------------------------------------------------------
class WeightReader:
    """Tensors of a model's external data, memory-mapped; :meth:`close` unmaps (once the arrays are gone)."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self._maps: dict[Path, mmap.mmap] = {}

    def array(self, t: TensorProto) -> np.ndarray:
        if t.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(t)
        from ..model.external_data import confined_path

        info = {e.key: e.value for e in t.external_data}
        path = confined_path(self.base_dir, info["location"])
        mm = self._maps.get(path)
        if mm is None:
            with open(path, "rb") as fh:
                mm = self._maps[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        count = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        return np.frombuffer(mm, dtype=dtype, count=count, offset=int(info.get("offset", 0))).reshape(tuple(t.dims))

    def close(self) -> None:
        for mm in self._maps.values():
            with contextlib.suppress(BufferError):  # an array still alive: unmapped when it goes
                mm.close()
        self._maps.clear()


def cut(model: onnx.ModelProto, targets: list[str], stops: set[str], types: dict[str, onnx.TypeProto],
        name: str) -> onnx.ModelProto:
    """The sub-model computing ``targets`` from ``stops`` (its inputs; graph inputs among them): every node on the
    way back, in the model's order, with the initializers they read (external references stay references)."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    keep: set[int] = set()
    inputs: list[str] = []
    used_inits: set[str] = set()
    stack = [producer[t] for t in targets if t in producer]
    while stack:
        i = stack.pop()
        if i in keep:
            continue
        keep.add(i)
        for read in node_reads(g.node[i]):
            if read in stops:
                if read not in inputs:
                    inputs.append(read)
            elif read in inits:
                used_inits.add(read)
            elif read in producer:
                stack.append(producer[read])
            else:
                raise ValueError(f"segment {name}: tensor {read!r} is neither made, an input nor a weight")
    nodes = [g.node[i] for i in sorted(keep)]
    outputs = [t for t in dict.fromkeys(targets) if t in producer or t in inputs]

    def vi(n: str) -> onnx.ValueInfoProto:
        v = onnx.ValueInfoProto(name=n)
        if n in types:
            v.type.CopyFrom(types[n])
        return v

    graph = helper.make_graph(nodes, name, [vi(n) for n in inputs], [vi(n) for n in outputs],
                              [inits[n] for n in sorted(used_inits)])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    sub.functions.extend(model.functions)
    return sub


class SegmentFiles:
    """One segment's weights written straight from their arrays (memory-mapped originals, converted float16) into a
    private ``weights.bin`` (page-aligned), its sub-model's tensors pointing there, and graph files written beside
    it per session. Duck-types :class:`workbench.engines.files.ModelFiles` for the engines."""

    def __init__(self):
        import shutil
        import weakref

        from ..core.scratch import scratch_dir
        from ..engines.files import WEIGHTS

        self.folder = scratch_dir("workbench-segment-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        self._fh = open(self.folder / WEIGHTS, "wb")  # noqa: SIM115 - closed by finish()
        self._location = WEIGHTS
        self._count = 0
        self.skeleton: onnx.ModelProto | None = None
        self.data_dir: str | None = None  # graph files are written beside weights.bin: nothing to tell the runtime
        self.mapped = False  # no weight is left in the user's files

    def put(self, t: TensorProto, data: np.ndarray) -> None:
        """Write ``data`` and make ``t`` (same name and dims; type from ``data``) a reference to it, in place."""
        offset = self._fh.tell()
        pad = (-offset) % 4096
        if pad:
            self._fh.write(b"\0" * pad)
            offset += pad
        data = np.ascontiguousarray(data)
        self._fh.write(memoryview(data).cast("B"))
        name, dims = t.name, list(t.dims)
        t.Clear()
        t.name, t.data_type = name, helper.np_dtype_to_tensor_dtype(data.dtype)
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self._location), ("offset", str(offset)), ("length", str(data.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value

    def finish(self, model: onnx.ModelProto) -> None:
        self._fh.close()
        self.skeleton = model

    def graph_file(self, model: onnx.ModelProto, outputs=None) -> Path:
        from ..engines.outputs import edit_lock, temporarily

        self._count += 1
        path = self.folder / f"graph_{self._count:04d}.onnx"
        with edit_lock(model):
            if outputs is not None:
                with temporarily(model, outputs) as marked:
                    data = marked.SerializeToString()
            else:
                data = model.SerializeToString()
        path.write_bytes(data)
        return path

    def discard(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)

    def materialize(self, model: onnx.ModelProto) -> onnx.ModelProto:
        from onnx.external_data_helper import load_external_data_for_model

        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        load_external_data_for_model(copy, str(self.folder))
        return copy

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        self._finalizer()


def fill(sub: onnx.ModelProto, source: dict[str, TensorProto], reader: WeightReader, files: SegmentFiles,
         limits=None, counter=None, clamped: dict | None = None) -> None:
    """Write every data-less initializer of ``sub`` (stubs and external references) to ``files`` from the original's
    data (memory-mapped), as float16 by the converters' rule (``counter``) where the converter made it float16; the
    converted values of tensors the rule clamped go to ``clamped`` (for the clamp report)."""
    for t in sub.graph.initializer:
        if not (is_stub(t) or t.data_location == TensorProto.EXTERNAL):
            continue
        src = source[t.name]
        data = reader.array(src)
        if t.data_type == TensorProto.FLOAT16 and src.data_type == TensorProto.FLOAT:
            before = counter.clamped
            data = counter(data, *limits)
            if counter.clamped > before:
                counter.names.add(t.name)
                if clamped is not None:
                    clamped[t.name] = data
        files.put(t, data)
        del data
    files.finish(sub)


@dataclass
class _Original:
    """What a result reads of the model (a :class:`~workbench.model.load.LoadedModel`'s fields): no weights."""

    proto: onnx.ModelProto
    fingerprint: str
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def base_dir(self) -> Path:
        return self.path.parent


class StreamPlan(PlanEngines):
    """A comparison plan (the fields :func:`workbench.compare.run.run_plan` and results read) whose measurement
    streams the model segment by segment: :meth:`measure`."""

    def __init__(self, model: str | os.PathLike, reference: str | EngineSpec = "ort",
                 candidate: str | EngineSpec = "ort:fp16", *, feeds: Any = None,
                 options: CompareOptions | dict | None = None, **option_overrides: Any):
        from ..model.external_data import check_external_files, external_refs
        from ..model.fingerprint import fingerprint
        from ..model.graph import GraphInfo
        from ..model.load import _read_model_file, name_nodes
        from ..model.precision import infer_precision, lossier
        from ..model.validate import check_structure
        from .plan import _feeds

        t0 = time.perf_counter()
        opts = CompareOptions.build(options, **option_overrides)
        self.notes: list[str] = []
        if opts.impact:
            self.notes.append("impact of the culprits not measured: streaming never builds the whole candidate "
                              "(rerun with --stream off on a machine that holds the model to measure it)")
            opts = opts.replace(impact=0)
        self.options = opts
        self.ref_spec, self.cand_spec = EngineSpec.parse(reference), EngineSpec.parse(candidate)
        self.timing: dict[str, float] = {}
        self.model_source, self.cand_source, self.module = model, None, None
        path = model_path(model).expanduser().absolute()
        data = _read_model_file(path)
        skeleton = onnx.ModelProto()
        skeleton.ParseFromString(data)
        refs = external_refs(skeleton)
        files = check_external_files(refs, path.parent) if refs else []
        name_nodes(skeleton)
        check_structure(skeleton)
        digest = fingerprint(data, files)
        del data
        self.weights_dir = path.parent
        self._embedded = None
        if not refs and any(tensor_nbytes(t) > KEEP_BYTES for t in skeleton.graph.initializer):
            from ..engines.files import ModelFiles

            # weights held in the .onnx file itself: written once to a private file, then read like external data
            self._embedded = ModelFiles(skeleton, prefix="workbench-stream-")
            skeleton = self._embedded.skeleton
            self.weights_dir = self._embedded.folder
        self.original = _Original(skeleton, digest, path)
        self.engine_options = dict(opts.engine_options)
        self.custom_engines: list[str] = []
        self.granularity: dict = {}
        self.feeds, self.feed_info = _feeds(skeleton, feeds, opts)
        t1 = time.perf_counter()
        inferred = infer_shapes_lenient(skeleton)
        self.ref_graph = GraphInfo.build(inferred)
        order = {n.name: n.topo_index for n in self.ref_graph.nodes}  # segments follow the comparison's order
        nodes = sorted(skeleton.graph.node, key=lambda n: order[n.name])
        del skeleton.graph.node[:]
        skeleton.graph.node.extend(nodes)
        self.ref_model = skeleton
        self.ref_types = value_types(inferred)
        self.ref_variant = None
        self.source = {t.name: t for t in skeleton.graph.initializer}
        if self.cand_spec.variant == "fp16":
            self.cand_model, var, self.limits, small_clamped = _fp16_skeleton(skeleton, inferred, opts.keep_fp32)
            self.views = dict(var.tensor_map)
            self.variant_info = var.to_json()
        else:
            self.cand_model, self.views, self.limits, small_clamped = skeleton, {}, None, False
            self.variant_info = {"variant": "fp32", "converter": "none"}
        self.clamps: list[dict] = self.variant_info.setdefault("clamped", []) if self.limits else []
        if self.limits and small_clamped:  # the converter clamped a constant the graph holds itself
            self.clamps.extend(r.to_json() for r in _small_clamps(skeleton, self.cand_model, self.limits))
        self.timing["variant_s"] = time.perf_counter() - t1
        self.cand_inferred = infer_shapes_lenient(self.cand_model)
        self.cand_types = value_types(self.cand_inferred)
        self.ref_precision, self.cand_precision = infer_precision(skeleton), infer_precision(self.cand_model)
        self.family = lossier(self.ref_precision, self.cand_precision).family
        given = opts.criterion
        self.criterion = given if isinstance(given, Criterion) else (
            Criterion.parse(given) if given else Criterion.default_for(self.family))
        self.pairs = pair_tensors(self.ref_graph, self.cand_inferred, self.views)
        self.ref_inputs = set(self.ref_graph.inputs)
        self.known = {p.candidate: p.tensor for p in self.pairs}
        self.known |= {i.name: i.name for i in self.cand_model.graph.input if i.name in self.ref_inputs}
        self.cand_feeds = cast_feeds(self.cand_model, self.feeds)
        elem = {n: tp.tensor_type.elem_type for n, tp in self.cand_types.items() if tp.HasField("tensor_type")}
        by_cand = tensor_formats(self.cand_model, elem, [p.candidate for p in self.pairs])
        self.formats = {p.tensor: by_cand[p.candidate] for p in self.pairs if p.candidate in by_cand}
        budget = parse_size(opts.memory_budget)
        self.segment_bytes = parse_size(opts.segment_size) if opts.segment_size else max(budget // 8, 1 << 20)
        self.segments = plan_segments(skeleton.graph, self.segment_bytes)
        self.isolates_candidate = True
        self._engines: dict = {}
        self._lock = threading.Lock()
        self._current = None  # the segment's candidate files (isolation models read them)
        self.segment_records: list[dict] = []
        if self.cand_spec.engine == "ort" and self.cand_precision.family == "fp16":
            self.notes.append("ONNX Runtime's CPU provider runs most FP16 ops in FP32 (it inserts Casts), so FP16 "
                              "arithmetic overflow does not show on 'ort'; converter clamps and FP16 storage do. Use "
                              "'ref:fp16' (FP16 arithmetic in numpy) or a GPU engine (ort-cuda:fp16, trt:fp16).")
        self.timing["setup_s"] = time.perf_counter() - t0

    # --- the plan's interface ---------------------------------------------------------------------------------
    @cached_property
    def pair_by_tensor(self) -> dict:
        return {p.tensor: p for p in self.pairs}

    def candidate_name(self, tensor: str) -> str:
        pair = self.pair_by_tensor.get(tensor)
        return pair.candidate if pair is not None else (self.views.get(tensor) or tensor)

    @property
    def isolation_source(self) -> onnx.ModelProto:
        return self._current.skeleton

    @contextlib.contextmanager
    def derived(self, model: onnx.ModelProto):
        from ..engines.files import register, unregister

        register(model, self._current)
        try:
            yield model
        finally:
            unregister(model)

    def release_weights(self) -> None:
        """Nothing to release: the plan never holds the weights."""

    def run(self, progress: Progress | None = None, cancel: threading.Event | None = None):
        from .run import run_plan

        return run_plan(self, Steps(progress, cancel))

    def close(self) -> None:
        if self._embedded is not None:
            self._embedded.close()
        for engine in self._engines.values():
            if type(engine).__name__ == "IsolatedEngine":
                engine.close()

    # --- streaming --------------------------------------------------------------------------------------------
    def measure(self, ctx: Context) -> Measured:
        """Every segment in turn (see the module docstring); the statistics of every paired tensor."""
        out = Measured()
        n = len(self.segments)
        ref_chain: list[dict[str, np.ndarray]] = [{} for _ in self.feeds]
        cand_chain: list[dict[str, np.ndarray]] = [{} for _ in self.feeds]
        for seg in self.segments:
            span = ctx.step.span(seg.index / n, (seg.index + 1) / n)
            self._segment(ctx, seg, out, ref_chain, cand_chain, span)
        largest = max(self.segments, key=lambda s: s.weight_bytes)
        ctx.notes.append(f"streamed in {n} segment(s) cut at single-tensor frontiers, at most "
                         f"{human_size(self.segment_bytes)} of weights each where the frontiers allow (largest: "
                         f"segment {largest.index + 1}, {human_size(largest.weight_bytes)})")
        worst = self._worst_segment()
        if worst:
            ctx.notes.append(worst)
        ctx.timing["segments"] = float(n)
        order = {name: i for i, name in enumerate(self.source)}  # ties as find_clamps leaves them: model order
        self.clamps.sort(key=lambda r: (r["kind"] != "overflow", -r["max_abs_change"], order.get(r["name"], -1)))
        ctx.step(1.0, "layer-wise comparison done")
        return out

    def _worst_segment(self) -> str | None:
        crit = self.criterion
        judged = [r for r in self.segment_records if r.get("introduced")]
        if not judged:
            return None
        r = max(judged, key=lambda r: crit.badness(r["introduced"]))
        return (f"segment {r['index'] + 1} (nodes {r['nodes'][0]}..{r['nodes'][1]}) introduces the most error by "
                f"itself: {crit.metric} {_fmt(r['introduced'].get(crit.metric))} at {r['leaves']} from the "
                f"reference's input (from its own chain's: {_fmt((r.get('received') or {}).get(crit.metric))})")

    def _segment(self, ctx: Context, seg: Segment, out: Measured, ref_chain, cand_chain, span: Steps) -> None:
        from ..engines.files import register, unregister
        from ..variants.fp16_fast import ClampCounter
        from .isolate import build_isolation

        g = self.ref_model.graph
        own = g.node[seg.start:seg.stop]
        own_names = {nd.name for nd in own}
        pairs = [p for p in self.pairs if p.node in own_names]
        where = f"segment {seg.index + 1}/{len(self.segments)}"
        graph_outputs = set(self.ref_graph.outputs)
        ref_targets = [o for nd in own for o in nd.output if o]
        ref_stops = set(self.ref_inputs) | ({seg.enters} if seg.enters else set())
        ref_sub = cut(self.ref_model, ref_targets, ref_stops, self.ref_types, f"segment{seg.index}")
        cand_enters = self.candidate_name(seg.enters) if seg.enters else None
        cand_leaves = self.candidate_name(seg.leaves) if seg.leaves else None
        outs = [o for o in ref_targets if o in graph_outputs]
        cand_targets = [p.candidate for p in pairs] + ([cand_leaves] if cand_leaves else []) + outs
        cand_stops = {i.name for i in self.cand_model.graph.input} | ({cand_enters} if cand_enters else set())
        cand_sub = cut(self.cand_model, cand_targets, cand_stops, self.cand_types, f"segment{seg.index}")
        t0 = time.perf_counter()
        reader = WeightReader(self.weights_dir)
        counter = ClampCounter()
        cand_files, ref_files, clamped = SegmentFiles(), SegmentFiles(), {}
        try:
            fill(cand_sub, self.source, reader, cand_files, self.limits, counter, clamped)
            if clamped:
                self._clamps(ref_sub, cand_sub, clamped, reader)
            clamped.clear()
            fill(ref_sub, self.source, reader, ref_files)
        except BaseException:
            cand_files.close()
            ref_files.close()
            raise
        finally:
            reader.close()
        ref_model, cand_model = ref_files.skeleton, cand_files.skeleton
        del ref_sub, cand_sub
        register(ref_model, ref_files)
        register(cand_model, cand_files)
        self._current = cand_files
        ctx.timing["weights_s"] = ctx.timing.get("weights_s", 0.0) + time.perf_counter() - t0
        record = {"index": seg.index, "nodes": [seg.start, seg.stop - 1], "enters": seg.enters,
                  "leaves": seg.leaves or (outs[0] if outs else None), "weights_mib": seg.weight_bytes / 2**20}
        try:
            present = {i.name for i in cand_files.skeleton.graph.input}
            present |= {o for nd in cand_files.skeleton.graph.node for o in nd.output}
            known = {c: r for c, r in self.known.items() if c in present}
            iso = build_isolation(cand_files.skeleton, [p.candidate for p in pairs], known, self.cand_types) \
                if self.options.culprits else None
            sub_inputs = {i.name for i in ref_model.graph.input}
            made = {o for nd in ref_model.graph.node for o in nd.output if o}
            need = {p.tensor for p in pairs} | (set(iso.boundary.values()) if iso else set())
            need |= {seg.leaves} if seg.leaves else set()
            marked = sorted((need & made) - sub_inputs)
            n_feeds = len(self.feeds)
            refs: list[dict[str, np.ndarray]] = []
            with Ticker(span, 0.0, 0.3, f"{where}: reference") as tick:
                t1 = time.perf_counter()
                session = self.ref_engine.prepare(ref_model, marked)
                ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t1
                t1 = time.perf_counter()
                try:
                    for fi, feed in enumerate(self.feeds):
                        tick(0.3 * fi / n_feeds, f"{where}: reference, feed {fi + 1}/{n_feeds}")
                        given = {k: v for k, v in feed.items() if k in sub_inputs}
                        given.update({k: v for k, v in ref_chain[fi].items() if k in sub_inputs})
                        values = dict(session.run(given))
                        values.update({k: v for k, v in feed.items() if k in self.ref_inputs})
                        values.update(ref_chain[fi])
                        refs.append(values)
                finally:
                    session.close()
                ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t1
            self._candidate(ctx, cand_files.skeleton, pairs, refs, cand_chain, out, record, cand_enters, cand_leaves,
                            seg, outs, span, where)
            if iso is not None and iso.outputs:
                with Ticker(span, 0.6, 1.0, f"{where}: every node alone on the candidate (culprit search)") as tick:
                    _run_isolation(ctx, iso, refs, out,
                                   _FeedSteps(tick, 0.6, 0.4, f"{where}: every node alone", n_feeds))
            for fi in range(n_feeds):
                ref_chain[fi] = {seg.leaves: refs[fi][seg.leaves]} if seg.leaves else {}
            del refs
        finally:
            unregister(ref_model, cand_model)
            self._current = None
            cand_files.close()
            ref_files.close()
        self.segment_records.append(record)

    def _candidate(self, ctx, model, pairs, refs, cand_chain, out, record, cand_enters, cand_leaves, seg, outs,
                   span, where) -> None:
        """The candidate segment on its own chain's frontier value (the full run's error) and, past the first
        segment, on the reference's (the error the segment introduces by itself)."""
        ends = [(seg.leaves, cand_leaves)] if seg.leaves else [(o, self.candidate_name(o)) for o in outs]
        marked = list(dict.fromkeys([p.candidate for p in pairs] + [c for _, c in ends]))
        sub_inputs = {i.name: i for i in model.graph.input}
        dtype = _np_dtype(sub_inputs[cand_enters]) if cand_enters in sub_inputs else None
        alone = {r: ErrorStats() for r, _ in ends}
        n_feeds = len(self.feeds)
        with Ticker(span, 0.3, 0.6, f"{where}: candidate") as tick:
            t0 = time.perf_counter()
            session = ctx.prepare_candidate(model, marked)
            ctx.timing["build_s"] = ctx.timing.get("build_s", 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                for fi, cfeed in enumerate(self.cand_feeds):
                    tick(0.3 + 0.3 * fi / n_feeds, f"{where}: candidate, feed {fi + 1}/{n_feeds}")
                    given = {k: v for k, v in cfeed.items() if k in sub_inputs}
                    given.update({k: v for k, v in cand_chain[fi].items() if k in sub_inputs})
                    cand = session.run(given)
                    update_many(_compare_jobs(ctx, out, pairs, refs[fi], cand))
                    cand_chain[fi] = {cand_leaves: cand[cand_leaves]} if cand_leaves else {}
                    del cand
                    if cand_enters in sub_inputs:  # the same segment from the reference's frontier value
                        with np.errstate(over="ignore", invalid="ignore"):
                            given[cand_enters] = np.asarray(refs[fi][seg.enters]).astype(dtype or np.float32)
                        got = session.run(given)
                        for r, c in ends:
                            alone[r].update(refs[fi][r], got[c])
                        del got
            finally:
                session.close()
            ctx.timing["run_s"] = ctx.timing.get("run_s", 0.0) + time.perf_counter() - t0
        end = ends[0][0] if ends else None
        if end is not None and end in out.full:
            record["received"] = out.full[end].metrics()
            record["introduced"] = alone[end].metrics() if cand_enters in sub_inputs else record["received"]

    def _clamps(self, ref_sub, cand_sub, clamped: dict, reader) -> None:
        """Clamp records of the weights this segment's conversion clamped, as :func:`find_clamps` makes them,
        computed on the only values the rule can change (beyond its limits) instead of whole tensors."""
        from ..variants.clamps import _records
        from ..variants.graph_names import node_names

        lo, hi = self.limits
        originals = set(node_names(ref_sub))
        for name, converted in clamped.items():
            a = reader.array(self.source[name]).reshape(-1)
            absa = np.abs(a)
            sel = np.flatnonzero((absa > hi) | ((absa < lo) & (a != 0)))
            del absa
            for r in _records(name, "initializer", a[sel].astype(np.float32), converted.reshape(-1)[sel], hi, lo,
                              cand_sub, originals):
                r.size, r.indices = int(a.size), [int(sel[i]) for i in r.indices]
                self.clamps.append(r.to_json())
            del a


def _small_clamps(original: onnx.ModelProto, converted: onnx.ModelProto, limits) -> list:
    """Clamp records of the constants the graph holds itself (weights are reported segment by segment)."""
    from ..variants.clamps import find_clamps

    def embedded(model: onnx.ModelProto) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        kept = [t for t in out.graph.initializer if not (is_stub(t) or t.data_location == TensorProto.EXTERNAL)]
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
        return out

    return find_clamps(embedded(original), embedded(converted), max_finite=limits[1], min_positive=limits[0])


def _fmt(value) -> str:
    if value is None:  # not measured: as the comparison's tables print it
        return "-"
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _np_dtype(vi: onnx.ValueInfoProto):
    et = vi.type.tensor_type.elem_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(et)) if et else None


def _fp16_skeleton(skeleton: onnx.ModelProto, inferred: onnx.ModelProto, keep_fp32):
    """The FP16 converter's weight-free output for the whole graph (ORT's converter, else onnxconverter-common's,
    as :func:`workbench.variants.fp16.to_fp16` picks), its variant record and its limits."""
    from ..core.shapes import map_model_tensors, stub_tensor
    from ..errors import VariantError
    from ..variants.fp16 import CONVERTERS, DEFAULT_LIMITS, _type_problem, convert_weight_free, infer_source
    from ..variants.graph_names import check_node_names, map_tensors
    from ..variants.result import VariantResult

    keep = check_node_names(skeleton, keep_fp32, "keep_fp32")
    # references into the model's files become stubs: the checks then know them for weight-free
    skeleton = map_model_tensors(skeleton, lambda t, _key: stub_tensor(t) if t.data_location == TensorProto.EXTERNAL
                                 else None)
    skipped: dict[str, str] = {}
    for name in CONVERTERS:
        limits = DEFAULT_LIMITS[name]
        try:
            converted, counter = convert_weight_free(name, skeleton, inferred, keep, limits)
        except Exception as e:  # noqa: BLE001 - converters raise anything
            skipped[name] = f"it raised {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}"
            continue
        problem = _type_problem(infer_source(converted))
        if problem:
            skipped[name] = f"its model is rejected by onnx type and shape inference: {problem[:300]}"
            continue
        notes = [f"{CONVERTERS[o]} skipped: {why}" for o, why in skipped.items()]
        notes.append("weights converted segment by segment (streaming)")
        details = {"converter_module": CONVERTERS[name], "min_positive_val": limits[0], "max_finite_val": limits[1],
                   "skipped_converters": dict(skipped)}
        var = VariantResult(model=converted, variant="fp16", converter=name, tensor_map=map_tensors(skeleton,
                            converted), kept_fp32=list(keep), notes=notes, details=details)
        return converted, var, limits, counter.clamped > 0
    reasons = "; ".join(f"{CONVERTERS[n]}: {why}" for n, why in skipped.items())
    raise VariantError(f"no FP16 converter produced a model ONNX Runtime accepts ({reasons})",
                       "keep the failing nodes in float32 with --keep-fp32")
