"""Malicious bundles and recordings, crafted here from a real bundle: each is refused with one clear error
(CLI: one line, exit 2, no traceback), nothing is unpickled, and nothing outside the bundle is read or written."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SAMPLES

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.report import load_bundle, rerun_bundle, save_bundle
from workbench.report.interop import read_run_results
from workbench.report.safety import seal_manifest, sha256_file


class _Trap:
    """Unpickling this creates the sentinel file: proof that a pickle was (or was not) executed."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> Path:
    from workbench.compare.api import compare

    root = tmp_path_factory.mktemp("good")
    model = root / "fp16_clamp_constant.onnx"
    shutil.copyfile(SAMPLES / "fp16_clamp_constant.onnx", model)
    result = compare(model, "ort", "ort:fp16")
    return save_bundle(result, dest=root / "bundle", tensors="auto")


def _copy(good: Path, d: Path) -> Path:
    bundle = d / "bundle"
    shutil.copytree(good, bundle, symlinks=True)
    return bundle


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _save_manifest(bundle: Path, m: dict, rehash: bool = True) -> None:
    if rehash:  # keep the integrity map consistent, so the refusal under test is the one that fires
        m["files"] = {rel: sha256_file(bundle / rel) for rel in m["files"] if (bundle / rel).is_file()
                      and not (bundle / rel).is_symlink()}
    (bundle / "manifest.json").write_text(json.dumps(seal_manifest(m)))  # the manifest's own seal too


def _secret(d: Path) -> Path:
    secret = d / "secret.npz"
    np.savez(secret, image=np.zeros((1, 3, 16, 16), np.float32))
    return secret


def case_traversal_in_manifest(d, good):
    b = _copy(good, d)
    _secret(d)
    m = _manifest(b)
    m["feeds"]["files"] = ["../secret.npz"]
    _save_manifest(b, m)
    return b, "leaves the bundle"


def case_absolute_path_in_manifest(d, good):
    b = _copy(good, d)
    secret = _secret(d)
    m = _manifest(b)
    m["feeds"]["files"] = [str(secret)]
    _save_manifest(b, m)
    return b, "absolute"


def case_traversal_in_model_entry(d, good):
    b = _copy(good, d)
    shutil.copyfile(good / "model" / "fp16_clamp_constant.onnx", d / "outside.onnx")
    m = _manifest(b)
    m["model"]["file"] = "model/../../outside.onnx"
    _save_manifest(b, m)
    return b, "leaves the bundle"


def case_traversal_in_files_map(d, good):
    b = _copy(good, d)
    _secret(d)
    m = _manifest(b)
    m["files"]["../secret.npz"] = "0" * 64
    _save_manifest(b, m, rehash=False)
    return b, "leaves the bundle"


def case_symlink_escaping(d, good):
    b = _copy(good, d)
    secret = _secret(d)
    (b / "inputs" / "feed_000.npz").unlink()
    os.symlink(secret, b / "inputs" / "feed_000.npz")
    return b, "symlink"


def case_zip_slip(d, good):
    z = d / "bundle.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for p in sorted(good.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(good).as_posix())
        zf.writestr("../evil.txt", "pwned")
    return z, "leaves the bundle"


def case_zip_absolute_entry(d, good):
    z = d / "bundle.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("manifest.json", (good / "manifest.json").read_text())
        zf.writestr(str(d / "evil_abs.txt"), "pwned")
    return z, "absolute"


def case_zip_symlink_entry(d, good):
    z = d / "bundle.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("manifest.json", (good / "manifest.json").read_text())
        info = zipfile.ZipInfo("inputs/feed_000.npz")
        info.external_attr = (0o120777 << 16)  # a symlink entry
        zf.writestr(info, str(d / "secret.npz"))
    return z, "symlink"


def case_pickle_in_npz(d, good):
    b = _copy(good, d)
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap(str(d / "PWNED"))
    np.savez(b / "inputs" / "feed_000.npz", image=trap)
    _save_manifest(b, _manifest(b))
    return b, "pickled"


