"""Notebook panels without a browser: build them, press their buttons programmatically, wait for the worker thread,
check what they show. Long work runs on threads; failures and cancellation become messages, never exceptions."""

from __future__ import annotations

import datetime
import io
import threading

import numpy as np
import pytest
from conftest import REPO, SAMPLES, load_file

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import (  # noqa: E402
    CalibrationPanel,
    ComparePanel,
    ErrorsPanel,
    GraphPanel,
    ModelPanel,
    Workbench,
    WorkbenchState,
)

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"


def bench_ui():
    """benchmarks/bench_ui.py: the synthetic graph generator and the browser harness."""
    return load_file(REPO / "benchmarks" / "bench_ui.py")


def _outputs_text(out) -> str:
    return " ".join(str(o.get("data", {})) for o in out.outputs)




def test_workbench_builds_on_a_path_and_shows_the_model():
    wb = Workbench(CLAMP)
    assert "fp16_clamp_constant.onnx" in wb.header.value and "7 nodes" in wb.header.value
    assert [wb.tabs.get_title(i) for i in range(5)] == ["Model", "Compare", "Errors", "Graph", "Calibration"]
    panel = wb.model_panel
    assert "BatchNormalization" in panel.ops_table.value
    assert "application/vnd.plotly.v1+json" in panel.chart.outputs[0]["data"]
    assert panel.wait(30) and "onnxruntime" in panel.probes.value
    assert "Workbench(fp16_clamp_constant.onnx)" in repr(wb) and len(repr(wb)) <= 110


def test_workbench_takes_a_modelproto_and_a_torch_module():
    import onnx

    assert "7 nodes" in Workbench(onnx.load(CLAMP)).header.value
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    wb = Workbench(net, example_inputs=(torch.randn(1, 4),))
    assert wb.state.model.source == "torch" and "Gemm" in wb.model_panel.ops_table.value
    # the torch engine runs the module itself, in Compare and in Repair
    wb = Workbench(net.eval(), example_inputs=(torch.randn(2, 4),), reference="torch")
    compare = wb.compare_panel
    compare.run()
    assert compare.wait(120) and compare.jobs.error is None, compare.jobs.status.value
    result = wb.state.result
    assert result.reference == "torch" and result.engines["reference"]["engine"] == "torch"
    assert "torch module" in str(result.precision["reference"])  # read from the module, not from its export
    repair = wb.show("repair")
    repair.run()
    assert repair.wait(240) and repair.jobs.error is None, repair.jobs.status.value
    assert "target MET" in repair.summary.value


