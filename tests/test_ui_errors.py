"""Issue 13, Errors / export / history: widget-level checks of the Errors panel's layer names on the curve, zoom
for long curves, the reference / candidate / difference view (images for image-like tensors), sending a layer's
arrays to a notebook variable; the Compare panel's HTML report and bundle downloads and its run history. Each
test fails without the feature it names."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnx
import pytest
from conftest import SAMPLES, served_downloads
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import ErrorsPanel, Workbench  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"


@pytest.fixture(scope="module")
def clamp_result():
    from workbench.compare.api import compare

    return compare(CLAMP, "ort", "ort:fp16")


def _outputs_text(out) -> str:
    return " ".join(str(o.get("data", {})) for o in out.outputs)


def _figure_of(out) -> dict:
    import json

    for o in out.outputs:
        data = o.get("data", {})
        if "application/vnd.plotly.v1+json" in data:
            doc = data["application/vnd.plotly.v1+json"]
            return json.loads(doc) if isinstance(doc, str) else doc
    raise AssertionError(f"no figure in {out.outputs!r:.300}")


def chain_model(layers: int) -> onnx.ModelProto:
    """x[1,16] -> (Mul by a constant, Add a constant) x layers/2 -> y: a long curve, every tensor named."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for k in range(layers // 2):
        inits += [numpy_helper.from_array(rng.uniform(0.9, 1.1, 16).astype(np.float32), f"m{k}"),
                  numpy_helper.from_array(rng.uniform(-0.1, 0.1, 16).astype(np.float32), f"a{k}")]
        nodes += [helper.make_node("Mul", [prev, f"m{k}"], [f"t{k}"], name=f"/block{k}/Mul"),
                  helper.make_node("Add", [f"t{k}", f"a{k}"], [f"u{k}"], name=f"/block{k}/Add")]
        prev = f"u{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="/out/Identity"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# --- the curve: names and zoom ---------------------------------------------------------------------------------
def test_curve_names_the_first_divergent_and_the_worst_layers(clamp_result):
    from workbench.plots.compare import layer_error_curve

    texts = [a.text for a in layer_error_curve(clamp_result).layout.annotations]
    assert f"first divergent: {CULPRIT}" in texts
    worst = [t for t in texts if t.startswith("worst #")]
    assert len(worst) == 3 and all(CULPRIT not in t for t in worst), texts  # the first divergent is named once
    nodes = {t.node for t in clamp_result.tensors}
    assert all(t.split(": ", 1)[1] in nodes for t in worst)
    assert not [a for a in layer_error_curve(clamp_result, label_worst=0).layout.annotations
                if a.text.startswith("worst")]


def test_a_long_curve_has_a_range_slider_and_zoom_keeps_the_selection(tmp_path):
    from workbench.compare.api import compare

    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(600), path)
    result = compare(path, "ort", "ort:fp16", culprits=False)
    assert len(result.tensors) >= 500
    panel = ErrorsPanel(result, model=path)
    assert panel.curve.layout.xaxis.rangeslider.visible, "500+ layers: a range slider to zoom with"
    assert panel.curve.layout.uirevision, "a zoom survives redraws"
    node = "/block200/Add"
    panel.select(node)
    index = next(t.topo_index for t in result.tensors if t.node == node)
    span = panel.zoom("selected")
    assert span is not None and span[0] < index < span[1] and span[1] - span[0] < 100
    assert tuple(panel.curve.layout.xaxis.range) == span
    ring = next(t for t in panel.curve.data if t.name == "selected layer")
    assert list(ring.x) == [index], "the selection is kept while zooming"
    panel.zoom_all.click()
    assert panel.curve.layout.xaxis.autorange is True and list(ring.x) == [index]
    assert panel.wait(120)


def test_a_short_curve_has_no_range_slider_and_zoom_needs_a_layer(clamp_result):
    panel = ErrorsPanel(clamp_result, model=CLAMP)
    assert not panel.curve.layout.xaxis.rangeslider.visible
    assert panel.zoom("selected") is None and "no selected layer" in panel.zoom_note.value
    first = clamp_result.first_divergent.topo_index
    span = panel.zoom("first")
    assert span[0] < first < span[1]


