"""The Repair panel without a browser: run it on the sample model with the planted FP16 clamp, wait for the worker
thread, check what it shows (kept node, outputs before/after, weights, verification), that the repaired model and
the bug report download and load, that the kept node is ringed and selectable in the graph, and that Cancel and
failures leave no stale result behind."""

from __future__ import annotations

import json
import re
import threading
import zipfile
from pathlib import Path

import onnx
import pytest
from conftest import SAMPLES, served_downloads

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.repair import RepairError  # noqa: E402
from workbench.ui import GraphPanel, RepairPanel, Workbench, WorkbenchState  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"




def _link(html_text: str) -> tuple[str, bytes]:
    """(data-path, decoded bytes) of the first in-page download link in ``html_text``."""
    _name, path, data = served_downloads(html_text)[0]
    return path, data


def test_repair_keeps_the_clamped_batchnorm_rings_it_and_offers_the_model(chdir_tmp):
    wb = Workbench(CLAMP)
    assert [wb.tabs.get_title(i) for i in range(6)] == ["Model", "Compare", "Errors", "Graph", "Calibration",
                                                        "Repair"]
    graph = wb.graph_panel  # built first: the repair rings its nodes in it when it ends
    panel = wb.show("repair")
    assert panel is wb.repair_panel and wb.tabs.selected_index == 5
    assert panel.reference == "ort" and panel.candidate == "ort:fp16" and panel.stale
    thread = panel.run()
    assert isinstance(thread, threading.Thread) and panel.run_button.disabled
    assert panel.wait(120)
    assert panel.jobs.error is None, panel.jobs.status.value
    assert panel.kept == [CULPRIT] and not panel.stale and not panel.run_button.disabled
    assert panel.result.met and panel.result.kept == []  # no FP32 island: the BN is folded into its Conv
    assert [(r["node"], r["kind"]) for r in panel.result.repairs] == [(CULPRIT, "fold-bn")]
    # met / not met, the cost
    assert "target MET: every output passes (sqnr_db &lt; 30" in panel.summary.value
    assert re.search(r"\d+ evaluations, \d+ candidate builds", panel.summary.value)
    # before/after per output, the FP16 share of the weight bytes, the verification lines
    table = panel.outputs_table.value
    assert "<th>sqnr_db before</th>" in table and "<td>logits</td>" in table
    assert "<td>fails</td><td>passes</td>" in table
    details = panel.details.value
    assert "FP16 share of the weight bytes: 100.00% before, <b>100.00%</b> after (684 of 684 bytes)" in details
    assert "verified on candidate (ort): met" in details and "verified on independent (ref" in details
    assert "onnx checker: ok" in details
    assert "application/vnd.plotly.v1+json" in panel.chart.outputs[0]["data"]
    # the repaired model: a fresh folder outside the working directory, downloadable, loadable
    path, data = _link(panel.download.value)
    assert Path(path) == panel.model_file and panel.model_file.is_file()
    assert data == panel.model_file.read_bytes()
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert onnx.load_from_string(data).graph.node
    assert not any(chdir_tmp.iterdir()), "nothing is written to the working directory"
    assert Path(wb.state.output_dir) in panel.model_file.parents
    # the kept node is ringed in the graph; clicking it selects it there and brings the graph forward
    assert CULPRIT in graph.canvas.highlight and "scope:/bn_big_var" in graph.canvas.highlight
    button = panel.kept_rows.children[1]
    assert button.description == f"{CULPRIT} · fold-bn"
    button.click()
    assert wb.state.selected == CULPRIT and wb.tabs.selected_index == 3
    assert graph.canvas.selected == CULPRIT


def test_a_graph_opened_after_the_repair_rings_the_kept_nodes():
    wb = Workbench(CLAMP)
    wb.repair_panel.run()
    assert wb.repair_panel.wait(120) and wb.repair_panel.kept == [CULPRIT]
    assert CULPRIT in wb.graph_panel.canvas.highlight


