"""Per-channel equalization of depthwise-Conv inputs (workbench/variants/equalize.py), on small graphs checked
against onnx's reference evaluator in float64 and numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from workbench.variants.equalize import equalize_depthwise

C = 4
#: how wide each channel of the depthwise input is (1000x between the widest and the narrowest)
WIDTHS = np.array([1.0, 0.05, 0.001, 0.3])


def _model(producer: str) -> onnx.ModelProto:
    """x[1,C,6,6] -> pointwise Conv (channel c scaled by WIDTHS[c]) -> ``producer`` chain -> depthwise 3x3 Conv -> y.
    ``producer``: bn (BatchNormalization, Relu), mul (Mul by a scalar), div (Div by a [1,C,1,1] constant), affine
    (Mul then Add of scalars), conv (the Conv itself), shared (Relu read by the depthwise Conv and by the output)."""
    rng = np.random.default_rng(0)
    w1 = (rng.normal(size=(C, C, 1, 1)) * WIDTHS[:, None, None, None]).astype(np.float32)
    dw = rng.normal(size=(C, 1, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(dw, "dw")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="pw")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 6, 6])]
    if producer == "bn":
        inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
                  (("g", rng.uniform(0.5, 2, C)), ("b", rng.normal(size=C) * WIDTHS), ("m", np.zeros(C)),
                   ("v", np.ones(C)))]
        nodes += [helper.make_node("BatchNormalization", ["a", "g", "b", "m", "v"], ["n"], name="bn"),
                  helper.make_node("Relu", ["n"], ["t"], name="relu")]
    elif producer == "mul":
        inits.append(numpy_helper.from_array(np.array(1.5, np.float32), "k"))
        nodes.append(helper.make_node("Mul", ["k", "a"], ["t"], name="mul"))
    elif producer == "div":
        inits.append(numpy_helper.from_array(rng.uniform(1, 3, (1, C, 1, 1)).astype(np.float32), "k"))
        nodes.append(helper.make_node("Div", ["a", "k"], ["t"], name="div"))
    elif producer == "affine":
        inits += [numpy_helper.from_array(np.array([0.7], np.float32), "k"),
                  numpy_helper.from_array(np.array([0.01], np.float32), "c")]
        nodes += [helper.make_node("Mul", ["a", "k"], ["m"], name="mul"),
                  helper.make_node("Add", ["m", "c"], ["t"], name="add")]
    elif producer == "conv":
        nodes[0].output[0] = "t"
    elif producer == "shared":
        nodes.append(helper.make_node("Relu", ["a"], ["t"], name="relu"))
        outputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, C, 6, 6]))
    nodes.append(helper.make_node("Conv", ["t", "dw"], ["y"], name="dwconv", group=C, pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 6, 6])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _feeds(n: int = 4) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(size=(1, C, 6, 6)).astype(np.float32)} for _ in range(n)]


def _run64(model: onnx.ModelProto, feed: dict, names: list[str]) -> list[np.ndarray]:
    """``names`` of ``model`` on onnx's reference evaluator with every constant and input in float64."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in [*m.graph.input, *m.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    del m.graph.value_info[:]
    return ReferenceEvaluator(m).run(names, {k: v.astype(np.float64) for k, v in feed.items()})


def _ranges(model, tensor, feeds) -> np.ndarray:
    return np.max([np.abs(_run64(model, f, [tensor])[0]).max(axis=(0, 2, 3)) for f in feeds], axis=0)


@pytest.mark.parametrize("producer,folded", [("bn", "BatchNormalization"), ("mul", "Mul"), ("div", "Div"),
                                             ("affine", "Mul"), ("conv", "Conv"), ("shared", None)])
def test_equalized_model_computes_the_same_function_with_narrower_channel_spread(producer, folded):
    model, feeds = _model(producer), _feeds()
    before = _ranges(model, "t", feeds)
    out, report = equalize_depthwise(model, feeds, alpha=0.5)
    onnx.checker.check_model(out, full_check=True)
    assert report.convs == ["dwconv"]
    assert report.folded == ({"dwconv": folded} if folded else {})
    assert report.inserted == ([] if folded else ["dwconv"])
    for f in feeds:  # the same function, to float64 rounding of the float32 constants
        np.testing.assert_allclose(_run64(out, f, ["y"])[0], _run64(model, f, ["y"])[0], rtol=1e-5, atol=1e-6)
    dw = next(n for n in out.graph.node if n.name == "dwconv")
    assert dw.input[0] != "t"  # the scaled tensor has a name of its own
    if producer == "shared":  # the other reader still gets the original values
        np.testing.assert_allclose(_run64(out, feeds[0], ["t"])[0], _run64(model, feeds[0], ["t"])[0])
    after = _ranges(out, dw.input[0], feeds)
    spread = before.max() / before.min()
    # alpha 0.5: channel c scaled by sqrt(widest / width_c): the spread becomes its square root
    np.testing.assert_allclose(after.max() / after.min(), np.sqrt(spread), rtol=1e-4)
    scale = np.sqrt(before.max() / before)
    np.testing.assert_allclose(after, before * scale, rtol=1e-4)
    w = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    original = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "dw"))
    np.testing.assert_allclose(w[dw.input[1]], original / scale[:, None, None, None], rtol=1e-5)
    assert "dw" not in w  # the replaced filter is not carried as dead weight


