"""The Compare panel with the user's own candidate file (typed or uploaded), without a browser: what it says before
Run comes from the file itself (expected precision, the "auto" tolerance), hints about the ignored pickers hide,
and the out-of-date warning follows the file (its name and content), not only the engine specs."""

from __future__ import annotations

import datetime
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import ComparePanel  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"  # an FP32 model: the FP32 candidate file as it is
ORT_FP16_HINT = "ONNX Runtime&#x27;s CPU provider computes most FP16 ops in FP32"
FILE_NOTE = "the candidate runs your file"


@pytest.fixture(scope="module")
def fp16_file(tmp_path_factory) -> Path:
    """The sample converted to FP16 by onnxconverter-common (a user's own FP16 export, inputs/outputs kept FP32)."""
    import onnx

    float16 = pytest.importorskip("onnxconverter_common.float16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the float32 number ... will be truncated": the point of the model
        model = float16.convert_float_to_float16(onnx.load(CLAMP), keep_io_types=True)
    dest = tmp_path_factory.mktemp("own") / "mine_fp16.onnx"
    onnx.save(model, dest)
    return dest


def _upload(panel: ComparePanel, path: Path, name: str | None = None) -> Path:
    """Upload ``path`` (as ``name``) through the upload control; returns where the panel kept it."""
    data = path.read_bytes()
    panel.cand_upload.value = ({"name": name or path.name, "type": "", "size": len(data), "content": memoryview(data),
                                "last_modified": datetime.datetime.now(datetime.timezone.utc)},)
    return Path(panel.cand_file.value)


def _candidate_part(panel: ComparePanel) -> str:
    """The candidate's part of the "expected precision" line."""
    text = panel.precision.value
    assert "expected precision: " in text, text
    return text.split("candidate ", 1)[1] if "; candidate " in text else ""


def test_expected_precision_and_auto_tolerance_come_from_the_candidate_file(fp16_file, tmp_path):
    panel = ComparePanel(CLAMP)  # candidate picker: ort:fp16 -> the picker's guess is fp16, tolerance 30
    assert ">fp16</b>" in _candidate_part(panel) and "fp16 variant the workbench makes" in panel.precision.value
    assert panel.threshold.value == 30.0

    panel.cand_file.value = str(CLAMP)  # an FP32 file typed: fp32, and the auto tolerance of fp32 (60)
    part = _candidate_part(panel)
    assert ">fp32</b>" in part and f"your file {CLAMP.name}" in part, part
    assert "fp16 variant the workbench makes" not in panel.precision.value
    assert panel.threshold.value == 60.0 and panel.auto_criterion().text().startswith("sqnr_db<60")
    assert f"computes in fp32: read from your file {CLAMP.name}" in panel.tolerance_note.value
    shown = panel.auto_criterion().text()
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.state.result.criterion.text() == shown, "what auto showed before Run is what the run used"
    assert panel.state.result.precision["candidate"]["precision"] == "fp32"

    panel.cand_file.value = str(fp16_file)  # an FP16 file typed: fp16, 30
    part = _candidate_part(panel)
    assert ">fp16</b>" in part and "your file mine_fp16.onnx" in part and "float16 holds" in part, part
    assert panel.threshold.value == 30.0
    panel.cand_variant.value = "int8"  # the ignored picker changes nothing (was: 0.1, int8's default)
    assert panel.threshold.value == 30.0 and ">fp16</b>" in _candidate_part(panel)
    panel.cand_variant.value = "fp16"

    uploaded = _upload(panel, CLAMP, "my_upload.onnx")  # an FP32 file uploaded: named by its name
    assert uploaded.name == "my_upload.onnx"
    part = _candidate_part(panel)
    assert ">fp32</b>" in part and "your file my_upload.onnx" in part, part
    assert panel.threshold.value == 60.0

    panel.cand_file.value = ""  # no file: the picker's guess again
    assert "fp16 variant the workbench makes" in _candidate_part(panel) and panel.threshold.value == 30.0


@pytest.mark.parametrize("kind", ["missing", "folder", "garbage", "empty"])
def test_an_unreadable_candidate_file_is_one_clear_line(tmp_path, kind):
    bad = tmp_path / f"{kind}.onnx"
    if kind == "folder":
        bad.mkdir()
    elif kind == "garbage":
        bad.write_bytes(b"\x07not an onnx model at all" * 10)
    elif kind == "empty":
        bad.write_bytes(b"")
    panel = ComparePanel(CLAMP)
    panel.cand_file.value = str(bad)
    text = panel.precision.value
    assert _candidate_part(panel) == "", "no precision is claimed for a file that cannot be read"
    assert text.count("wb-msg") == 1 and f"candidate file {bad.name} cannot be read: " in text, text
    assert "Traceback" not in text and "internal error" not in text, text
    want = {"missing": "not found", "folder": "is a folder", "garbage": "not a valid ONNX model",
            "empty": "is empty"}[kind]
    assert want in text, text
    assert "fp16 variant" not in text and "the candidate file cannot be read" in panel.tolerance_note.value
    assert panel.threshold.value == 60.0, "no guess from the ignored precision picker (fp16: 30)"
    started = panel.run()  # the run refuses it up front (no file there) or fails with the loader's message
    if kind in ("missing", "folder"):
        assert started is None and "not found" in panel.jobs.status.value
    else:
        assert panel.wait(120) and panel.jobs.error is not None and want in panel.jobs.status.value
        assert panel.state.result is None


def test_picker_hints_hide_while_a_file_overrides_the_pickers(fp16_file):
    panel = ComparePanel(CLAMP)  # ort:fp16
    assert ORT_FP16_HINT in panel.engine_note.value and FILE_NOTE not in panel.engine_note.value
    panel.cand_file.value = str(fp16_file)
    note = panel.engine_note.value
    assert FILE_NOTE in note and "the precision picker is ignored" in note
    assert ORT_FP16_HINT not in note, "the ort:fp16 hint is about a picker the file overrides"
    panel.cand_variant.value = "int8"  # an ignored picker: no INT8 hint either
    assert "INT8 is a Q/DQ model" not in panel.engine_note.value
    panel.cand_engine.value = "ref"  # ref has no int8, but the variant is ignored: no problem, Run stays enabled
    assert "no int8 variant" not in panel.engine_note.value and not panel.run_button.disabled
    panel.cand_file.value = ""  # the pickers decide again: their problem and hints come back
    assert "ref: the engine has no int8 variant" in panel.engine_note.value and panel.run_button.disabled
    panel.cand_engine.value, panel.cand_variant.value = "ort", "fp16"
    assert ORT_FP16_HINT in panel.engine_note.value and FILE_NOTE not in panel.engine_note.value


def test_out_of_date_warning_follows_the_candidate_file(fp16_file, tmp_path):
    panel = ComparePanel(CLAMP)
    panel.cand_file.value = str(fp16_file)
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.state.result.variant["file"] == "mine_fp16.onnx" and panel.stale_note.value == ""

    panel.cand_file.value = str(CLAMP)  # another file, same engines
    warn = panel.stale_note.value
    assert "mine_fp16.onnx on ort against ort" in warn and f"now say {CLAMP.name} on ort against ort" in warn, warn
    panel.cand_file.value = str(fp16_file)  # back to the file that ran
    assert panel.stale_note.value == ""

    copy = tmp_path / "elsewhere" / "mine_fp16.onnx"  # the same file elsewhere (same name, same content)
    copy.parent.mkdir()
    shutil.copyfile(fp16_file, copy)
    panel.cand_file.value = str(copy)
    assert panel.stale_note.value == ""
    assert _upload(panel, fp16_file).name == "mine_fp16.onnx"  # uploaded again: still what ran
    assert panel.stale_note.value == ""
    _upload(panel, CLAMP, "mine_fp16.onnx")  # an upload with the same name but other content
    assert "press Run" in panel.stale_note.value, "the upload's content differs from what ran"
    _upload(panel, fp16_file)
    assert panel.stale_note.value == ""
    shutil.copyfile(CLAMP, copy)  # the file at a path changed on disk since
    panel.cand_file.value = str(copy)
    assert "press Run" in panel.stale_note.value

    panel.cand_file.value = str(tmp_path / "missing.onnx")  # a path that is not there
    assert "missing.onnx on ort" in panel.stale_note.value
    panel.cand_file.value = ""  # back to the picker (ort:fp16): not the file that ran
    assert "now say ort:fp16 against ort" in panel.stale_note.value
    panel.cand_variant.value = "fp32"  # the picker's spec ("ort") equals the result's, but it ran a file
    warn = panel.stale_note.value
    assert "mine_fp16.onnx on ort against ort" in warn and "now say ort against ort" in warn, warn

    panel.cand_variant.value = "fp16"  # a picker run, then a file typed: out of date too
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.stale_note.value == ""
    panel.cand_file.value = str(fp16_file)
    assert "the results below compare ort:fp16 against ort" in panel.stale_note.value
    assert "now say mine_fp16.onnx on ort against ort" in panel.stale_note.value
