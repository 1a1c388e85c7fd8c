"""One comparison plan: everything a comparison needs, built once and shared by every consumer.

``ComparisonPlan(model, reference, candidate, feeds=..., cand_model=..., options=CompareOptions(...))`` loads the
model, makes the precision variant (or loads the user's candidate file), infers both sides' precision, pairs
their tensors, casts the feeds, picks the criterion and floors, and builds the engines on first use. compare()
runs it (:meth:`run`); the layer probe, the report's tensor capture, interop recording, bundles, rerun and
repair read the same plan instead of rebuilding the setup. Shape inference runs once per side, on weight-free
copies; the models that run are never copied.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from functools import cached_property
from typing import Any

import onnx

from .. import __version__
from ..core.feeds import cast_feeds
from ..core.progress import Progress, Steps
from ..core.shapes import infer_shapes_lenient, value_types
from ..engines import get_engine, should_isolate
from ..engines.base import Engine
from ..engines.spec import EngineSpec
from ..errors import InputError, SpecError
from ..model.graph import GraphInfo
from ..model.load import LoadedModel, is_torch_module, load_model
from ..model.precision import Precision, infer_precision, lossier, module_precision
from ..model.validate import check_structure
from .criterion import Criterion
from .floor import tensor_formats
from .options import CompareOptions
from .pairs import pair_tensors

log = logging.getLogger(__name__)

#: variants of the torch engines that change the arithmetic but not the ONNX graph
MODULE_ONLY_VARIANTS = ("tf32", "autocast")


def runs_module(spec: EngineSpec) -> bool:
    """The engine runs the torch.nn.Module itself (``torch``, ``torch-cuda``)."""
    from ..engines.registry import class_for

    return bool(getattr(class_for(spec.engine), "runs_module", False))


def make_engine(spec: EngineSpec, *, isolate: bool | None = None, options: dict | None = None,
                timeout_s: float | None = None) -> Engine:
    """The engine for ``spec``, in a worker process where it may crash the caller (TensorRT, GPU providers)."""
    opts = dict(options or {})
    if spec.engine == "ref" and spec.variant != "fp32":
        opts.setdefault("precision", "native")
    if runs_module(spec):  # the torch engines apply the variant to the module itself
        opts["variant"] = spec.variant
    if isolate is None:
        isolate = should_isolate(spec.engine)
    if isolate:
        from ..engines.isolated import IsolatedEngine

        return IsolatedEngine(spec.engine, opts, timeout_s=timeout_s or 600)
    return get_engine(spec.engine, **opts)


def names_list(names: list[str], most: int = 4) -> str:
    """Up to ``most`` names, comma-separated and shown safely, then how many more."""
    from ..textfmt import safe_name

    shown = ", ".join(safe_name(n, 80) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _check_outputs_paired(ref: GraphInfo, pairs: list, candidate: onnx.ModelProto) -> list[str]:
    """The verdict is read from the graph outputs: refuse a comparison where none can be compared (every output a
    graph input, or a candidate file that computes none of them under their names; a graph with no output is
    refused by :func:`check_structure`). Notes for the outputs left out when only some are missing."""
    from ..errors import InputError

    outputs = list(dict.fromkeys(ref.outputs))
    computed = [o for o in outputs if o not in set(ref.inputs)]
    if not computed:
        raise InputError(f"every graph output of the model is one of its inputs ({names_list(outputs)}): it computes "
                         "nothing to compare", "compare a model whose outputs are computed by its nodes")
    paired = {p.tensor for p in pairs}
    missing = [o for o in computed if o not in paired]
    if len(missing) == len(computed):
        theirs = [o.name for o in candidate.graph.output]
        raise InputError(f"the candidate computes none of the reference's graph outputs ({names_list(computed)}); its "
                         f"outputs are {names_list(theirs) or 'none'}: nothing would be compared",
                         "a candidate file (--cand-model) must keep the tensor names of the model it was made from: "
                         "pass that model as the reference")
    return [f"graph output(s) {names_list(missing)} have no tensor of that name in the candidate: not compared"] \
        if missing else []


def _check_native(variant: str, model: onnx.ModelProto, name: str) -> None:
    """Refuse ``ref:fp16``/``ref:bf16`` on a file without that type: it would run in another arithmetic."""
    want = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[variant]
    g = model.graph
    found = any(t.data_type == want for t in g.initializer) or any(
        v.type.tensor_type.elem_type == want for v in (*g.input, *g.output, *g.value_info)) or any(
        a.name == "to" and a.i == want for n in g.node if n.op_type == "Cast" for a in n.attribute)
    if not found:
        raise SpecError(f"--cand ref:{variant} runs the candidate file in {variant.upper()} arithmetic, but {name} "
                        f"holds no {variant.upper()} tensor", "use --cand ref (float64) for this file, or pass "
                        f"its {variant.upper()} conversion")


class PlanEngines:
    """The engines of a plan, made on first use, and their JSON: shared by :class:`ComparisonPlan` and the streamed
    plan (:class:`workbench.compare.stream.StreamPlan`). Needs ``_lock``, ``_engines``, ``options``,
    ``engine_options``, ``ref_spec``/``cand_spec`` and ``ref_precision``/``cand_precision``."""

    def _engine(self, side: str, spec: EngineSpec) -> Engine:
        with self._lock:
            if side not in self._engines:
                self._engines[side] = make_engine(spec, isolate=self.options.isolate,
                                                  options=self.engine_options.get(spec.engine),
                                                  timeout_s=self.options.timeout_s)
            return self._engines[side]

    @property
    def ref_engine(self) -> Engine:
        return self._engine("reference", self.ref_spec)

    @property
    def cand_engine(self) -> Engine:
        return self._engine("candidate", self.cand_spec)

    def describe_engines(self) -> dict:
        return {"reference": _describe(self.ref_engine), "candidate": _describe(self.cand_engine),
                "workbench": __version__}

    def precision_json(self) -> dict:
        return {side: {"precision": p.precision, "precision_source": p.source, "family": p.family}
                for side, p in (("reference", self.ref_precision), ("candidate", self.cand_precision))}


class ComparisonPlan(PlanEngines):
    """The setup of one comparison (see the module docstring). ``reference_engine``/``candidate_engine``: Engine
    instances used instead of the ones the specs name (the spec still picks the variant), e.g. a recorded run."""

    def __init__(self, model: Any, reference: str | EngineSpec = "ort", candidate: str | EngineSpec = "ort:fp16",
                 *, feeds: Any = None, cand_model: Any = None, options: CompareOptions | dict | None = None,
                 example_inputs: Any = None, reference_engine: Engine | None = None,
                 candidate_engine: Engine | None = None, **option_overrides: Any):
        t0 = time.perf_counter()
        self.options = opts = CompareOptions.build(options, **option_overrides)
        self.ref_spec, self.cand_spec = EngineSpec.parse(reference), EngineSpec.parse(candidate)
        self.timing: dict[str, float] = {}
        self.notes: list[str] = []
        self.module = model if is_torch_module(model) else None
        torch_side = next((s for s in (self.ref_spec, self.cand_spec) if runs_module(s)), None)
        if self.module is None and torch_side is not None:
            raise SpecError(f"the '{torch_side.engine}' engine runs a torch.nn.Module: pass the module itself as the "
                            "model", "compare(module, 'torch', 'ort', example_inputs=(x,)) exports it and runs both")
        self.model_source, self.cand_source = model, cand_model
        self.original = model if isinstance(model, LoadedModel) else load_model(model, example_inputs=example_inputs)
        check_structure(self.original.proto)  # a cycle or a tensor made twice is the model's fault, not an engine's
        self._owns_loaded = not isinstance(model, LoadedModel)
        self.engine_options = dict(opts.engine_options)
        if self.module is not None:  # the torch engines run the module itself
            for spec in {s.engine: s for s in (self.ref_spec, self.cand_spec) if runs_module(s)}.values():
                self.engine_options[spec.engine] = {"module": self.module, "example_inputs": example_inputs,
                                                    **self.engine_options.get(spec.engine, {})}
        self.feeds, self.feed_info = _feeds(self.original.proto, feeds, opts)
        calib = opts.calibration_feeds
        if isinstance(calib, int) and not isinstance(calib, bool):  # N seeded random calibration feeds
            from ..inputs.generate import random_feeds

            if calib < 1:
                raise InputError(f"calibration needs at least one feed, not {calib}", "give N >= 1, a file or a folder")
            self.options = opts = opts.replace(calibration_feeds=random_feeds(  # seed + 1: not the compared feeds
                self.original.proto, seed=int(opts.seed or 0) + 1, count=calib, shapes=opts.input_shapes,
                ranges=opts.val_ranges))
        self.loaded = _inline_decided_ifs(self.original, self.feeds, self.notes) if opts.inline_branches \
            else self.original
        t1 = time.perf_counter()
        # reference side
        self.ref_variant = self._variant(self.ref_spec) if self.ref_spec.variant != "fp32" else None
        self.ref_model = self.ref_variant.model if self.ref_variant else self.loaded.proto
        self.ref_graph = GraphInfo.build(infer_shapes_lenient(self.ref_model)) if self.ref_variant \
            else self.loaded.graph
        # candidate side
        if cand_model is not None:
            native = self.cand_spec.engine == "ref" and self.cand_spec.variant in ("fp16", "bf16")
            if self.cand_spec.variant != "fp32" and not native:
                raise SpecError(f"--cand-model is already the candidate's variant; drop ':{self.cand_spec.variant}' "
                                f"from {str(candidate)!r}", f"use --cand {self.cand_spec.engine}")
            cand_loaded = load_model(cand_model)
            self.cand_model = cand_loaded.proto
            if native:  # 'ref:fp16' on a user's file: that file in its own arithmetic (numpy FP16), not converted
                _check_native(self.cand_spec.variant, self.cand_model, cand_loaded.name)
            self.views: dict[str, str | None] = {}
            if any(n.op_type == "DequantizeLinear" for n in self.cand_model.graph.node):
                from ..variants.int8 import qdq_outputs  # a user's Q/DQ file: compare what consumers read

                self.views = dict(qdq_outputs(self.cand_model, self.ref_model))
            self.variant_info = {"variant": "user model", "file": cand_loaded.name,
                                 "sha256": cand_loaded.fingerprint}
            self.clamps = _user_file_changes(self.ref_model, self.cand_model, self.variant_info)
        else:
            var = self._variant(self.cand_spec)
            self.cand_model = var.model
            self.views = {**var.tensor_map, **var.details.get("qdq_outputs", {})}
            self.variant_info = var.to_json()
            self.clamps = self.variant_info.get("clamped", [])
        self.timing["variant_s"] = time.perf_counter() - t1
        self.cand_inferred = infer_shapes_lenient(self.cand_model)
        self.cand_types = value_types(self.cand_inferred)
        # precision and criterion
        self.ref_precision = self._precision(self.ref_spec, self.ref_model)
        self.cand_precision = self._precision(self.cand_spec, self.cand_model)
        self.family = lossier(self.ref_precision, self.cand_precision).family
        given = opts.criterion
        self.criterion = given if isinstance(given, Criterion) else (
            Criterion.parse(given) if given else Criterion.default_for(self.family))
        # pairs, boundaries, feeds, floors
        self.pairs = pair_tensors(self.ref_graph, self.cand_inferred, self.views)
        self.pairs = _drop_conflicting(self.ref_graph, self.cand_types, self.pairs, self.notes,
                                       user_file=self.cand_source is not None)
        self.notes += _check_outputs_paired(self.ref_graph, self.pairs, self.cand_model)
        self.granularity: dict = {}
        if opts.granularity == "fused":  # only the candidate engine's fused-group boundaries
            from ..engine_graphs.granularity import restrict

            self.pairs, self.granularity = restrict(self)
        self.ref_inputs = set(self.ref_graph.inputs)
        self.known = {p.candidate: p.tensor for p in self.pairs}
        self.known |= {i.name: i.name for i in self.cand_model.graph.input if i.name in self.ref_inputs}
        self.cand_feeds = cast_feeds(self.cand_model, self.feeds)
        elem = {name: tp.tensor_type.elem_type for name, tp in self.cand_types.items() if tp.HasField("tensor_type")}
        by_cand = tensor_formats(self.cand_model, elem, [p.candidate for p in self.pairs])
        self.formats = {p.tensor: by_cand[p.candidate] for p in self.pairs if p.candidate in by_cand}
        self._files = self._write_weights(reference_engine, candidate_engine)
        self._engines: dict[str, Engine] = {}
        if reference_engine is not None:
            self._engines["reference"] = reference_engine
        if candidate_engine is not None:
            self._engines["candidate"] = candidate_engine
        self.custom_engines = [k for k, e in (("reference", reference_engine), ("candidate", candidate_engine)) if e]
        self._lock = threading.Lock()
        #: culprits run every node alone on the candidate engine: not possible where it runs the nn.Module
        self.isolates_candidate = not runs_module(self.cand_spec)
        if opts.culprits and not self.isolates_candidate:
            self.notes.append(f"no culprit ranking: '{self.cand_spec}' runs the torch.nn.Module, which cannot run one "
                              "ONNX node alone; the layer-wise errors still show where the answers part")
        if self.cand_spec.engine == "ort" and self.cand_precision.family == "fp16":
            self.notes.append("ONNX Runtime's CPU provider runs most FP16 ops in FP32 (it inserts Casts), so FP16 "
                              "arithmetic overflow does not show on 'ort'; converter clamps and FP16 storage do. Use "
                              "'ref:fp16' (FP16 arithmetic in numpy) or a GPU engine (ort-cuda:fp16, trt:fp16).")
        self.timing["setup_s"] = time.perf_counter() - t0

    # --- pieces -------------------------------------------------------------------------------------------
    def _write_weights(self, reference_engine, candidate_engine) -> dict:
        """Write each side's weights once for engines that build sessions from files (ORT, OpenVINO): every
        session then maps them instead of copying them (see :mod:`workbench.engines.files`)."""
        from ..engines.files import ModelFiles, register, unregister_ids
        from ..engines.registry import class_for

        files: dict = {}
        self._registered: list[int] = []  # ids the finalizer unregisters (shared with it, never holding the plan)
        for side, spec, model, custom in (("reference", self.ref_spec, self.ref_model, reference_engine),
                                          ("candidate", self.cand_spec, self.cand_model, candidate_engine)):
            if custom is not None or not getattr(class_for(spec.engine), "reads_files", False):
                continue
            t0 = time.perf_counter()
            files[side] = ModelFiles(model)
            register(model, files[side])
            self._registered.append(id(model))
            self.timing["weights_s"] = self.timing.get("weights_s", 0.0) + time.perf_counter() - t0
        if files:
            weakref.finalize(self, unregister_ids, self._registered)
        return files

    def release_weights(self) -> None:
        """Let go of in-memory weights that sessions read from disk anyway: each side whose weights were written
        becomes its weight-free skeleton (registered to the same files, so every session still maps them), and a
        model this plan loaded itself keeps only its skeleton. Engines that need values in memory (onnx's reference
        evaluator) load them from the files. compare() does this; plans that build new models from the weights
        (repair, reduce) keep them."""
        from ..core.shapes import strip_weights
        from ..engines.files import register, unregister

        released = False
        for side, attr in (("reference", "ref_model"), ("candidate", "cand_model")):
            files = self._files.get(side)
            old = getattr(self, attr)
            if files is None or old is files.skeleton:
                continue
            unregister(old)
            register(files.skeleton, files)
            self._registered.append(id(files.skeleton))
            setattr(self, attr, files.skeleton)
            released = True
        if released and self._owns_loaded and "reference" in self._files and self.ref_variant is None:
            for loaded in {id(self.original): self.original, id(self.loaded): self.loaded}.values():
                loaded.proto = self.ref_model if loaded is self.loaded else strip_weights(loaded.proto)


    @property
    def isolation_source(self) -> onnx.ModelProto:
        """What isolation models are cut from: the candidate's weight-free skeleton when its weights are on disk
        (the isolation model then references them), else the candidate model."""
        files = self._files.get("candidate")
        return files.skeleton if files is not None else self.cand_model

    @contextlib.contextmanager
    def derived(self, model: onnx.ModelProto):
        """Sessions of ``model``, built from the candidate's skeleton (an isolation model), read the candidate's
        weights file while the block runs."""
        from ..engines.files import register, unregister

        files = self._files.get("candidate")
        if files is None:
            yield model
            return
        register(model, files)
        try:
            yield model
        finally:
            unregister(model)
    def _variant(self, spec: EngineSpec):
        return self.variant_of(self.loaded.proto, spec)

    def variant_of(self, model: onnx.ModelProto, spec: EngineSpec, **options):
        """``spec``'s variant of ``model`` made as this plan makes its own (the same calibration feeds and nodes
        kept in FP32; ``options`` go to the converter): a :class:`~workbench.variants.result.VariantResult`."""
        from ..variants import make_variant

        # torch-cuda's tf32/autocast change the arithmetic, not the graph: the export names its tensors
        variant = "fp32" if runs_module(spec) and spec.variant in MODULE_ONLY_VARIANTS else spec.variant
        return make_variant(model, variant, calibration_feeds=self.calibration_feeds,
                            keep_fp32=self.options.keep_fp32, **options)

    @property
    def calibration_feeds(self) -> list[dict]:
        """The feeds this plan's variants are calibrated on: the options' calibration set, else the compared feeds."""
        calib = self.options.calibration_feeds
        return calib if calib is not None else self.feeds

    def _precision(self, spec: EngineSpec, model: onnx.ModelProto) -> Precision:
        if runs_module(spec) and self.module is not None:
            return module_precision(self.module, spec.variant)
        return infer_precision(model)

    @cached_property
    def pair_by_tensor(self) -> dict:
        return {p.tensor: p for p in self.pairs}

    def candidate_name(self, tensor: str) -> str:
        """The candidate tensor standing for reference ``tensor`` (renamed or quantized view)."""
        from ..errors import WorkbenchError

        if tensor in self.views and self.views[tensor] is None:
            raise WorkbenchError(f"tensor {tensor!r} has no counterpart in the candidate model", "pick another layer")
        pair = self.pair_by_tensor.get(tensor)
        return pair.candidate if pair is not None else (self.views.get(tensor) or tensor)

    # --- running -------------------------------------------------------------------------------------------
    def run(self, progress: Progress | None = None, cancel: threading.Event | None = None):
        """Compare layer by layer, rank culprits, measure their impact: a :class:`CompareResult`."""
        from .run import run_plan

        return run_plan(self, Steps(progress, cancel))

    def close(self) -> None:
        """Stop worker processes of isolated engines and delete the weights written for sessions."""
        from ..engines.files import unregister

        unregister(self.ref_model, self.cand_model)
        for files in self._files.values():
            files.close()
        for engine in self._engines.values():
            close = getattr(engine, "close", None)
            if callable(close) and engine is not None and type(engine).__name__ == "IsolatedEngine":
                close()


def _describe(engine: Engine) -> dict:
    try:
        return engine.describe()
    except Exception as e:  # noqa: BLE001 - a description must never fail a finished comparison
        return {"error": str(e)}


def _feeds(model: onnx.ModelProto, feeds: Any, opts: CompareOptions) -> tuple[list[dict], dict]:
    from ..core.budget import check_run_fits, parse_size
    from ..inputs import check_feeds, feeds_from, random_feeds
    from ..inputs.generate import planned_feed

    budget, explicit = parse_size(opts.memory_budget), opts.memory_budget is not None
    if feeds is None:  # sized before a byte is allocated
        check_run_fits(model, [planned_feed(model, opts.input_shapes)] * opts.feed_count, budget, explicit)
        made = random_feeds(model, seed=opts.seed, count=opts.feed_count, shapes=opts.input_shapes,
                            ranges=opts.val_ranges, max_bytes=budget)
        return made, {"source": "random", "seed": opts.seed, "count": len(made), "shapes": opts.input_shapes,
                      "ranges": opts.val_ranges}
    source = str(feeds) if isinstance(feeds, (str, bytes)) or hasattr(feeds, "__fspath__") else type(feeds).__name__
    given = check_feeds(model, feeds_from(feeds))
    check_run_fits(model, given, budget, explicit)
    return given, {"source": source, "count": len(given)}


def _drop_conflicting(ref_graph, cand_types: dict, pairs: list, notes: list[str], user_file: bool) -> list:
    """``pairs`` less those whose tensors cannot have the same shape (:func:`~.pairs.conflicting_shapes`), with a
    note; a user's candidate file where most named tensors conflict is refused: it is another model, not a
    conversion of the reference."""
    from .pairs import conflicting_shapes

    bad = conflicting_shapes(ref_graph, cand_types, pairs)
    if not bad:
        return pairs
    p, ours, theirs = bad[0]
    example = f"{p.tensor} {list(ours)} in the reference, {list(theirs)} in the candidate"
    if user_file and len(bad) * 2 > len(pairs):
        raise InputError(f"the candidate file does not look like a conversion of the reference: {len(bad)} of "
                         f"{len(pairs)} tensors of the same name have other shapes (first: {example})",
                         "compare a conversion of this model (the same graph in another precision): tensors are "
                         "matched by name")
    notes.append(f"{len(bad)} tensor(s) of the same name have other shapes on the two sides and were not compared "
                 f"(first: {example})")
    dropped = {id(q) for q, _, _ in bad}
    return [q for q in pairs if id(q) not in dropped]


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
    if not taken:
        return loaded
    from ..model.mapped import reloadable

    inlined, base_dir = reloadable(inline_ifs(loaded.proto, taken))  # weights left in files stay there
    return load_model(inlined, base_dir=base_dir)


def _user_file_changes(reference: onnx.ModelProto, candidate: onnx.ModelProto, info: dict) -> list[dict]:
    """Constants of a user's own candidate file that differ from the reference's beyond their format's rounding
    (clamped, flushed or re-quantized), as clamp records the explanations read."""
    from ..variants.clamps import find_changed_constants

    records = [r.to_json() for r in find_changed_constants(reference, candidate)]
    if records:
        info["clamped"] = records
    return records