def test_a_bad_model_is_a_message_not_an_exception(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model at all")
    wb = Workbench(bad)
    assert "wb-error" in wb.header.value and "loading the model failed" in wb.header.value
    assert wb.state.model is None
    wrong = Workbench(42)  # the user's mistake, named, not an internal error
    assert "load_model(): source must be a path" in wrong.header.value and "internal error" not in wrong.header.value


@pytest.mark.parametrize("kwargs, used, says", [
    ({"candidate": "ort:FP16"}, ("ort", "ort:fp16"), None),  # a variant in capitals is read as meant
    ({"candidate": "ort:fp8"}, ("ort", "ort:fp16"), "unknown candidate variant 'fp8'"),
    ({"reference": "bogus"}, ("ort", "ort:fp16"), "unknown reference engine 'bogus'"),
])
def test_a_spec_the_pickers_lack_is_said_and_the_panels_still_build(kwargs, used, says):
    import html

    wb = Workbench(CLAMP, **kwargs)
    pair = wb.compare_panel.pair
    assert (pair.reference, pair.candidate) == used
    note = html.unescape(wb.spec_note.value)
    assert (says in note and "wb-error" in note) if says else note == "", note
    assert wb.repair_panel is not None and wb.dataset_panel is not None


def test_a_path_that_cannot_be_written_is_the_users_problem_not_an_internal_error():
    import html

    from workbench.compare.api import compare

    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    wb.state.result = compare(str(CLAMP), "ort", "ort:fp16", culprits=False)
    panel.save_path.value = "/proc/wb-no-such-folder/x.json"
    assert panel.save() is None
    note = html.unescape(panel.save_note.value)
    assert "saving the result failed: No such file or directory: /proc/wb-no-such-folder" in note, note
    assert "internal error" not in note and "check the path" in note


def test_compare_run_finds_the_planted_culprit():
    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    assert panel.reference == "ort" and panel.candidate == "ort:fp16"
    thread = panel.run()
    assert isinstance(thread, threading.Thread)
    assert panel.wait(120)
    assert panel.jobs.error is None, panel.jobs.status.value
    result = wb.state.result
    assert result is not None and result.culprits[0].node == CULPRIT and result.diverged
    summary = panel.summary.value
    assert "first divergent: /bn_big_var/BatchNormalization" in summary
    assert "DIVERGED: output(s) logits fail sqnr_db &lt; 30" in summary
    # both sides' inferred precision, what it was read from as a tooltip
    assert "inferred precision: reference <b title=" in summary
    source = result.precision["candidate"]["precision_source"]
    assert f'candidate <b title="{source}">fp16</b>' in summary
    assert "FP16 " in summary and "<td>logits</td>" in summary  # the output against its floor
    buttons = [row.children[0] for row in panel.culprit_rows.children[1:]]
    assert buttons[0].description == f"#1 {CULPRIT}" and buttons[0].button_style == "danger"
    row = panel.culprit_rows.children[1].children[1].value
    assert "clamped constant" in row and ">harmful</b>" in row
    gain = result.culprits[0].impact["best_gain_db"]
    assert f"impact: fixing it gains {gain:.3g} dB on the outputs (logits {gain:.3g} dB)" in row
    assert "<td>DIVERGED</td>" in panel.tensors.value and "<th>floor</th>" in panel.tensors.value
    buttons[0].click()  # select it everywhere, bring Errors forward
    assert wb.state.selected == CULPRIT and wb.tabs.selected_index == 2
    assert wb.graph_panel.canvas.selected == CULPRIT


def test_the_kernel_stays_responsive_while_comparing(monkeypatch):
    import workbench.compare.api as api

    release, real = threading.Event(), api.compare

    def slow_compare(*args, **kwargs):
        assert release.wait(60), "the caller was blocked"
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "compare", slow_compare)
    panel = ComparePanel(CLAMP)
    panel.run()
    # run() returned while the comparison still waits for the caller (on the kernel's thread it would have waited
    # the 60 s out and failed): the work is on a thread
    assert not release.is_set() and panel.jobs.running and panel.run_button.disabled  # Run is off meanwhile
    assert panel.run() is None and "wait for the running job" in panel.jobs.status.value
    release.set()  # the caller (the kernel) was free to do this while the comparison waited
    assert panel.wait(120) and panel.state.result is not None
    assert not panel.run_button.disabled


def test_cancel_stops_a_running_comparison():
    panel = ComparePanel(CLAMP, candidate="ref:fp16")
    panel.inputs.count.value = 2000  # many feeds: plenty of progress steps to stop at
    seen = threading.Event()
    panel.jobs.bar.observe(lambda _: seen.set(), "value")
    panel.run()
    assert seen.wait(60), "no progress reported"
    panel.jobs.cancel_button.click()
    assert panel.wait(60)
    assert panel.jobs.cancelled and "cancelled" in panel.jobs.status.value
    assert panel.state.result is None and panel.jobs.error is None
    panel.inputs.count.value = 1  # the panel is usable again
    panel.run()
    assert panel.wait(120) and panel.state.result is not None


