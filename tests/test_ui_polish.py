"""Issue 13, the notebook as a polished tool: widget-level checks of what the browser tests cannot see (threads,
shapes handed to the core, stale results, progress, downloads, figure text, search ranking, saved notebooks).
Each test fails on the behaviour the issue reported."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, SAMPLES, load_file, served_downloads
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import ComparePanel, GraphPanel, Workbench, WorkbenchState  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"


def dynamic_model() -> onnx.ModelProto:
    """x[N,3,H,W] -> Conv(3->4, 3x3) -> Relu -> y: height and width dynamic (named), the batch too."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="/act/Relu")]
    graph = helper.make_graph(
        nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "height", "width"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# --- thread safety -------------------------------------------------------------------------------------------
class FakeLoop:
    """Stands for the kernel's io loop: collects what is handed to the kernel's thread."""

    def __init__(self):
        self.callbacks: list = []

    def add_callback(self, fn, *args):
        self.callbacks.append((fn, args))


def test_job_results_reach_widgets_and_state_on_the_kernel_thread_only(monkeypatch):
    from workbench.ui import kernel_thread
    from workbench.ui.jobs import JobControls

    loop = FakeLoop()
    monkeypatch.setattr(kernel_thread, "_io_loop", lambda: loop)
    state = WorkbenchState()
    seen: list[threading.Thread] = []
    state.observe(lambda _: seen.append(threading.current_thread()), "result")
    run = __import__("ipywidgets").Button(description="Run")
    jobs = JobControls(locks=[run])
    thread = jobs.start("job", lambda progress, _cancel: (progress(0.5, "half"), "value")[1],
                        lambda value: setattr(state, "result", value))
    thread.join(10)
    assert not thread.is_alive()
    # the worker set nothing itself: the result, the progress and Run's state wait for the kernel's thread
    assert state.result is None and seen == [] and run.disabled
    assert loop.callbacks and kernel_thread.pending() > 0
    assert kernel_thread.drain() > 0  # what the io loop does on the kernel's (here: the main) thread
    assert state.result == "value" and seen == [threading.main_thread()]
    assert not run.disabled and jobs.bar.bar_style == "success"


def test_wait_on_the_kernel_thread_runs_the_queued_updates(monkeypatch):
    """``panel.run(); panel.wait()`` in one cell shows the result although the io loop is busy with the cell."""
    from workbench.ui import kernel_thread

    monkeypatch.setattr(kernel_thread, "_io_loop", lambda: FakeLoop())
    panel = ComparePanel(CLAMP)
    panel.run()
    assert panel.wait(120)
    assert panel.state.result is not None and "first divergent" in panel.summary.value
    assert kernel_thread.pending() == 0


def test_errors_panel_probe_follows_the_result_without_the_kernel_thread_waiting(monkeypatch):
    """The probe is built on the worker; a new result arriving meanwhile neither blocks the kernel's thread nor
    lets the next layer click reuse the old result's probe."""
    import workbench.inspect_tensor as inspect_tensor
    from workbench.ui import ErrorsPanel

    wb = Workbench(CLAMP)
    wb.compare_panel.run()
    assert wb.compare_panel.wait(120)
    first = wb.state.result
    building, release, waited, built = threading.Event(), threading.Event(), threading.Event(), []
    real = inspect_tensor.probe_for

    def slow_probe_for(result, model=None):
        building.set()
        released = release.wait(30)
        waited.set()
        assert released
        built.append(result)
        return real(result, model)

    monkeypatch.setattr(inspect_tensor, "probe_for", slow_probe_for)
    panel = ErrorsPanel(state=wb.state)
    panel.select(first.tensors[0].node)
    assert building.wait(30)
    wb.compare_panel.run()  # a new result while the worker builds the old one's probe
    assert not waited.is_set(), "the kernel's thread waited for the probe"  # it is released only below
    release.set()
    assert wb.compare_panel.wait(120) and panel.wait(60)
    second = wb.state.result
    assert second is not first
    panel.select(second.tensors[1].node)
    assert panel.wait(60) and panel.jobs.error is None, panel.jobs.status.value
    assert built[-1] is second and panel._probe_for is second
    assert "value distributions" in str(panel.values_plot.outputs)


# --- item 5: dynamic shapes ----------------------------------------------------------------------------------
def test_shapes_are_prefilled_from_the_model_and_shared_with_calibration():
    wb = Workbench(dynamic_model())
    compare, calibration = wb.compare_panel, wb.calibration_panel
    assert compare.inputs.shapes.value == "x:[1,3,?,?]"  # the batch is 1, the other dynamic dims to fill
    assert calibration.shapes.value == "x:[1,3,?,?]"
    assert "fill each ?" in compare.inputs.shapes_note.value and "2 (height)" in compare.inputs.shapes_note.value
    # unfilled: both panels say what to do, naming the field, before anything runs
    assert compare.run() is None and "fill in the dynamic dimension" in compare.jobs.status.value
    assert calibration.run() is None and "x:[1,3,224,224]" in calibration.jobs.status.value
    calibration.shapes.value = "x:[1,3,8,12]"  # filled in one panel: the other has it too
    assert compare.inputs.shapes.value == "x:[1,3,8,12]"
    for note in (compare.inputs.shapes_note.value, calibration.shapes_note.value):  # filled: no longer asked
        assert "fill each ?" not in note and "2 (height)" in note
    compare.run()
    assert compare.wait(120) and compare.jobs.error is None, compare.jobs.status.value
    assert wb.state.result.feeds["shapes"] == {"x": [1, 3, 8, 12]}
    calibration.data_count.value, calibration.eval_count.value = 2, 1
    calibration.run()
    assert calibration.wait(120) and calibration.jobs.error is None, calibration.jobs.status.value
    assert wb.state.calibration is not None and wb.state.calibration.histograms
    # a static model: nothing to fill, the field says so
    static = Workbench(CLAMP)
    assert static.compare_panel.inputs.shapes.value == "" and "fixed" in static.compare_panel.inputs.shapes.placeholder


def test_missing_shapes_error_names_the_python_keyword():
    from workbench.compare.api import compare
    from workbench.errors import InputError

    with pytest.raises(InputError) as info:
        compare(dynamic_model(), "ort", "ort:fp16")
    text = str(info.value)
    assert "--input-shapes x:[1,3,N,N]" in text and "input_shapes={'x': [...]}" in text
    assert "(Python: shapes=" not in text


# --- item 6: stale results -----------------------------------------------------------------------------------
def test_a_failed_run_leaves_no_culprits_of_an_earlier_run_on_screen():
    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    panel.run()
    assert panel.wait(120) and panel.culprit_rows.children and wb.state.result is not None
    assert wb.errors_panel.curve_shown and panel.stale_note.value == ""
    panel.cand_engine.value, panel.cand_variant.value = "ref", "fp16"  # another pair ...
    assert "compare ort:fp16 against ort; the engines above now say ref:fp16 against ort" in panel.stale_note.value
    panel.inputs.ranges.value = "nope:[0,1]"  # ... whose run fails inside compare()
    panel.run()
    assert panel.wait(120) and panel.jobs.error is not None
    assert panel.culprit_rows.children == () and panel.tensors.value == ""
    assert "failed" in panel.summary.value and "no current result" in panel.summary.value
    assert wb.state.result is None and not wb.errors_panel.curve_shown and not wb.errors_panel.curve.data
    assert "ort:fp16 against ort" not in panel.summary.value and panel.stale_note.value == ""


def test_cancel_clears_the_results_area_and_says_so():
    panel = ComparePanel(CLAMP, candidate="ref:fp16")
    panel.run()
    assert panel.wait(120) and panel.culprit_rows.children
    panel.inputs.count.value = 5000
    seen = threading.Event()
    panel.jobs.bar.observe(lambda _: seen.set(), "value")
    panel.run()
    assert "comparing ref:fp16 against ort on 5000 random feed(s)" in panel.summary.value
    assert panel.culprit_rows.children == (), "the previous culprits go as the new run starts"
    assert seen.wait(60)
    panel.cancel()
    assert panel.wait(60) and panel.jobs.cancelled
    assert "cancelled: no current result" in panel.summary.value and "comparing" not in panel.summary.value
    assert panel.culprit_rows.children == () and panel.state.result is None and panel.save_button.disabled


def test_a_cancelled_calibration_leaves_no_old_report():
    from workbench.ui import CalibrationPanel

    panel = CalibrationPanel(SAMPLES / "int8_outlier.onnx")
    panel.data_count.value, panel.eval_count.value = 4, 0
    panel.run()
    assert panel.wait(120) and panel.state.calibration is not None and panel.tensor.options
    panel.data_count.value = 5000
    seen = threading.Event()
    panel.jobs.bar.observe(lambda _: seen.set(), "value")
    panel.run()
    assert panel.state.calibration is None and panel.tensor.options == ()
    assert seen.wait(60)
    panel.jobs.cancel()
    assert panel.wait(60) and panel.jobs.cancelled
    assert "cancelled: no current calibration" in panel.summary.value
    assert panel.histogram.outputs == () and panel.qdq_button.disabled


# --- item 7: progress through the culprit search -------------------------------------------------------------
def test_progress_keeps_moving_while_every_node_runs_alone(monkeypatch):
    from workbench.compare import strategies
    from workbench.compare.api import compare

    monkeypatch.setattr(strategies, "TICK_S", 0.05)
    real = strategies._prepare_isolation

    def slow_isolation(ctx, iso, ref):
        iso, session, dtypes = real(ctx, iso, ref)
        run = session.run

        def slow_run(feed):
            time.sleep(0.8)  # one long engine call, as on a 500-node detector
            return run(feed)

        session.run = slow_run
        return iso, session, dtypes

    monkeypatch.setattr(strategies, "_prepare_isolation", slow_isolation)
    seen: list[tuple[float, str]] = []
    compare(CLAMP, "ort", "ort:fp16", progress=lambda f, m: seen.append((f, m)))
    start = next(k for k, (_, m) in enumerate(seen) if "every node alone" in m)
    end = next(k for k, (f, _) in enumerate(seen) if f >= 0.85)
    during = [f for f, _ in seen[start:end]]
    assert len(set(during)) >= 5, f"the bar stalled during the culprit search: {seen[start:end]}"
    assert during == sorted(during) and max(during) < 0.85
    assert any(re.search(r"culprit search.*\(\d+ s\)", m) for _, m in seen[start:end]), "elapsed seconds shown"
    assert seen[-1][0] == 1.0


# --- item 15: saved JSON downloadable ------------------------------------------------------------------------
def test_saved_result_json_comes_with_a_download_link(chdir_tmp):
    panel = ComparePanel(CLAMP)
    panel.run()
    assert panel.wait(120)
    written = panel.save()
    assert written is not None and written.parent != chdir_tmp
    [(name, path, data)] = served_downloads(panel.save_note.value)
    assert name == "result.json" and Path(path) == written
    doc = json.loads(data)
    assert doc["schema"] == "workbench.compare/1" and doc["culprits"][0]["node"] == "/bn_big_var/BatchNormalization"
    panel.run()  # a new run: the old link goes with the old result
    assert "wb-download" not in panel.save_note.value
    assert panel.wait(120)




# --- item 13: figure text ------------------------------------------------------------------------------------
def test_long_titles_wrap_and_long_labels_are_shortened_not_cut():
    from workbench.plots import LABEL_CHARS, TITLE_CHARS
    from workbench.plots.compare import value_histograms

    name = "/model/encoder/layers.11/attention/self/MatMul_1_output_0_of_a_very_long_exported_graph"
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(100).astype(np.float32)
    fig = value_histograms(ref, ref + np.float32(1e-3), name)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= TITLE_CHARS for line in lines)
    assert "".join(lines).replace(" ", "") == f"{name}: value distributions".replace(" ", ""), "nothing is cut"
    assert fig.layout.title.automargin and fig.layout.margin.t >= 30 + 19 * len(lines)

    from workbench.plots import short_labels

    labels = short_labels([name + "_a", name + "_b", "short"])
    assert len(set(labels)) == 3 and all(len(label) <= LABEL_CHARS for label in labels)
    assert labels[0].startswith("/model/encoder") and labels[0].endswith("_a")


