"""Rewrite repairs before FP32 islands, on real PP-OCR detectors (workbench/repair/rewrites.py).

The truth is computed without the workbench: onnxruntime runs the FP32 model and the saved repaired model, ocr_truth
decodes the DB text masks, onnx reads the repaired model's nodes and constants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from workbench.repair import repair
from workbench.repair.graph import constants
from workbench.repair.rewrites import RewriteFinder, apply_rewrites

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
BN = "/bn_big_var/BatchNormalization"
QUICK = {"impact": 0, "max_culprits": 8}  # a shorter comparison: the culprit ranks first without measured impact


def float_weight_types(model: onnx.ModelProto) -> set[int]:
    """Element types of the float weights (initializers and Constant tensors larger than a scalar)."""
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node if n.op_type == "Constant"
                                               for a in n.attribute if a.name == "value"]
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
    return {t.data_type for t in tensors if t.data_type in floats and int(np.prod(t.dims)) > 1}


def test_sample_batchnorm_is_folded_before_any_island(tmp_path):
    res = repair(str(CLAMP), "ort", "ort:fp16", out=tmp_path / "fixed.onnx", verify=None)
    assert res.met and res.kept == []
    assert [(r["node"], r["kind"], r.get("into")) for r in res.repairs] == [(BN, "fold-bn", "/conv/Conv")]
    # a rewrite costs no island: it is tried first, and no island set was ever evaluated
    assert [e["how"] for e in res.evaluations] == ["baseline", "rewrite", "verify"]
    fixed = onnx.load(str(tmp_path / "fixed.onnx"))
    assert BN not in {n.name for n in fixed.graph.node}
    assert float_weight_types(fixed) == {TensorProto.FLOAT16}
    doc = res.to_json()
    assert doc["schema"] == "workbench.repair/1" and doc["repairs"][0]["kind"] == "fold-bn"
    assert "fold-bn" in res.render()
    # without rewrites: the FP32 island, and the JSON says so
    res = repair(str(CLAMP), "ort", "ort:fp16", verify=None, rewrites=False)
    assert res.kept == [BN] and res.to_json()["repairs"] == [{"node": BN, "kind": "fp32-island"}]


def test_a_scale_after_an_overflowing_conv_moves_into_its_weights(tmp_path):
    """cnn_fp16_overflow on ref:fp16 (numpy FP16 arithmetic): /stage2/conv/Conv's outputs pass 65504 before
    /stage2/scale/Mul (x 1e-4) brings them back. Moving the scale into the Conv's weights keeps both in FP16;
    without rewrites both are FP32 islands. The truth: onnxruntime on the FP32 and the saved model."""
    model = SAMPLES / "cnn_fp16_overflow.onnx"
    out = tmp_path / "fixed.onnx"
    res = repair(str(model), "ref", "ref:fp16", out=out, verify="ort")
    assert res.met and res.kept == [] and res.verification["independent"]["met"], res.render()
    assert [(r["node"], r["kind"], r["into"]) for r in res.repairs] == [
        ("/stage2/scale/Mul", "fold-scale", "/stage2/conv/Conv")]
    fixed = onnx.load(str(out))
    assert "/stage2/scale/Mul" not in {n.name for n in fixed.graph.node}
    assert float_weight_types(fixed) == {TensorProto.FLOAT16}
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    import onnxruntime as ort

    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    assert np.array_equal(ref.argmax(-1), got.argmax(-1)) and np.abs(got - ref).max() < 1e-2 * np.abs(ref).max()
    res = repair(str(model), "ref", "ref:fp16", verify=None, rewrites=False)
    assert [r["kind"] for r in res.repairs] == ["fp32-island", "fp32-island"]


def test_islands_remain_where_no_rewrite_fixes_it(tmp_path):
    """mlp_external: fc2's weights are below FP16's smallest subnormal; rounding them to FP16 (what a rewrite could
    restore) still flushes them, so fc2 stays an FP32 island, and is the only repair reported."""
    res = repair(str(SAMPLES / "external_data" / "mlp_external.onnx"), "ort", "ort:fp16", verify=None)
    assert res.met and res.kept == ["/fc2/MatMul"]
    assert res.repairs == [{"node": "/fc2/MatMul", "kind": "fp32-island"}]


def test_real_v4_detector_from_fp32_keeps_no_island(fetch_model, tmp_path):
    """`repair FP32 --cand ort:fp16` on PP-OCRv4 det: the converter clamps a BatchNormalization variance 9.8e7 to
    65504; the BN is folded into its Conv, every weight stays FP16, and the text mask comes back."""
    import ocr_truth

    fp32 = fetch_model("ppocr-det")
    feeds = ocr_truth.make_feeds("ppocr-det", small=True)
    out = tmp_path / "fixed.onnx"
    res = repair(str(fp32), "ort", "ort:fp16", feeds=feeds, out=out, verify=None, **QUICK)
    assert res.met and res.kept == [], res.render()
    assert [(r["node"], r["kind"], r["into"]) for r in res.repairs] == [
        ("p2o.BatchNormalization.1", "fold-bn", "p2o.Conv.61")]
    fixed = onnx.load(str(out))
    onnx.checker.check_model(fixed)
    assert "p2o.BatchNormalization.1" not in {n.name for n in fixed.graph.node}
    assert float_weight_types(fixed) == {TensorProto.FLOAT16}
    ref = ocr_truth.run_model(fp32, feeds)
    fixed_truth = ocr_truth.task_truth("det", ref, ocr_truth.run_model(out, feeds))
    assert fixed_truth["healthy"] and fixed_truth["detail"]["max_flip_fraction"] < 0.001, fixed_truth
    # the candidate as converted does flip the mask: the rewrite is what fixes it
    onnx.save(res.plan.cand_model, str(tmp_path / "as_converted.onnx"))
    broken = ocr_truth.task_truth("det", ref, ocr_truth.run_model(tmp_path / "as_converted.onnx", feeds))
    assert not broken["healthy"], broken


def test_real_v5_detector_clamped_variance_is_restored_in_fp16(fetch_model, tmp_path):
    """PP-OCRv5 det converted by onnxconverter-common (max_finite_val 1e4): a variance FP16 holds (3.5e4) was
    clamped to 1e4; repair restores it in FP16 and keeps the node in FP16 (the user's own file, npz folder)."""
    import ocr_truth

    fp32 = fetch_model("ppocrv5-det")
    fp16 = ocr_truth.make_fp16(fp32, "occ", tmp_path / "mine.fp16.onnx")
    feeds = ocr_truth.make_feeds("ppocrv5-det", small=True)
    folder = ocr_truth.save_feeds(feeds, tmp_path / "feeds")
    out = tmp_path / "fixed.onnx"
    res = repair(str(fp32), "ort", "ort", cand_model=str(fp16), feeds=str(folder), out=out, verify=None, **QUICK)
    assert res.met and "restore-constant" in res.render(), res.render()
    doc = json.loads(json.dumps(res.to_json(), allow_nan=False))
    assert doc["kept"] == [] and [r["kind"] for r in doc["repairs"]] == ["restore-constant"]
    node = doc["repairs"][0]["node"]
    fixed, mine, ref = onnx.load(str(out)), onnx.load(str(fp16)), onnx.load(str(fp32))
    bn = next(n for n in fixed.graph.node if n.name == node)
    var = constants(fixed)[bn.input[4]]
    assert var.data_type == TensorProto.FLOAT16  # still FP16, the reference's value rounded to it
    want = numpy_helper.to_array(constants(ref)[bn.input[4]]).astype(np.float16)
    assert np.array_equal(numpy_helper.to_array(var), want) and float(want.max()) > 1e4
    assert float(numpy_helper.to_array(constants(mine)[bn.input[4]]).max()) == pytest.approx(1e4, rel=1e-3)
    truth = ocr_truth.task_truth("det", ocr_truth.run_model(fp32, feeds), ocr_truth.run_model(out, feeds))
    assert truth["healthy"], truth


def test_rescale_keeps_the_real_v3_detector_batchnorm_in_fp16(fetch_model, tmp_path):
    """The alternative to folding: the variance (4.8e7) moved into the BatchNormalization's scale, every parameter
    FP16, the same text mask."""
    import ocr_truth

    fp32 = fetch_model("ppocrv3-det")
    fp16 = onnx.load(str(ocr_truth.make_fp16(fp32, "ort", tmp_path / "fp16.onnx")))
    finder = RewriteFinder(fp16, constants(onnx.load(str(fp32))))
    node = finder.idx.by_name["BatchNormalization_47"]
    assert [name for _, name, _ in finder.changed(node)] == ["batch_norm_47.w_2"]  # the clamped variance
    rewrite = finder._rescale_bn(node, np.float16)
    assert rewrite is not None and rewrite.kind == "rescale"
    fixed = apply_rewrites(fp16, [rewrite])
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    bn = next(n for n in fixed.graph.node if n.name == "BatchNormalization_47")
    params = [constants(fixed)[t] for t in bn.input[1:5]]
    assert all(p.data_type == TensorProto.FLOAT16 for p in params)
    assert float(np.abs(numpy_helper.to_array(params[3]).astype(np.float32) - 1).max()) < 1e-3
    feeds = ocr_truth.make_feeds("ppocrv3-det", small=True)
    ref = ocr_truth.run_model(fp32, feeds)
    assert ocr_truth.task_truth("det", ref, ocr_truth.run_model(tmp_path / "fixed.onnx", feeds))["healthy"]
    onnx.save(fp16, str(tmp_path / "fp16.onnx"))
    assert not ocr_truth.task_truth("det", ref, ocr_truth.run_model(tmp_path / "fp16.onnx", feeds))["healthy"]


def test_cli_from_fp32_with_a_built_in_task_metric_reports_each_kind(tmp_path, capsys):
    """`workbench repair FP32 --cand ort:fp16 --metric top1 --target '>=1'`: compare's built-in task metrics work
    as repair targets; the text and the JSON name each repair's kind; --no-rewrites gives the FP32 island."""
    from workbench.cli import main

    out, js = tmp_path / "fixed.onnx", tmp_path / "r.json"
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    for s in range(3):
        x = np.random.default_rng(s).standard_normal((1, 4, 16, 16)).astype(np.float32)
        np.savez(feeds / f"{s}.npz", image=x)
    args = ["repair", str(CLAMP), "--cand", "ort:fp16", "--inputs", str(feeds), "--metric", "top1", "--target",
            ">=1", "--verify", "none", "--out", str(out), "--json", str(js)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "top1 >= 1 on the worst feed" in text and f"{BN} (fold-bn: folded into /conv/Conv" in text, text
    doc = json.loads(js.read_text())
    assert doc["target"]["metric"] == "top1" and doc["after"]["value"] == 1.0
    assert [(r["node"], r["kind"]) for r in doc["repairs"]] == [(BN, "fold-bn")] and doc["kept"] == []
    js2 = tmp_path / "r2.json"
    assert main([*args[:-4], "--out", str(tmp_path / "f2.onnx"), "--json", str(js2), "--no-rewrites"]) == 0
    assert "kept in reference precision (fp32-island): " + BN in capsys.readouterr().out
    assert json.loads(js2.read_text())["repairs"] == [{"node": BN, "kind": "fp32-island"}]


def _linear_then_scale(kind: str) -> tuple[onnx.ModelProto, dict]:
    """x -> a linear op whose outputs pass 65504 (weights ~ 2000) -> a constant scale that brings them back.
    ``kind``: "matmul+add" (an exported Linear: MatMul, Add of the bias, then Mul by 1e-3), "gemm" (Gemm with C,
    then Div by 1000) or "matmul" (a bare MatMul, then Mul by one scale per output channel)."""
    from onnx import helper

    rng = np.random.default_rng(7)
    n_in, n_out = 64, 32
    w = (rng.uniform(1500.0, 2500.0, (n_in, n_out)) * rng.choice([-1, 1], (1, n_out))).astype(np.float32)
    b = rng.normal(0.0, 10.0, n_out).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    if kind == "matmul+add":
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="fc/MatMul"),
                 helper.make_node("Add", ["mm", "B"], ["lin"], name="fc/Add"),
                 helper.make_node("Mul", ["lin", "C"], ["scaled"], name="fc/scale")]
        inits += [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(1e-3, np.float32), "C")]
    elif kind == "gemm":
        nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["lin"], name="fc/Gemm"),
                 helper.make_node("Div", ["lin", "C"], ["scaled"], name="fc/scale")]
        inits += [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(1000.0, np.float32), "C")]
    else:
        c = rng.uniform(5e-4, 2e-3, n_out).astype(np.float32)
        nodes = [helper.make_node("MatMul", ["x", "W"], ["lin"], name="fc/MatMul"),
                 helper.make_node("Mul", ["lin", "C"], ["scaled"], name="fc/scale")]
        inits += [numpy_helper.from_array(c, "C")]
    nodes.append(helper.make_node("Relu", ["scaled"], ["y"], name="act/Relu"))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, n_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n_out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = (np.abs(rng.standard_normal((4, n_in))) * 3).astype(np.float32)
    return model, {"x": x}


