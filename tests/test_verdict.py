"""The output-led, precision-aware verdict: inferred precision, precision floors, criterion parsing, impact.

Independent references: floors are checked against numpy's own float16 / ml_dtypes' bfloat16 casts and a
hand-written INT8 grid; precision inference against the dtypes written into hand-made models.
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import SAMPLES
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16

from workbench.compare.api import compare
from workbench.compare.criterion import Criterion, CriterionError
from workbench.compare.floor import FloorStats, NumberFormat, tensor_formats
from workbench.compare.options import CompareOptions
from workbench.core.shapes import infer_shapes_lenient, strip_weights
from workbench.model.precision import infer_precision

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"


def _sqnr(ref: np.ndarray, other: np.ndarray) -> float:
    ref, other = ref.astype(np.float64), other.astype(np.float64)
    return 10 * np.log10((ref ** 2).sum() / ((other - ref) ** 2).sum())


def _scaled_relu(scale: float = 1e-4, n: int = 64) -> onnx.ModelProto:
    """x -> *scale -> *scale -> Relu -> + x -> y. With scale 1e-4 (a normal FP16 number) the middle tensors are
    ~1e-8, below FP16's smallest subnormal: they flush to zero in FP16, and y = x + (almost nothing) does not care."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["small1"], name="down1"),
             helper.make_node("Mul", ["small1", "s"], ["small"], name="down2"),
             helper.make_node("Relu", ["small"], ["act"], name="relu"),
             helper.make_node("Add", ["x", "act"], ["y"], name="add")]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s")]
    g = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# --- precision -------------------------------------------------------------------------------------------------

def test_precision_is_read_from_the_file_not_the_spec(tmp_path):
    fp32 = onnx.load(str(CLAMP))
    fp16 = convert_float_to_float16(onnx.load(str(CLAMP)), keep_io_types=True)
    assert infer_precision(fp32).precision == "fp32"
    p = infer_precision(fp16)
    assert p.precision == "fp16" and p.family == "fp16" and "float16" in p.source
    assert infer_precision(strip_weights(fp16)).precision == "fp16"  # weight-free copies keep dims and types
    path = tmp_path / "mine_fp16.onnx"
    onnx.save(fp16, str(path))
    result = compare(CLAMP, "ort", "ort", cand_model=path)
    assert result.precision["candidate"]["precision"] == "fp16"
    assert result.precision["reference"]["precision"] == "fp32"
    assert result.criterion == Criterion.default_for("fp16")  # not FP32's sqnr_db < 60
    doc = result.to_json()
    assert doc["precision"]["candidate"]["precision_source"].startswith("float16 holds")


def test_a_float32_resize_factor_does_not_make_an_fp16_model_fp32():
    """The FP16 converters keep Upsample/Resize scales in float32 (the schema asks for it): a weightless FP16 model
    with such a factor is still FP16 (it was read as fp32 and judged with FP32's stricter criterion, while the same
    model without the Upsample got FP16's)."""
    def build(with_upsample: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add"), helper.make_node("Sub", ["s", "b"], ["y"],
                                                                                         name="sub")]
        outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])]
        inits = []
        if with_upsample:
            nodes.append(helper.make_node("Upsample", ["x", "sc"], ["u"], name="up", mode="nearest"))
            outs.append(helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 1, 8, 8]))
            inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc"))
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 4, 4]) for n in ("x", "b")]
        return helper.make_model(helper.make_graph(nodes, "g", ins, outs, initializer=inits),
                                 opset_imports=[helper.make_opsetid("", 9)])

    for with_upsample in (False, True):
        fp16 = convert_float_to_float16(build(with_upsample), keep_io_types=True)
        assert any(t.name == "sc" and t.data_type == TensorProto.FLOAT for t in fp16.graph.initializer) \
            == with_upsample
        assert infer_precision(fp16).precision == "fp16", infer_precision(fp16)


