"""Calibration bundles rerun elsewhere to the same thresholds; the calibration HTML report draws offline."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import SAMPLES
from test_report import _render_offline

from workbench.calibrate import calibrate
from workbench.calibrate.bundle import save_calibration_bundle
from workbench.cli import main
from workbench.report.calibration_html import write_calibration_report
from workbench.report.rerun import rerun_bundle
from workbench.report.safety import seal_manifest


@pytest.fixture(scope="module")
def outlier_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    shutil.copy(SAMPLES / "int8_outlier.onnx", folder / "m.onnx")
    return calibrate(folder / "m.onnx", 16, eval_data=8), folder / "m.onnx"


def test_bundle_moved_without_model_reruns_to_the_same_thresholds(outlier_report, tmp_path):
    report, model = outlier_report
    bundle = save_calibration_bundle(report, tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kind"] == "calibrate" and manifest["feeds"]["count"] == 16 and manifest["eval_feeds"]["count"] == 8
    moved = tmp_path / "elsewhere" / "b"
    moved.parent.mkdir()
    shutil.move(bundle, moved)
    model.unlink()  # the original model is gone: the bundle's copy is used (sha256-checked)
    rerun = rerun_bundle(moved)
    assert rerun.reproduced and rerun.exit_code == 0 and not rerun.changes
    assert rerun.report.ranges == report.ranges
    assert "REPRODUCED" in rerun.render()


def test_changed_options_are_reported_per_threshold(outlier_report, tmp_path, capsys):
    report, _ = outlier_report
    bundle = save_calibration_bundle(report, tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["calibrate"]["percentile"] = 99.9  # e.g. a colleague's changed setting
    (bundle / "manifest.json").write_text(json.dumps(seal_manifest(manifest)))  # a deliberate edit, re-sealed
    assert main(["rerun", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "NOT REPRODUCED" in out and "percentile" in out and "/mlp/fc2/Add_output_0" in out


def test_cli_calibrate_writes_report_and_bundle(tmp_path, capsys):
    code = main(["calibrate", str(SAMPLES / "int8_outlier.onnx"), "--data", "8", "--report", str(tmp_path / "c.html"),
                 "--bundle", str(tmp_path / "c.zip")])
    assert code == 0
    assert (tmp_path / "c.zip").is_file() and (tmp_path / "c.html").is_file()
    assert main(["rerun", str(tmp_path / "c.zip")]) == 0


@pytest.mark.browser
def test_calibration_report_renders_offline(outlier_report, tmp_path):
    report, _ = outlier_report
    path = write_calibration_report(report, tmp_path / "cal.html", top=3)

    def check(page):
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() >= 4  # sensitivity + 3 histograms
        assert page.locator(".js-plotly-plot .barlayer .point path").count() > 0
        doc = page.evaluate("JSON.parse(document.getElementById('workbench-result').textContent)")
        assert doc["schema"] == "workbench.calibrate/1"
        assert "/mlp/fc2/Add_output_0" in page.content()

    requests, errors = _render_offline(path, check)
    assert requests == [] and errors == []
