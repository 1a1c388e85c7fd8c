"""Models whose weights stay in their external data files (issue 24, item 2).

One test drives a 2.4 GB model (over protobuf's 2 GB: it can never be serialized whole; sparse files, so it costs
MB of disk) through the CLI in child processes and bounds their peak RSS below 1.5x its largest tensor, which a
single full copy of the weights would break. The others run the same code paths on a small model with the inline
limit lowered (``WORKBENCH_INLINE_WEIGHTS_BYTES``), so they are fast, and check the mapped path against the
ordinary in-memory one: same fingerprint, same metrics, same repair, runnable written files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bigmodel_support import make_big_model, run_cli, write_feeds

from workbench.cli import main
from workbench.model.load import load_model
from workbench.model.mapped import is_mapped, save_model

ROWS, WIDTH = 4096, 64  # the small model: 3 tables of 1 MiB


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, Path]:
    model = make_big_model(tmp_path / "m", rows=ROWS, width=WIDTH)
    return model, write_feeds(tmp_path / "feeds", width=WIDTH, rows=ROWS)


@pytest.fixture
def mapped_env(monkeypatch):
    monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", "64K")


def _run(feed: Path, model: Path) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, dict(np.load(feed)))[0]


@pytest.mark.slow
def test_a_model_over_2gb_through_the_cli_without_a_copy_of_its_weights(tmp_path):
    """inspect, compare ort vs ort:fp16 with a bundle, rerun, calibrate: each child's peak RSS under 1.5x the
    largest tensor (805 MB; the weights are 2.4 GB), the divergence found at the clamped table, the bundle without
    the weights. (repair, reduce, --qdq and the rest: the small mapped model below, same code paths.)"""
    model = make_big_model(tmp_path / "big")
    try:
        _over_2gb(model, write_feeds(tmp_path / "feeds"), tmp_path)
    finally:
        shutil.rmtree(model.parent)  # sparse, but 2.4 GB to a reader


def _over_2gb(model: Path, feeds: Path, tmp_path: Path) -> None:
    weights = sum(f.stat().st_size for f in model.parent.glob("*.bin"))
    largest = 196_608 * 1024 * 4
    assert weights > 2**31 and model.stat().st_size < 2**24
    bound = int(1.5 * largest)

    code, out, rss, _ = run_cli(["inspect", str(model), "--json", str(tmp_path / "inspect.json")])
    assert code == 0, out
    doc = json.loads((tmp_path / "inspect.json").read_text())
    assert doc["problems"] == [] and doc["nodes"] == 9
    assert rss < bound, f"inspect peaked at {rss / 1e6:.0f} MB"

    bundle = tmp_path / "bundle"
    code, out, rss, _ = run_cli(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                                 "--bundle", str(bundle), "--json", str(tmp_path / "cmp.json")])
    assert code == 1, out
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert result["first_divergent"]["node"] == "gather1"
    assert any(c["name"] == "T1" and c["kind"] == "overflow" for c in result["variant"]["clamped"])
    assert rss < bound, f"compare peaked at {rss / 1e6:.0f} MB"
    entry = json.loads((bundle / "manifest.json").read_text())["model"]
    assert sorted(w["location"] for w in entry["weights"]) == ["big.bin", "big2.bin"]
    assert sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) < 64 << 20  # weights referenced

    code, out, rss, _ = run_cli(["rerun", str(bundle)])
    assert code == 1, out
    assert "first divergent: g1 -> g1 (same)" in out and "per-tensor sqnr_db: no change" in out
    assert rss < bound, f"rerun peaked at {rss / 1e6:.0f} MB"

    code, out, rss, _ = run_cli(["calibrate", str(model), "--data", str(feeds), "--json", str(tmp_path / "cal.json")])
    assert code == 0, out
    ranges = json.loads((tmp_path / "cal.json").read_text())
    assert ranges["config"]["feeds"] == 2 and "g1" in ranges["tensors"]
    assert rss < bound, f"calibrate peaked at {rss / 1e6:.0f} MB"


def test_mapped_load_keeps_the_fingerprint_and_reads_no_weight(small, mapped_env, monkeypatch):
    model, _ = small
    mapped = load_model(model)
    tables = [t for t in mapped.proto.graph.initializer if t.name.startswith("T")]
    assert len(tables) == 3 and all(is_mapped(t) and not t.raw_data for t in tables)
    monkeypatch.delenv("WORKBENCH_INLINE_WEIGHTS_BYTES")
    inline = load_model(model)
    assert not any(is_mapped(t) for t in inline.proto.graph.initializer)
    assert mapped.fingerprint == inline.fingerprint
    assert [p.name for p in mapped.external_files] == ["big.bin", "big2.bin"]


def test_mapped_compare_gives_the_in_memory_metrics(small, tmp_path, monkeypatch):
    model, feeds = small
    docs = []
    for limit in ("64K", "1G"):
        monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", limit)
        out = tmp_path / f"cmp-{limit}.json"
        assert main(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                     "--json", str(out)]) == 1
        docs.append(json.loads(out.read_text()))
    mapped, inline = docs
    assert mapped["model"]["sha256"] == inline["model"]["sha256"]
    assert mapped["first_divergent"] == inline["first_divergent"]
    assert mapped["first_divergent"]["node"] == "gather1"
    assert [t["metrics"] for t in mapped["tensors"]] == [t["metrics"] for t in inline["tensors"]]
    assert [c["node"] for c in mapped["culprits"]] == [c["node"] for c in inline["culprits"]]
    assert mapped["variant"]["clamped"] == inline["variant"]["clamped"]


def test_mapped_repair_and_reduce_write_external_data_that_runs(small, mapped_env, tmp_path, capsys):
    model, feeds = small
    fixed = tmp_path / "out" / "fixed.onnx"
    code = main(["repair", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                 "--out", str(fixed), "--json", str(tmp_path / "repair.json")])
    assert code == 0, capsys.readouterr().err
    assert "gather1" in json.loads((tmp_path / "repair.json").read_text())["kept"]
    assert sorted(p.name for p in fixed.parent.iterdir()) == ["fixed.onnx", "fixed.onnx.data"]
    graph = onnx.load(str(fixed), load_external_data=False)
    assert all(not os.path.isabs(e.value) for t in graph.graph.initializer for e in t.external_data)
    feed = sorted(feeds.glob("*.npz"))[0]
    reference, repaired = _run(feed, model), _run(feed, fixed)
    assert np.abs(repaired - reference).max() <= 1e-2 * np.abs(reference).max()

    out = tmp_path / "reduced"
    assert main(["reduce", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                 "--node", "gather1", "--out", str(out)]) == 0  # reproduced alone
    capsys.readouterr()
    assert {"reference.onnx.data", "candidate.onnx.data"} <= {p.name for p in out.iterdir()}
    inputs = dict(np.load(out / "inputs.npz"))
    expected = dict(np.load(out / "expected.npz"))
    got = ort.InferenceSession(str(out / "reference.onnx")).run(None, inputs)[0]
    np.testing.assert_array_equal(got, next(iter(expected.values())))


def test_mapped_calibrate_writes_a_qdq_model_with_external_data(small, mapped_env, tmp_path, capsys):
    model, feeds = small
    qdq = tmp_path / "q" / "model.qdq.onnx"
    assert main(["calibrate", str(model), "--data", str(feeds), "--qdq", str(qdq)]) == 0, capsys.readouterr().err
    assert qdq.with_name("model.qdq.onnx.data").is_file()
    graph = onnx.load(str(qdq), load_external_data=False)
    assert any(n.op_type == "DequantizeLinear" for n in graph.graph.node)
    feed = sorted(feeds.glob("*.npz"))[0]
    reference, quantized = _run(feed, model), _run(feed, qdq)
    assert np.isfinite(quantized).all() and quantized.shape == reference.shape


def test_bundle_references_weights_by_hash_and_rerun_finds_or_refuses_them(small, mapped_env, tmp_path, capsys):
    model, feeds = small
    bundle = tmp_path / "bundle"
    assert main(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                 "--bundle", str(bundle)]) == 1
    entry = json.loads((bundle / "manifest.json").read_text())["model"]
    assert entry["files"] == ["model/big.onnx"] and not (bundle / "model" / "big.bin").exists()
    assert {w["location"]: w["size"] for w in entry["weights"]} == {"big.bin": 2 * ROWS * WIDTH * 4,
                                                                  "big2.bin": ROWS * WIDTH * 4}
    capsys.readouterr()
    assert main(["rerun", str(bundle)]) == 1  # found where the original model is
    assert "first divergent: g1 -> g1 (same)" in capsys.readouterr().out

    moved = tmp_path / "moved"
    shutil.move(str(model.parent), moved)
    assert main(["rerun", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert "kept by reference and were not found" in err and "--weights DIR" in err and len(err.splitlines()) == 1

    assert main(["rerun", str(bundle), "--weights", str(moved)]) == 1
    capsys.readouterr()
    assert main(["rerun", str(bundle), "--weights", str(moved / "big.bin")]) == 2  # a file, not a folder
    assert "not a folder" in capsys.readouterr().err

    data = bytearray((moved / "big2.bin").read_bytes())
    data[-1] ^= 1  # same size, other content
    (moved / "big2.bin").write_bytes(bytes(data))
    assert main(["rerun", str(bundle), "--weights", str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert "big2.bin has sha256" in err and "the bundle recorded" in err and len(err.splitlines()) == 1


def test_bundle_weights_copy_copies_them(small, mapped_env, tmp_path, capsys):
    model, feeds = small
    bundle = tmp_path / "bundle"
    assert main(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                 "--bundle", str(bundle), "--bundle-weights", "copy", "--no-culprits"]) == 1
    entry = json.loads((bundle / "manifest.json").read_text())["model"]
    assert "weights" not in entry and (bundle / "model" / "big.bin").is_file()
    shutil.rmtree(model.parent)
    capsys.readouterr()
    assert main(["rerun", str(bundle)]) == 1
    assert main(["rerun", str(bundle), "--weights", str(tmp_path)]) == 2  # it keeps none by reference
    assert "keeps no weights by reference" in capsys.readouterr().err


def test_save_model_writes_external_data_past_the_threshold(tmp_path, monkeypatch):
    """An in-memory model over the save threshold gets NAME.data beside it; under it, one file."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    assert [p.name for p in save_model(proto, tmp_path / "a.onnx")] == ["a.onnx"]
    monkeypatch.setenv("WORKBENCH_SAVE_EXTERNAL_BYTES", "1000")
    written = save_model(proto, tmp_path / "b.onnx")
    assert [p.name for p in written] == ["b.onnx", "b.onnx.data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx", "b.onnx.data"]  # no temporaries
    x = np.ones((1, 64), np.float32)
    for name in ("a.onnx", "b.onnx"):
        got = ort.InferenceSession(str(tmp_path / name)).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, x @ numpy_helper.to_array(w), rtol=1e-6)