def test_qdq_and_bf16_models_are_recognised():
    m = _scaled_relu(1.0)
    q = helper.make_node("QuantizeLinear", ["x", "qs", "zp"], ["xq"], name="q")
    dq = helper.make_node("DequantizeLinear", ["xq", "qs", "zp"], ["xd"], name="dq")
    m.graph.node.insert(0, dq)
    m.graph.node.insert(0, q)
    m.graph.initializer.extend([numpy_helper.from_array(np.array(0.1, np.float32), "qs"),
                                numpy_helper.from_array(np.array(0, np.int8), "zp")])
    p = infer_precision(m)
    assert p.precision == "int8" and "QuantizeLinear" in p.source
    bf = _scaled_relu(1.0)
    big = np.ones((256,), dtype=ml_dtypes.bfloat16)
    bf.graph.initializer.append(helper.make_tensor("w", TensorProto.BFLOAT16, [256], big.view(np.uint16).tobytes(),
                                                   raw=True))
    assert infer_precision(bf).precision == "bf16"


# --- floors ------------------------------------------------------------------------------------------------------

def test_floor_matches_numpy_float16_and_counts_the_format_limits():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(1000), np.full(10, 1e-9), np.full(5, 3e-6), np.full(3, 1e5)]
                       ).astype(np.float32)
    floor = FloorStats().add(x, NumberFormat("fp16")).summary()
    with np.errstate(over="ignore"):  # 1e5 overflows to inf: what the floor must count
        held = x.astype(np.float16).astype(np.float32)
    finite = np.isfinite(held)
    assert floor["nonfinite_mismatch"] == 3  # 1e5 overflows to inf
    assert floor["sqnr_db"] == pytest.approx(_sqnr(x[finite], held[finite]), abs=1e-3)
    assert floor["share_flushed"] == pytest.approx(10 / x.size)
    assert floor["share_under_min_normal"] == pytest.approx(15 / x.size)
    assert floor["share_over_max"] == pytest.approx(3 / x.size)


