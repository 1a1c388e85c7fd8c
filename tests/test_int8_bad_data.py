"""INT8 on data or models it cannot quantize honestly: calibration data holding inf, a model quantized already,
a model with nothing to quantize, tensors holding only zeros or an -inf mask, bad imported thresholds, too few
bins. Each is one clear error (nothing written) or a note that names the tensors, never an FP32 model reported as
INT8; ORT's own loader reads the calibration.json we write (test_calibrate_formats)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import SAMPLES
from onnx import TensorProto, helper

from workbench.calibrate import calibrate
from workbench.calibrate.formats import read_trt_cache
from workbench.cli import main
from workbench.errors import VariantError, WorkbenchError
from workbench.variants import make_variant

MODEL = SAMPLES / "int8_outlier.onnx"


def _feeds(count: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(count)]


def _with_inf() -> list[dict[str, np.ndarray]]:
    feeds = _feeds()
    feeds[0]["x"][0, 3] = np.inf
    return feeds


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_calibration_data_holding_inf_is_refused_not_passed_off_as_int8(tmp_path, capsys):
    with pytest.raises(VariantError, match=r"nothing was quantized: the calibration data itself holds NaN/inf "
                                           r"in input\(s\) x"):
        make_variant(onnx.load(MODEL), "int8", calibration_feeds=_with_inf())
    for i, feed in enumerate(_with_inf()):
        np.savez(tmp_path / f"{i}.npz", **feed)
    outs = [tmp_path / "q.onnx", tmp_path / "c.cache"]
    code, _, err = _cli(capsys, "calibrate", MODEL, "--data", tmp_path, "--qdq", outs[0], "--cache", outs[1])
    assert code == 2 and "no tensor has a usable INT8 range (9 left out: x holds NaN/inf" in err  # streamed
    assert len(err.strip().splitlines()) == 1 and not any(p.exists() for p in outs)  # nothing written
    report = calibrate(MODEL, _with_inf())
    assert any("the calibration data itself holds NaN or +inf in input(s) x" in n for n in report.notes)
    for export in (lambda: report.write_trt_cache(tmp_path / "c2.cache"), lambda: report.to_qdq(),
                   lambda: report.write_ort_table(tmp_path / "t")):
        with pytest.raises(WorkbenchError, match=r"holds NaN or \+inf in input"):
            export()
    code, out, err = _cli(capsys, "compare", MODEL, "--cand", "ort:int8", "--calib", tmp_path)
    assert code == 2 and "nothing was quantized" in err and "verdict" not in out


def test_a_model_quantized_already_is_refused_with_what_to_do(tmp_path, capsys):
    qdq = make_variant(onnx.load(MODEL), "int8", calibration_feeds=_feeds()).model
    with pytest.raises(VariantError, match="quantized already") as info:
        make_variant(qdq, "int8", calibration_feeds=_feeds())
    assert "--cand-model" in info.value.hint
    onnx.save(qdq, tmp_path / "q.onnx")
    code, _, err = _cli(capsys, "calibrate", tmp_path / "q.onnx", "--data", 4, "--qdq", tmp_path / "qq.onnx",
                        "--cache", tmp_path / "qq.cache")
    assert code == 2 and "quantized already" in err and "--exclude-nodes" not in err
    assert not (tmp_path / "qq.onnx").exists() and not (tmp_path / "qq.cache").exists()
    assert any("quantized already" in n for n in calibrate(tmp_path / "q.onnx", 2).notes)  # diagnostics: said


def test_a_model_with_nothing_to_quantize_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g", [x],
                                                [y]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(VariantError, match="nothing was quantized: the model has no op that ONNX Runtime's "
                                           "quantizer quantizes.*its ops: Identity"):
        make_variant(model, "int8", calibration_feeds=[{"x": np.ones((1, 4), np.float32)}])


def test_zero_tensors_and_an_inf_mask_are_left_out_of_the_cache_and_said(tmp_path, capsys):
    zeros = [{"x": np.zeros((1, 64), np.float32)} for _ in range(3)]
    report = calibrate(MODEL, zeros)
    note = next(n for n in report.notes if "hold only zeros" in n)
    assert "x" in note and "scale 1" in note
    assert set(report.left_out()) == {"x", "/mlp/fc1/MatMul_output_0"}
    report.write_trt_cache(tmp_path / "z.cache")
    assert "x" not in read_trt_cache(tmp_path / "z.cache").bits
    # the transformer's additive -inf causal mask: a scale from its finite values would clip -inf; left out
    model, inputs = SAMPLES / "transformer_block.onnx", SAMPLES / "transformer_block_inputs.npz"
    code, out, _ = _cli(capsys, "calibrate", model, "--data", inputs, "--cache", tmp_path / "tb.cache")
    assert code == 0
    mask = "/block/attn/mask/Add_output_0"
    assert mask not in read_trt_cache(tmp_path / "tb.cache").bits
    assert "2 tensor(s) left out: attention_mask holds NaN/inf" in out and f"{mask} holds NaN/inf" in out


def test_imported_thresholds_that_set_no_range_are_left_out_and_duplicates_refused(tmp_path, capsys):
    bad = tmp_path / "bad.cache"
    bad.write_text("TRT-100300-EntropyCalibration2\nx: 7f800000\n/mlp/fc1/MatMul_output_0: 00000000\n"
                   "/mlp/fc2/Add_output_0: 3c000000\n")
    report = calibrate(MODEL, 2)
    imported = report.read_cache(bad)
    assert imported.matched == ["/mlp/fc2/Add_output_0"]
    assert any("not positive finite" in n and "'x' (amax inf)" in n for n in report.notes)
    dup = tmp_path / "dup.cache"
    dup.write_text("TRT-100300-EntropyCalibration2\nx: 3c000000\nx: 3c000000\n")
    code, _, err = _cli(capsys, "calibrate", MODEL, "--data", 2, "--import-cache", dup)
    assert code == 2 and "line 3: tensor 'x' appears a second time" in err


def test_too_few_bins_for_the_entropy_search_are_refused(capsys):
    with pytest.raises(WorkbenchError, match=">= 128"):
        calibrate(MODEL, 2, num_bins=64)
    code, _, err = _cli(capsys, "calibrate", MODEL, "--data", 2, "--num-bins", 2)
    assert code == 2 and "128" in err


def test_compare_takes_a_count_of_random_calibration_feeds(tmp_path, capsys):
    code, out, err = _cli(capsys, "compare", MODEL, "--cand", "ort:int8", "--calib", 8, "--bundle", tmp_path / "b")
    assert code in (0, 1) and "error" not in err and "verdict" in out
    assert len(list((tmp_path / "b" / "calibration").glob("*.npz"))) == 8  # the feeds it drew travel with it
    code, out, _ = _cli(capsys, "rerun", tmp_path / "b")
    assert code in (0, 1) and ": REPRODUCED" in out


def test_int8_repair_of_an_old_opset_model_with_constants_and_a_softmax(tmp_path):
    """Opset 11 -> 13 for Q/DQ: the version converter wraps a Softmax in new, unnamed nodes (the graph output's
    Reshape among them), and Constant nodes feed quantized nodes (as in the PP-OCR recognizers): the variant names
    every node, the pool holds no Constant, and the repair meets a strict target with onnxruntime (was: 'node
    Constant_1 is a Constant', or the output's Q/DQ left in place)."""
    from onnx import numpy_helper

    from workbench.repair import repair

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    bias = helper.make_tensor("b", TensorProto.FLOAT, [16], rng.standard_normal(16).astype(np.float32).tolist())
    nodes = [helper.make_node("Constant", [], ["bias"], value=bias),
             helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "bias"], ["hb"], name="add"),
             helper.make_node("Softmax", ["hb"], ["y"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    onnx.save(model, tmp_path / "old.onnx")
    feeds = [{"x": (rng.standard_normal((1, 4, 16)) * 3).astype(np.float32)} for _ in range(4)]
    variant = make_variant(onnx.load(tmp_path / "old.onnx"), "int8", calibration_feeds=feeds).model
    assert all(n.name for n in variant.graph.node)
    result = repair(tmp_path / "old.onnx", "ort", "ort:int8", feeds=feeds, calibration=feeds, target="sqnr_db<60",
                    out=tmp_path / "fixed.onnx")
    assert result.met, result.render()
    import onnxruntime as ort

    ref = ort.InferenceSession(str(tmp_path / "old.onnx"), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(tmp_path / "fixed.onnx"), providers=["CPUExecutionProvider"])
    for feed in feeds:  # checked here in numpy: the repaired model's output against FP32's
        r, c = ref.run(None, feed)[0].astype(np.float64), got.run(None, feed)[0].astype(np.float64)
        assert 10 * np.log10((r ** 2).sum() / max(((r - c) ** 2).sum(), 1e-300)) >= 60