def test_calibration_threshold_labels_never_share_a_row():
    from workbench.calibrate import calibrate
    from workbench.plots.calibration import LABEL_ROW_PX, calibration_histogram, sensitivity_bars

    report = calibrate(SAMPLES / "int8_outlier.onnx", 4, seed=0)
    tensor = report.sensitivity[0].tensor
    fig = calibration_histogram(report, tensor)
    notes = list(fig.layout.annotations)
    shifts = sorted(a.yshift for a in notes)
    # rows a fixed number of pixels apart, whatever the plot's height: an 11 px label and its box fit in one
    assert all(a.yref == "paper" and a.y == 1 and a.yanchor == "top" for a in notes)
    assert all(b - a >= LABEL_ROW_PX >= 20 for a, b in zip(shifts, shifts[1:]))
    bars = sensitivity_bars(report)
    assert all(t.customdata is not None for t in bars.data), "the hover names the tensor in full"


# --- item 12: search ranking ---------------------------------------------------------------------------------
def test_search_selects_the_exact_name_first_and_steps_through_matches():
    nodes = [helper.make_node("HardSigmoid", ["x"], ["a"], name="HardSigmoid.0"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="Sigmoid.0"),
             helper.make_node("Sigmoid", ["b"], ["y"], name="Sigmoid.1")]
    graph = helper.make_graph(nodes, "s", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    panel = GraphPanel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert panel.find("Sigmoid.0")[0] == "Sigmoid.0" and panel.state.selected == "Sigmoid.0"
    assert panel.canvas.matches[0] == ["Sigmoid.0", "Sigmoid"] and panel.canvas.match_total == 2
    assert panel.step_match(1) == "HardSigmoid.0" and panel.step_match(1) == "Sigmoid.0"
    assert panel.step_match(-1) == "HardSigmoid.0"
    panel.canvas.query = "sigmoid.1"  # typed in the browser's search box
    assert panel.state.selected == "Sigmoid.1" and panel.canvas.selected == "Sigmoid.1"
    panel.overlay.value = "precision"  # a new overlay keeps the pan and zoom
    assert panel.canvas.data["view"] == "keep"


def test_expanding_a_scope_keeps_the_view_and_the_selection(tmp_path):
    bench = load_file(REPO / "benchmarks" / "bench_ui.py")
    path = tmp_path / "m.onnx"
    onnx.save(bench.synthetic_model(400), path)
    panel = GraphPanel(path, max_nodes=40)
    node = panel.view.names[3]
    panel.select(node)
    scope = next(i for i in panel.canvas.data["ids"] if i.startswith("scope:") and i != f"scope:{node}")
    panel.canvas.selected = scope  # the first click of a double click lands on the scope
    panel.expand(scope)
    data = panel.canvas.data
    assert data["view"] == "keep" and data["anchor"][0] == scope and data["anchor"][1] in data["ids"]
    assert panel.canvas.selected == node and panel.state.selected == node


# --- item 11: saved notebooks --------------------------------------------------------------------------------
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_notebooks_open_clean(path):
    """No path of the machine that made them; the installed kernelspec (JupyterLab would rewrite another and mark
    the notebook modified); every figure with its picture (JupyterLab's plotly renderer adds a PNG to a figure
    without one as it draws it, marking the notebook modified on open); the panels' saved widgets carry the CSS
    that replaces ipywidgets' broken-link icons with one note."""
    text = path.read_text()
    assert str(REPO) not in text and not re.search(r'"/(?:tmp|root|home|Users|private)/', text)
    nb = json.loads(text)
    from jupyter_client.kernelspec import KernelSpecManager

    assert nb["metadata"]["kernelspec"]["display_name"] == KernelSpecManager().get_kernel_spec("python3").display_name
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert all(o["data"].get("image/png") for o in figures), "a figure without its picture"
    state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    roots = [m for m in state.values() if "wb-root" in (m["state"].get("_dom_classes") or [])]
    styles = [m for m in state.values() if "wb-style" in (m["state"].get("_dom_classes") or [])]
    assert roots and styles and all("wb-saved-note" in m["state"]["value"] for m in styles)


def test_make_notebooks_scrubs_paths_and_draws_pictures(tmp_path):
    import tempfile

    import nbformat
    import plotly.graph_objects as go

    mk = load_file(REPO / "scripts" / "make_notebooks.py")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    fig = go.Figure(go.Bar(x=[1], y=[2]))
    cell.outputs = [nbformat.v4.new_output("execute_result", execution_count=1, data={
        "application/vnd.plotly.v1+json": json.loads(fig.to_json()), "text/plain": "<fig>"})]
    text = nbformat.v4.new_code_cell("print()")
    text.outputs = [nbformat.v4.new_output("stream", text=f"{REPO}/sample_models/a.onnx and "
                                                           f"{tempfile.gettempdir()}/workbench-abc123/x.json")]
    nb.cells = [cell, text]
    assert mk.scrub_paths(nb, REPO / "notebooks") == 2
    assert nb.cells[1].outputs[0].text == "../sample_models/a.onnx and (a temporary folder)/x.json"
    # in an HTML widget's value too, where "<temporary folder>" was read as a tag: the saved quickstart said
    # "finished runs are saved to" and nothing more
    html_widget = {"state": {"value": f'<span>runs are saved to {tempfile.gettempdir()}/workbench-runs-x</span>'}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m": html_widget}}}
    assert mk.scrub_paths(nb, REPO / "notebooks") == 1
    saved = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]["m"]["state"]["value"]
    assert saved == "<span>runs are saved to (a temporary folder)</span>"
    if not Path(mk.CHROMIUM).exists():
        pytest.skip(f"{mk.CHROMIUM} not found")
    pytest.importorskip("playwright")
    assert mk.add_pictures(nb) == 1
    png = base64.b64decode(nb.cells[0].outputs[0].data["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_table_cells_of_ordinary_words_wrap_between_words_only():
    """The Calibration rules table broke "entropy" as "entrop/y" in a squeezed column: every text cell could break
    anywhere. Now only a cell holding a long token (a tensor path) may; the stylesheet keeps the others whole."""
    from importlib.resources import files

    from workbench.ui.tables import WORD_CHARS, cell_html

    assert cell_html("ranks the tensors") == "<td>ranks the tensors</td>"
    assert cell_html("ort-percentile") == "<td>ort-percentile</td>"
    long = "/model/layers.0/self_attn/q_proj/MatMul_output_0"
    assert len(long) > WORD_CHARS and cell_html(long) == f'<td class="wb-long">{long}</td>'
    css = (files("workbench.ui") / "static" / "workbench.css").read_text()
    assert ".wb-table td:not(.wb-long) { overflow-wrap: normal; }" in css
