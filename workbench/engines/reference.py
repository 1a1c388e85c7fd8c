"""The golden reference: onnx's ReferenceEvaluator on a float64 copy of the model."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..errors import EngineRunError
from .base import Engine, Feeds, Session
from .reference_fixes import NEW_OPS

log = logging.getLogger(__name__)

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
#: INT attributes that name an output element type (Cast.to, RandomNormal.dtype, EyeLike.dtype, ...).
#: LayerNormalization.stash_type stays: the evaluator only implements stash_type=1.
TYPE_ATTRIBUTES = {"to", "dtype"}


class ReferenceEngine(Engine):
    """``onnx.reference.ReferenceEvaluator`` in float64: every float tensor, constant and cast is widened, float
    feeds are cast to float64 and results come back as float64 (the caller compares).

    ``precision="native"`` runs the model in its own types instead: an FP16 variant then computes with numpy
    float16 arithmetic (``ref:fp16``), an emulation of FP16 storage and arithmetic that shows overflow which
    ONNX Runtime's CPU provider hides (it runs most FP16 ops in FP32). ``accumulate="float32"`` (the default)
    runs the nodes that accumulate (GEMMs, convolutions, reductions, softmax, normalizations) in FP32 with FP16
    inputs and outputs, as GPU kernels do (:mod:`workbench.engines.fp16_arith`, checked against CUDA FP16 by
    ``scripts/gpu_check.py``); ``"float16"`` keeps onnx's evaluator's own float16 arithmetic inside them.
    Summation order still differs from GPU kernels (a few FP16 ulps).
    """

    name = "ref"
    label = ("onnx's ReferenceEvaluator in float64: the golden answer ('ref:fp16': the FP16 variant in FP16 "
             "arithmetic as GPU kernels do it, an emulation that shows FP16 overflow on a CPU)")
    variants = ("fp32", "fp16")

    def __init__(self, precision: str = "float64", accumulate: str = "float32"):
        from .fp16_arith import MODES

        if precision not in ("float64", "native"):
            raise ValueError(f"precision must be 'float64' or 'native', not {precision!r}")
        if accumulate not in MODES:
            raise ValueError(f"accumulate must be one of {', '.join(MODES)}, not {accumulate!r}")
        self.precision = precision
        self.accumulate = accumulate

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        from onnx.reference import ReferenceEvaluator

        from ..model.graph import sort_nodes
        from .files import files_for

        files = files_for(model)
        if files is not None:  # weights on disk (skeleton references): load them into a private copy
            model = files.materialize(model)
        else:  # weights left in the user's files (over the inline limit): the evaluator needs them in memory
            from ..model.mapped import materialized

            model = materialized(model)
        # a copy (the evaluator keeps its nodes), in topological order (it runs nodes in file order)
        wide = sort_nodes(to_float64(model) if self.precision == "float64" else self._native(model))
        try:
            evaluator = ReferenceEvaluator(wide, new_ops=NEW_OPS)
        except (NotImplementedError, TypeError, ValueError, KeyError, RuntimeError) as e:
            raise EngineRunError(f"onnx's ReferenceEvaluator cannot run this model: {_one_line(e)}",
                                 "compare against ort instead of ref for this model") from e
        known = {i.name for i in wide.graph.input} | {i.name for i in wide.graph.initializer}
        known |= {o for n in wide.graph.node for o in n.output if o}
        unknown = [n for n in outputs if n not in known]
        if unknown:
            raise EngineRunError(f"no top-level tensor named {', '.join(unknown[:5])} in the model",
                                 "tensors inside If/Loop/Scan bodies cannot be marked; mark the node's output")
        return ReferenceSession(evaluator, list(dict.fromkeys(outputs)), wide, widen=self.precision == "float64")

    def _native(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` in its own types; accumulating FP16 nodes run in FP32 unless told otherwise."""
        if self.accumulate != "float32":
            return _copy(model)
        from ..core.shapes import elem_type_of, infer_shapes_lenient, value_types
        from .fp16_arith import accumulate_in_float32

        types = value_types(infer_shapes_lenient(model))
        elem = {name: elem_type_of(types, name) for name in types}
        out, wrapped = accumulate_in_float32(model, elem)
        log.debug("ref native: %d accumulating FP16 node(s) computed in FP32", wrapped)
        return out

    def describe(self) -> dict:
        if self.precision == "float64":
            dtype = "float64"
        else:
            dtype = ("native (model's own types, numpy arithmetic; FP16 accumulations in FP32 as GPU kernels do)"
                     if self.accumulate == "float32" else "native (model's own types, numpy float16 arithmetic)")
        return {"engine": self.name, "onnx": onnx.__version__, "dtype": dtype}


