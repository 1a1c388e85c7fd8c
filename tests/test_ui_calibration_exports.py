"""The Calibration tab's exports as a user meets them: a typed path that is the loaded model or a calibration
file is refused as the CLI refuses it (nothing overwritten), the cache and the QDQ model each keep their download
link, a new run clears them, and data holding +inf is refused instead of writing an empty cache."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import CalibrationPanel  # noqa: E402


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data(folder, inf: bool = False):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        x = rng.standard_normal((1, 64)).astype(np.float32)
        if inf and i == 1:
            x[0, 5] = np.inf
        np.savez(folder / f"s{i}.npz", x=x)
    return folder


def test_exports_never_overwrite_the_model_or_the_data_and_each_keeps_its_link(tmp_path):
    model = tmp_path / "victim.onnx"
    shutil.copyfile(SAMPLES / "int8_outlier.onnx", model)
    data = _data(tmp_path / "data")
    panel = CalibrationPanel(str(model))
    panel.data_path.value = str(data)
    panel.run()
    assert panel.wait(120) and panel.state.calibration is not None, panel.jobs.status.value
    kept = {p: _sha(p) for p in (model, data / "s0.npz")}
    for field, export in ((panel.cache_path, panel.export_cache), (panel.qdq_path, panel.export_qdq)):
        for target in kept:
            field.value = str(target)
            assert export() is None and panel.wait(60)
            note = panel.export_note.value
            assert "refusing to overwrite" in note or "would overwrite a file of the input" in note, note
    assert {p: _sha(p) for p in kept} == kept
    panel.cache_path.value = panel.qdq_path.value = ""  # the defaults: the output folder
    assert panel.export_cache() is not None
    panel.export_qdq()
    assert panel.wait(120)
    note = panel.export_note.value
    assert note.count('class="wb-download"') == 2 and "TensorRT cache written" in note and "QDQ model saved" in note
    assert "run #1: " in note
    panel.run()  # a new calibration: the exports of the last one go with it
    assert panel.wait(120) and panel.export_note.value == ""


def test_data_holding_inf_writes_no_empty_cache(tmp_path):
    panel = CalibrationPanel(str(SAMPLES / "int8_outlier.onnx"))
    panel.data_path.value = str(_data(tmp_path / "data", inf=True))
    panel.run()
    assert panel.wait(120) and panel.state.calibration is not None
    assert panel.export_cache() is None
    assert "no tensor has a usable INT8 range" in panel.export_note.value
    assert not list(panel.state.out_dir().glob("*.cache"))