def test_bf16_and_int8_floors_match_independent_roundings():
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 3
    bf = NumberFormat("bf16").represent(x)
    np.testing.assert_array_equal(bf, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    scale = np.array([0.02])
    grid = NumberFormat("int8", scale, np.array([0.0])).represent(x)
    expected = np.clip(np.round(x / 0.02), -128, 127) * 0.02
    np.testing.assert_allclose(grid, expected, atol=1e-6)
    stats = FloorStats().add(x, NumberFormat("int8", scale, np.array([0.0]))).summary()
    q = x.astype(np.float64) / 0.02
    assert stats["share_over_max"] == pytest.approx(np.mean((q < -128.5) | (q > 127.5)))  # the int8 grid's ends


@pytest.mark.parametrize("qtype,axis", [(TensorProto.INT8, None), (TensorProto.UINT8, None), (TensorProto.UINT8, 1),
                                        (TensorProto.INT16, 1)])
def test_integer_floor_is_onnxruntimes_own_quantize_dequantize(qtype, axis):
    """The integer grid a floor holds the reference on is what ONNX Runtime's QuantizeLinear -> DequantizeLinear
    computes, value for value (ties, zero points, saturation, per-axis scales), and the counts are numpy's."""
    import onnxruntime as ort

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 6, 40, 40)) * 4).astype(np.float32)
    x[0, 0, 0, :8] = [0.0, -0.0, 0.05, 0.15, -0.05, 1e-6, 500.0, -500.0]  # ties at scale 0.1, tiny, past the ends
    # halfway points in float32 arithmetic that float64 puts off the tie (0.35 / 0.1: 3.5 in float32, 3.4999999 in
    # float64): the engine rounds what float32 gives
    x[0, 0, 1, :] = (np.arange(40, dtype=np.float32) - 20 + np.float32(0.5)) * np.float32(0.1)
    channels = 6 if axis == 1 else 1
    scale = np.full(channels, 0.1, np.float32) if axis is None else rng.uniform(0.02, 0.6, channels).astype(np.float32)
    scale[0] = np.float32(0.1)
    np_type = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16}[qtype]
    zp = rng.integers(-3, 4, channels) + (128 if qtype == TensorProto.UINT8 else 0)
    zp = zp.astype(np_type)
    attrs = {"axis": axis} if axis is not None else {}
    shape = [channels] if axis is not None else []
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(scale.reshape(shape), "s"), numpy_helper.from_array(zp.reshape(shape), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    held_by_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    name = {TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.INT16: "int16"}[qtype]
    fmt = NumberFormat(name, scale.astype(np.float64), zp.astype(np.float64), axis)
    np.testing.assert_array_equal(fmt.represent(x), held_by_ort)
    stats = FloorStats().add(x, fmt).summary()
    lo, hi = fmt.bounds()
    b = [1] * x.ndim
    if axis is not None:
        b[axis] = channels
    q = np.rint(x.astype(np.float64) / scale.reshape(b)) + zp.astype(np.float64).reshape(b)
    assert stats["share_over_max"] == pytest.approx(np.mean((q < lo) | (q > hi)))
    assert stats["share_flushed"] == pytest.approx(np.mean((x != 0) & (held_by_ort == 0)))
    assert stats["sqnr_db"] == pytest.approx(_sqnr(x, held_by_ort), abs=1e-3)


def test_integer_floor_of_a_scalar_and_of_a_zero_scale():
    """A 0-d tensor (a reduced activation, a scalar constant) is held like any other; a per-axis scale of 0 (a pruned
    channel) holds its zeros as NaN, which are not counted as flushed (the count is of nonzero values held as 0)."""
    fmt = NumberFormat("int8", np.array([0.1]), np.array([0.0]))
    assert float(fmt.represent(np.array(1.04, np.float32))) == pytest.approx(1.0)
    assert FloorStats().add(np.array(1.04, np.float32), fmt).summary()["sqnr_db"] == pytest.approx(
        _sqnr(np.array([1.04]), np.array([1.0])), abs=1e-3)
    pruned = NumberFormat("int8", np.array([0.5, 0.0]), np.array([0.0, 0.0]), axis=0)
    x = np.array([[0.0, 0.2, 2.0], [0.0, 0.0, 0.0]], np.float32)
    stats = FloorStats().add(x, pruned).summary()
    assert stats["share_flushed"] == pytest.approx(1 / 6)  # 0.2 on the 0.5 grid; the zeros stay out of it


def test_formats_follow_the_candidate_types_and_casts_back_to_float32():
    fp16 = convert_float_to_float16(onnx.load(str(CLAMP)), keep_io_types=True)
    inferred = infer_shapes_lenient(fp16)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(inferred.graph.value_info) + list(
        inferred.graph.output)}
    formats = tensor_formats(fp16, types, ["logits", "/relu/Relu_output_0"])
    assert formats["/relu/Relu_output_0"].name == "fp16"
    assert formats["logits"].name == "fp16"  # float32 output cast from float16: held in FP16 on the way


# --- verdict -------------------------------------------------------------------------------------------------------

def test_activations_below_fp16_subnormals_are_at_their_floor_not_a_divergence():
    """The Relu.3 case: reference values ~1e-8 flush to zero in FP16 (0 dB) and the output does not care. The
    tensors are at their floor (not diverged), no node is blamed for the format's limit, the verdict is ok."""
    result = compare(_scaled_relu(), "ref", "ref:fp16", seed=0)
    for name in ("small", "act"):
        t = result.tensor(name)
        assert t.metrics["sqnr_db"] < 1 and t.floor["sqnr_db"] < 1 and t.floor["share_flushed"] > 0.4
        assert t.at_floor and not t.diverged
    assert not result.diverged and result.first_divergent is None
    assert result.output_results[0].metrics["sqnr_db"] > 45
    assert not any(c.introduces_divergence and not c.harmless for c in result.culprits)
    assert {"small", "act"} <= {t.tensor for t in result.internal_dips if t.at_floor}
    old_style = Criterion.default_for("fp16")  # judged without floors, the same numbers would be divergences
    assert old_style.fails(result.tensor("act").metrics)


def test_output_at_its_floor_is_not_a_divergence():
    """An output whose reference values are themselves below FP16's subnormals (inputs of ~1e-9)."""
    relu = _scaled_relu()
    result = compare(relu, "ref", "ref:fp16", val_ranges={"x": (-2e-9, 2e-9)})
    out = result.output_results[0]
    assert out.at_floor and not out.diverged and not result.diverged
    assert out.floor["share_flushed"] > 0.5