def test_repair_shares_inputs_and_engines_with_compare():
    wb = Workbench(CLAMP)
    compare, repair = wb.compare_panel, wb.repair_panel
    assert repair.inputs is compare.inputs
    compare.cand_engine.value = "ref"
    assert repair.candidate == "ref:fp16"
    repair.ref_variant.value = "fp16"
    assert compare.reference == "ort:fp16"


def test_bug_report_is_a_zip_of_the_reduced_pair(chdir_tmp):
    panel = RepairPanel(CLAMP)
    panel.run()
    assert panel.wait(120) and panel.kept == [CULPRIT]
    thread = panel.make_bug_report()
    assert isinstance(thread, threading.Thread)
    assert panel.wait(120)
    assert panel.reduce_jobs.error is None, panel.reduce_jobs.status.value
    assert f"{CULPRIT} (BatchNormalization)" in panel.reduce_note.value
    assert "reproduces alone" in panel.reduce_note.value
    path, data = _link(panel.reduce_note.value)
    assert Path(path) == panel.report_zip and panel.report_zip.is_file() and panel.report_zip.suffix == ".zip"
    assert data == panel.report_zip.read_bytes()
    assert not list(panel.report_zip.parent.glob(".*.tmp")), "the zip is renamed into place"
    with zipfile.ZipFile(panel.report_zip) as zf:
        names = set(zf.namelist())
        assert {f"bug-report/{n}" for n in ("reference.onnx", "candidate.onnx", "inputs.npz", "expected.npz",
                                            "README.md")} <= names
        ref = onnx.load_from_string(zf.read("bug-report/reference.onnx"))
    assert [n.op_type for n in ref.graph.node] == ["BatchNormalization"]
    assert not any(chdir_tmp.iterdir())


def test_cancel_clears_the_result_and_marks_it_stale():
    state = WorkbenchState.of(CLAMP)
    graph = GraphPanel(state=state)
    panel = RepairPanel(state=state)
    panel.link_graph(graph)
    panel.run()
    assert panel.wait(120) and panel.kept == [CULPRIT] and CULPRIT in graph.canvas.highlight
    panel.cand_engine.value = "ref"  # FP16 arithmetic, and many feeds: plenty of progress steps to stop at
    panel.inputs.count.value = 2000
    seen = threading.Event()
    panel.jobs.bar.observe(lambda ch: ch["new"] > 0 and seen.set(), "value")
    panel.run()
    assert panel.stale and panel.kept == [] and panel.download.value == "", "a new run clears the old result"
    assert seen.wait(60), "no progress reported"
    panel.jobs.cancel_button.click()
    assert panel.wait(60)
    assert panel.jobs.cancelled and panel.jobs.error is None
    assert panel.stale and panel.result is None and panel.kept == [] and graph.canvas.highlight == []
    assert "(repair) cancelled" in panel.summary.value and "cleared" in panel.summary.value
    assert panel.state.current_run("repair").status == "cancelled"
    assert panel.kept_rows.children == () and panel.outputs_table.value == "" and panel.download.value == ""
    assert not panel.run_button.disabled
    panel.cand_engine.value, panel.inputs.count.value = "ort", 1  # usable again
    panel.run()
    assert panel.wait(120) and panel.kept == [CULPRIT] and not panel.stale


def test_a_bad_metric_is_one_line():
    panel = RepairPanel(CLAMP)
    panel.metric.value = "nope:fn"
    panel.run()
    assert panel.wait(60)
    status = panel.jobs.status.value
    assert status.count('class="wb-msg') == 1 and "wb-error" in status
    assert "repair failed: cannot import metric module &#x27;nope&#x27;" in status and "Traceback" not in status
    assert isinstance(panel.jobs.error, RepairError)
    others = [panel.summary, panel.outputs_table, panel.details, panel.download, panel.engine_note,
              panel.reduce_note]
    assert not any("wb-error" in w.value for w in others), "the failure is said once"
    assert panel.summary.value == "" and panel.stale and panel.kept == [] and panel.download.value == ""
    assert not panel.run_button.disabled


