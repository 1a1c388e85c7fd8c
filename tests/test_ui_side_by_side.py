"""Issue 22, beyond the defects: the reference and candidate graphs side by side (node matching, candidate-only
Casts and Q/DQ, the overlay on both, linked selection with both sides' numbers, following the current run, a
5,000-node graph collapsed on both sides) and the user's colour thresholds reaching the graph and the Errors plots
(pure functions given the thresholds; one clear line for bad input). In process; the browser side is
tests/test_browser_side_by_side.py."""

from __future__ import annotations

import html
import math
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench import load_model  # noqa: E402
from workbench.compare.api import compare  # noqa: E402
from workbench.compare.criterion import Criterion  # noqa: E402
from workbench.model.graph import GraphInfo  # noqa: E402
from workbench.plots.compare import layer_error_curve, metric_histogram  # noqa: E402
from workbench.plots.graph import GraphView, graph_payload  # noqa: E402
from workbench.plots.side_by_side import CANDIDATE_ONLY, candidate_result, match_nodes, side_payloads  # noqa: E402
from workbench.plots.thresholds import BAD, BAND_STYLE, GOOD, MARGINAL, Bands, ThresholdError  # noqa: E402
from workbench.ui import ErrorsPanel, GraphPanel  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
FP16_SAMPLE = SAMPLES / "fp16_clamp_constant.onnx"
CULPRIT = "/bn_big_var/BatchNormalization"
GREEN, AMBER, RED = (BAND_STYLE[b][0] for b in (GOOD, MARGINAL, BAD))


@pytest.fixture(scope="module")
def fp16():
    """The bundled sample compared with the tool's own FP16 conversion (Casts inserted at the input and output)."""
    model = load_model(FP16_SAMPLE)
    return model, compare(model, "ort", "ort:fp16")


def _cand_graph(result) -> GraphInfo:
    return GraphInfo.build(result.plan.cand_inferred)


# --- matching ----------------------------------------------------------------------------------------------------
def test_fp16_nodes_match_by_name_and_the_inserted_casts_are_candidate_only(fp16):
    model, result = fp16
    cand = _cand_graph(result)
    match = match_nodes(model.graph, cand, result)
    assert match.ref_to_cand == {n.name: n.name for n in model.graph.nodes}
    assert match.candidate_only and set(match.candidate_only.values()) == {"Cast"}
    assert all(n not in model.graph.producer.values() for n in match.candidate_only)
    assert not match.reference_only


def test_qdq_nodes_match_through_their_dequantize_and_q_dq_pairs_are_candidate_only():
    model = load_model(SAMPLES / "int8_outlier.onnx")
    result = compare(model, "ort", "ort:int8")
    cand = _cand_graph(result)
    match = match_nodes(model.graph, cand, result)
    assert set(match.ref_to_cand) == {n.name for n in model.graph.nodes}
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(match.candidate_only.values())
    # the comparison paired each reference tensor with a DequantizeLinear output: its counterpart is the node
    # computing it, not the DequantizeLinear
    for t in result.tensors:
        assert cand.node(match.ref_to_cand[t.node]).op_type == t.op_type


def test_a_renamed_user_file_matches_through_the_comparisons_tensor_pairing(fp16, tmp_path):
    model, _ = fp16
    proto = onnx.load(FP16_SAMPLE)
    for k, node in enumerate(proto.graph.node):
        node.name = f"mine_{k}"
    path = tmp_path / "renamed.onnx"
    onnx.save(proto, path)
    result = compare(model, "ort", "ort", cand_model=str(path))
    match = match_nodes(model.graph, _cand_graph(result), result)
    ref_nodes = [n.name for n in model.graph.nodes]
    assert [match.ref_to_cand[n] for n in ref_nodes] == [f"mine_{k}" for k in range(len(ref_nodes))]
    assert not match.candidate_only


# --- overlay data --------------------------------------------------------------------------------------------------
def test_both_sides_are_coloured_by_the_same_numbers_and_candidate_only_nodes_as_such(fp16):
    model, result = fp16
    cand = _cand_graph(result)
    match = match_nodes(model.graph, cand, result)
    ref_view, cand_view = GraphView.from_graph(model.graph), GraphView.from_graph(cand)
    bands = Bands.from_criterion(result.criterion)
    left, right = side_payloads(ref_view, cand_view, match, result, overlay="error", bands=bands)
    lcol, rcol = dict(zip(left["ids"], left["color"])), dict(zip(right["ids"], right["color"]))
    for ref, c in match.ref_to_cand.items():
        assert rcol[c] == lcol[ref], ref
    for c in match.candidate_only:
        assert rcol[c] == CANDIDATE_ONLY
    value = next(t for t in result.tensors if t.node == CULPRIT).metrics["sqnr_db"]
    assert lcol[CULPRIT] == (RED if value < bands.bad else GREEN if value >= bands.good else AMBER)
    assert [f"only in the candidate ({len(match.candidate_only)} shown)", CANDIDATE_ONLY] in right["legend"]
    assert right["counterpart"][right["ids"].index(CULPRIT)] == CULPRIT
    told = candidate_result(result, match)
    assert [t.node for t in told.tensors] == [match.ref_to_cand[t.node] for t in result.tensors]


