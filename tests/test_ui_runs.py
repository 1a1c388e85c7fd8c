"""One state of runs (issue 22): every comparison, calibration, repair, dataset run and engine inspection is a
numbered run with a status; every view is derived from the current run of its kind and says which run its numbers
come from; after a Cancel no view shows the previous run's numbers as current. Driven in-process on real engines."""

from __future__ import annotations

import html
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import CalibrationPanel, RepairPanel, Workbench  # noqa: E402
from workbench.ui.dataset_panel import DatasetPanel  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"  # image (1, 4, 16, 16) -> logits (1, 10); BN variance clamped in FP16
CULPRIT = "/bn_big_var/BatchNormalization"


@pytest.fixture(scope="module")
def dyn(tmp_path_factory) -> Path:
    """The sample with its image's height and width dynamic (``image:[1,4,?,?]``): runs on other input shapes."""
    import onnx

    model = onnx.load(CLAMP)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    del model.graph.value_info[:]
    dest = tmp_path_factory.mktemp("dyn") / "clamp_dynamic.onnx"
    onnx.save(model, dest)
    return dest


@pytest.fixture(scope="module")
def fp16_file(tmp_path_factory) -> Path:
    """The sample converted to FP16 by onnxconverter-common: a user's own FP16 export (inputs/outputs FP32)."""
    import onnx

    float16 = pytest.importorskip("onnxconverter_common.float16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = float16.convert_float_to_float16(onnx.load(CLAMP), keep_io_types=True)
    dest = tmp_path_factory.mktemp("own") / "mine_fp16.onnx"
    onnx.save(model, dest)
    return dest


def _compare(wb, shapes: str | None = None):
    panel = wb.compare_panel
    if shapes is not None:
        panel.inputs.shapes.value = shapes
    assert panel.run() is not None, panel.jobs.status.value
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    return wb.state.result


def _value(result, node: str, metric: str = "sqnr_db") -> str:
    """The node's metric as the graph's side pane prints it."""
    t = next(t for t in result.tensors if t.node == node)
    return f"{t.metrics[metric]:.4g}"


def _cancel(monkeypatch, target: str, panel, start) -> None:
    """Start ``panel``'s job with ``target`` (a core function) held until Cancel is pressed, press Cancel, wait."""
    import importlib

    module, name = target.rsplit(".", 1)
    module = importlib.import_module(module)
    real, reached = getattr(module, name), threading.Event()

    def held(*args, **kwargs):
        reached.set()
        assert kwargs["cancel"].wait(60), "Cancel was never pressed"
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, held)
    assert start() is not None
    assert reached.wait(60)
    panel.jobs.cancel_button.click()
    assert panel.wait(60) and panel.jobs.cancelled, panel.jobs.status.value
    monkeypatch.setattr(module, name, real)


def test_runs_are_numbered_and_their_transitions_recorded(monkeypatch):
    wb = Workbench(CLAMP)
    state = wb.state
    assert state.current_run("comparison") is None
    result = _compare(wb)
    run = state.current_run("comparison")
    assert (run.id, run.kind, run.status) == (1, "comparison", "done") and run.result is result
    assert state.run_of(result) is run and "run #1" in wb.compare_panel.summary.value
    _cancel(monkeypatch, "workbench.compare.api.compare", wb.compare_panel, wb.compare_panel.run)
    run = state.current_run("comparison")
    assert (run.id, run.status, run.result) == (2, "cancelled", None) and state.result is None
    assert state.log.get(1).status == "done"  # the older run is still recorded, not current
    cal = wb.calibration_panel
    cal.data_count.value, cal.eval_count.value = 2, 0
    cal.run()
    assert cal.wait(120) and state.current_run("calibration").id == 3
    assert state.calibration is state.current_run("calibration").result
    state.result = result  # a result opened directly (a dataset sample, a JSON) becomes a run of its own
    assert state.run_of(result).id == 1 and state.current_run("comparison").id == 2