def test_a_failing_run_shows_the_workbench_error(tmp_path):
    panel = ComparePanel(CLAMP)
    panel.inputs.source.value = "file on the server"
    panel.inputs.path.value = str(tmp_path / "missing.npz")
    panel.run()
    assert panel.wait(60)
    assert panel.state.result is None
    assert "wb-error" in panel.jobs.status.value and "feed file not found" in panel.jobs.status.value
    assert "Traceback" not in panel.jobs.status.value


def test_bad_options_are_reported_before_running():
    panel = ComparePanel(CLAMP)
    panel.inputs.shapes.value = "image:[1,four]"
    assert panel.run() is None
    assert "whole numbers" in panel.jobs.status.value


def test_unavailable_engines_say_why_and_block_run():
    panel = ComparePanel(CLAMP)
    if panel.engines["trt"]["available"]:
        pytest.skip("TensorRT is available here")
    panel.cand_engine.value = "trt"
    assert panel.run_button.disabled
    assert "trt:" in panel.engine_note.value and "wb-error" in panel.engine_note.value
    labels = [label for label, _ in panel.cand_engine.options]
    assert "trt (not available here)" in labels
    panel.cand_engine.value = "ort"
    assert not panel.run_button.disabled


def test_torch_engine_is_refused_for_an_onnx_model():
    panel = ComparePanel(CLAMP)
    if not panel.engines.get("torch", {}).get("available"):
        pytest.skip("torch is not installed here")
    panel.cand_engine.value = "torch"
    assert panel.run_button.disabled
    assert "torch.nn.Module models only" in panel.engine_note.value
    panel.cand_engine.value = "ort"
    assert not panel.run_button.disabled


def test_run_is_disabled_while_its_job_runs():
    import ipywidgets as widgets

    from workbench.ui.jobs import JobControls

    button = widgets.Button(description="Run")
    jobs = JobControls(locks=[button])
    release, started = threading.Event(), threading.Event()

    def work(_progress, _cancel):
        started.set()
        release.wait(10)

    thread = jobs.start("job", work)
    assert started.wait(10)
    assert button.disabled and jobs.running
    # while it runs the controls carry the class that, if the kernel goes away (a restart), hides the bar and
    # Cancel (which can do nothing then: the view stayed "running" for ever) and shows what happened
    from importlib.resources import files

    from workbench.ui.jobs import GONE_NOTE, RUNNING_CLASS

    assert RUNNING_CLASS in jobs._dom_classes and GONE_NOTE in jobs.gone.value and jobs.gone in jobs.children
    css = (files("workbench.ui") / "static" / "workbench.css").read_text()
    assert ".jupyter-widgets-disconnected .wb-job-running .wb-gone-note { display: block;" in css
    assert ".jupyter-widgets-disconnected .wb-job-running .wb-job-row { display: none !important; }" in css
    assert ".wb-gone-note { display: none; }" in css and "wb-job-row" in jobs._row._dom_classes
    release.set()
    thread.join(10)
    assert not button.disabled and not jobs.running
    assert RUNNING_CLASS not in jobs._dom_classes


def test_uploaded_npz_feeds_are_used(tmp_path):
    buf = io.BytesIO()
    feed = np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)
    np.savez(buf, image=feed)
    panel = ComparePanel(CLAMP)
    panel.inputs.source.value = "upload"
    panel.inputs.upload.value = ({"name": "feeds.npz", "type": "application/octet-stream", "size": buf.tell(),
                                  "content": memoryview(buf.getvalue()),
                                  "last_modified": datetime.datetime.now(datetime.timezone.utc)},)
    assert "1 feed(s) uploaded" in panel.inputs.status.value
    panel.run()
    assert panel.wait(120)
    result = panel.state.result
    assert result.feeds["count"] == 1 and result.culprits[0].node == CULPRIT
    np.testing.assert_array_equal(result.used_feeds[0]["image"], feed)


