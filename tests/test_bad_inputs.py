"""A generated corpus of bad model inputs: each gives one specific, clear error and no traceback.

Every case is made here, in a temporary folder, from real files (an ONNX model, torch.save output,
numpy arrays...). The API must raise the named ModelLoadError subclass; the CLI must print one line
on stderr and exit 2. An audit hook proves no file outside the model's folder is ever opened.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import tiny_model

from workbench.cli import main
from workbench.errors import (
    ExternalDataError,
    ModelFormatError,
    ModelLoadError,
    ModelNotFoundError,
    NotAModelFileError,
    OpsetTooNewError,
    UnsafePathError,
)
from workbench.model.load import load_model


def _ext_model(folder: Path, location: str = "weights.bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_model(), folder / "model.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    if location != "weights.bin":
        m = onnx.load(folder / "model.onnx", load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save(m, folder / "model.onnx")
    return folder / "model.onnx"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _good_bytes() -> bytes:
    return tiny_model().SerializeToString()


def case_missing(d):
    return d / "nope.onnx", ModelNotFoundError, "not found"


def case_missing_with_neighbours(d):
    _write(d / "real.onnx", _good_bytes())
    return d / "rael.onnx", ModelNotFoundError, "real.onnx"


def case_empty(d):
    return _write(d / "empty.onnx", b""), NotAModelFileError, "empty"


def case_folder(d):
    (d / "folder").mkdir()
    return d / "folder", NotAModelFileError, "folder"


def case_folder_with_model(d):
    _write(d / "folder" / "inner.onnx", _good_bytes())
    return d / "folder", NotAModelFileError, "inner.onnx"


def case_truncated_half(d):
    data = _good_bytes()
    return _write(d / "half.onnx", data[: len(data) // 2]), ModelFormatError, "not a valid ONNX model"


def case_truncated_head(d):
    return _write(d / "head.onnx", _good_bytes()[:7]), ModelFormatError, "not a valid ONNX model"


def case_random_bytes(d):
    data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return _write(d / "random.onnx", data), (ModelFormatError, NotAModelFileError), "not"


def case_random_bytes_small(d):
    data = np.random.default_rng(1).integers(0, 256, 17, dtype=np.uint8).tobytes()
    return _write(d / "random17.onnx", data), (ModelFormatError, NotAModelFileError), "not"


def case_torch_zip(d):
    import torch

    buf = io.BytesIO()
    torch.save({"weight": torch.ones(3)}, buf)
    return _write(d / "model.pt", buf.getvalue()), NotAModelFileError, "zip"


def case_pickle(d):
    return _write(d / "legacy.pth", pickle.dumps({"w": [1.0, 2.0]}, protocol=2)), NotAModelFileError, "pickle"


def case_git_lfs_pointer(d):
    text = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n"
    return _write(d / "lfs.onnx", text), NotAModelFileError, "git lfs"


def case_json(d):
    return _write(d / "config.onnx", json.dumps({"a": 1}).encode()), NotAModelFileError, "json"


def case_npy(d):
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    return _write(d / "array.onnx", buf.getvalue()), NotAModelFileError, "numpy"


def case_text_format(d):
    text = onnx.printer.to_text(tiny_model()).encode()
    return _write(d / "text.onnx", text), (NotAModelFileError, ModelFormatError), "onnx"


def case_html(d):
    return _write(d / "page.onnx", b"<!DOCTYPE html><html>404</html>"), NotAModelFileError, "html"


def case_no_graph(d):
    m = onnx.ModelProto(ir_version=8)
    return _write(d / "nograph.onnx", m.SerializeToString()), ModelFormatError, "no graph"


def case_opset_too_new(d):
    m = tiny_model(opset=99)
    return _write(d / "opset99.onnx", m.SerializeToString()), OpsetTooNewError, "opset 99"


def case_ir_too_new(d):
    m = tiny_model(ir_version=99)
    return _write(d / "ir99.onnx", m.SerializeToString()), OpsetTooNewError, "ir version 99"


def case_external_missing(d):
    path = _ext_model(d / "m")
    (d / "m" / "weights.bin").unlink()
    return path, ExternalDataError, "missing"


def case_external_truncated(d):
    path = _ext_model(d / "m")
    w = d / "m" / "weights.bin"
    w.write_bytes(w.read_bytes()[:10])
    return path, ExternalDataError, "truncated"


def case_external_negative_offset(d):
    path = _ext_model(d / "m")
    m = onnx.load(path, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "offset":
            e.value = "-128"
    if not any(e.key == "offset" for e in m.graph.initializer[0].external_data):
        m.graph.initializer[0].external_data.add(key="offset", value="-128")
    onnx.save(m, path)
    return path, ExternalDataError, "negative external-data offset"


def case_external_location_is_a_fifo(d):
    path = _ext_model(d / "m", "pipe.bin")
    os.mkfifo(d / "m" / "pipe.bin")
    return path, ExternalDataError, "is a FIFO (named pipe), not a file"


def case_external_location_is_the_folder(d):
    return _ext_model(d / "m", "."), ExternalDataError, "is a folder, not a file"


def case_external_absolute(d):
    _write(d / "secret.bin", b"\x00" * 64)
    return _ext_model(d / "m", str(d / "secret.bin")), UnsafePathError, "absolute"


def case_external_dotdot(d):
    _write(d / "secret.bin", b"\x00" * 64)
    return _ext_model(d / "m", "../secret.bin"), UnsafePathError, ".."


def case_external_dotdot_nested(d):
    _write(d / "secret.bin", b"\x00" * 64)
    return _ext_model(d / "m", "sub/../../secret.bin"), UnsafePathError, ".."


def case_external_symlink_escape(d):
    _write(d / "secret.bin", b"\x00" * 64)
    path = _ext_model(d / "m", "link.bin")
    os.symlink(d / "secret.bin", d / "m" / "link.bin")
    return path, UnsafePathError, "outside"


def case_external_windows_drive(d):
    return _ext_model(d / "m", "C:\\Windows\\secret.bin"), UnsafePathError, "absolute"


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def test_corpus_is_large_enough():
    assert len(CASES) >= 20


@pytest.fixture
def opened_outside():
    """Record every file opened via Python's audit 'open' event."""
    opened: list[str] = []

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # hooks cannot be removed; the list is only read inside each test
    yield opened
    opened.clear()


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_raises_specific_error(case, tmp_path, opened_outside):
    path, exc_type, needle = CASES[case](tmp_path)
    opened_outside.clear()
    with pytest.raises(exc_type) as info:
        load_model(path)
    err = info.value
    assert isinstance(err, ModelLoadError)
    assert needle.lower() in str(err).lower(), str(err)
    assert err.hint, "every error says what to do"
    assert "\n" not in str(err)
    model_dir = (path.parent if path.suffix else path).resolve()
    outside = [p for p in opened_outside
               if Path(p).resolve().is_relative_to(tmp_path.resolve())
               and not Path(p).resolve().is_relative_to(model_dir)]
    assert not outside, f"opened files outside the model folder: {outside}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_gives_one_line_and_exit_2(case, tmp_path, capsys):
    path, _, needle = CASES[case](tmp_path)
    code = main(["inspect", str(path), "--no-probe"])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("workbench: error:")
    assert needle.lower() in lines[0].lower()
    assert "Traceback" not in captured.err + captured.out


