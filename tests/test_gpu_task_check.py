"""scripts/gpu_task_check.py: case loading, the task judgement and the onnx -> torch path on a tiny FP16 model.

The judgement and the Constant -> initializer rewrite are checked against numpy and onnx's ReferenceEvaluator;
the onnx2torch part (not a project dependency: the device check installs its wheel) is skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import onnx
import pytest
from conftest import REPO, load_file
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

G = load_file(REPO / "scripts" / "gpu_task_check.py")


def fp16_model() -> onnx.ModelProto:
    """x (float32, 1x2x6x6) -> Cast fp16 -> Conv (fp16 weights from a Constant node, bias an initializer) -> Relu ->
    Cast float32 -> y: a det-like 1x1x6x6 map; FP32 graph I/O as the FP16 converters keep them."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 2, 3, 3)) * 0.3).astype(np.float16)
    b = np.array([0.2], np.float16)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("Conv", ["x16", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6, 6])],
                              initializer=[numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feed(seed: int) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((1, 2, 6, 6)).astype(np.float32)}


def write_cases(folder, model: onnx.ModelProto, n_feeds: int = 2) -> list[dict]:
    """A cases folder as scripts/gpu_task_cases.py writes it: one det model, its FP16 file as the ``workbench``
    tool, feeds and the reference outputs (the reference evaluator's, standing in for ONNX Runtime's FP32)."""
    case = folder / "toy-det"
    case.mkdir(parents=True)
    onnx.save(model, case / "workbench.onnx")
    ref = ReferenceEvaluator(model)
    refs = []
    for i in range(n_feeds):
        np.savez_compressed(case / f"feed_{i:03d}.npz", **feed(i))
        refs.append({"y": ref.run(None, feed(i))[0]})
        np.savez_compressed(case / f"ref_{i:03d}.npz", **refs[-1])
    manifest = {"made": "test", "git": "test", "cases": [{
        "model": "toy-det", "kind": "det", "inputs": ["x"], "outputs": ["y"], "fp32": None,
        "feeds": [f"toy-det/feed_{i:03d}.npz" for i in range(n_feeds)],
        "refs": [f"toy-det/ref_{i:03d}.npz" for i in range(n_feeds)],
        "tools": {"workbench": {"file": "toy-det/workbench.onnx", "cpu_met": True, "high_nodes": 0},
                  "ort-fp16": {"file": "toy-det/workbench.onnx", "cpu_met": False, "high_nodes": 0,
                               "same_as": "workbench"},
                  "autocast+calib": {"file": None, "cpu_met": True, "high_nodes": 3, "dropped": "over budget"}}}]}
    (folder / "cases.json").write_text(json.dumps(manifest))
    return refs


def test_load_cases_resolves_files_and_rejects_bad_folders(tmp_path):
    write_cases(tmp_path / "ok", fp16_model())
    manifest = G.load_cases(tmp_path / "ok")
    case = manifest["cases"][0]
    assert case["tools"]["workbench"]["file"] == tmp_path / "ok" / "toy-det" / "workbench.onnx"
    assert [p.name for p in case["feeds"]] == ["feed_000.npz", "feed_001.npz"]
    assert G.load_arrays(case["feeds"])[1]["x"].tolist() == feed(1)["x"].tolist()
    with pytest.raises(G.CasesError, match="cannot read"):
        G.load_cases(tmp_path / "missing")
    (tmp_path / "ok" / "toy-det" / "ref_001.npz").unlink()
    with pytest.raises(G.CasesError, match="missing or unpaired"):
        G.load_cases(tmp_path / "ok")
    assert G.main(["--cases", str(tmp_path / "missing"), "--device", "cpu"]) == 2


def test_judge_det_flips_against_the_target():
    rng = np.random.default_rng(1)
    prob = rng.uniform(0, 1, (1, 1, 40, 50)).astype(np.float32)
    ref = [{"y": prob}]
    few = prob.copy().reshape(-1)
    few[:8] = np.where(few[:8] > 0.3, 0.0, 1.0)  # 8 of 2000 pixels flip: 0.4% < 0.5%
    many = prob.copy().reshape(-1)
    many[:12] = np.where(many[:12] > 0.3, 0.0, 1.0)  # 0.6%
    ok = G.judge("toy-det", "det", ref, [{"y": few.reshape(prob.shape)}])
    bad = G.judge("toy-det", "det", ref, [{"y": many.reshape(prob.shape)}])
    assert ok["met"] and ok["worst"] == pytest.approx(1 - 8 / 2000)
    assert not bad["met"] and bad["worst"] == pytest.approx(1 - 12 / 2000)