# --- side by side ---------------------------------------------------------------------------------------------
def test_image_tensors_are_shown_side_by_side_as_images_with_a_channel_picker(clamp_result):
    panel = ErrorsPanel(clamp_result, model=CLAMP)
    panel.select(CULPRIT)  # its output is [1, 8, 16, 16]
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    fig = _figure_of(panel.views_plot)
    assert [t["type"] for t in fig["data"]] == ["heatmap"] * 3
    assert [t["name"] for t in fig["data"]] == ["reference", "candidate", "difference"]
    assert len(fig["data"][0]["z"]) == 16 and len(fig["data"][0]["z"][0]) == 16
    assert panel.view_channel.layout.display != "none" and panel.view_channel.max == 7
    assert "image-like" in panel.view_note.value and "8 channels" in panel.view_note.value
    ref, cand = panel._values[2], panel._values[3]
    panel.view_channel.value = 5
    fig = _figure_of(panel.views_plot)
    assert "channel 5 of 8" in fig["layout"]["title"]["text"]
    z = np.array(fig["data"][0]["z"], dtype=float)
    assert np.allclose(z, ref[0, 5], equal_nan=True)
    diff = np.array(fig["data"][2]["z"], dtype=float)
    assert np.allclose(diff, cand[0, 5].astype(np.float64) - ref[0, 5], equal_nan=True)


def test_flat_tensors_are_shown_side_by_side_as_values(clamp_result):
    panel = ErrorsPanel(clamp_result, model=CLAMP)
    panel.select("/head/fc/Gemm")  # [1, 5]: not image-like
    assert panel.wait(120)
    fig = _figure_of(panel.views_plot)
    assert [t["type"] for t in fig["data"]] == ["scatter"] * 3
    assert panel.view_channel.layout.display == "none" and "not image-like" in panel.view_note.value


def test_image_like_shapes():
    from workbench.plots.compare import image_channels, tensor_side_by_side

    assert image_channels((1, 3, 8, 8)) == 3 and image_channels((4, 8, 8)) == 4 and image_channels((8, 8)) == 1
    assert image_channels((1, 8)) is None and image_channels((1, 8, 1, 1)) is None and image_channels((5,)) is None
    big = np.zeros((1, 2, 1000, 600), np.float32)
    fig = tensor_side_by_side(big, big, "big", channel=1)
    assert len(fig.data[0].z) <= 256 and len(fig.data[0].z[0]) <= 256, "thinned, not a million cells"
    assert "shown" in fig.layout.title.text
    fig.to_json()  # JSON-compliant with inf/NaN inside
    odd = np.array([[1.0, np.inf], [np.nan, 2.0]], np.float32)
    tensor_side_by_side(odd, odd + 1, "odd").to_json()


# --- send to a notebook variable ------------------------------------------------------------------------------
def test_send_arrays_puts_reference_and_candidate_into_the_notebook_namespace(clamp_result, monkeypatch):
    import IPython

    panel = ErrorsPanel(clamp_result, model=CLAMP)
    assert panel.send_button.disabled and "user_ns" in panel.send_note.value  # the panel says where they go
    assert panel.send_arrays("x", {}) is None and "select a layer first" in panel.send_note.value
    panel.select(CULPRIT)
    assert panel.wait(120)
    assert not panel.send_button.disabled
    namespace: dict = {}
    shell = type("Shell", (), {"user_ns": namespace})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    panel.var_name.value = "bn_values"
    panel.send_button.click()
    assert set(namespace["bn_values"]) == {"reference", "candidate"}
    ref, cand = namespace["bn_values"]["reference"], namespace["bn_values"]["candidate"]
    assert ref.shape == cand.shape == (1, 8, 16, 16) and not np.array_equal(ref, cand, equal_nan=True)
    assert "bn_values" in panel.send_note.value and "user_ns" in panel.send_note.value
    panel.var_name.value = "not a name"
    panel.send_button.click()
    assert "not a Python variable name" in panel.send_note.value and "not a name" not in namespace


# --- exports and history ----------------------------------------------------------------------------------------
def _download(note: str, k: int = 0) -> bytes:
    """The bytes of the ``k``-th download link in ``note`` (-1: the last)."""
    return served_downloads(note)[k][2]