def test_errors_panel_click_shows_the_layer_detail():
    wb = Workbench(CLAMP)
    wb.compare_panel.run()
    assert wb.compare_panel.wait(120)
    panel = wb.errors_panel
    curve = panel.curve
    assert curve is not None and any(t.name == "first divergent" for t in curve.data)
    assert any(s.type == "line" for s in curve.layout.shapes), "the tolerance line"
    assert any(t.name == "FP16 floor (reference held in FP16)" and t.fill == "tonexty" for t in curve.data)
    from plotly.callbacks import Points

    trace = curve.data[0]
    index = [row[1] for row in trace.customdata].index(CULPRIT)
    panel._on_click(trace, Points(point_inds=[index], xs=[trace.x[index]], ys=[trace.y[index]],
                                  trace_name=trace.name, trace_index=0), None)
    assert wb.state.selected == CULPRIT
    bn = wb.state.result.tensor(CULPRIT + "_output_0")
    assert f"FP16 floor sqnr_db {bn.floor['sqnr_db']:.1f} dB" in panel.detail_title.value  # its floor next to it
    assert "dB beyond it" in panel.detail_title.value and ">diverged</b>" in panel.detail_title.value
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert "value distributions" in _outputs_text(panel.values_plot)
    assert "candidate vs reference" in _outputs_text(panel.scatter_plot)
    assert "per channel" in _outputs_text(panel.channel_plot)
    selected = next(t for t in curve.data if t.name == "selected layer")
    assert list(selected.x) == [trace.x[index]]
    assert wb.graph_panel.canvas.selected == CULPRIT  # the graph follows the plot


def test_errors_panel_curve_survives_a_second_comparison():
    """A second Run clears the result first (no stale numbers), then the new result must bring the curve back."""
    wb = Workbench(CLAMP)
    for _ in range(2):
        wb.compare_panel.run()
        assert wb.compare_panel.wait(120)
        panel = wb.errors_panel
        assert panel.curve is not None and panel.curve_box.children == (panel.curve,) and panel.curve_shown


def test_errors_panel_on_a_result_read_back_from_json(tmp_path):
    from workbench.compare.api import compare
    from workbench.compare.result import CompareResult

    saved = compare(CLAMP, "ort", "ort:fp16", seed=3).save_json(tmp_path / "r.json")
    result = CompareResult.load_json(saved)
    panel = ErrorsPanel(result, model=CLAMP)
    panel.select(CULPRIT)
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert "value distributions" in _outputs_text(panel.values_plot)


TRANSFORMER = SAMPLES / "transformer_block.onnx"
POW = "/block/ln2/Pow"


def test_errors_panel_on_a_result_opened_from_a_bundle(tmp_path):
    """Issue 13.3, the reproduce_investigation notebook's click: a bundle's result keeps its feeds, so the layer
    values run both engines on exactly those feeds."""
    from workbench.compare.api import compare
    from workbench.report import load_bundle, save_bundle

    feeds = SAMPLES / "transformer_block_inputs.npz"
    found = compare(TRANSFORMER, "ort", "ref:fp16", feeds=feeds)
    bundle_dir = tmp_path / "ln2-overflow"
    save_bundle(found, dest=bundle_dir, tensors="auto")
    saved = load_bundle(bundle_dir).result
    assert saved.used_feeds is not None and len(saved.used_feeds) == len(found.used_feeds)
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for a, b in zip(saved.used_feeds, found.used_feeds)
               for k in a)
    panel = ErrorsPanel(saved, model=TRANSFORMER)
    layer = found.culprits[0].node
    panel.select(layer)
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    assert "value distributions" in _outputs_text(panel.values_plot)
    from workbench.inspect_tensor import probe_for

    tensor = next(t.tensor for t in found.tensors if t.node == layer)
    now, then = probe_for(saved, TRANSFORMER).values(tensor, 0), probe_for(found).values(tensor, 0)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(now, then)), "the same feeds and engines"


