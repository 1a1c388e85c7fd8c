"""Bundles on real engines and files: layout, relocation, rerun exit codes, what-changed reports, zip, references."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from conftest import SAMPLES

from workbench.cli import main
from workbench.compare.api import compare
from workbench.errors import WorkbenchError
from workbench.report import load_bundle, rerun_bundle, save_bundle
from workbench.report.safety import BundleError, ModelMismatchError, seal_manifest

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
BN_NODE = "/bn_big_var/BatchNormalization"
BN_TENSOR = "/bn_big_var/BatchNormalization_output_0"


def _relative_paths(m: dict) -> list[str]:
    """Every path a copied bundle's manifest names."""
    return [*m["files"], m["model"]["file"], *m["model"]["files"], *m["feeds"]["files"], m["results"],
            *[t["file"] for t in m["tensors"]]]


def test_moved_bundle_reruns_to_the_same_first_divergent_layer(tmp_path, capsys):
    """The acceptance case: model copied to a temp folder, compare + bundle, model deleted, bundle moved, rerun."""
    work = tmp_path / "work"
    work.mkdir()
    model = work / "fp16_clamp_constant.onnx"
    shutil.copyfile(CLAMP, model)
    bundle = work / "bundle"
    code = main(["compare", str(model), "--ref", "ort", "--cand", "ort:fp16", "--bundle", str(bundle)])
    assert code == 1
    assert "bundle written" in capsys.readouterr().err
    model.unlink()
    moved = tmp_path / "elsewhere" / "moved_bundle"
    moved.parent.mkdir()
    shutil.move(str(bundle), moved)
    shutil.rmtree(work)

    out_json = tmp_path / "rerun.json"
    code = main(["rerun", str(moved), "--json", str(out_json)])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "REPRODUCED" in captured.out and "NOT REPRODUCED" not in captured.out
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "workbench.rerun/1"
    assert doc["reproduced"] is True and doc["diverged"] is True and doc["exit_code"] == 1
    assert doc["first_divergent"]["saved"]["tensor"] == doc["first_divergent"]["now"]["tensor"] == BN_TENSOR
    assert doc["first_divergent"]["now"]["node"] == BN_NODE
    assert doc["diff"]["culprits"]["after"][0]["node"] == BN_NODE
    assert doc["metrics_match"] is True  # same engines, same feeds: identical numbers


def test_bundle_layout_and_manifest(tmp_path):
    result = compare(CLAMP, "ort", "ort:fp16", seed=3)
    path = save_bundle(result, dest=tmp_path / "b", tensors="auto")
    assert path == tmp_path / "b"
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert files == ["inputs/feed_000.npz", "manifest.json", "model/fp16_clamp_constant.onnx", "results.json",
                     "tensors/tensor_000.npz", "tensors/tensor_001.npz"]
    m = json.loads((path / "manifest.json").read_text())
    assert m["schema"] == "workbench.bundle/1" and m["kind"] == "compare"
    for pkg in ("workbench", "onnx", "onnxruntime", "numpy"):
        assert m["versions"][pkg]
    assert m["python"] and m["platform"]["system"]
    assert m["gpu"] is None or isinstance(m["gpu"], list)
    if shutil.which("nvidia-smi") is None:
        assert m["gpu"] is None
    assert m["model"]["sha256"] == result.model["sha256"] and m["model"]["copied"] is True
    assert m["compare"]["reference"] == "ort" and m["compare"]["candidate"] == "ort:fp16"
    assert m["compare"]["mode"] == "all" and m["compare"]["rerunnable"] is True
    assert m["criterion"]["metric"] == "sqnr_db" and m["criterion"]["threshold"] == 30.0
    assert m["feeds"]["seed"] == 3 and m["seeds"]["feeds"] == 3 and m["feeds"]["files"] == ["inputs/feed_000.npz"]
    assert m["variant"]["clamped"], "the FP16 clamp is part of the variant settings"
    assert set(m["files"]) == set(files) - {"manifest.json"}
    for rel in _relative_paths(m):
        assert not rel.startswith("/") and ".." not in rel.split("/") and (path / rel).is_file(), rel
    # the feeds are the exact arrays compared, readable without pickle
    with np.load(path / "inputs/feed_000.npz", allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["image"], result.used_feeds[0]["image"])
    # selected tensors: the first divergent tensor, reference float32 vs candidate float16
    with load_bundle(path) as b:
        values = b.tensors()
        assert BN_TENSOR in values
        ref, cand = values[BN_TENSOR]
        assert ref.dtype == np.float32 and cand.dtype == np.float16 and ref.shape == cand.shape
        assert b.result.first_divergent.tensor == BN_TENSOR
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder left behind"