def test_exit_code_follows_outputs_and_strict_mode_fails_on_dips(tmp_path):
    model = tmp_path / "scaled.onnx"
    onnx.save(_scaled_relu(), str(model))
    run = [sys.executable, "-m", "workbench", "compare", str(model), "--ref", "ref", "--cand", "ref:fp16"]
    ok = subprocess.run(run + ["--json", str(tmp_path / "a.json")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["diverged"] is False and doc["verdict"]["internal_dips"] and doc["first_divergent"] is None
    strict = subprocess.run(run + ["--fail-on-internal-dips"], capture_output=True, text=True)
    if any(not d["at_floor"] for d in doc["verdict"]["internal_dips"]):
        assert strict.returncode == 1
    else:  # dips at their floor are listed but are not failures even in strict mode
        assert strict.returncode == 0
    bad = subprocess.run([sys.executable, "-m", "workbench", "compare", str(CLAMP), "--criterion", "sqnr_db>30"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "sqnr_db<30" in bad.stderr


@pytest.mark.parametrize("text", ["sqnr_db>30", "cosine>0.9", "max_abs<1e-3", "sqnr_db<nan", "sqnr_db<inf",
                                  "sqnr_db<30,atol=-1", "sqnr_db<30,foo=1", "bogus<3", "sqnr_db30"])
def test_criterion_refuses_text_that_would_judge_the_wrong_way(text):
    with pytest.raises(CriterionError):
        Criterion.parse(text)


def test_criterion_reads_both_operator_spellings():
    assert Criterion.parse("sqnr_db <= 25") == Criterion("sqnr_db", 25.0)
    assert Criterion.parse("norm_mean_abs>0.2,atol=1e-6") == Criterion("norm_mean_abs", 0.2, atol=1e-6)


def test_impact_runs_every_culprit_in_one_candidate_session(monkeypatch):
    """All culprits share one patched candidate build; fixing the clamped BN repairs the output."""
    from workbench.compare import impact

    calls = []
    original = impact.patched

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(impact, "patched", counting)
    result = compare(CLAMP, "ort", "ort:fp16", impact=5)
    top = result.culprits[0]
    assert len(calls) == 1 and result.builds == 4  # + the failing output run unmarked (it fails there too)
    assert top.impact["best_gain_db"] > 60 and not top.harmless
    assert top.impact["after"]["logits"]["sqnr_db"] > 60  # the fixed run agrees with the reference


def test_options_round_trip_through_json():
    opts = CompareOptions(mode="all", criterion="sqnr_db<25", keep_fp32=("a",), val_ranges={"x": (0.0, 1.0)},
                          impact=2, fail_on_internal_dips=True)
    back = CompareOptions.from_json(json.loads(json.dumps(opts.to_json())))
    assert back == opts
    with pytest.raises(Exception, match="impact"):
        CompareOptions(impact=-1)


def test_a_users_own_file_is_explained_by_its_changed_constants(tmp_path):
    """A user's FP16 file made by onnxconverter-common (which clamps to 1e4): the culprit's explanation names the
    constant the file changed, with its values before and after, read by diffing the two files."""
    import warnings

    from onnxconverter_common.float16 import convert_float_to_float16 as occ

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = occ(onnx.load(str(CLAMP)), keep_io_types=True)
    path = tmp_path / "mine.onnx"
    onnx.save(mine, str(path))
    result = compare(CLAMP, "ort", "ort", cand_model=path)
    top = result.culprits[0]
    assert result.diverged and top.node == "/bn_big_var/BatchNormalization" and not top.harmless
    assert "The candidate file clamped constant '/bn_big_var/running_var' from [9.8e+07] to [1e+04]" in \
        top.explanation
    clamp = next(c for c in result.variant["clamped"] if c["name"] == "/bn_big_var/running_var")
    assert clamp["by"] == "the candidate file" and clamp["converted"] == [10000.0]