def _repaired_by_fold_scale_alone(model: onnx.ModelProto, feed: dict, tmp_path: Path, scale: str, into: str):
    """Repair ``model`` on ref:fp16 (verified on onnxruntime): met by one fold-scale of node ``scale`` into node
    ``into``, no island; the saved model is valid, has no ``scale`` node and only FP16 weights. -> (result, path)."""
    path, out = tmp_path / "model.onnx", tmp_path / "fixed.onnx"
    onnx.save(model, str(path))
    res = repair(str(path), "ref", "ref:fp16", feeds=[feed], out=out, verify="ort")
    assert res.met and res.kept == [] and res.verification["independent"]["met"], res.render()
    assert [(r["node"], r["kind"], r["into"]) for r in res.repairs] == [(scale, "fold-scale", into)]
    fixed = onnx.load(str(out))
    onnx.checker.check_model(fixed)
    assert scale not in {n.name for n in fixed.graph.node}
    assert float_weight_types(fixed) == {TensorProto.FLOAT16}
    return res, out


@pytest.mark.parametrize("kind, culprit_into", [("matmul+add", "fc/Add"), ("gemm", "fc/Gemm"),
                                                ("matmul", "fc/MatMul")])
def test_a_scale_after_an_overflowing_matmul_or_gemm_moves_into_its_weights(tmp_path, kind, culprit_into):
    """The linear op's outputs pass FP16's 65504 before the scale brings them back: on ref:fp16 (numpy FP16
    arithmetic) the outputs are inf. The scale moves into the weights (and the bias), the Mul/Div goes, and every
    weight stays FP16. The truth: numpy's float64 arithmetic on the FP32 weights and onnxruntime on the saved
    model."""
    model, feed = _linear_then_scale(kind)
    _, out = _repaired_by_fold_scale_alone(model, feed, tmp_path, "fc/scale", culprit_into)
    # float64 truth from the FP32 model's own weights, computed here by hand
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = feed["x"].astype(np.float64)
    lin = x @ init["W"] + init.get("B", 0.0)
    truth = np.maximum(lin / init["C"] if kind == "gemm" else lin * init["C"], 0.0)
    assert np.abs(lin).max() > 65504  # the linear op does overflow FP16 before the scale
    import onnxruntime as ort

    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.isfinite(got).all() and np.abs(got - truth).max() < 1e-3 * np.abs(truth).max(), np.abs(got - truth).max()