def test_healthy_bundle_reruns_with_exit_0(tmp_path, capsys):
    dest = tmp_path / "healthy"
    assert main(["compare", str(SAMPLES / "healthy_cnn.onnx"), "--bundle", str(dest)]) == 0
    capsys.readouterr()
    assert main(["rerun", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "REPRODUCED" in out and "first divergent: none -> none" in out
    # the bundle replays the random feeds it saved: the same inputs, not "random -> list" and "seed 0 -> None"
    assert "feeds." not in out
    report = rerun_bundle(dest)
    assert not any(k.startswith("feeds.") for k in report.diff.specs_changed)
    assert report.result.feeds["source"] == "random" and report.result.feeds["seed"] == 0
    assert report.result.feeds["replayed"] == "the bundle's saved inputs"


def test_zip_bundle_with_external_data(tmp_path):
    src = tmp_path / "m"
    shutil.copytree(SAMPLES / "external_data", src)
    result = compare(src / "mlp_external.onnx", "ort", "ort:fp16")
    path = save_bundle(result, dest=tmp_path / "ext_bundle", zip=True)
    assert path.name == "ext_bundle.zip" and path.is_file()
    shutil.rmtree(src)
    moved = tmp_path / "other" / "b.zip"
    moved.parent.mkdir()
    path.rename(moved)
    report = rerun_bundle(moved)
    assert report.reproduced and report.exit_code == 1
    assert report.result.first_divergent.node == "/fc2/MatMul"
    assert report.result.model["sha256"] == result.model["sha256"]


def test_given_feeds_and_int8_variant_reproduce(tmp_path):
    feeds = SAMPLES / "transformer_block_inputs.npz"
    r = compare(SAMPLES / "transformer_block.onnx", "ref", "ref:fp16", feeds=feeds)
    report = rerun_bundle(save_bundle(r, dest=tmp_path / "tb"))
    assert report.reproduced and report.result.first_divergent.node == "/block/ln2/Pow"
    r8 = compare(SAMPLES / "int8_outlier.onnx", "ort", "ort:int8", seed=1, feed_count=2)
    report = rerun_bundle(save_bundle(r8, dest=tmp_path / "q"))
    assert report.reproduced and report.result.first_divergent.node == r8.first_divergent.node
    assert report.result.feeds["count"] == 2


def test_reference_only_bundle_checks_the_model_hash(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    shutil.copyfile(CLAMP, model)
    r = compare(model, "ort", "ort:fp16")
    path = save_bundle(r, dest=tmp_path / "ref_only", copy_model=False)
    m = json.loads((path / "manifest.json").read_text())
    assert m["model"] == {"copied": False, "path": str(model.resolve()), "name": "model.onnx",
                          "sha256": r.model["sha256"]}
    assert not (path / "model").exists()
    assert rerun_bundle(path).reproduced
    # the referenced file changes: refused, naming both hashes
    proto = onnx.load(model)
    proto.producer_name = "edited"
    onnx.save(proto, model)
    with pytest.raises(ModelMismatchError) as info:
        rerun_bundle(path)
    from workbench.model.load import load_model

    assert r.model["sha256"] in str(info.value) and load_model(model).fingerprint in str(info.value)
    assert main(["rerun", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0]
    # --model points at the right file again
    good = tmp_path / "good.onnx"
    shutil.copyfile(CLAMP, good)
    assert main(["rerun", str(path), "--model", str(good)]) == 1


def test_rerun_says_what_changed(tmp_path):
    """A bundle whose saved result diverged while its recorded options (keep_fp32 on the BN) no longer do:
    not reproduced, the first divergent layer changed, metric drift per tensor, versions diffed."""
    r = compare(CLAMP, "ort", "ort:fp16")
    path = save_bundle(r, dest=tmp_path / "b", compare_kwargs={"keep_fp32": [BN_NODE]})
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["versions"]["onnxruntime"] = "1.0.0"
    (path / "manifest.json").write_text(json.dumps(seal_manifest(manifest)))  # a deliberate edit, re-sealed
    report = rerun_bundle(path)
    assert not report.reproduced and report.exit_code == 1  # no divergence now, but not the saved answer
    doc = report.to_json()
    assert doc["first_divergent"]["saved"]["node"] == BN_NODE and doc["first_divergent"]["now"] is None
    assert doc["first_divergent"]["changed"] is True
    assert doc["versions_changed"]["onnxruntime"][0] == "1.0.0"
    top = doc["diff"]["largest_changes"][0]
    assert top["metric"] == "sqnr_db" and top["change"] > 80  # from about -20 dB to about +70 dB
    text = report.render()
    assert "NOT REPRODUCED" in text and "onnxruntime 1.0.0 ->" in text and "largest sqnr_db changes" in text


def test_save_bundle_refuses_unknowns_and_existing_dest(tmp_path):
    r = compare(CLAMP, "ort", "ort:fp16")
    save_bundle(r, dest=tmp_path / "b")
    with pytest.raises(BundleError, match="already exists"):
        save_bundle(r, dest=tmp_path / "b")
    again = save_bundle(r, dest=tmp_path / "b", overwrite=True)
    assert (again / "manifest.json").is_file()
    from workbench.compare.result import CompareResult

    loaded = CompareResult.from_json(r.to_json())  # no feeds or options after JSON
    with pytest.raises(BundleError, match="feeds"):
        save_bundle(loaded, dest=tmp_path / "c")
    assert not (tmp_path / "c").exists()
    path = save_bundle(loaded, CLAMP, r.used_feeds, tmp_path / "c")
    assert rerun_bundle(path).reproduced
    other = tmp_path / "other.onnx"
    proto = onnx.load(CLAMP)
    proto.producer_name = "someone else"
    onnx.save(proto, other)
    with pytest.raises(ModelMismatchError, match="sha256"):
        save_bundle(loaded, other, r.used_feeds, tmp_path / "d")
    assert not (tmp_path / "d").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bundle_is_written_beside_the_destination_never_in_cwd(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    r = compare(CLAMP, "ort", "ort:fp16")
    save_bundle(r, dest=tmp_path / "out" / "b")
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b"]


def test_bundle_api_is_lazy_and_errors_are_workbench_errors():
    import subprocess
    import sys

    code = "import sys, workbench.report; assert 'plotly' not in sys.modules and 'onnxruntime' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert issubclass(BundleError, WorkbenchError)


def test_cand_model_is_bundled_and_checked(tmp_path):
    """--cand-model: the user's own FP16 export travels in the bundle too, sha256-checked on rerun."""
    from workbench.variants import make_variant

    fp16 = tmp_path / "mine_fp16.onnx"
    onnx.save(make_variant(onnx.load(CLAMP), "fp16").model, fp16)
    r = compare(CLAMP, "ort", "ort", cand_model=fp16)
    assert r.first_divergent.node == BN_NODE
    path = save_bundle(r, dest=tmp_path / "b")
    m = json.loads((path / "manifest.json").read_text())
    assert m["cand_model"]["file"] == "cand_model/mine_fp16.onnx" and m["cand_model"]["sha256"] == r.variant["sha256"]
    fp16.unlink()
    report = rerun_bundle(path)
    assert report.reproduced and report.result.variant["sha256"] == r.variant["sha256"]


def test_recorded_or_torch_comparisons_say_why_they_cannot_rerun(tmp_path):
    from workbench.report.interop import compare_with_recording, record_run

    rec = tmp_path / "rec.json"
    feeds = [{"image": np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)}]
    record_run(CLAMP, "ort", feeds, path=rec)
    r = compare_with_recording(CLAMP, rec, "ort:fp16", feeds=feeds)
    path = save_bundle(r, dest=tmp_path / "b")
    with pytest.raises(BundleError, match="cannot be rerun: the reference engine was a custom Engine"):
        rerun_bundle(path)
    r.reference, r.candidate = "torch", "ort"
    with pytest.raises(BundleError, match="torch engine cannot be bundled"):
        save_bundle(r, dest=tmp_path / "t")


def test_a_bundle_carries_no_path_of_the_authors_machine(tmp_path, capsys):
    """The model and the feeds travel as files of the bundle: their folders on the author's machine are not
    written into it (the README: relative paths only)."""
    author = tmp_path / "home of the author"
    author.mkdir()
    model, feeds = author / "model.onnx", author / "inputs.npz"
    shutil.copyfile(SAMPLES / "transformer_block.onnx", model)
    shutil.copyfile(SAMPLES / "transformer_block_inputs.npz", feeds)
    assert main(["compare", str(model), "--ref", "ref", "--cand", "ref:fp16", "--inputs", str(feeds),
                 "--bundle", str(tmp_path / "b")]) in (0, 1)
    texts = [p.read_text() for p in (tmp_path / "b").rglob("*.json")]
    assert texts and not any(str(author) in t or str(tmp_path) in t for t in texts)
    doc = json.loads((tmp_path / "b" / "results.json").read_text())
    assert doc["model"]["path"] == "model.onnx" and doc["feeds"]["source"] == "inputs.npz"
    shutil.rmtree(author)  # the author's files are gone: the bundle still reruns to the same answer
    capsys.readouterr()
    main(["rerun", str(tmp_path / "b")])
    assert ": REPRODUCED" in capsys.readouterr().out


def test_save_bundle_refuses_feeds_the_comparison_did_not_run_on(tmp_path):
    feeds = dict(np.load(SAMPLES / "transformer_block_inputs.npz"))
    r = compare(SAMPLES / "transformer_block.onnx", "ref", "ref:fp16", feeds=feeds)
    other = {**feeds, "x": feeds["x"] * 1e-3}
    with pytest.raises(BundleError, match="input 'x' is not the array the comparison ran on"):
        save_bundle(r, SAMPLES / "transformer_block.onnx", feeds=other, dest=tmp_path / "b1")
    with pytest.raises(BundleError, match="has input"):
        save_bundle(r, SAMPLES / "transformer_block.onnx", feeds={"image": feeds["x"]}, dest=tmp_path / "b2")
    assert not (tmp_path / "b1").exists() and not (tmp_path / "b2").exists()
    path = save_bundle(r, SAMPLES / "transformer_block.onnx", feeds=feeds, dest=tmp_path / "b3")  # the same: fine
    assert rerun_bundle(path).reproduced


def test_package_versions_do_not_depend_on_what_the_process_imported(monkeypatch):
    """OpenVINO's __version__ carries its build string: a notebook kernel that had imported it recorded
    '2026.4.1-22982-...' and the CLI rerun on the same install, which had not, '2026.4.1', and rerun reported a
    package change. The installed version is recorded either way; a module loaded at another version still wins."""
    import sys
    import types
    from importlib import metadata

    from workbench.report.env import diff_versions, package_versions

    installed = metadata.version("onnx")
    fake = types.ModuleType("onnx")
    fake.__version__ = installed + "-12345-build"
    monkeypatch.setitem(sys.modules, "onnx", fake)
    assert package_versions()["onnx"] == installed
    fake.__version__ = "0.0.1"  # a process still running an older onnx than the one installed since
    assert package_versions()["onnx"] == "0.0.1"
    assert diff_versions({"openvino": "2026.4.1-22982-e213a147257-releases/2026/4"}, {"openvino": "2026.4.1"}) == {}
    assert diff_versions({"openvino": "2026.4.0"}, {"openvino": "2026.4.1"}) == {"openvino": ["2026.4.0", "2026.4.1"]}