def test_graph_side_pane_shows_the_current_comparison_only(dyn):
    """Defect 1: the side pane kept the previous comparison's numbers after a new one."""
    wb = Workbench(dyn)
    graph = wb.graph_panel
    first = _compare(wb, "image:[1,4,16,16]")
    graph.select(CULPRIT)
    assert "from comparison run #1" in graph.info.value and _value(first, CULPRIT) in graph.info.value
    second = _compare(wb, "image:[1,4,24,24]")
    assert _value(first, CULPRIT) != _value(second, CULPRIT)
    assert "run #1" not in graph.info.value and _value(first, CULPRIT) not in graph.info.value
    graph.select(CULPRIT)
    assert "from comparison run #2" in graph.info.value and _value(second, CULPRIT) in graph.info.value
    assert _value(first, CULPRIT) not in graph.info.value
    assert "colours from comparison run #2" in graph.overlay_note.value


def test_after_cancel_no_view_shows_the_previous_run(monkeypatch):
    """Defect 2: after Cancel, Errors kept the old layer and plots, Graph its side pane, Calibration its sensitivity
    chart and representativeness table, Engine its error column."""
    wb = Workbench(CLAMP)
    state, compare, errors, graph = wb.state, wb.compare_panel, wb.errors_panel, wb.graph_panel
    _compare(wb)
    errors.select(CULPRIT)
    assert errors.wait(120) and errors.values_plot.outputs and errors.curve_shown
    assert "run #1" in errors.message.value and errors.overview.outputs
    graph.select(CULPRIT)
    assert "from comparison run #1" in graph.info.value
    cal = wb.calibration_panel
    cal.data_count.value, cal.eval_count.value = 4, 4
    cal.run()
    assert cal.wait(120) and cal.sensitivity.outputs and "<table" in cal.represent.value
    assert "run #2" in cal.summary.value
    engine = wb.engine_panel
    engine.engine.value = "ort"
    engine.inspect()
    assert engine.wait(120) and "from comparison run #1" in engine.summary.value

    _cancel(monkeypatch, "workbench.compare.api.compare", compare, compare.run)
    assert state.result is None and state.current_run("comparison").status == "cancelled"
    cancelled = f"run #{state.current_run('comparison').id} (comparison) cancelled"
    assert cancelled in errors.message.value
    assert not errors.curve_shown and errors.curve.data == () and errors.detail_title.value == ""
    for out in (errors.values_plot, errors.scatter_plot, errors.channel_plot, errors.overview, errors.culprit_chart,
                errors.views_plot):
        assert not out.outputs
    assert errors.send_button.disabled
    assert "run #1" not in graph.info.value and cancelled in graph.info.value
    assert "run #1" not in engine.summary.value and "no current comparison" in engine.summary.value
    assert "run #1" not in compare.summary.value and compare.culprit_rows.children == ()

    _cancel(monkeypatch, "workbench.calibrate.calibrate", cal, cal.run)
    assert state.calibration is None and "cancelled" in cal.summary.value
    assert not cal.sensitivity.outputs and cal.represent.value == "" and not cal.histogram.outputs
    assert cal.tensor.options == () and cal.rules.value == ""

    _compare(wb)  # a new run: every view shows it, labelled
    run = state.current_run("comparison")
    assert f"run #{run.id}:" in errors.message.value and errors.curve_shown
    assert f"from comparison run #{run.id}" in engine.summary.value


def test_repair_takes_the_file_compare_compares(fp16_file):
    """Defects 3 and 4: Repair with the user's file and the default fp16 picker failed in CLI words
    (--cand-model / --cand), and in the Workbench it repaired the tool's own FP16 conversion instead of the file
    Compare compared."""
    wb = Workbench(CLAMP)
    compare = wb.compare_panel
    compare.cand_file.value = str(fp16_file)
    assert compare.cand_variant.value == "fp16" and compare.candidate == "ort"
    result = _compare(wb)
    assert result.variant["file"] == "mine_fp16.onnx"
    repair = wb.repair_panel
    assert repair.cand_file.value == str(fp16_file) and repair.cand_variant.value == "fp16"
    assert repair.candidate == "ort" and "your file" in repair.engine_note.value
    assert "wb-error" not in repair.engine_note.value
    repair.run()
    assert repair.wait(180) and repair.jobs.error is None, repair.jobs.status.value
    assert "mine_fp16.onnx" in repair.result.candidate and ":fp16" not in repair.result.candidate
    assert "mine_fp16.onnx" in repair.summary.value
    assert wb.state.current_run("repair").status == "done"
    compare.cand_file.value = ""  # both follow: back to the tool's own FP16 conversion
    assert repair.cand_file.value == "" and repair.candidate == "ort:fp16"