def _attention(scale: float = 1e-4, exported: bool = False) -> tuple[onnx.ModelProto, dict]:
    """One attention head whose scores Q @ K^T pass 65504 (projections of std 10 on 64 features: up to 1.6e5)
    before ``* scale`` brings them to softmax's range: q = Reshape(x @ Wq + bq), k^T = Transpose(x @ Wk + bk),
    y = softmax((q @ k^T) * scale) @ (x @ Wv). ``exported``: as torch.onnx.export writes a Hugging Face BERT's
    eager attention: the query bias read through an Identity and added first (``Add(bias, x @ Wq)``), the scale a
    ``Div`` by a Constant node."""
    from onnx import helper

    rng = np.random.default_rng(3)
    s, d = 16, 64
    f = numpy_helper.from_array
    weights = {"Wq": rng.standard_normal((d, d)) * 10, "Wk": rng.standard_normal((d, d)) * 10,
               "Wv": rng.standard_normal((d, d)) / 8, "Bq": rng.standard_normal(d), "Bk": rng.standard_normal(d),
               "C": np.array(scale)}
    q_add = helper.make_node("Add", ["q_mm", "Bq"], ["q_lin"], name="q/Add")
    scaling = [helper.make_node("Mul", ["scores", "C"], ["scaled"], name="attn/scale")]
    if exported:
        q_add = helper.make_node("Add", ["q_bias", "q_mm"], ["q_lin"], name="q/Add")
        scaling = [helper.make_node("Identity", ["Bq"], ["q_bias"], name="q/bias/Identity"),
                   helper.make_node("Constant", [], ["div_by"], name="attn/Constant",
                                    value=f(np.array(1 / scale, np.float32))),
                   helper.make_node("Div", ["scores", "div_by"], ["scaled"], name="attn/scale")]
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q_mm"], name="q/MatMul"),
             q_add,
             helper.make_node("Reshape", ["q_lin", "shape"], ["q"], name="q/Reshape"),
             helper.make_node("MatMul", ["x", "Wk"], ["k_mm"], name="k/MatMul"),
             helper.make_node("Add", ["k_mm", "Bk"], ["k"], name="k/Add"),
             helper.make_node("Transpose", ["k"], ["kT"], name="k/Transpose", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kT"], ["scores"], name="attn/scores"),
             *scaling,
             helper.make_node("Softmax", ["scaled"], ["p"], name="attn/softmax", axis=-1),
             helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v/MatMul"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="attn/context")]
    inits = [f(v.astype(np.float32), k) for k, v in weights.items()] + [f(np.array([1, s, d]), "shape")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"x": rng.standard_normal((1, s, d)).astype(np.float32)}


@pytest.mark.parametrize("exported", [False, True], ids=["mul", "as-exported"])
def test_a_scale_after_attention_scores_moves_into_the_query_projection(tmp_path, exported):
    """Attention scores that overflow FP16 before their scale (ref:fp16: FP16 storage between nodes): the scalar
    moves across the scores MatMul and the query's Reshape into the query projection's weights and bias, so
    Q @ K^T is computed in range, every weight FP16 -- also in torch's export of a Hugging Face BERT (the bias
    behind an Identity, a Div by a Constant node). The truth: float64 numpy on the FP32 weights, and onnxruntime
    on the saved model."""
    model, feed = _attention(exported=exported)
    res, out = _repaired_by_fold_scale_alone(model, feed, tmp_path, "attn/scale", "attn/scores")
    assert "inf/NaN where the reference is finite" in res.render()  # the output before: NaN from the inf scores
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = feed["x"].astype(np.float64)
    scores = (x @ w["Wq"] + w["Bq"]) @ (x @ w["Wk"] + w["Bk"]).transpose(0, 2, 1)
    assert np.abs(scores).max() > 65504  # Q @ K^T does overflow FP16 before the scale
    z = scores * w["C"]
    p = np.exp(z - z.max(-1, keepdims=True))
    truth = (p / p.sum(-1, keepdims=True)) @ (x @ w["Wv"])
    import onnxruntime as ort

    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.isfinite(got).all() and np.abs(got - truth).max() < 1e-2 * np.abs(truth).max()