def test_html_report_and_bundle_are_written_to_a_temp_folder_with_download_links(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    assert panel.report_button.disabled and panel.bundle_button.disabled  # nothing to export yet
    panel.run()
    assert panel.wait(120)
    panel.report_button.click()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    page = _download(panel.export_note.value).decode()
    assert "<html" in page.lower() and "workbench-result" in page and CULPRIT in page
    assert "Download the HTML report" in panel.export_note.value
    panel.bundle_button.click()
    assert panel.wait(120) and panel.jobs.error is None, panel.jobs.status.value
    with zipfile.ZipFile(io.BytesIO(_download(panel.export_note.value, -1))) as z:
        assert any(n.endswith("manifest.json") for n in z.namelist()), z.namelist()
    # both links stay offered (the bundle's did not replace the report's)
    assert "Download the HTML report" in panel.export_note.value and "Download the bundle" in panel.export_note.value
    assert b"<html" in _download(panel.export_note.value, 0)[:2000].lower()
    assert list(cwd.iterdir()) == [], "nothing written into the working directory"
    target = tmp_path / "exports"
    panel.export_dir.value = str(target)
    panel.report_button.click()
    assert panel.wait(120)
    assert [p.suffix for p in target.iterdir()] == [".html"], "a typed folder is used as given"


def test_run_history_keeps_each_finished_run_and_diffs_two(clamp_result):
    wb = Workbench(CLAMP)
    panel = wb.compare_panel
    assert panel.diff_button.disabled
    panel.run()
    assert panel.wait(120)
    assert len(wb.state.history) == 1 and panel.diff_button.disabled
    panel.cand_variant.value = "fp32"  # ort against itself: no divergence
    panel.run()
    assert panel.wait(120)
    assert len(wb.state.history) == 2 and not panel.diff_button.disabled
    labels = [label for label, _ in panel.history_a.options]
    assert labels[0].startswith("#1: ort:fp16 vs ort, the model's shapes, 1 random feed(s), ")
    assert labels[1].startswith("#2: ort vs ort, the model's shapes, 1 random feed(s), ") and labels[0] != labels[1]
    assert (panel.history_a.value, panel.history_b.value) == (0, 1)
    panel.diff_button.click()
    out = panel.diff_out.value
    assert "verdict: DIVERGED -&gt; ok (changed)" in out and "first divergent:" in out
    assert "a different conclusion" in out and "the candidate changed: ort:fp16 -&gt; ort" in out
    assert "<pre" in out
    panel.history_a.value, panel.history_b.value = 1, 0
    diff = panel.diff_runs()
    assert not diff.same_conclusion and "verdict: ok -&gt; DIVERGED" in panel.diff_out.value


def test_history_is_shared_and_bounded():
    from workbench.ui.state import HISTORY_SIZE, WorkbenchState

    state = WorkbenchState()
    results = [object() for _ in range(HISTORY_SIZE + 3)]
    for r in results:
        state.remember(r)
    state.remember(results[-1])  # the same run again is not a new entry
    assert list(state.history) == results[-HISTORY_SIZE:]


def test_a_layers_index_says_whose_graph_it_counts_in_when_the_reference_is_a_variant():
    """With an INT8 reference its Q/DQ nodes shift every topological index: Errors said #18 where the Graph tab,
    drawing the loaded model, said #3 for the same node. The index now names the graph it counts in."""
    from workbench.compare.api import compare
    from workbench.ui.errors_panel import layer_html

    model = SAMPLES / "fp16_clamp_constant.onnx"
    plain = compare(model, "ort", "ort:fp16", culprits=False)
    variant = compare(model, "ort:int8", "ort:fp16", culprits=False)
    node = "/head/pool/GlobalAveragePool"
    a = next(t for t in plain.tensors if t.node == node)
    b = next(t for t in variant.tensors if t.node == node)
    assert a.topo_index != b.topo_index
    assert f"#{a.topo_index})" in layer_html(plain, a, "sqnr_db")
    assert f"#{b.topo_index} in ort:int8's graph)" in layer_html(variant, b, "sqnr_db")