def case_pickle_in_tensor_npz(d, good):
    b = _copy(good, d)
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap(str(d / "PWNED"))
    np.savez(b / "tensors" / "tensor_000.npz", reference=trap, candidate=trap)
    _save_manifest(b, _manifest(b))
    return b, "pickled"


def _forged_npy(shape: tuple[int, ...]) -> bytes:
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    buf = io.BytesIO()
    from numpy.lib import format as npy_format

    npy_format.write_array_header_1_0(buf, header)
    return buf.getvalue() + b"\x00" * 64


def case_absurd_shape_header(d, good):
    b = _copy(good, d)
    with zipfile.ZipFile(b / "inputs" / "feed_000.npz", "w") as zf:
        zf.writestr("image.npy", _forged_npy((1_000_000, 1_000_000, 1000)))
    _save_manifest(b, _manifest(b))
    return b, "refusing to allocate"


def case_shape_larger_than_file(d, good):
    b = _copy(good, d)
    with zipfile.ZipFile(b / "inputs" / "feed_000.npz", "w") as zf:
        zf.writestr("image.npy", _forged_npy((1, 3, 16, 16)))
    _save_manifest(b, _manifest(b))
    return b, "forged or the file truncated"


def case_truncated_manifest(d, good):
    b = _copy(good, d)
    text = (b / "manifest.json").read_text()
    (b / "manifest.json").write_text(text[: len(text) // 2])
    return b, "not valid json"


def case_truncated_results(d, good):
    b = _copy(good, d)
    text = (b / "results.json").read_text()
    (b / "results.json").write_text(text[: len(text) // 3])
    _save_manifest(b, _manifest(b))
    return b, "not valid json"


def case_wrong_schema_version(d, good):
    b = _copy(good, d)
    m = _manifest(b)
    m["schema"] = "workbench.bundle/99"
    _save_manifest(b, m)
    return b, "workbench.bundle/99"


def case_foreign_json(d, good):
    b = _copy(good, d)
    (b / "manifest.json").write_text(json.dumps({"hello": "world"}))
    return b, "expected 'workbench.bundle/1'"


def case_results_wrong_schema(d, good):
    b = _copy(good, d)
    doc = json.loads((b / "results.json").read_text())
    doc["schema"] = "workbench.inspect/1"
    (b / "results.json").write_text(json.dumps(doc))
    _save_manifest(b, _manifest(b))
    return b, "workbench.compare/1"


def case_model_hash_mismatch(d, good):
    b = _copy(good, d)
    path = b / "model" / "fp16_clamp_constant.onnx"
    proto = onnx.load(path)
    proto.graph.initializer[0].float_data[:] = []
    proto.producer_name = "tampered"
    onnx.save(proto, path)
    return b, "sha256"


def case_edited_feed(d, good):
    b = _copy(good, d)
    np.savez(b / "inputs" / "feed_000.npz", image=np.ones((1, 3, 16, 16), np.float32))
    return b, "changed since the bundle was written"


def case_not_a_bundle(d, good):
    z = d / "bundle.zip"
    z.write_bytes(b"PK\x03\x04 this is not really a zip")
    return z, "bundle"


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


@pytest.fixture
def opened():
    """Every file Python opens (audit event "open"), to prove nothing outside the bundle is read or written."""
    seen: list[str] = []

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            seen.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # hooks cannot be removed; the list is only read inside each test
    yield seen
    seen.clear()


def _snapshot(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_refuses(case, tmp_path, good_bundle, opened, monkeypatch):
    bundle, needle = CASES[case](tmp_path, good_bundle)
    scratch = tmp_path.parent / f"{tmp_path.name}-tmp"  # this test's own system temp folder (zip extraction)
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = _snapshot(tmp_path)
    opened.clear()
    with pytest.raises(WorkbenchError) as info:
        rerun_bundle(bundle)
    message = str(info.value)
    assert needle.lower() in message.lower(), message
    assert "\n" not in message and info.value.hint
    assert not (tmp_path / "PWNED").exists(), "a pickle was executed"
    assert _snapshot(tmp_path) == before, "something was written next to the bundle"
    assert list(scratch.iterdir()) == [], "a temporary extraction was left behind"
    assert not (tmp_path.parent / "evil.txt").exists()
    inside = bundle.resolve()
    outside = [p for p in opened if Path(p).resolve().is_relative_to(tmp_path.resolve())
               and not (Path(p).resolve() == inside or Path(p).resolve().is_relative_to(inside))]
    assert not outside, f"opened outside the bundle: {outside}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_gives_one_line_and_exit_2(case, tmp_path, good_bundle, capsys):
    bundle, needle = CASES[case](tmp_path, good_bundle)
    code = main(["rerun", str(bundle)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error:"), captured.err
    assert needle.lower() in lines[0].lower()
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "PWNED").exists()


def test_good_bundle_still_loads(good_bundle):
    with load_bundle(good_bundle) as b:
        assert b.feeds()[0]["image"].shape == (1, 4, 16, 16)
        assert b.result.first_divergent.node == "/bn_big_var/BatchNormalization"


# --- recorded runs (Polygraphy RunResults JSON) ---------------------------------------------------------------

def _run_results(value: dict) -> dict:
    return {"lst": [["onnxrt-runner", [{"outputs": {"logits": value}, "runtime": 0.1, "runner_name": "onnxrt-runner",
                                        "polygraphy_class": "IterationResult"}]]], "polygraphy_class": "RunResults"}


def _pickled_trap(d: Path) -> str:
    import pickle

    return base64.b64encode(pickle.dumps(_Trap(str(d / "PWNED")))).decode()


def rr_pickle_payload(d):
    return _run_results({"values": {"array": _pickled_trap(d), "polygraphy_class": "ndarray"},
                         "polygraphy_class": "LazyArray"}), "pickle"


def rr_legacy_pickle_payload(d):
    return _run_results({"array": _pickled_trap(d), "__polygraphy_encoded_ndarray":
                         "polygraphy_serialized_json_type"}), "pickle"


def rr_torch_tensor(d):
    return _run_results({"tensor": _pickled_trap(d), "polygraphy_class": "Tensor"}), "torch.save"


def rr_object_npy(d):
    buf = io.BytesIO()
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap(str(d / "PWNED"))
    np.save(buf, trap, allow_pickle=True)
    return _run_results({"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}), "pickled"


def rr_absurd_shape(d):
    return _run_results({"array": base64.b64encode(_forged_npy((10**9, 10**9))).decode(),
                         "polygraphy_class": "ndarray"}), "refusing to allocate"


def rr_wrong_class(d):
    doc = _run_results({"array": "", "polygraphy_class": "ndarray"})
    doc["polygraphy_class"] = "AccuracyResult"
    return doc, "not a polygraphy runresults"


RR_CASES = {name[3:]: fn for name, fn in sorted(globals().items()) if name.startswith("rr_")}


@pytest.mark.parametrize("case", sorted(RR_CASES))
def test_recorded_runs_refuse_pickles_and_forgeries(case, tmp_path, opened):
    doc, needle = RR_CASES[case](tmp_path)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    opened.clear()
    with pytest.raises(WorkbenchError) as info:
        read_run_results(path)
    assert needle.lower() in str(info.value).lower(), str(info.value)
    assert not (tmp_path / "PWNED").exists(), "a pickle was executed"
    assert [p for p in opened if Path(p).resolve().is_relative_to(tmp_path.resolve())] == [str(path)]


def test_truncated_recording(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_run_results({"array": "AAAA", "polygraphy_class": "ndarray"}))[:50])
    with pytest.raises(WorkbenchError, match="not valid JSON"):
        read_run_results(path)
