"""`workbench reduce`: the smallest reference/candidate pair around a culprit, checked in a fresh Python that has
only numpy and onnxruntime (as the README tells a bug report's reader to run it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.cli import main
from workbench.reduce import FILES, ReduceError, reduce

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
BN = "/bn_big_var/BatchNormalization"

#: what a bug report's reader runs: numpy and onnxruntime only, nothing of the workbench (or onnx) imported
FRESH = r'''
import json, sys
import numpy as np
import onnxruntime as ort
inputs, expected = np.load("inputs.npz"), np.load("expected.npz")
def run(path):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    cast = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
    feed = {i.name: inputs[i.name].astype(cast.get(i.type, inputs[i.name].dtype)) for i in s.get_inputs()}
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
ref, cand = run("reference.onnx"), run("candidate.onnx")
def sqnr(e, g):
    e, g = e.astype(np.float64), g.astype(np.float64)
    ok = np.isfinite(g)
    d = np.where(ok, g - e, 0.0)
    return 10 * np.log10(np.sum(e ** 2) / np.sum(d ** 2)) if d.any() else float("inf"), int((~ok).sum())
out = {name: {"ref": sqnr(expected[name], ref[name]), "cand": sqnr(expected[name], cand[name]),
              "ref_close": bool(np.allclose(ref[name], expected[name], rtol=1e-5, atol=1e-6))}
       for name in expected.files}
out["__imported__"] = sorted(m for m in ("workbench", "onnx") if m in sys.modules)
print(json.dumps(out))
'''


def fresh_run(folder: Path, code: str = FRESH) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh, isolated interpreter inside ``folder``."""
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=120, check=False)


def fresh_check(folder: Path) -> dict:
    proc = fresh_run(folder)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc.pop("__imported__") == []
    return doc