def test_the_panel_links_selection_and_shows_both_sides_numbers(fp16):
    model, result = fp16
    panel = GraphPanel(FP16_SAMPLE)
    panel.state.result = compare(panel.state.model, "ort", "ort:fp16")
    result = panel.state.result
    panel.mode.value = "side"
    side = panel.side_by_side
    assert panel.body.layout.display == "none" and panel.side_box.layout.display == ""
    assert panel.side_box.children == (side,)
    cast = next(iter(side.match.candidate_only))
    side.select(CULPRIT, "candidate")  # a click on the candidate's node
    assert panel.state.selected == CULPRIT
    assert side.left.canvas.selected == CULPRIT and side.right.canvas.selected == CULPRIT
    t = next(t for t in result.tensors if t.node == CULPRIT)
    shown = side.numbers.value
    assert f"{t.metrics['sqnr_db']:.4g}" in shown and "float16" in shown and "float32" in shown
    assert "culprit #1" in shown and "data-band='bad'" in shown
    assert f"{t.floor['sqnr_db']:.4g}" in shown and "held in FP16" in shown
    side.select(cast, "candidate")  # a candidate-only Cast: no counterpart selected, said so
    assert side.right.canvas.selected == cast and side.left.canvas.selected == ""
    assert "inserted by the conversion" in side.numbers.value
    panel.state.selected = "/conv/Conv"  # selected elsewhere (Errors, a culprit): both sides follow
    assert side.left.canvas.selected == side.right.canvas.selected == "/conv/Conv"


def test_side_by_side_follows_the_current_run(fp16):
    panel = GraphPanel(FP16_SAMPLE)
    state = panel.state
    state.result = compare(state.model, "ort", "ort:fp16")
    panel.mode.value = "side"
    side = panel.side_by_side
    assert side.left.canvas.data["ids"] and side.right.canvas.data["ids"]
    run = state.begin_run("comparison", "again")
    assert side.left.canvas.data == {} and side.right.canvas.data == {} and side.numbers.value == ""
    assert f"{run.tag} (comparison) is running" in side.message.value
    state.end_run(run, "cancelled")
    assert side.left.canvas.data == {} and "cancelled" in side.message.value
    run = state.begin_run("comparison", "third")
    state.end_run(run, "done", compare(state.model, "ort", "ort:fp16"))
    assert side.left.canvas.data["ids"] and run.tag in side.message.value


def test_a_comparison_reopened_from_its_bundle_shows_the_variant_built_again(fp16, tmp_path):
    from workbench.report.bundle import load_bundle, save_bundle

    model, result = fp16
    path = save_bundle(result, model, dest=tmp_path / "bundle")
    panel = GraphPanel(FP16_SAMPLE)
    panel.mode.value = "side"
    with load_bundle(path) as bundle:
        panel.state.result = bundle.result  # a run reopened from its bundle: no candidate model in memory
    side = panel.side_by_side
    assert "built again from the model" in side.message.value
    assert set(side.match.candidate_only.values()) == {"Cast"} and len(side.match.ref_to_cand) == 7
    side.select(CULPRIT, "candidate")
    t = next(t for t in result.tensors if t.node == CULPRIT)
    assert f"{t.metrics['sqnr_db']:.4g}" in side.numbers.value


def test_a_result_without_its_candidate_graph_says_why_instead_of_drawing(fp16, tmp_path):
    from workbench.compare.result import CompareResult

    model, _ = fp16
    proto = onnx.load(FP16_SAMPLE)
    proto.graph.node[0].name = "mine"
    onnx.save(proto, tmp_path / "mine.onnx")
    own = compare(model, "ort", "ort", cand_model=str(tmp_path / "mine.onnx"))
    panel = GraphPanel(FP16_SAMPLE)
    panel.mode.value = "side"
    panel.state.result = CompareResult.from_json(own.to_json())  # your own file, its path not recorded
    side = panel.side_by_side
    assert side.left.canvas.data == {} and "not kept with this comparison" in side.message.value