def test_repair_alone_accepts_a_file_with_the_fp16_picker_and_says_errors_in_its_words(fp16_file, tmp_path):
    panel = RepairPanel(CLAMP)
    panel.cand_file.value = str(fp16_file)
    assert panel.cand_variant.value == "fp16" and not panel.run_button.disabled
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.result is not None and "mine_fp16.onnx" in panel.result.candidate
    panel.cand_file.value = str(tmp_path / "missing.onnx")
    assert panel.run() is None
    said = panel.jobs.status.value
    assert "candidate file" in said and "not found" in said and "--cand" not in said


def test_dataset_runs_the_users_own_candidate_file(fp16_file, tmp_path):
    """Defect 5: the Dataset panel had no own-candidate-file field."""
    folder = tmp_path / "npz"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(folder / f"s{i}.npz", image=rng.standard_normal((1, 4, 16, 16)).astype(np.float32))
    panel = DatasetPanel(CLAMP)
    panel.folder.value = str(folder)
    panel.cand_file.value = str(fp16_file)
    assert panel.candidate == "ort" and "your file" in panel.engine_note.value
    assert panel.run_options()["cand_model"] == str(fp16_file)
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.result.run_options["cand_model"] == str(fp16_file)
    run = panel.state.current_run("dataset")
    assert run.status == "done" and "mine_fp16.onnx" in run.label and run.tag in panel.summary.value
    panel.cand_file.value = str(tmp_path / "missing.onnx")
    assert panel.run() is None and "candidate file" in panel.jobs.status.value


def test_a_culprit_card_with_an_unbounded_gain_reads_in_words():
    """Defect 6 (the card): an infinite gain prints in words, not "inf dB"."""
    import math

    from workbench.compare.impact import impact_record
    from workbench.compare.result import Culprit
    from workbench.ui.compare_panel import culprit_html

    impact = impact_record("sqnr_db", {"out": {"sqnr_db": 20.0}}, {"out": {"sqnr_db": math.inf}})
    c = Culprit("/head/Sigmoid", "Sigmoid", "y", 3, {"sqnr_db": 30.0}, {"sqnr_db": 60.0}, True, impact=impact)
    text = culprit_html(c, "sqnr_db")
    assert "harmful" in text and "inf dB" not in text and "match the reference exactly" in text
    assert "out exact after the fix" in text


def test_repair_details_say_floor_met_checks_and_the_originals_checker_errors():
    """Defect 8: the independent check said "met" at 25.7 dB against a 30 dB target, before/after bars were the same
    red, and the original model's checker error read as the repair's."""
    from workbench.plots.repair import repair_outputs_figure
    from workbench.ui.repair_panel import details_html

    doc = {"target": {"kind": "criterion", "criterion": "sqnr_db<30", "text": "every output passes"},
           "before": {"outputs": {"logits": {"sqnr_db": 10.0, "diverged": True}}},
           "after": {"outputs": {"logits": {"sqnr_db": 12.0, "diverged": True}}},
           "verification": {"independent": {"engine": "ref", "met": True,
                                            "outputs": {"logits": {"sqnr_db": 25.7, "diverged": False}}},
                            "candidate": {"engine": "ort", "met": True,
                                          "outputs": {"logits": {"sqnr_db": 45.0, "diverged": False}}}},
           "checker": {"ok": False, "errors": ["Field 'shape' of 'type' is required but missing."]}}
    text = details_html(doc, ["Field 'shape' of 'type' is required but missing."])
    assert "met at the precision floor: logits sqnr_db 25.7 misses the target sqnr_db&lt;30" in text
    assert "verified on candidate (ort): met (logits sqnr_db 45" in text
    assert "already fails it the same way (not caused by the repair)" in text and "wb-bad" not in text
    assert "wb-bad" in details_html(doc, [])  # an error the original did not have is the repair's
    fig = repair_outputs_figure(doc)
    before, after = fig.data
    assert before.marker.color[0] != after.marker.color[0] and before.marker.pattern.shape == "/"