@pytest.fixture(scope="module")
def dips_result():
    """Outputs pass under ort:fp16; internal tensors of the second LayerNorm dip (Pow overflows FP16)."""
    from workbench.compare.api import compare

    return compare(TRANSFORMER, "ort", "ort:fp16", feeds=SAMPLES / "transformer_block_inputs.npz")


def test_compare_panel_shows_a_passing_verdict_with_internal_dips(dips_result):
    result = dips_result
    assert not result.diverged and POW + "_output_0" in [t.tensor for t in result.internal_dips]
    panel = ComparePanel(TRANSFORMER)
    panel.state.result = result
    summary = panel.summary.value
    assert "ok: every output passes sqnr_db &lt; 30" in summary and "DIVERGED" not in summary
    assert f"{len(result.internal_dips)} internal dip(s)" in summary and POW + "_output_0" in summary
    assert "not a divergence" in summary and "first divergent" not in summary
    assert "<td>internal dip</td>" in panel.tensors.value
    labels = [row.children[1].value for row in panel.culprit_rows.children[1:]]
    assert labels and all("impact: " in text for text in labels)


def test_compare_panel_labels_outputs_at_their_floor_and_harmless_culprits(tmp_path):
    from test_ui_plots import at_floor_result

    result = at_floor_result(tmp_path)
    panel = ComparePanel(tmp_path / "tiny_values.onnx")
    panel.state.result = result
    summary = panel.summary.value
    assert "ok: every output passes" in summary and "1 at the candidate format&#x27;s floor" in summary
    assert "1 output(s) at their precision floor: y" in summary
    assert "ok, at its floor (the format cannot hold the values)" in summary
    rows = panel.culprit_rows.children[1:]
    harmless = [r for r, c in zip(rows, result.culprits) if c.harmless]
    assert harmless and ">harmless</b>" in harmless[0].children[1].value
    assert "fixing it gains at most" in harmless[0].children[1].value
    assert harmless[0].children[0].button_style == ""  # only harmful culprits are red


def test_auto_tolerance_follows_the_inferred_candidate_precision(tmp_path):
    """"auto" shows the criterion compare() will pick: from the precision read from the model the candidate
    runs (the loaded file itself for "fp32", the variant otherwise), the lossier side deciding."""
    import onnx

    from workbench.variants import make_variant

    panel = ComparePanel(TRANSFORMER)  # an FP32 file
    assert panel.metric.value == "default for the candidate precision" and panel.threshold.disabled
    assert panel.threshold.value == 30.0 and "sqnr_db &lt; 30" in panel.tolerance_note.value
    assert "expected precision: reference <b" in panel.precision.value and ">fp32</b>" in panel.precision.value
    panel.cand_variant.value = "fp32"
    assert panel.threshold.value == 60.0 and "computes in fp32" in panel.tolerance_note.value
    panel.cand_variant.value = "int8"
    assert panel.threshold.value == 0.1 and "norm_mean_abs &gt; 0.1" in panel.tolerance_note.value
    fp16 = tmp_path / "transformer_fp16.onnx"  # the user's own FP16 file, run as loaded: still FP16
    onnx.save(make_variant(onnx.load(TRANSFORMER), "fp16").model, fp16)
    own = ComparePanel(fp16, candidate="ort")
    assert own.cand_variant.value == "fp32" and own.threshold.value == 30.0
    assert "computes in fp16: float16 holds" in own.tolerance_note.value
    assert own.auto_criterion().text() == "sqnr_db<30"
    own.metric.value = "cosine"  # a metric picked by hand starts from its usual tolerance
    assert not own.threshold.disabled and own.threshold.value == 0.999
    assert own.criterion().text() == "cosine<0.999"