class ReferenceSession(Session):
    def __init__(self, evaluator, outputs: list[str], model: onnx.ModelProto, widen: bool = True):
        self._evaluator = evaluator
        self.outputs = outputs
        self._ops = {o: n.op_type for n in model.graph.node for o in n.output}
        self._widen = widen

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        wide = {k: (_widen(np.asarray(v)) if self._widen else np.asarray(v)) for k, v in feeds.items()}
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # FP16 overflow is what we measure
                results = self._evaluator.run(None, wide, intermediate=True)
        except (NotImplementedError, TypeError, ValueError, RuntimeError, IndexError, KeyError) as e:
            raise EngineRunError(f"onnx's ReferenceEvaluator failed{_where(e)}: {_one_line(e)}",
                                 "compare against ort instead of ref for this model") from e
        return {name: np.asarray(results[name]) for name in self.outputs}

    def close(self) -> None:
        """Drop the evaluator, freed at once: onnx's ReferenceEvaluator and its operators reference each other, so
        its weights (the model's worth of arrays, kept by the evaluator) waited for a garbage collection that
        counts objects, not bytes (a 0.9 GB decoder's FP16-arithmetic repair held 2.6 GB of them). The cycle is
        broken instead of collected: a full collection costs ~0.2 s in a notebook's kernel (plotly and ipywidgets
        loaded: 400k objects to visit), and a repair closes a session per build (2.2 s of a 2.3 s repair)."""
        if self._evaluator is not None:
            _release(self._evaluator)
            self._evaluator = None


def _release(evaluator, seen: set[int] | None = None) -> None:
    """Break the reference cycles of onnx's ReferenceEvaluator (evaluator -> operators -> their ``run_params``
    dict -> a logging lambda -> the evaluator; a context-dependent function node's ``parent`` and ``impl_``),
    subgraph and function evaluators (If/Loop/Scan bodies, local functions) included, so that dropping the last
    reference frees it and its arrays. Each evaluator once; its operators are emptied (the session is closed)."""
    seen = set() if seen is None else seen
    if id(evaluator) in seen:
        return
    seen.add(id(evaluator))
    nodes = list(getattr(evaluator, "rt_nodes_", None) or [])
    functions = getattr(evaluator, "functions_", None)
    inner = [v for v in (functions.values() if isinstance(functions, dict) else ()) if hasattr(v, "rt_nodes_")]
    for node in nodes:
        attrs = getattr(node, "__dict__", None)
        if attrs is None:
            continue
        inner += [v for v in attrs.values() if hasattr(v, "rt_nodes_")]
        params = attrs.get("run_params")
        if isinstance(params, dict):
            params.clear()
        attrs.clear()
    vars(evaluator).clear()
    for other in inner:
        _release(other, seen)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose float/float16/bfloat16 tensors, constants, casts and value types are float64,
    subgraphs and local functions included."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    _widen_graph(wide.graph)
    for function in wide.functions:
        for node in function.node:
            _widen_node(node)
    return wide


def _widen_graph(graph: onnx.GraphProto) -> None:
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type in FLOAT_TYPES:
            graph.initializer[i].CopyFrom(_widen_tensor(tensor))
    for sparse in graph.sparse_initializer:
        if sparse.values.data_type in FLOAT_TYPES:
            sparse.values.CopyFrom(_widen_tensor(sparse.values))
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        _widen_type(value.type)
    for node in graph.node:
        _widen_node(node)


def _widen_node(node: onnx.NodeProto) -> None:
    for attr in node.attribute:
        if attr.type == AttributeProto.TENSOR and attr.t.data_type in FLOAT_TYPES:
            attr.t.CopyFrom(_widen_tensor(attr.t))
        elif attr.type == AttributeProto.TENSORS:
            for t in attr.tensors:
                if t.data_type in FLOAT_TYPES:
                    t.CopyFrom(_widen_tensor(t))
        elif attr.type == AttributeProto.INT and attr.name in TYPE_ATTRIBUTES and attr.i in FLOAT_TYPES:
            attr.i = TensorProto.DOUBLE
        elif attr.type == AttributeProto.GRAPH:
            _widen_graph(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            for g in attr.graphs:
                _widen_graph(g)
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        _widen_constant_scalars(node)


def _widen_constant_scalars(node: onnx.NodeProto) -> None:
    """Constant(value_float[s]=...) produces float32: rewrite it as a float64 ``value`` tensor."""
    for i, attr in enumerate(node.attribute):
        if attr.name in ("value_float", "value_floats"):
            data = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float64)
            del node.attribute[i]
            node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(data, attr.name)))
            return


def _widen_tensor(tensor: TensorProto) -> TensorProto:
    array = numpy_helper.to_array(tensor).astype(np.float64)
    return numpy_helper.from_array(array, tensor.name)


def _widen_type(tp: onnx.TypeProto) -> None:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type" and tp.tensor_type.elem_type in FLOAT_TYPES:
        tp.tensor_type.elem_type = TensorProto.DOUBLE
    elif kind == "sequence_type":
        _widen_type(tp.sequence_type.elem_type)
    elif kind == "optional_type":
        _widen_type(tp.optional_type.elem_type)
    elif kind == "map_type":
        _widen_type(tp.map_type.value_type)


def _widen(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array


def _where(exc: BaseException) -> str:
    """' in Op node NAME' when the traceback shows which node the evaluator was running."""
    tb = exc.__traceback__
    node = None
    while tb is not None:
        op = tb.tb_frame.f_locals.get("self")
        if op is not None and hasattr(op, "onnx_node"):
            node = op.onnx_node
        tb = tb.tb_next
    return f" in {node.op_type} node {node.name or node.output[0]}" if node is not None else ""


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:400]
