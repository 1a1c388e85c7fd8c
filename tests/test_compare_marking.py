"""Marking tensors can change what an optimizing engine computes: ONNX Runtime's CPU provider keeps an unmarked FP16
intermediate in FP32 (it inserts Casts around its FP16 fall-backs and removes the pairs between them), but a marked
one must come out in FP16, as a GPU holds it. On a model whose LayerNormalization input passes 65504, marking every
tensor turns the deployed file's finite outputs into inf. ``--mode all`` keeps the marked run's verdict (FP16
storage overflows) and says, with the figures, that on ONNX Runtime's CPU as deployed the outputs pass, which the
truth confirms (onnxruntime on the file, against numpy in float64) and ``--mode bisect`` (nothing else marked)
finds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from workbench.compare.api import compare

D = 64


def _residual_ln(dtype: int, np_type) -> onnx.ModelProto:
    """x -> MatMul (weights ~6000: outputs past 65504) -> + x -> LayerNormalization -> MatMul -> y."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((D, D)) * 6000, rng.standard_normal((D, 16)) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "x"], ["res"], name="res"),
             helper.make_node("LayerNormalization", ["res", "g", "b"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "W2"], ["y"], name="head")]
    inits = [numpy_helper.from_array(v.astype(np_type), k) for k, v in
             (("W1", w1), ("W2", w2), ("g", np.ones(D)), ("b", np.zeros(D)))]
    graph = helper.make_graph(nodes, "residual_ln", [helper.make_tensor_value_info("x", dtype, [4, D])],
                              [helper.make_tensor_value_info("y", dtype, [4, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_verdict_reads_the_outputs_as_deployed_not_as_marked(tmp_path):
    fp32, fp16 = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(_residual_ln(TensorProto.FLOAT, np.float32), str(fp32))
    onnx.save(_residual_ln(TensorProto.FLOAT16, np.float16), str(fp16))
    x = np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)

    # the truth, without the workbench: the FP16 file as deployed on onnxruntime against float64 numpy
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(fp32)).graph.initializer}
    res = x.astype(np.float64) @ init["W1"] + x
    assert np.abs(res).max() > 65504  # FP16 storage of this tensor would overflow
    ln = (res - res.mean(-1, keepdims=True)) / np.sqrt(res.var(-1, keepdims=True) + 1e-5)
    truth = ln @ init["W2"]
    deployed = ort.InferenceSession(str(fp16), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float16)})[0].astype(np.float64)
    sqnr = 10 * np.log10((truth ** 2).sum() / ((deployed - truth) ** 2).sum())
    assert np.isfinite(deployed).all() and sqnr > 30, sqnr
    # ... while marking every tensor makes onnxruntime's own outputs inf (what the comparison must not judge)
    marked = onnx.load(str(fp16))
    marked.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT16, None) for t in ("mm", "res", "ln"))
    assert not np.isfinite(ort.InferenceSession(marked.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["y"], {"x": x.astype(np.float16)})[0]).all()

    every = compare(str(fp32), "ort", "ort", cand_model=str(fp16), feeds=[{"x": x}], mode="all")
    assert every.diverged and next(t for t in every.tensors if t.tensor == "ln").diverged
    said = [n for n in every.notes if n.startswith("on ort as deployed")]
    assert len(said) == 1 and "the failing output(s) pass: y (" in said[0], every.notes
    unmarked_db = float(said[0].split("marked, ")[1].split(" dB unmarked")[0])
    assert abs(unmarked_db - sqnr) < 1.0, (unmarked_db, sqnr)  # the figure is the deployed file's own
    bisect = compare(str(fp32), "ort", "ort", cand_model=str(fp16), feeds=[{"x": x}], mode="bisect")
    assert not bisect.diverged
    y = next(t for t in bisect.tensors if t.tensor == "y")
    assert abs(y.metrics["sqnr_db"] - sqnr) < 1.0


def test_outputs_that_fail_unmarked_too_get_no_such_note(tmp_path):
    """The sample's clamped BatchNormalization breaks the FP16 file wherever it runs: one more candidate build looks
    at the failing output unmarked, and no note claims it passes."""
    from conftest import SAMPLES

    result = compare(str(SAMPLES / "fp16_clamp_constant.onnx"), "ort", "ort:fp16")
    assert result.diverged and not [n for n in result.notes if n.startswith("on ort as deployed")]