def test_errors_panel_shows_the_floor_of_the_selected_layer(dips_result):
    panel = ErrorsPanel(dips_result, model=TRANSFORMER)
    names = [t.name for t in panel.curve.data]
    assert "first divergent" not in names and "internal dip (outputs pass)" in names
    assert "FP16 floor (reference held in FP16)" in names
    assert "ok: every output passes" in panel.message.value and "3 internal dip(s)" in panel.message.value
    panel.select(POW)
    pow_out = dips_result.tensor(POW + "_output_0")
    title = panel.detail_title.value
    assert f"sqnr_db {pow_out.metrics['sqnr_db']:.1f} dB" in title
    assert f"FP16 floor sqnr_db {pow_out.floor['sqnr_db']:.1f} dB" in title
    assert "exceed its range in FP16" in title and ">internal dip</b>" in title
    panel.metric.value = "cosine"  # the detail follows the metric shown
    assert "FP16 floor cosine" in panel.detail_title.value
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    panel.select(dips_result.tensor("y").node)
    assert "graph output" in panel.detail_title.value
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value


def test_errors_panel_without_a_result_says_so():
    panel = ErrorsPanel(model=CLAMP)
    assert "no comparison yet" in panel.message.value and panel.curve is None


def test_graph_panel_collapses_searches_and_focuses(tmp_path):
    import onnx

    path = tmp_path / "big.onnx"
    onnx.save(bench_ui().synthetic_model(5000), path)
    panel = GraphPanel(path, max_nodes=1500)
    data = panel.canvas.data
    assert len(panel.view.names) >= 5000
    assert 0 < len(data["ids"]) <= 1500 and any(i.startswith("scope:") for i in data["ids"])
    matches = panel.find("layers.37/attn/tanh")
    assert matches and panel.state.selected == matches[0] and panel.canvas.selected == matches[0]
    assert matches[0] in panel.canvas.data["ids"], "the found node is revealed"
    assert panel.canvas.highlight == matches[:50]
    panel.hops.value = 2
    panel.focus_on(matches[0])
    assert set(panel.canvas.data["ids"]) == {panel.view.names[i] for i in panel.view.neighbourhood(matches[0], 2)}
    panel.whole_graph()
    assert len(panel.canvas.data["ids"]) > 100
    scope = next(i for i in panel.canvas.data["ids"] if i.startswith("scope:"))
    before = len(panel.canvas.data["ids"])
    panel._on_canvas_msg(panel.canvas, {"event": "expand", "id": scope}, [])
    assert len(panel.canvas.data["ids"]) > before


def test_graph_selection_links_to_the_state_and_overlays_follow_results():
    state = WorkbenchState.of(CLAMP)
    graph = GraphPanel(state=state)
    assert graph.overlay.value == "op_type"
    graph.canvas.selected = "/relu/Relu"  # a click in the browser
    assert state.selected == "/relu/Relu"
    from workbench.compare.api import compare

    state.result = compare(state.model, "ort", "ort:fp16")
    assert graph.overlay.value == "introduced"
    colors = dict(zip(graph.canvas.data["ids"], graph.canvas.data["color"]))
    assert colors[CULPRIT] == "#b71c1c"
    state.selected = CULPRIT
    assert graph.canvas.selected == CULPRIT and "culprit #1" in graph.info.value


def test_model_panel_compatibility_for_chosen_targets():
    panel = ModelPanel(SAMPLES / "transformer_block.onnx")
    panel.targets.value = ("TensorRT 8.6", "OpenVINO")
    panel.check()
    assert "TensorRT 8.6" in panel.compat.value and "OpenVINO" in panel.compat.value
    assert "ONNX Runtime 1.18" not in panel.compat.value