def test_a_task_metric_target(tmp_path):
    metric = tmp_path / "task_metric.py"
    metric.write_text("import numpy as np\n\n"
                      "def cosine(ref, cand):\n"
                      "    a, b = ref['logits'].ravel().astype(np.float64), cand['logits'].ravel().astype(np.float64)\n"
                      "    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))\n")
    panel = RepairPanel(CLAMP)
    panel.metric.value = f"{metric}:cosine"
    panel.target.value = ">=0.999"
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert panel.kept == [CULPRIT]
    assert "cosine &gt;= 0.999 on the worst feed" in panel.summary.value
    assert f"{metric}:cosine (worst feed): " in panel.outputs_table.value


def test_bad_options_are_reported_before_running(tmp_path):
    panel = RepairPanel(CLAMP)
    panel.cand_file.value = str(tmp_path / "missing_fp16.onnx")
    assert panel.run() is None
    assert "candidate file" in panel.jobs.status.value and "not found" in panel.jobs.status.value
    if not panel.engines["trt"]["available"]:
        panel.cand_file.value = ""
        panel.cand_engine.value = "trt"
        assert panel.run_button.disabled and "trt:" in panel.engine_note.value
        assert panel.run() is None


def test_run_is_disabled_while_running_and_the_kernel_stays_free(monkeypatch):
    import workbench.repair.api as api

    release, real = threading.Event(), api.repair

    def slow_repair(*args, **kwargs):
        assert release.wait(60), "the caller was blocked"
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "repair", slow_repair)
    panel = RepairPanel(CLAMP)
    panel.run()
    assert panel.jobs.running and panel.run_button.disabled
    assert panel.run() is None and "wait for the running job" in panel.jobs.status.value
    release.set()
    assert panel.wait(120) and panel.kept == [CULPRIT] and not panel.run_button.disabled


def test_repair_figure_is_json_compliant():
    from workbench.plots.repair import repair_outputs_figure, repair_rows

    doc = {"target": {"criterion": "sqnr_db<30", "kind": "criterion"},
           "before": {"outputs": {"a": {"sqnr_db": "-inf", "diverged": True}, "b": {"sqnr_db": 12.0,
                                                                                     "diverged": True}}},
           "after": {"outputs": {"a": {"sqnr_db": "inf", "diverged": False}, "b": {"sqnr_db": "nan",
                                                                                    "diverged": True}}}}
    rows = repair_rows(doc)
    assert [r["output"] for r in rows] == ["a", "b"] and rows[0]["after"] == float("inf")
    fig = repair_outputs_figure(doc)
    json.dumps(fig.to_plotly_json(), allow_nan=False, default=str)
    assert [t.name for t in fig.data] == ["before (candidate as converted)", "after (repaired model)"]
    assert any(s.type == "line" for s in fig.layout.shapes), "the target line"


def test_a_whole_model_rewrite_is_a_line_not_a_button(tmp_path):
    """An INT8 repair quantized again in TensorRT's placement (``qdq-placement``, a rewrite of the whole model)
    shows that rewrite as a line above the nodes; only real nodes get a button and a ring."""
    import numpy as np

    from workbench.repair import repair

    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 64)).astype(np.float32)} for s in range(8)]
    result = repair(str(SAMPLES / "int8_outlier.onnx"), "ort", "ort:int8", feeds=feeds, verify=None,
                    out=tmp_path / "fixed.onnx")
    panel = RepairPanel(SAMPLES / "int8_outlier.onnx")
    panel.show_result(result)
    rows = panel.kept_rows.children
    assert "qdq-placement: the FP32 model quantized again" in rows[0].value
    buttons = [r for r in rows if hasattr(r, "on_click")]
    assert [b.description for b in buttons] == ["/mlp/fc3/MatMul · remove-qdq"]
    assert panel.kept == ["/mlp/fc3/MatMul"] and "1 node(s) Q/DQ removed around" in rows[1].value