def test_per_tensor_int8_of_the_equalized_model_is_closer_to_fp32():
    """The point of it: ONNX Runtime's per-tensor INT8 (TensorRT's placement) of the equalized model is nearer the
    FP32 output than that of the model as it was, measured against the float64 reference."""
    from workbench.variants.int8 import to_int8

    model, feeds = _model("bn"), _feeds(8)
    out, _ = equalize_depthwise(model, feeds)
    ref = np.stack([_run64(model, f, ["y"])[0] for f in feeds])
    width = np.abs(ref).max(axis=(0, 1, 3, 4))
    errors = []
    for m in (model, out):  # the worst channel's error relative to its own width (the narrow ones suffer)
        q = to_int8(m, feeds, placement="weighted").model
        got = np.stack([_run64(q, f, ["y"])[0] for f in feeds])
        errors.append(float((np.abs(got - ref).max(axis=(0, 1, 3, 4)) / width).max()))
    assert errors[1] < errors[0] / 3, errors


def test_nothing_to_equalize_returns_the_model_itself():
    model = _model("bn")
    for n in model.graph.node:
        if n.name == "dwconv":  # an ordinary Conv: one group
            n.ClearField("attribute")
            n.attribute.append(helper.make_attribute("pads", [1, 1, 1, 1]))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((C, C, 3, 3), np.float32), "dw"))
    out, report = equalize_depthwise(model, _feeds())
    assert out is model and report.convs == []
    even = _model("conv")  # channels of one width: nothing to gain
    even.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.eye(C, dtype=np.float32)[:, :, None, None], "w1"))
    out, report = equalize_depthwise(even, [{"x": np.ones((1, C, 6, 6), np.float32)}])
    assert out is even and report.convs == []


def test_graph_input_dead_channel_and_bias():
    """A depthwise Conv reading the graph input directly (no producer to fold into: a Mul goes before it), with a
    bias, no name, and a channel that is always zero (left unscaled, not blown up)."""
    rng = np.random.default_rng(2)
    dw = rng.normal(size=(2 * C, 1, 3, 3)).astype(np.float32)  # channel multiplier 2: outputs 2c, 2c+1 read c
    bias = rng.normal(size=2 * C).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "dw", "bias"], ["y"], group=C)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * C, 3, 3])],
        [numpy_helper.from_array(dw, "dw"), numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    widths = np.array([2.0, 0.0, 0.02, 1.0])
    feeds = [{"x": (rng.normal(size=(1, C, 5, 5)) * widths[None, :, None, None]).astype(np.float32)}
             for _ in range(3)]
    out, report = equalize_depthwise(model, feeds, alpha=1.0)
    onnx.checker.check_model(out, full_check=True)
    assert report.inserted == ["Conv#0"] and report.folded == {}
    mul = next(n for n in out.graph.node if n.op_type == "Mul")
    scale = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == mul.input[1])).ravel()
    measured = np.max([np.abs(f["x"]).max(axis=(0, 2, 3)) for f in feeds], axis=0)
    expected = np.where(measured > 0, measured.max() / np.where(measured > 0, measured, 1), 1.0)
    np.testing.assert_allclose(scale, expected, rtol=1e-6)  # alpha 1: every live channel to the widest's range
    assert scale[1] == 1.0  # the dead channel
    for f in feeds:
        np.testing.assert_allclose(_run64(out, f, ["y"])[0], _run64(model, f, ["y"])[0], rtol=1e-5, atol=1e-6)


def test_calibrate_reports_the_channel_spread_of_depthwise_inputs():
    """`workbench calibrate` names each depthwise Conv input, how far apart its channels' ranges are and how many
    of one per-tensor scale's 127 INT8 steps the narrowest channel spans (checked against the float64 reference),
    with a note that says what to do; the numbers survive the JSON round trip. A model without depthwise Convs
    has none."""
    from workbench.calibrate import calibrate
    from workbench.calibrate.report import CalibrationReport
    from workbench.calibrate.text import render

    model, feeds = _model("bn"), _feeds()
    report = calibrate(model, feeds, methods=("max",))
    widths = _ranges(model, "t", feeds)
    [row] = report.depthwise
    assert row["tensor"] == "t" and row["convs"] == ["dwconv"] and row["channels"] == C
    np.testing.assert_allclose(row["spread"], widths.max() / widths.min(), rtol=1e-5)
    np.testing.assert_allclose(row["narrowest_steps"], 127 * widths.min() / widths.max(), rtol=1e-5)
    assert any("depthwise Conv input(s) hold channels whose ranges differ" in n and "equalize-depthwise" in n
               for n in report.notes), report.notes
    assert "Depthwise Conv inputs (1;" in render(report)
    assert CalibrationReport.from_json(report.to_json()).depthwise == report.depthwise

    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 6, 6])]),
        opset_imports=[helper.make_opsetid("", 19)])
    report = calibrate(plain, feeds, methods=("max",))
    assert report.depthwise == [] and not any("depthwise" in n for n in report.notes)
    assert "Depthwise Conv inputs" not in render(report)