def readme_snippet(folder: Path) -> str:
    text = (folder / "README.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def node_count(path: Path) -> int:
    return len(onnx.load(path).graph.node)


def test_fp16_clamped_batchnorm_alone_reproduces_in_a_fresh_python(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "bug"
    result = reduce(CLAMP, "ort", "ort:fp16", out=out)
    assert result.reproduced and result.exit_code == 0 and result.node == BN
    assert result.nodes == [BN] and len(result.attempts) == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert not any(cwd.iterdir())  # nothing written where the user stands
    assert node_count(out / "reference.onnx") == 1 and node_count(out / "candidate.onnx") <= 3
    assert result.metrics["sqnr_db"] < 30 and result.reference_metrics["sqnr_db"] > 100
    # the reason travels with it: the candidate's variance constant is the clamped one
    ref_var = {t.name: numpy_helper.to_array(t) for t in onnx.load(out / "reference.onnx").graph.initializer}
    cand_var = {t.name: numpy_helper.to_array(t) for t in onnx.load(out / "candidate.onnx").graph.initializer}
    name = "/bn_big_var/running_var"
    assert ref_var[name][3] == pytest.approx(9.8e7) and cand_var[name].dtype == np.float16
    assert float(cand_var[name][3]) <= 65504
    doc = fresh_check(out)
    (tensor,) = doc
    assert doc[tensor]["cand"][0] < 30 and doc[tensor]["ref"][0] > 100 and doc[tensor]["ref_close"]
    assert doc[tensor]["cand"][0] == pytest.approx(result.metrics["sqnr_db"], abs=0.01)
    # the README: versions, command, node, measured divergence, and a snippet that runs as printed
    readme = (out / "README.md").read_text()
    for needle in ("onnxruntime:", "onnx:", "workbench:", "python:", "workbench reduce", "--cand ort:fp16", BN,
                   "BatchNormalization", "sqnr_db", "cosine", "max_abs", "nonfinite_mismatch", "-18.4"):
        assert needle in readme, needle
    proc = fresh_run(out, readme_snippet(out) + "\nimport sys; assert 'workbench' not in sys.modules\n")
    assert proc.returncode == 0, proc.stderr
    cand_line = next(line for line in proc.stdout.splitlines() if line.startswith("candidate vs expected"))
    assert float(re.search(r"sqnr_db (\S+),", cand_line).group(1)) < 30


def test_external_data_model_reduces_to_self_contained_files(tmp_path):
    out = tmp_path / "bug"
    result = reduce(SAMPLES / "external_data" / "mlp_external.onnx", "ort", "ort:fp16", out=out)
    assert result.reproduced and result.nodes == ["/fc2/MatMul"]
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # no weights.bin beside them
    for name in ("reference.onnx", "candidate.onnx"):
        data = (out / name).read_bytes()
        model = onnx.load_model_from_string(data)  # no base path: everything is inside
        assert not any(t.data_location == TensorProto.EXTERNAL or t.external_data for t in model.graph.initializer)
        assert any(t.raw_data or t.float_data or t.int32_data for t in model.graph.initializer)
        assert len(model.graph.node) <= 3
    doc = fresh_check(out)
    (tensor,) = doc
    assert doc[tensor]["cand"][0] < 30 and doc[tensor]["ref_close"]


def test_users_own_fp16_file_gives_the_candidate_side(tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    mine = tmp_path / "mine" / "model_fp16.onnx"
    mine.parent.mkdir()
    # the user's converter settings differ from the workbench variant's (which clamps to 65504)
    onnx.save(convert_float_to_float16(onnx.load(CLAMP), keep_io_types=True, max_finite_val=1e4), mine)
    out = tmp_path / "mine" / "bug"  # inside the model's folder is fine
    result = reduce(CLAMP, "ort", "ort", cand_model=mine, out=out)
    assert result.reproduced and result.node == BN
    cand = {t.name: numpy_helper.to_array(t) for t in onnx.load(out / "candidate.onnx").graph.initializer}
    assert float(cand["/bn_big_var/running_var"][3]) == pytest.approx(1e4, rel=1e-3)  # the user's clamp, not ours
    ref = {t.name: numpy_helper.to_array(t) for t in onnx.load(out / "reference.onnx").graph.initializer}
    assert ref["/bn_big_var/running_var"].dtype == np.float32
    assert "model_fp16.onnx" in (out / "README.md").read_text()
    doc = fresh_check(out)
    assert all(v["cand"][0] < 30 and v["ref_close"] for v in doc.values())


def test_grows_one_producer_at_a_time_until_it_reproduces(tmp_path):
    result = reduce(CLAMP, "ort", "ort:fp16", node="/head/pool/GlobalAveragePool", out=tmp_path / "a")
    assert [len(a.nodes) for a in result.attempts] == [1, 2, 3]
    assert [a.reproduced for a in result.attempts] == [False, False, True]
    assert result.nodes == [BN, "/relu/Relu", "/head/pool/GlobalAveragePool"]
    assert node_count(tmp_path / "a" / "reference.onnx") == 3
    doc = fresh_check(tmp_path / "a")
    assert all(v["cand"][0] < 30 for v in doc.values())
    capped = reduce(CLAMP, "ort", "ort:fp16", node="/head/pool/GlobalAveragePool", max_nodes=2,
                    out=tmp_path / "b")
    assert not capped.reproduced and capped.exit_code == 1 and len(capped.attempts) == 2
    assert "does NOT reproduce" in (tmp_path / "b" / "README.md").read_text()


def test_constant_node_inputs_are_embedded_on_both_sides(tmp_path):
    """A Constant node feeding the culprit becomes an initializer; the candidate keeps its own (converted)
    constant, so the FP16 clamp of 1e5 stays in the reproducer."""
    path = _scaled_model(tmp_path / "const.onnx")
    feeds = {"x": np.array([[1e-4, 2e-4, 3e-4, 4e-4]], np.float32)}
    result = reduce(path, "ort", "ort:fp16", feeds=feeds, node="/scale/Mul", out=tmp_path / "bug")
    assert result.reproduced
    models = {name: onnx.load(tmp_path / "bug" / name) for name in ("reference.onnx", "candidate.onnx")}
    assert [n.op_type for n in models["reference.onnx"].graph.node] == ["Mul"]
    assert [n.op_type for n in models["candidate.onnx"].graph.node] == ["Mul", "Cast"]  # y is cast back to float
    consts = {}
    for name, m in models.items():
        assert [i.name for i in m.graph.input] == ["h"] and [o.name for o in m.graph.output] == ["y"]
        consts[name] = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}["c"]
    assert consts["reference.onnx"].max() == 1e5 and consts["candidate.onnx"].dtype == np.float16
    assert float(consts["candidate.onnx"].max()) <= 65504


def _scaled_model(path: Path, batch: int | str = 1) -> Path:
    """x[batch,4] -> MatMul(I) -> Mul(Constant 1e5): the constant overflows FP16."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    big = numpy_helper.from_array(np.full((1, 4), 1e5, np.float32), "big")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="/fc/MatMul"),
             helper.make_node("Constant", [], ["c"], name="/scale/Constant", value=big),
             helper.make_node("Mul", ["h", "c"], ["y"], name="/scale/Mul")]
    graph = helper.make_graph(nodes, "const", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_feeds_of_different_shapes_give_symbolic_dims(tmp_path):
    path = _scaled_model(tmp_path / "dyn.onnx", batch="N")
    feeds = [{"x": np.full((1, 4), 1e-4, np.float32)}, {"x": np.full((3, 4), 1e-4, np.float32)}]
    result = reduce(path, "ort", "ort:fp16", feeds=feeds, node="/scale/Mul", out=tmp_path / "bug")
    assert result.reproduced
    (vi,) = onnx.load(tmp_path / "bug" / "reference.onnx").graph.input
    dims = vi.type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_value == 4
    assert fresh_check(tmp_path / "bug")["y"]["cand"][0] < 30


def test_a_failure_leaves_nothing_behind(tmp_path, monkeypatch):
    import workbench.reduce.api as reduce_module

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(reduce_module, "readme", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        reduce(CLAMP, "ort", "ort:fp16", out=tmp_path / "bug")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_folder_gets_ordinary_permissions_and_an_empty_one_is_reused(tmp_path):
    import os

    out = tmp_path / "bug"
    out.mkdir()
    reduce(CLAMP, "ort", "ort:fp16", out=out)
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bug"]


def test_another_candidate_engine_is_named_in_the_readme(tmp_path):
    result = reduce(SAMPLES / "cnn_fp16_overflow.onnx", "ref", "ref:fp16", out=tmp_path / "bug")
    assert result.reproduced and result.node == "/stage2/conv/Conv" and result.engine == "ref"
    assert result.metrics["nonfinite_mismatch"] > 0 and result.ort_metrics is not None
    readme = (tmp_path / "bug" / "README.md").read_text()
    assert "shows on the `ref` engine" in readme and "ONNX Runtime CPU on candidate.onnx gives" in readme
    assert "get_engine('ref', precision='native')" in readme


def test_bad_inputs_are_refused_before_anything_is_written(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    with pytest.raises(ReduceError, match="not empty"):
        reduce(CLAMP, out=full)
    with pytest.raises(ReduceError, match="is a file"):
        reduce(CLAMP, out=full / "keep.txt")
    with pytest.raises(ReduceError, match="unknown node '/nope'"):
        reduce(CLAMP, node="/nope", out=tmp_path / "new")
    assert not (tmp_path / "new").exists()
    with pytest.raises(ReduceError, match="max_nodes"):
        reduce(CLAMP, max_nodes=0, out=tmp_path / "new")
    with pytest.raises(ReduceError, match="no node introduces a harmful divergence"):
        reduce(SAMPLES / "healthy_cnn.onnx", out=tmp_path / "new")


def test_node_may_be_named_by_its_output_tensor(tmp_path):
    result = reduce(CLAMP, node="/bn_big_var/BatchNormalization_output_0", out=tmp_path / "bug")
    assert result.node == BN and result.reproduced


# --- CLI ---------------------------------------------------------------------------------------------------
def test_cli_end_to_end_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "bug"
    assert main(["reduce", str(CLAMP), "--ref", "ort", "--cand", "ort:fp16", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "reproduces alone" in text and BN in text
    assert f"workbench reduce {CLAMP} --ref ort --cand ort:fp16 --out {out}" in (out / "README.md").read_text()
    doc = fresh_check(out)
    assert all(v["cand"][0] < 30 for v in doc.values())
    # the same folder again: refused, one line, exit 2
    assert main(["reduce", str(CLAMP), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and err.count("\n") == 1
    # a file as --out
    assert main(["reduce", str(CLAMP), "--out", str(out / "README.md")]) == 2
    assert "is a file" in capsys.readouterr().err
    # unknown node: one line, exit 2, nothing written
    assert main(["reduce", str(CLAMP), "--node", "/bn_big/BatchNorm", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: unknown node '/bn_big/BatchNorm'") and err.count("\n") == 1
    assert "did you mean /bn_big_var/BatchNormalization" in err and not (tmp_path / "x").exists()
    # written, but not reproduced within --max-nodes: exit 1, and it says so
    assert main(["reduce", str(CLAMP), "--node", "/head/fc/Gemm", "--max-nodes", "1", "--out",
                 str(tmp_path / "gemm"), "--json", str(tmp_path / "gemm.json")]) == 1
    assert "NOT reproduced within 1 node(s)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "gemm.json").read_text())
    assert doc["schema"] == "workbench.reduce/1" and doc["reproduced"] is False
    assert (tmp_path / "gemm" / "README.md").exists()
    assert main(["reduce", str(CLAMP), "--max-nodes", "0", "--out", str(tmp_path / "y")]) == 2


def test_cli_user_file(tmp_path, capsys):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    mine = tmp_path / "mine_fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(CLAMP), keep_io_types=True), mine)
    out = tmp_path / "bug"
    assert main(["reduce", str(CLAMP), "--cand", "ort", "--cand-model", str(mine), "--out", str(out)]) == 0
    assert f"--cand-model {mine}" in (out / "README.md").read_text()
    assert main(["reduce", str(CLAMP), "--cand", "ort:fp16", "--cand-model", str(mine), "--out",
                 str(tmp_path / "z")]) == 2
    assert "drop ':fp16'" in capsys.readouterr().err


# --- a real model ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ppocr_det_fp16_batchnorm_reduces_to_a_tiny_pair(fetch_model, tmp_path):
    out = tmp_path / "det"
    result = reduce(fetch_model("ppocr-det"), "ort", "ort:fp16", input_shapes={"x": [1, 3, 320, 320]}, out=out)
    assert result.reproduced and result.op_type == "BatchNormalization"
    assert node_count(out / "reference.onnx") <= 3 and node_count(out / "candidate.onnx") <= 3
    doc = fresh_check(out)
    assert all(v["cand"][0] < 30 and v["ref_close"] for v in doc.values())