def test_calibration_panel_ranks_tensors_and_exports_outside_the_cwd(chdir_tmp):
    import html

    from workbench.calibrate.methods import METHODS, RULES

    panel = CalibrationPanel(SAMPLES / "int8_outlier.onnx")
    assert panel.cache_button.disabled and panel.qdq_button.disabled
    # every rule is offered and selected, each shown with whose threshold it reproduces
    assert panel.methods.value == METHODS and len(METHODS) == 6
    assert dict((v, k) for k, v in panel.methods.options) == {m: f"{m} — {RULES[m].label}" for m in METHODS}
    assert panel.rule_percentile.value and panel.percentile.disabled  # each rule's own percentile by default
    assert panel.ort_entropy_bins.value == 128
    panel.data_count.value, panel.eval_count.value = 16, 4
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    report = panel.state.calibration
    assert report.config["percentile"] is None and report.config["ort_entropy_bins"] == 128
    assert report.methods == list(METHODS) and report.method == "entropy"
    assert panel.tensor.value == "/mlp/fc2/Add_output_0"  # the planted outlier is the most sensitive
    text = _outputs_text(panel.histogram)
    assert "|x| over the calibration data" in text and "clips" in text and "evaluation" in text
    assert "entropy (TensorRT)" in text and "ort-entropy (ONNX Runtime)" in text
    assert "entropy" in panel.tensor_note.value and "ONNX Runtime" in panel.tensor_note.value
    # the rules table: one row per rule, labelled, the ranking rule marked
    rules = panel.rules.value
    assert rules.count("<tr") == 1 + 6
    assert all(html.escape(RULES[m].label) in rules for m in METHODS)
    assert rules.count('class="first"') == 1 and "ranks the tensors" in rules
    assert "percentile 99.99<" in rules and "percentile 99.999<" in rules and "128 bins" in rules
    # the notes (here: entropy is far worse than another rule at the median tensor) come first, as warnings
    assert report.notes and any("ranks the tensors, but" in n for n in report.notes)
    summary = panel.summary.value
    assert summary.startswith('<div class="wb-msg wb-warn">')
    assert all(html.escape(n) in summary for n in report.notes)
    assert summary.index("ranks the tensors, but") < summary.index("tensors calibrated")
    # export: options name their rule; the messages say which rule the files carry
    assert dict(panel.export_method.options)[f"percentile — {RULES['percentile'].label}"] == "percentile"
    panel.export_method.value = "percentile"
    cache = panel.export_cache()
    assert cache is not None and cache.exists() and cache.read_text().startswith("TRT-")
    assert html.escape(f"written with 'percentile' ({RULES['percentile'].label}) thresholds: {cache}") \
        in panel.export_note.value
    panel.export_method.value = "ort-percentile"
    panel.qdq_path.value = "exported.qdq.onnx"  # relative: goes under the output folder
    panel.export_qdq()
    assert panel.wait(180), panel.export_note.value
    assert html.escape(f"QDQ model saved with 'ort-percentile' ({RULES['ort-percentile'].label}) ranges") \
        in panel.export_note.value
    assert (panel.state.out_dir() / "exported.qdq.onnx").exists()
    assert list(chdir_tmp.iterdir()) == [], "nothing is written to the working directory"


def test_calibration_panel_passes_an_explicit_percentile_bins_and_ranking_rule():
    panel = CalibrationPanel(SAMPLES / "int8_outlier.onnx")
    panel.rule_percentile.value = False
    assert not panel.percentile.disabled
    panel.percentile.value, panel.ort_entropy_bins.value = 99.9, 256
    panel.methods.value = ("entropy", "ort-percentile")
    panel.rank_method.value = "mse"  # not among the rules picked: computed too
    panel.data_count.value, panel.eval_count.value = 4, 0
    panel.run()
    assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
    report = panel.state.calibration
    assert report.config["percentile"] == 99.9 and report.config["ort_entropy_bins"] == 256
    assert report.methods == ["entropy", "ort-percentile", "mse"] and report.method == "mse"
    assert panel.rules.value.count("<tr") == 1 + 3 and "percentile 99.9<" in panel.rules.value
    assert [v for _, v in panel.export_method.options] == report.methods and panel.export_method.value == "mse"