def test_history_labels_and_the_diff_name_the_input_change(dyn):
    """Defect 11: identical history labels; the diff did not mention the input-shape change."""
    wb = Workbench(dyn)
    panel = wb.compare_panel
    _compare(wb, "image:[1,4,16,16]")
    _compare(wb, "image:[1,4,24,24]")
    labels = [label for label, _ in panel.history_a.options]
    assert re.match(r"#1: ort:fp16 vs ort, shapes image:\[1,4,16,16\], 1 random feed\(s\), \d\d:\d\d:\d\d: "
                    r"DIVERGED$", labels[0]), labels
    assert labels[1].startswith("#2: ort:fp16 vs ort, shapes image:[1,4,24,24], ")
    panel.diff_runs()
    assert "the inputs changed: shapes image:[1,4,16,16], 1 random feed(s) -&gt; shapes image:[1,4,24,24]" in \
        panel.diff_out.value
    assert "run #1 against run #2" in panel.diff_out.value


def test_representativeness_shows_the_calibrations_own_share_beyond_amax():
    """Defect 12: "100% beyond amax" stood next to "flagged: no" without the calibration data's own share."""
    panel = CalibrationPanel(CLAMP)
    panel.data_count.value, panel.eval_count.value = 4, 4
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    table = panel.represent.value
    assert "<th>eval beyond amax</th><th>calib beyond amax</th><th>excess</th>" in table
    rows = panel.state.calibration.representativeness
    assert rows and re.search(rf"<td[^>]*>{re.escape(f'{rows[0].calib_beyond_fraction:.3%}')}</td>", table)
    assert re.search(r"<td[^>]*>(no|yes)</td>", table)
    assert "clearly more often than the calibration data does" in table


def test_precision_colouring_says_whose_precision_it_shows():
    """Defect 13: the "precision" colouring showed the candidate's fp16 on the FP32 model without saying so."""
    wb = Workbench(CLAMP)
    graph = wb.graph_panel
    graph.overlay.value = "precision"
    assert "the loaded model's own tensor types" in html.unescape(graph.overlay_note.value)
    _compare(wb)
    graph.overlay.value = "precision"
    note = html.unescape(graph.overlay_note.value)
    assert "what the candidate of comparison run #1 (ort:fp16) computes each node in" in note
    assert "not the loaded model's own types" in note


def test_input_placeholders_name_the_models_own_inputs(dyn):
    """Defect 19: the input placeholders named inputs (x, ids) the model does not have."""
    wb = Workbench(dyn)
    boxes = (wb.compare_panel.inputs.shapes, wb.calibration_panel.shapes, wb.engine_panel.shapes)
    for field in boxes:
        assert field.placeholder.startswith("image:[1,4,?,?]") and "x:" not in field.placeholder
    assert wb.compare_panel.inputs.ranges.placeholder.startswith("image:[0,1]")
    fixed = Workbench(CLAMP)
    assert "fixed: nothing to fill" in fixed.compare_panel.inputs.shapes.placeholder
    assert "x:" not in fixed.engine_panel.shapes.placeholder


def test_options_that_cannot_be_used_do_not_leave_the_last_attempts_line(tmp_path):
    """After a failed run, a new attempt whose options cannot be used (an empty feed path) said nothing about itself
    in the results: they still read "run #1 ... failed (the reason is above)", and the reason above was the new
    one. They now say that nothing ran."""
    from workbench.ui.inputs_box import PATH

    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    bad = tmp_path / "nan.npz"
    np.savez(bad, image=np.full((1, 4, 16, 16), np.nan, np.float32))
    panel.inputs.source.value = PATH
    panel.inputs.path.value = str(bad)
    assert panel.run() is not None
    assert panel.wait(120) and panel.jobs.error is not None
    assert "failed (the reason is above)" in panel.summary.value
    panel.inputs.path.value = ""
    assert panel.run() is None
    assert "no feed file given" in panel.jobs.status.value
    assert "run #" not in panel.summary.value and "nothing ran" in panel.summary.value
