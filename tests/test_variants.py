"""Precision variants on real converters and ONNX Runtime, checked against independent FP32 runs.

References are computed with onnxruntime directly on the untouched original models; agreement is measured
with numpy (max relative error, cosine similarity).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLES
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import VariantError
from workbench.model.load import load_model
from workbench.variants import make_variant
from workbench.variants.fp16 import to_fp16
from workbench.variants.int8 import to_int8

BN = "/bn_big_var/BatchNormalization"


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(str(SAMPLES / name))


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _rel(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _image(shape) -> dict:
    return {"image": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def _names_survive(original: onnx.ModelProto, result) -> None:
    """Every original node output exists in the variant under its own name or under its tensor_map name."""
    variant_names = {o for n in result.model.graph.node for o in n.output}
    for node in original.graph.node:
        for out in node.output:
            assert result.tensor_map.get(out, out) in variant_names, out


# ---------------------------------------------------------------- FP16


def test_fp16_reports_the_clamped_variance_and_the_flushed_eps():
    model = _load("fp16_clamp_constant.onnx")
    before = model.SerializeToString()
    result = make_variant(model, "fp16")
    assert model.SerializeToString() == before  # the caller's proto is untouched
    assert result.variant == "fp16" and result.converter == "ort"  # ORT's converter is tried first and accepted
    by_name = {(c.name, c.kind): c for c in result.clamped}
    var = by_name[("/bn_big_var/running_var", "overflow")]
    assert var.original == [pytest.approx(9.8e7)] and var.converted == [65504.0]  # ORT clamps at fp16 max
    assert (var.count, var.size, var.indices, var.consumers) == (1, 8, [3], [BN])
    assert var.max_rel_change == pytest.approx(1 - 65504 / 9.8e7)
    eps = by_name[("/head/eps", "underflow")]
    assert eps.original == [pytest.approx(1e-9)] and eps.converted == [float(np.float16(5.96e-8))]
    assert eps.consumers == ["/head/eps/Add"]
    assert result.clamped[0].kind == "overflow"  # overflows rank first
    assert len(result.clamped) == 2
    json.dumps(result.to_json())  # JSON-ready, without the model
    assert "model" not in result.to_json()


def test_fp16_clamp_breaks_outputs_while_a_healthy_cnn_stays_close():
    clamp = _load("fp16_clamp_constant.onnx")
    feed = _image((1, 4, 16, 16))
    ref = _run(clamp, feed)
    got = _run(make_variant(clamp, "fp16").model, feed)
    assert got.dtype == np.float32  # keep_io_types: graph outputs stay float32
    assert _rel(ref, got) > 5  # measured 9.1: channel 3 normalised by sqrt(65504) instead of sqrt(9.8e7)

    healthy = load_model(SAMPLES / "healthy_cnn.onnx")
    feed = _image((1, 3, 32, 32))
    assert _rel(_run(healthy.proto, feed), _run(make_variant(healthy, "fp16").model, feed)) < 1e-2  # measured 4.7e-4


def test_keep_fp32_keeps_the_constant_and_removes_the_error():
    model = _load("fp16_clamp_constant.onnx")
    feed = _image((1, 4, 16, 16))
    result = to_fp16(model, keep_fp32=[BN])
    assert result.kept_fp32 == [BN]
    assert [c.name for c in result.clamped] == ["/head/eps"]  # only the harmless underflow is left
    var = next(t for t in result.model.graph.initializer if t.name == "/bn_big_var/running_var")
    assert var.data_type == TensorProto.FLOAT and numpy_helper.to_array(var)[3] == np.float32(9.8e7)
    inferred = onnx.shape_inference.infer_shapes(result.model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    bn = next(n for n in result.model.graph.node if n.name == BN)
    assert {types[t] for t in list(bn.input) + list(bn.output)} == {TensorProto.FLOAT}
    assert _rel(_run(model, feed), _run(result.model, feed)) < 1e-3  # measured 8.3e-5


@pytest.mark.parametrize("converter, limit", [("ort", 65504.0), ("onnxconverter_common", 1e4)])
def test_each_converter_can_be_forced(converter, limit):
    model = _load("fp16_clamp_constant.onnx")
    feed = _image((1, 4, 16, 16))
    result = to_fp16(model, converter=converter)
    assert result.converter == converter and result.details["max_finite_val"] == limit
    var = next(c for c in result.clamped if c.name == "/bn_big_var/running_var")
    assert var.converted == [limit] and var.consumers == [BN]
    assert any("forced" in n for n in result.notes)
    assert _rel(_run(model, feed), _run(result.model, feed)) > 5  # measured 9.1 (ORT) and 23.7 (1e4 clamp)
    _names_survive(model, result)


def test_auto_falls_back_when_the_ort_converter_raises_or_its_model_is_rejected(monkeypatch):
    import onnxruntime.transformers.float16 as ort_fp16

    model = _load("fp16_clamp_constant.onnx")

    def raises(*args, **kwargs):
        raise RuntimeError("simulated converter crash")

    monkeypatch.setattr(ort_fp16, "convert_float_to_float16", raises)
    result = to_fp16(model)
    assert result.converter == "onnxconverter_common"
    assert "simulated converter crash" in result.details["skipped_converters"]["ort"]
    assert any("skipped" in n for n in result.notes)

    def broken(m, **kwargs):
        bad = onnx.ModelProto()
        bad.CopyFrom(m)
        bad.graph.node[0].op_type = "NoSuchOp"
        return bad

    monkeypatch.setattr(ort_fp16, "convert_float_to_float16", broken)
    result = to_fp16(model)
    assert result.converter == "onnxconverter_common"
    assert "rejected" in result.details["skipped_converters"]["ort"]
    with pytest.raises(VariantError) as err:
        to_fp16(model, converter="ort")
    assert "\n" not in str(err.value) and "keep_fp32" in str(err.value)


def test_fp16_keeps_intermediate_names_on_a_transformer():
    model = _load("transformer_block.onnx")
    for converter in ("ort", "onnxconverter_common"):
        result = to_fp16(model, converter=converter)
        assert result.tensor_map == {}
        _names_survive(model, result)
        assert result.details["inserted_casts"] >= 3  # two inputs and one output cast at least


def test_variant_argument_errors():
    model = _load("fp16_clamp_constant.onnx")
    with pytest.raises(VariantError, match="keep_fp32 names node"):
        make_variant(model, "fp16", keep_fp32=["/no/such/Node"])
    with pytest.raises(VariantError, match="--inputs"):
        make_variant(model, "int8")
    with pytest.raises(VariantError, match="unknown variant"):
        make_variant(model, "fp8")
    copy = make_variant(model, "FP32")
    assert copy.model is not model and copy.model.SerializeToString() == model.SerializeToString()


# ---------------------------------------------------------------- INT8


def _outlier_feeds() -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(32)]


def test_int8_qdq_model_runs_and_the_outlier_costs_accuracy():
    """Column 7 of /mlp/fc2/Add_output_0 sits at ~300-400, so MinMax gives that tensor a scale of ~3 and
    ordinary values (~5) lose almost all resolution: logits keep only cosine ~0.70 to FP32 (measured
    0.696). Percentile 99.9 clips the outlier column (0.05% of elements) and recovers cosine ~0.99."""
    model = _load("int8_outlier.onnx")
    feeds = _outlier_feeds()
    ref = np.concatenate([_run(model, f) for f in feeds])

    result = make_variant(model, "int8", calibration_feeds=feeds)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("QuantizeLinear") >= 5 and ops.count("DequantizeLinear") >= 8
    assert result.details["calibration_method"] == "minmax" and result.details["calibration_feeds"] == 32
    assert result.details["preprocessing"].startswith("ONNX shape inference")  # every tensor typed by it
    assert result.details["calibrator"].startswith("ORT minmax ranges from the tensor scan")
    assert result.excluded_nodes == [] and result.details["opset_upgrade"] is None
    weights = [n for n in result.model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].endswith(
        "weight_quantized")]
    assert weights and all(any(a.name == "axis" for a in n.attribute) for n in weights)  # per-channel weights
    _names_survive(model, result)
    assert result.details["qdq_outputs"]["/mlp/fc2/Add_output_0"] in {o for n in result.model.graph.node
                                                                      for o in n.output}
    minmax = _cos(ref, np.concatenate([_run(result.model, f) for f in feeds]))
    assert 0.6 < minmax < 0.8

    pct = to_int8(model, feeds, method="percentile", percentile=99.9)
    assert _cos(ref, np.concatenate([_run(pct.model, f) for f in feeds])) > 0.98  # measured 0.987


def test_int8_hands_the_typed_model_to_the_quantizer_in_memory(monkeypatch):
    """With our MinMax ranges as its calibration cache, quantize_static gets the model ONNX shape inference typed
    instead of saving, re-inferring and reloading it (its loader is never called), and quantizes it to the same
    bytes as through the file. (``import onnxruntime.quantization.quantize as m`` binds the package's function
    ``quantize``, not the module: the hand-over never happened while it was looked up that way.)"""
    import importlib

    import workbench.variants.int8 as int8

    module = importlib.import_module("onnxruntime.quantization.quantize")
    original, calls = module.load_model_with_shape_infer, []

    def spy(path):
        calls.append(path)
        return original(path)

    monkeypatch.setattr(module, "load_model_with_shape_infer", spy)
    model, feeds = _load("int8_outlier.onnx"), _outlier_feeds()
    handed = to_int8(model, feeds)
    assert calls == []  # in memory
    monkeypatch.setattr(int8, "_can_hand_over", lambda: False)
    written = to_int8(model, feeds)
    assert len(calls) == 1  # through the file: ORT's loader read it
    assert handed.model.SerializeToString() == written.model.SerializeToString()


def _graph_key(model: onnx.ModelProto) -> tuple:
    nodes = [(n.op_type, tuple(n.input), tuple(n.output), [a.SerializeToString() for a in n.attribute])
             for n in model.graph.node]
    return nodes, sorted((t.name, t.SerializeToString()) for t in model.graph.initializer)


def _empty_constant_model() -> tuple[onnx.ModelProto, list[dict]]:
    """x -> Concat(x, an empty float Constant) -> MatMul: ORT's calibrator ranges the empty tensor as (inf, -inf)
    (paddle2onnx's detectors hold such constants)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    empty = helper.make_tensor("e", TensorProto.FLOAT, [1, 0], [])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], name="/c/Constant", value=empty),
         helper.make_node("Concat", ["x", "c"], ["xc"], name="/cat/Concat", axis=1),
         helper.make_node("MatMul", ["xc", "w"], ["y"], name="/mm/MatMul")], "empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, [{"x": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(4)]