def test_calibration_failure_is_a_message(tmp_path):
    panel = CalibrationPanel(SAMPLES / "int8_outlier.onnx")
    panel.data_path.value = str(tmp_path / "nowhere")
    panel.run()
    assert panel.wait(60)
    assert panel.state.calibration is None and "wb-error" in panel.jobs.status.value


def test_graph_panel_opens_a_large_model_without_name_scopes(tmp_path):
    """Issue 13.1: over max_nodes nodes and no '/' in the names used to crash (depth 1 not among the options)."""
    import onnx
    from onnx import TensorProto, helper

    n = 2000
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu_{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    panel = GraphPanel(path, max_nodes=1500)
    assert "wb-error" not in panel.message.value, panel.message.value
    assert panel.depth.value in [v for _, v in panel.depth.options] and panel.depth.value == -1
    assert len(panel.canvas.data["ids"]) == n and "no name scopes" in panel.message.value


def test_calibrating_again_redraws_the_selected_tensor():
    """Issue 13.2: a second report selecting the same tensor showed the first report's table and histogram."""
    from workbench.plots.calibration import calibration_histogram
    from workbench.ui.figures import figure_bundle
    from workbench.ui.tables import fmt

    panel = CalibrationPanel(SAMPLES / "int8_outlier.onnx")
    # ranked by 'max' (independent of the percentile): the same tensor is selected both times
    panel.methods.value, panel.rank_method.value = ("percentile", "max"), "max"
    panel.data_count.value, panel.eval_count.value = 4, 0
    panel.rule_percentile.value = False
    shown = []
    for percentile in (90.0, 99.99):
        panel.percentile.value = percentile
        panel.run()
        assert panel.wait(180) and panel.jobs.error is None, panel.jobs.status.value
        report, name = panel.state.calibration, panel.tensor.value
        assert report.config["percentile"] == percentile
        amax = report.errors[name]["percentile"].amax
        assert fmt(amax) in panel.tensor_note.value
        bundle = panel.histogram.outputs[0]["data"]
        expected = calibration_histogram(report, name, log_y=panel.log_y.value, show_eval=panel.show_eval.value)
        assert bundle == figure_bundle(expected)
        shown.append((name, amax, bundle))
    (first, amax0, fig0), (second, amax1, fig1) = shown
    assert first == second, "the same tensor stays selected: the case that used to keep the old numbers"
    assert amax0 != amax1 and fig0 != fig1
    assert fmt(amax0) not in panel.tensor_note.value


def test_compare_runs_the_users_own_candidate_file_typed_or_uploaded(tmp_path):
    """Issue 13 item 4: pick your own FP16 export in the Compare panel (path or upload); the result names it."""
    from pathlib import Path

    import onnx

    from workbench.ui import ComparePanel
    from workbench.variants import make_variant

    mine = tmp_path / "my_fp16.onnx"
    onnx.save(make_variant(onnx.load(CLAMP), "fp16").model, mine)
    panel = ComparePanel(CLAMP)
    panel.cand_upload.value = ({"name": "../../my_fp16.onnx", "type": "", "size": mine.stat().st_size,
                                "content": memoryview(mine.read_bytes()),
                                "last_modified": datetime.datetime.now(datetime.timezone.utc)},)
    uploaded = Path(panel.cand_file.value)
    assert uploaded.name == "my_fp16.onnx" and uploaded.parent != tmp_path
    assert uploaded.read_bytes() == mine.read_bytes()
    assert "runs your file" in panel.engine_note.value
    panel.cand_file.value = str(mine)
    panel.run()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    result = panel.state.result
    assert result.variant["variant"] == "user model" and result.variant["file"] == "my_fp16.onnx"
    assert result.candidate == "ort" and "your file my_fp16.onnx" in panel.summary.value
    assert result.diverged  # the converter's clamp is in the file: the culprit is still found
    panel.cand_file.value = str(tmp_path / "missing.onnx")
    assert panel.run() is None and "not found" in panel.jobs.status.value