def scoped_model(n: int):
    """About ``n`` elementwise nodes in blocks (/enc/blockK/...) of four and a residual Add."""
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Softsign"]
    nodes, h, k = [], "x", 0
    while len(nodes) < n:
        a = h
        for j in range(4):
            out = f"t{len(nodes)}"
            nodes.append(helper.make_node(ops[(k + j) % len(ops)], [a], [out], name=f"/enc/block{k}/op{j}"))
            a = out
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node("Add", [a, h], [out], name=f"/enc/block{k}/add"))
        h, k = out, k + 1
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_5000_node_model_is_collapsed_on_both_sides_and_a_pick_reveals_its_counterpart():
    panel = GraphPanel(scoped_model(5000), max_nodes=1500)
    panel.state.result = compare(panel.state.model, "ort", "ort:fp16")
    panel.mode.value = "side"
    side = panel.side_by_side
    assert 0 < len(side.left.canvas.data["ids"]) <= 1500 and 0 < len(side.right.canvas.data["ids"]) <= 1502
    name = "/enc/block700/op2"
    assert name not in side.left.canvas.data["ids"] and name not in side.right.canvas.data["ids"]
    side.select(name, "candidate")
    assert name in side.left.canvas.data["ids"] and name in side.right.canvas.data["ids"]
    assert side.left.canvas.selected == side.right.canvas.selected == name


# --- colour thresholds ---------------------------------------------------------------------------------------------
def test_bands_default_from_the_criterion_and_refuse_bad_input_in_one_line():
    assert Bands.from_criterion(Criterion("sqnr_db", 30.0)) == Bands("sqnr_db", 40.0, 30.0)
    low = Bands.from_criterion(Criterion("norm_mean_abs", 0.1))
    assert low.good == pytest.approx(0.01) and low.bad == 0.1
    assert [Bands("sqnr_db", 40, 30).classify(v) for v in (50, 35, 20, math.inf, math.nan)] == [GOOD, MARGINAL, BAD,
                                                                                                GOOD, BAD]
    assert [low.classify(v) for v in (0.001, 0.05, 0.5)] == [GOOD, MARGINAL, BAD]
    with pytest.raises(ThresholdError, match=r"good threshold \(30\) is below the bad one \(40\)"):
        Bands.parse("sqnr_db", "30", "40")
    with pytest.raises(ThresholdError, match="'abc' is not a number"):
        Bands.parse("sqnr_db", "abc", "30")
    with pytest.raises(ThresholdError, match="not a finite number"):
        Bands.parse("sqnr_db", "inf", "30")
    with pytest.raises(ThresholdError, match="above the bad one"):
        Bands.parse("max_abs", "1", "0.1")


def test_the_thresholds_reach_the_graph_and_the_errors_figures(fp16):
    model, result = fp16
    view = GraphView.from_graph(model.graph)
    default = Bands.from_criterion(result.criterion)
    strict = Bands.parse("sqnr_db", "300", "250")  # nothing is good, everything bad
    a = graph_payload(view, overlay="error", result=result, bands=default)
    b = graph_payload(view, overlay="error", result=result, bands=strict)
    assert a["color"] != b["color"] and set(b["color"]) == {RED}
    assert ["good: sqnr_db \u2265 300 dB", GREEN] in b["legend"] and ["bad: sqnr_db < 250 dB", RED] in b["legend"]
    assert b["bands"] == strict.to_json()
    curve = layer_error_curve(result, bands=strict)
    names = {html.unescape(tr.name) for tr in curve.data if tr.name}
    assert {"good: sqnr_db \u2265 300 dB", "marginal: 250-300 dB", "bad: sqnr_db < 250 dB"} <= names
    assert set(curve.data[0].marker.color) == {RED}
    assert {s.fillcolor for s in curve.layout.shapes if s.type == "rect"} == {GREEN, AMBER, RED}
    assert set(layer_error_curve(result, bands=default).data[0].marker.color) != {RED}
    hist = metric_histogram(result, bands=strict)
    assert "bad: sqnr_db < 250 dB" in {html.unescape(tr.name) for tr in hist.data if tr.name}
    assert layer_error_curve(result).data[0].marker.color != curve.data[0].marker.color  # none: as before