def test_bytes_with_external_data_need_a_folder(external_model_dir):
    data = (external_model_dir / "model.onnx").read_bytes()
    with pytest.raises(ExternalDataError, match="base_dir"):
        load_model(data)
    loaded = load_model(data, base_dir=external_model_dir)
    assert loaded.external_files == [external_model_dir / "weights.bin"]


def test_bit_flips_never_crash(tmp_path):
    """Flip every byte of a model, one at a time: each load succeeds (problems listed) or raises a ModelLoadError."""
    data = bytearray(_good_bytes())
    outcomes = {"loaded": 0, "rejected": 0}
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        try:
            loaded = load_model(bytes(flipped))
            _ = loaded.problems, loaded.graph
            outcomes["loaded"] += 1
        except ModelLoadError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 0 and sum(outcomes.values()) == len(data)


def test_console_script_runs_without_traceback(tmp_path):
    bad = _write(tmp_path / "bad.onnx", b"\x08\x07garbage")
    exe = Path(sys.executable).with_name("workbench")
    proc = subprocess.run([str(exe), "inspect", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "workbench", "inspect"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_a_file_whose_declared_types_contradict_its_nodes_says_it_is_inconsistent(tmp_path, capsys):
    """onnxconverter-common's FP16 conversion of PP-OCRv3's recognizer declares a Cast's output float16 while the
    Cast makes float: ONNX Runtime refuses it with a Type Error. The hint was about marked tensors and opsets; it
    now says the file contradicts itself and how to check it."""
    import onnx
    from onnx import TensorProto, helper

    from workbench.cli import main

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], name="Cast_0", to=TensorProto.FLOAT),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])],
        value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT16, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "bad.onnx")
    graph.value_info[0].type.tensor_type.elem_type = TensorProto.FLOAT
    graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "good.onnx")
    code = main(["compare", str(tmp_path / "good.onnx"), "--cand", "ort", "--cand-model", str(tmp_path / "bad.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "Type Error" in err and "the model file is inconsistent" in err, err