def test_runtimes_that_read_only_beside_the_graph_get_a_private_copy(small, tmp_path, monkeypatch):
    """OpenVINO cannot be told where the weights are: it gets a private copy (file to file) and the same answer."""
    pytest.importorskip("openvino")
    model, feeds = small
    docs = []
    for limit in ("64K", "1G"):
        monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", limit)
        out = tmp_path / f"ov-{limit}.json"
        assert main(["compare", str(model), "--ref", "ort", "--cand", "openvino", "--inputs", str(feeds),
                     "--no-culprits", "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    assert [t["metrics"] for t in docs[0]["tensors"]] == [t["metrics"] for t in docs[1]["tensors"]]
    assert len(docs[0]["tensors"]) == 9


def test_the_fp16_variant_of_a_mapped_model_is_saved_with_external_data(small, mapped_env, tmp_path):
    from workbench.variants import make_variant
    from workbench.variants.ort_session import ort_session

    model, feeds = small
    variant = make_variant(load_model(model).proto, "fp16")
    tables = [t for t in variant.model.graph.initializer if t.name.startswith("T")]
    assert all(is_mapped(t) and t.data_type == onnx.TensorProto.FLOAT16 for t in tables)  # converted to a file
    written = variant.save(tmp_path / "fp16" / "model.fp16.onnx")
    assert [p.name for p in written] == ["model.fp16.onnx", "model.fp16.onnx.data"]
    feed = sorted(feeds.glob("*.npz"))[0]
    in_run = ort_session(variant.model, optimize=True).run(None, dict(np.load(feed)))[0]  # weights where written
    np.testing.assert_allclose(_run(feed, written[0]), in_run, rtol=1e-5)
    assert not np.array_equal(in_run, _run(feed, model))  # it is the FP16 model (T1's 1e5 clamped)


def test_an_if_inlined_on_a_mapped_model_keeps_its_weights_in_their_files(tmp_path, mapped_env):
    """compare inlines the If branch every feed takes: the inlined model is loaded again from the same files."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.linspace(-1, 1, 64 * 512, dtype=np.float32).reshape(512, 64), "T")
    branch = helper.make_graph([helper.make_node("Gather", ["T", "ids"], ["g"], name="gather")], "then", [],
                               [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 64])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"], name="neg")], "else", [],
                              [helper.make_tensor_value_info("n", TensorProto.FLOAT, [1, 64])])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], name="max", keepdims=0),
             helper.make_node("Greater", ["m", "lo"], ["c"], name="cond"),
             helper.make_node("If", ["c"], ["b"], name="if", then_branch=branch, else_branch=other),
             helper.make_node("Add", ["b", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
                                            helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [table, numpy_helper.from_array(np.array(-100.0, np.float32), "lo")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(proto, folder / "if.onnx", save_as_external_data=True, location="w.bin", size_threshold=1024)
    np.savez(tmp_path / "feed.npz", x=np.ones((1, 64), np.float32), ids=np.array([3], np.int64))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(folder / "if.onnx"), "--ref", "ort", "--cand", "ort:fp16", "--inputs",
                 str(tmp_path / "feed.npz"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert any("every feed takes its then branch" in n for n in doc["notes"])
    assert "gather" in [t["node"] for t in doc["tensors"]]


def test_a_truncated_weight_file_is_refused_in_one_line_before_anything_runs(small, mapped_env, capsys):
    model, _ = small
    table = model.parent / "big2.bin"
    with open(table, "r+b") as fh:
        fh.truncate(table.stat().st_size - 4)
    assert main(["inspect", str(model)]) == 2
    err = capsys.readouterr().err.strip()
    assert "big2.bin" in err and "truncated" in err and len(err.splitlines()) == 1


def test_a_users_candidate_file_with_external_data_is_diffed_piece_by_piece(small, tmp_path, monkeypatch):
    """--cand-model: the clamp report of the user's FP16 file, read in pieces when mapped, matches the in-memory
    diff (the table's 1e5 clamped to 65504 is found either way)."""
    from workbench.variants import make_variant

    model, feeds = small
    cand = tmp_path / "cand" / "model.fp16.onnx"
    make_variant(load_model(model).proto, "fp16").save(cand)
    docs = []
    for limit in ("64K", "1G"):
        monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", limit)
        out = tmp_path / f"cand-{limit}.json"
        assert main(["compare", str(model), "--ref", "ort", "--cand", "ort", "--cand-model", str(cand),
                     "--inputs", str(feeds), "--no-culprits", "--json", str(out)]) == 1
        docs.append(json.loads(out.read_text()))
    assert docs[0]["variant"]["clamped"] == docs[1]["variant"]["clamped"]
    assert [(c["name"], c["kind"], c["converted"][0]) for c in docs[0]["variant"]["clamped"]] == [
        ("T1", "overflow", 65504.0)]


def test_writing_over_the_weights_a_model_reads_is_refused(small, mapped_env, tmp_path):
    from workbench.errors import WorkbenchError

    model, _ = small
    os.replace(model.parent / "big2.bin", model.parent / "out.onnx.data")
    proto = onnx.load(str(model), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location" and e.value == "big2.bin":
                e.value = "out.onnx.data"
    onnx.save(proto, model)
    loaded = load_model(model)
    with pytest.raises(WorkbenchError, match="a weight file the model reads"):
        save_model(loaded.proto, model.parent / "out.onnx")
    assert (model.parent / "out.onnx.data").stat().st_size == ROWS * WIDTH * 4


def test_rerun_reads_referenced_weights_once(small, mapped_env, tmp_path, monkeypatch, capsys):
    """A rerun checks weights kept by reference through the model's fingerprint (which reads every weight file), not
    by hashing each file again first; a changed file is still named, with its sha256."""
    from workbench.report import weights_ref

    model, feeds = small
    bundle = tmp_path / "bundle"
    assert main(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--inputs", str(feeds),
                 "--bundle", str(bundle)]) == 1
    hashed, real = [], weights_ref.sha256_file
    monkeypatch.setattr(weights_ref, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    capsys.readouterr()
    assert main(["rerun", str(bundle)]) == 1
    assert "first divergent: g1 -> g1 (same)" in capsys.readouterr().out
    assert hashed == []

    data = bytearray((model.parent / "big.bin").read_bytes())
    data[-1] ^= 1  # same size, other content
    (model.parent / "big.bin").write_bytes(bytes(data))
    assert main(["rerun", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert "big.bin has sha256" in err and "the bundle recorded" in err and len(err.splitlines()) == 1
    assert hashed == ["big.bin"]