@pytest.mark.parametrize("case", ["outlier per-channel", "outlier per-tensor", "empty constant", "outlier weighted",
                                  "cnn weighted"])
def test_int8_fast_path_is_ort_own_pipeline_bit_for_bit(tmp_path, case):
    """Without quant_pre_process and with the scan's min/max as ranges, the INT8 model is node for node and byte
    for byte what ONNX Runtime's documented pipeline (quant_pre_process, then quantize_static with its MinMax
    calibrator) makes of the same model and feeds; in the weighted placement, what it makes quantizing the weighted
    op types alone with their outputs excluded."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from workbench.variants.calibration import data_reader
    from workbench.variants.int8 import WEIGHTED_OPS

    per_channel, weighted = case != "outlier per-tensor", case.endswith("weighted")
    if case == "cnn weighted":
        model = _load("healthy_cnn.onnx")
        feeds = [_image([1, 3, 32, 32]) for _ in range(4)]
    else:
        model, feeds = _empty_constant_model() if case == "empty constant" else (_load("int8_outlier.onnx"),
                                                                                 _outlier_feeds()[:8])
    ours = to_int8(model, feeds, per_channel=per_channel, placement="weighted" if weighted else "all")
    assert ours.details["calibrator"].startswith("ORT minmax ranges from the tensor scan")
    assert ours.details["placement"] == ("weighted" if weighted else "all")
    extra = {"OpTypesToExcludeOutputQuantization": list(WEIGHTED_OPS), "DedicatedQDQPair": True} if weighted else {}
    onnx.save(model, tmp_path / "m.onnx")
    quant_pre_process(str(tmp_path / "m.onnx"), str(tmp_path / "pre.onnx"), skip_optimization=True)
    quantize_static(str(tmp_path / "pre.onnx"), str(tmp_path / "q.onnx"), data_reader(feeds),
                    quant_format=QuantFormat.QDQ, per_channel=per_channel, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                    op_types_to_quantize=list(WEIGHTED_OPS) if weighted else None,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, **extra})
    assert _graph_key(ours.model) == _graph_key(onnx.load(str(tmp_path / "q.onnx")))
    if weighted:  # every pair feeds one weighted op alone: no other reader of a tensor reads it quantized
        readers: dict[str, list] = {}
        for n in ours.model.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n.op_type)
        deq = [n for n in ours.model.graph.node if n.op_type == "DequantizeLinear"]
        assert deq and all(len(readers[n.output[0]]) == 1 and readers[n.output[0]][0] in WEIGHTED_OPS for n in deq)


def _residual_model() -> onnx.ModelProto:
    """x -> MatMul(w1) -> h -> Relu -> r; r feeds MatMul(w2) and, beside it, the residual Add(r, MatMul(w2))."""
    rng = np.random.default_rng(11)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.1, "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
         helper.make_node("Relu", ["h"], ["r"], name="/act/Relu"),
         helper.make_node("MatMul", ["r", "w2"], ["z"], name="/fc2/MatMul"),
         helper.make_node("Add", ["r", "z"], ["y"], name="/residual/Add")], "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_int8_repair_in_tensorrts_placement_can_free_a_side_reader():
    """The Relu's output feeds a MatMul (quantized in TensorRT's placement) and, beside it, the residual Add, which
    reads the same DequantizeLinear output as ONNX Runtime writes the model: the search's units are every reader
    of an activation's pair, the Add among them, so removing them all gives back the FP32 model's outputs
    (onnxruntime, bit for bit)."""
    from workbench.repair.islands import IslandBuilder
    from workbench.repair.qdq_placement import pair_readers
    model = _residual_model()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(4)]
    ours = to_int8(model, feeds, placement="weighted")
    readers: dict[str, list] = {}
    for n in ours.model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    shared = [n for n in ours.model.graph.node if n.op_type == "DequantizeLinear" and "Add" in readers[n.output[0]]]
    assert len(shared) == 1 and readers[shared[0].output[0]] == ["MatMul", "Add"]
    builder = IslandBuilder(ours.model, model)
    units = pair_readers(builder)
    assert units == ["/fc1/MatMul", "/fc2/MatMul", "/residual/Add"]
    np.testing.assert_array_equal(_run(builder.build(units), feeds[0]), _run(model, feeds[0]))
    assert not np.array_equal(_run(builder.build(units[:2]), feeds[0]), _run(model, feeds[0]))


def test_int8_placement_is_checked():
    model, feeds = _load("int8_outlier.onnx"), _outlier_feeds()[:2]
    with pytest.raises(VariantError, match="unknown Q/DQ placement 'trt'"):
        to_int8(model, feeds, placement="trt")
    with pytest.raises(VariantError, match="none of these op types was asked for"):
        to_int8(model, feeds, placement="weighted", op_types=["Add"])


def test_int8_range_overrides_set_the_scale():
    model = _load("int8_outlier.onnx")
    result = to_int8(model, _outlier_feeds()[:4], ranges={"/mlp/fc2/Add_output_0": (-5.0, 2.0), "nope": (0, 1)})
    scale = next(t for t in result.model.graph.initializer if t.name == "/mlp/fc2/Add_output_0_scale")
    assert float(numpy_helper.to_array(scale)) == pytest.approx(5.0 / 127)
    assert any("nope" in n for n in result.notes)


def test_int8_transformer_with_inf_mask_excludes_the_mask_nodes():
    model = _load("transformer_block.onnx")
    with np.load(SAMPLES / "transformer_block_inputs.npz") as z:
        feed = {k: z[k] for k in z.files}
    assert np.isneginf(feed["attention_mask"]).any()
    ref = _run(model, feed)
    for method in ("minmax", "percentile"):  # percentile: ORT's own calibrator would fail on the -inf
        result = to_int8(model, [feed], method=method)
        excluded = {e["node"]: e["reason"] for e in result.excluded_nodes}
        assert set(excluded) == {"/block/attn/mask/Add", "/block/attn/softmax/Softmax"}
        assert "-inf" in excluded["/block/attn/mask/Add"]
        assert "attention_mask" in result.details["nonfinite_tensors"]
        assert result.tensor_map == {}
        json.dumps(result.to_json())
        got = _run(result.model, feed)
        assert np.isfinite(got).all() and _cos(ref, got) > 0.99  # measured 0.9994 for both


def test_int8_upgrades_opset_12_for_per_channel():
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="/relu/Relu")], "opset12",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    result = to_int8(model, feeds)
    assert result.details["opset_upgrade"] == [12, 13]
    assert [o.version for o in result.model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    assert model.opset_import[0].version == 12
    assert _cos(_run(model, feeds[0]), _run(result.model, feeds[0])) > 0.99


def test_int8_falls_back_when_symbolic_shape_inference_fails_and_writes_nothing_to_cwd(tmp_path, monkeypatch):
    """MaxPool/2 then Resize x2 gives 2*floor(H/2), which ORT's symbolic inference cannot merge with H at the Add:
    quant_pre_process fails ("Incomplete symbolic shape inference") and dumps sym_shape_infer_temp.onnx into the
    working directory; the variant retries without symbolic inference, from inside its temporary folder. (The
    contrib Gelu leaves a tensor ONNX's inference cannot type, so pre-processing is not skipped.)"""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], name="/pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Resize", ["p", "", "scales"], ["u"], name="/up/Resize", mode="nearest"),
         helper.make_node("Add", ["x", "u"], ["a"], name="/add/Add"),
         # a contrib op ONNX's own inference cannot type: pre-processing is needed, so quant_pre_process runs
         helper.make_node("Gelu", ["a"], ["g"], name="/act/Gelu", domain="com.microsoft"),
         helper.make_node("Relu", ["g"], ["y"], name="/act/Relu")], "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "H", "W"])], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)} for _ in range(2)]
    monkeypatch.chdir(tmp_path)
    result = to_int8(model, feeds)
    assert list(tmp_path.iterdir()) == []
    assert result.details["preprocessing"].startswith("quant_pre_process: ONNX shape inference (symbolic skipped)")
    assert any("Incomplete symbolic shape inference" in n for n in result.notes)
    assert _cos(_run(model, feeds[0]), _run(result.model, feeds[0])) > 0.99