def test_judge_rec_cls_and_output_stats():
    idx = np.array([[1, 1, 0, 2, 3, 0, 0, 4, 4, 0], [2, 0, 3, 3, 0, 1, 0, 0, 0, 0]])
    rec = np.full((2, 10, 5), 0.025, np.float32)
    np.put_along_axis(rec, idx[..., None], 0.9, axis=-1)
    changed = rec.copy()
    changed[1, 6] = [0.025, 0.025, 0.025, 0.025, 0.9]  # a blank becomes a 4: the second line reads one more char
    assert G.judge("toy-rec", "rec", [{"o": rec}], [{"o": rec + 1e-3}])["met"]
    verdict = G.judge("toy-rec", "rec", [{"o": rec}], [{"o": changed}])
    assert not verdict["met"] and verdict["worst"] == 1
    cls = np.array([[0.9, 0.1], [0.2, 0.8]], np.float32)
    assert G.judge("toy-cls", "cls", [{"p": cls}], [{"p": cls[::-1].copy()}])["worst"] == 2
    noisy = cls + np.float32(0.01)
    noisy[0, 1] = np.inf
    stats = G.output_stats([{"p": cls}], [{"p": noisy}])["p"]
    assert stats["nonfinite"] == 1 and math.isnan(stats["sqnr_db"]) and stats["max_abs"] == pytest.approx(0.91)
    stats = G.output_stats([{"p": cls}], [{"p": cls + np.float32(0.01)}])["p"]
    expect = 10 * np.log10(np.sum(cls.astype(np.float64) ** 2) / np.sum(np.full(4, 0.01) ** 2))
    assert stats["sqnr_db"] == pytest.approx(expect, abs=0.01) and stats["nonfinite"] == 0


def test_constants_become_initializers_of_the_same_dtype():
    model = fp16_model()
    moved = G.constants_to_initializers(model)
    assert [n.op_type for n in moved.graph.node] == ["Cast", "Conv", "Relu", "Cast"]
    w = next(t for t in moved.graph.initializer if t.name == "w")
    assert w.data_type == TensorProto.FLOAT16
    x = feed(3)
    np.testing.assert_array_equal(ReferenceEvaluator(moved).run(None, x)[0], ReferenceEvaluator(model).run(None, x)[0])
    types = G._onnx_float_types(moved)
    assert types["c"] == "float16" and types["y"] == "float32"


def test_onnx2torch_runs_the_file_dtypes_and_main_writes_its_table(tmp_path):
    if importlib.util.find_spec("onnx2torch") is None:
        pytest.skip("onnx2torch is not installed (not a project dependency: the device check carries its wheel)")
    refs = write_cases(tmp_path / "cases", fp16_model())
    assert G.main(["--cases", str(tmp_path / "cases"), "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "gpu_task_check.json").read_text())
    row, same, dropped = doc["rows"]
    assert same["same_as"] == "workbench" and same["cpu_met"] is False and same["met"] == row["met"]
    assert dropped["tool"] == "autocast+calib" and dropped["error"] == "over budget"
    assert row["dtype_check"]["mismatched"] == 0 and row["dtype_check"]["torch_dtypes"]["float16"] >= 2
    assert row["params"] == {"float16": 2}
    module, types, inputs, outputs, from_ort = G.convert(tmp_path / "cases" / "toy-det" / "workbench.onnx",
                                                         G.import_onnx2torch("cpu")[0], feed(0))
    assert from_ort == 0  # onnx type inference knows every shape of this graph
    import torch

    got, check = G.run_module(module, [feed(0), feed(1)], inputs, outputs, torch.device("cpu"), types)
    for r, g in zip(refs, got, strict=True):
        np.testing.assert_allclose(g["y"], r["y"], atol=2e-3, rtol=2e-3)  # FP16 kernels vs numpy's FP16
    assert row["met"] is True and "toy-det" in (tmp_path / "out" / "gpu_task_check.txt").read_text()


def test_transformer_cases_are_judged_per_feed_on_argmax_and_sqnr():
    """Kind ``tensor`` (scripts/gpu_transformer_cases.py): a feed passes when the argmax over the last axis agrees
    on >= 99% of the rows and the SQNR is >= 30 dB; NaN fails it."""
    rng = np.random.default_rng(0)
    refs = [{"y": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(2)]
    close = [{"y": r["y"] * (1 + 1e-4)} for r in refs]
    assert G.judge("attention", "tensor", refs, close)["met"]
    broken = [close[0], {"y": np.where(np.arange(16) < 8, np.nan, refs[1]["y"]).astype(np.float32)}]
    judged = G.judge("attention", "tensor", refs, broken)
    assert not judged["met"] and judged["worst"] == 1.0 and judged["outputs"]["y"]["nonfinite"] == 32