def test_the_thresholds_reach_the_culprit_chart_and_the_html_report(fp16, tmp_path):
    from workbench.plots.compare import culprit_bars
    from workbench.report.html import write_report

    model, result = fp16
    assert result.culprits
    strict = Bands.parse("sqnr_db", "300", "250")
    labels = {"good: sqnr_db \u2265 300 dB", "marginal: 250-300 dB", "bad: sqnr_db < 250 dB"}
    bars = culprit_bars(result, bands=strict)
    assert all(label in html.unescape(bars.layout.title.text).replace("<br>", " ") for label in labels)
    assert {s.fillcolor for s in bars.layout.shapes if s.type == "rect"} == {GREEN, AMBER, RED}
    assert not [s for s in culprit_bars(result).layout.shapes if s.type == "rect"]  # none: as before
    mine = write_report(result, tmp_path / "mine.html", bands=strict).read_text()
    assert "colour bands (set by the user)" in mine and all(html.escape(label) in mine for label in labels)
    default = html.unescape(write_report(result, tmp_path / "default.html").read_text())
    assert "the criterion's defaults" in default and "good: sqnr_db \u2265 40 dB" in default
    assert "300 dB" not in default


def test_the_box_sets_the_bands_once_for_every_tab_and_says_what_is_wrong(fp16):
    panel = GraphPanel(FP16_SAMPLE)
    state = panel.state
    errors = ErrorsPanel(state=state)
    state.result = compare(state.model, "ort", "ort:fp16")
    box = panel.bands_box
    assert (box.good.value, box.bad.value) == ("40", "30")
    assert "from the run's criterion" in html.unescape(box.note.value)
    panel.overlay.value = "error"
    before = list(panel.canvas.data["color"])
    assert box.apply(good="300", bad="250") == Bands("sqnr_db", 300.0, 250.0, "user")
    assert panel.canvas.data["color"] != before and set(panel.canvas.data["color"]) == {RED}
    assert (errors.bands_box.good.value, errors.bands_box.bad.value) == ("300", "250")  # the other tab's box
    assert set(errors.curve.data[0].marker.color) == {RED}
    chart = errors.culprit_chart.outputs[0]["data"]["application/vnd.plotly.v1+json"]  # the culprit chart too
    assert "bad: sqnr_db < 250 dB" in html.unescape(chart["layout"]["title"]["text"]).replace("<br>", " ")
    for good, bad, said in (("20", "30", "is below the bad one"), ("abc", "30", "is not a number"),
                            ("", "30", "is empty")):
        assert box.apply(good=good, bad=bad) is None
        assert said in box.note.value and "Traceback" not in box.note.value and "wb-error" in box.note.value
        assert state.bands == Bands("sqnr_db", 300.0, 250.0, "user")  # unchanged, and said so
        assert "still in use: sqnr_db: good \u2265 300 dB" in box.note.value
    box.reset()
    assert state.bands is None and set(panel.canvas.data["color"]) != {RED}


def test_the_thresholds_colour_the_engine_tabs_slowest_nodes(fp16):
    from workbench import engine_graph
    from workbench.engine_graphs.layers import layer_rows
    from workbench.plots.engine_graph import slowest_layers

    model, result = fp16
    rows = layer_rows(engine_graph(model, "ort", runs=2), result)
    compared = [r for r in rows if r["error"] is not None and r["latency_ms"] is not None]
    assert compared
    loose = Bands.parse("sqnr_db", "-30", "-40")  # every compared node of this run is good by these
    strict = Bands.parse("sqnr_db", "300", "250")
    colors = {b: slowest_layers(rows, bands=b).data[0].marker.color for b in (loose, strict)}
    shown = [r for r in rows if r["latency_ms"] is not None][:20]
    assert [c for c, r in zip(colors[loose], shown) if r["error"] is not None] == [GREEN] * len(compared)
    assert [c for c, r in zip(colors[strict], shown) if r["error"] is not None] == [RED] * len(compared)
    names = {html.unescape(t.name) for t in slowest_layers(rows, bands=strict).data if t.name}
    assert "bad: sqnr_db < 250 dB" in names


def test_back_to_one_graph_and_again_side_by_side_shows_the_newest_run(fp16):
    panel = GraphPanel(FP16_SAMPLE)
    state = panel.state
    state.result = compare(state.model, "ort", "ort:fp16")
    panel.mode.value = "side"
    side = panel.side_by_side
    first = side.match
    panel.mode.value = "single"
    assert panel.body.layout.display == "" and panel.side_box.layout.display == "none"
    run = state.begin_run("comparison", "next")
    state.end_run(run, "done", compare(state.model, "ort", "ort:fp16"))
    panel.mode.value = "side"
    assert side.match is not None and side.match is not first and run.tag in side.message.value
    assert side.left.canvas.data["ids"]