def _converter_tensors(model: onnx.ModelProto) -> dict:
    """Every tensor of a model and its subgraphs, by place: (dtype, dims, bytes), read with onnx alone."""
    from onnx import numpy_helper

    out = {}

    def walk(graph, path):
        for t in graph.initializer:
            out[(path, "init", t.name)] = (t.data_type, list(t.dims), numpy_helper.to_array(t).tobytes())
        for n in graph.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    out[(path, n.output[0], a.name)] = (a.t.data_type, list(a.t.dims),
                                                        numpy_helper.to_array(a.t).tobytes())
                elif a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, f"{path}/{n.name}/{a.name}")

    walk(model.graph, "")
    return out


def _converted_directly(model: onnx.ModelProto, converter: str) -> onnx.ModelProto:
    """The converter's own output on a full copy of the model (the independent reference)."""
    import importlib
    import warnings

    from workbench.model.graph import sort_nodes

    module = {"ort": "onnxruntime.transformers.float16", "onnxconverter_common": "onnxconverter_common.float16"}
    limits = {"ort": (5.96e-08, 65504.0), "onnxconverter_common": (1e-7, 1e4)}[converter]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = importlib.import_module(module[converter]).convert_float_to_float16(
            copy, min_positive_val=limits[0], max_finite_val=limits[1], keep_io_types=True)
    return sort_nodes(out)


def _assert_same_as_converter(model: onnx.ModelProto, converter: str) -> None:
    ours = to_fp16(model, converter=converter).model
    theirs = _converted_directly(model, converter)
    assert _converter_tensors(ours) == _converter_tensors(theirs)
    assert [(n.op_type, list(n.input), list(n.output)) for n in ours.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in theirs.graph.node]


@pytest.mark.parametrize("converter", ["ort", "onnxconverter_common"])
@pytest.mark.parametrize("name", ["fp16_clamp_constant.onnx", "transformer_block.onnx", "healthy_cnn.onnx",
                                  "if_subgraph.onnx"])
def test_weight_free_conversion_is_bit_identical_to_the_converter(name, converter):
    """The converter runs on a weight-free copy and the weights are filled in afterwards by the same rule: the
    result must be the converter's own output, tensor for tensor and bit for bit (clamps included)."""
    _assert_same_as_converter(_load(name), converter)


def test_vectorised_rule_matches_both_converters_bit_for_bit():
    import warnings

    from onnxconverter_common.float16 import convert_np_to_float16 as occ_rule
    from onnxruntime.transformers.float16 import convert_np_to_float16 as ort_rule

    from workbench.variants.fp16_fast import ClampCounter

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-40, 20, 20000))).astype(np.float32)
    x = np.concatenate([x, np.array([0, -0.0, np.nan, np.inf, -np.inf, 65504, -65504, 1e4, 5.96e-8, -5.96e-8, 1e-7],
                                    np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rule, limits in ((ort_rule, (5.96e-08, 65504.0)), (occ_rule, (1e-7, 1e4))):
            for arr in (x, x.astype(np.float64)):
                counter = ClampCounter()
                ours = counter(arr.copy(), *limits)
                assert np.array_equal(rule(arr.copy(), *limits).view(np.uint16), ours.view(np.uint16))
                assert counter.clamped == 1


@pytest.mark.parametrize("where", [None, 0, "middle", "last"])
def test_rule_on_mostly_zero_tables_over_many_slices(where):
    """A table of zeros (a sparse or pruned weight) larger than the rule's slices, with one value under FP16's
    smallest subnormal at the start, in the middle, in the last (partial) slice, or none: the converter's own
    output, bit for bit, and a clamp counted exactly when there was one."""
    import warnings

    from onnxruntime.transformers.float16 import convert_np_to_float16 as ort_rule

    from workbench.variants import fp16_fast

    x = np.zeros((3 * fp16_fast._SLICE + 12345) // 5 * 5, np.float32).reshape(-1, 5)
    x[:, 2] = 0.5
    if where is not None:
        flat = x.reshape(-1)
        flat[{0: 0, "middle": flat.size // 2, "last": flat.size - 3}[where]] = -1e-9
    counter = fp16_fast.ClampCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ort_rule(x.copy(), 5.96e-08, 65504.0)
    got = counter(x.copy(), 5.96e-08, 65504.0)
    assert np.array_equal(want.view(np.uint16), got.view(np.uint16))
    assert counter.clamped == (where is not None)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppocr-det", "ppocr-rec"])
def test_weight_free_conversion_on_real_models(fetch_model, name):
    model = onnx.load(str(fetch_model(name)))
    for converter in ("ort", "onnxconverter_common"):
        _assert_same_as_converter(model, converter)


def test_the_quantizers_root_logger_warnings_are_routed_to_our_log(caplog):
    """ONNX Runtime's quantizer logs on the root logger; a notebook then shows 'WARNING:root:Axis 1 is out-of-range
    ...' under the cell. They go to workbench.variants.calibration at info level instead."""
    import logging

    from workbench.variants import make_variant

    model = onnx.load(str(SAMPLES / "fp16_clamp_constant.onnx"))
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{model.graph.input[0].name: np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
             for i in range(2)]
    with caplog.at_level(logging.INFO):
        make_variant(model, "int8", calibration_feeds=feeds)
    assert not [r for r in caplog.records if r.name == "root"], [r.getMessage() for r in caplog.records]
    assert any(r.name == "workbench.variants.calibration" and "out-of-range" in r.getMessage()
               for r in caplog.records)
    assert not logging.getLogger().filters  # the route is taken down after the quantizer


def test_the_clamp_report_of_mapped_weights_holds_only_the_clamped_values(tmp_path, monkeypatch):
    """Weights left in their files are diffed piece by piece, keeping the positions and values that may be clamps:
    FP16 rounds nearly every value, and keeping those too held 16 bytes per weight (0.5 GB for a 131 MB table).
    The records are those of the same model read into memory."""
    from workbench.variants.clamps import _changed_values

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    w[3, 7], w[100, 1], w[200, 300] = 1e6, -7e4, 1e-9  # two overflows past 65504, one underflow
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)

    inline = make_variant(load_model(tmp_path / "m.onnx"), "fp16").clamped
    monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", "1K")
    loaded = load_model(tmp_path / "m.onnx")
    variant = make_variant(loaded, "fp16")
    assert [r.to_json() for r in variant.clamped] == [r.to_json() for r in inline]
    assert {(r.kind, r.count) for r in inline} == {("overflow", 2), ("underflow", 1)}
    fp16 = next(t for t in variant.model.graph.initializer if t.name == "w")
    source = next(t for t in loaded.proto.graph.initializer if t.name == "w")
    where, a, _ = _changed_values(source, fp16, max_finite=65504.0, min_positive=5.96e-08, rounding=None)
    assert sorted(where.tolist()) == sorted([3 * 512 + 7, 100 * 512 + 1, 200 * 512 + 300])
    assert a.tolist() == pytest.approx([w.ravel()[i] for i in where])


def test_ort_session_takes_large_initializers_as_arrays_and_computes_what_the_whole_proto_does():
    """The scan's and validation's sessions get the graph without its large initializers, which follow as arrays
    (not serialized and parsed back). Same outputs, bit for bit, as a session on the whole protobuf -- also after
    the arrays are gone (ONNX Runtime copied them) -- with a large Constant node (kept inline), int64 and float16
    tables read by Gather, an initializer also listed as a graph input (IR 3 style) and one nothing reads (ONNX
    Runtime drops it before it would take its array, then refuses the array: it stays in the graph)."""
    import gc

    from workbench.variants.ort_session import BESIDE_BYTES, ort_session, weights_beside

    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 256)).astype(np.float32)  # 256 KB
    table = rng.integers(0, 256, size=(64, 256)).astype(np.int64)  # 128 KB
    half = rng.standard_normal((128, 256)).astype(np.float16)  # 64 KB
    c = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256,)).astype(np.float32)  # 1 KB: stays inline
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c, "c")),
             helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0),
             helper.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
             helper.make_node("Gather", ["half", "idx"], ["halves"], axis=0),
             helper.make_node("Cast", ["halves"], ["halves_f"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("MatMul", ["xw", "c"], ["xwc"]),
             helper.make_node("Add", ["xwc", "b"], ["xb"]),
             helper.make_node("Add", ["xb", "rows_f"], ["xr"]),
             helper.make_node("Add", ["xr", "halves_f"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(table, "table"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(half, "half"), numpy_helper.from_array(w + 1, "unread")]  # ONNX Runtime drops it
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256]),
                                           helper.make_tensor_value_info("idx", TensorProto.INT64, [1]),
                                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7

    light, names, arrays = weights_beside(model)
    assert names == ["w", "table", "half"] and all(a.nbytes >= BESIDE_BYTES for a in arrays)  # "unread" stays
    assert all(np.array_equal(a, e) for a, e in zip(arrays, (w, table, half)))
    assert light.ByteSize() < 8 * 1024 + c.nbytes + w.nbytes  # the graph, the bias, the Constant, "unread"
    del light, arrays
    feed = {"x": rng.standard_normal((1, 256)).astype(np.float32), "idx": np.array([5], np.int64)}
    for optimize in (False, True):
        session = ort_session(model, optimize=optimize)
        gc.collect()
        _ = [np.full(1 << 16, np.nan) for _ in range(64)]  # reuse freed memory: stale weights would show
        whole = ort.SessionOptions()
        if not optimize:
            whole.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        expected = ort.InferenceSession(model.SerializeToString(), whole,
                                        providers=["CPUExecutionProvider"]).run(None, feed)[0]
        got = session.run(None, feed)[0]
        assert np.array_equal(got, expected)
        assert np.allclose(got, feed["x"] @ w @ c + b + table[5].astype(np.float32) + half[5].astype(np.float32),
                           rtol=1e-4, atol=1e-3)
    # a name defined twice: ONNX Runtime picks one of the two itself, as it does from the whole protobuf
    ios = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    twice = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w + 1, "w")]
    dup = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "d", *ios, twice),
                            opset_imports=[helper.make_opsetid("", 13)])
    assert weights_beside(dup)[1] == []
    expected = ort.InferenceSession(dup.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed["x"]})[0]
    assert np.array_equal(ort_session(dup, optimize=True).run(None, {"x": feed["x"]})[0], expected)
