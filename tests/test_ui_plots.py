"""Plots the panels and reports share: pure functions from results to plotly figures (and the graph view's data)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from conftest import REPO, SAMPLES, load_file

pytest.importorskip("plotly")

from workbench.plots.graph import (  # noqa: E402
    GraphView,
    auto_depth,
    error_ratio,
    graph_figure,
    graph_payload,
    items_at,
    reveal,
    scope_of,
)
from workbench.plots.graph_layout import layered_layout  # noqa: E402


def _synthetic(n: int):
    module = load_file(REPO / "benchmarks" / "bench_ui.py")
    from workbench import load_model

    return load_model(module.synthetic_model(n)).graph


@pytest.fixture(scope="module")
def clamp_result():
    from workbench.compare.api import compare

    return compare(SAMPLES / "fp16_clamp_constant.onnx", "ort", "ort:fp16")


@pytest.fixture(scope="module")
def calibration():
    from workbench.calibrate import calibrate

    return calibrate(SAMPLES / "int8_outlier.onnx", 16, eval_data=4)


def test_inventory_bar_counts_every_op():
    from workbench import inspect_model
    from workbench.plots.inventory import inventory_bar

    found = inspect_model(SAMPLES / "transformer_block.onnx", probe=False)
    fig = inventory_bar(found)
    counts = {y: x for trace in fig.data for y, x in zip(trace.y, trace.x)}
    assert counts == {r.op_type: r.count for r in found.inventory.ops}
    assert sum(counts.values()) == found.nodes
    assert inventory_bar(found.to_json()).data[0].y == fig.data[0].y  # the JSON works too
    assert fig.layout.xaxis.tickformat == ",d" and fig.layout.xaxis.title.text == "nodes"
    # issue 13.15: no "0.2 nodes" ticks
    small = inventory_bar({"ops": [{"op_type": "Relu", "domain": "ai.onnx", "count": 1}]})
    assert small.layout.xaxis.dtick == 1 and small.layout.xaxis.tickformat == ",d"


def test_calibration_histogram_marks_every_method(calibration):
    from workbench.calibrate.methods import METHODS
    from workbench.plots.calibration import calibration_histogram, rule_tag

    assert calibration.methods == list(METHODS)  # all six rules by default
    tensor = calibration.sensitivity[0].tensor
    fig = calibration_histogram(calibration, tensor)
    assert fig.layout.yaxis.type == "log"
    assert len(fig.layout.shapes) == len(calibration.methods)  # one vertical line per rule
    xs = sorted(s.x0 for s in fig.layout.shapes)
    assert xs == sorted(calibration.ranges[m][tensor] for m in calibration.methods)
    assert [t.name.split(" ")[0] for t in fig.data[:2]] == ["calibration", "evaluation"]
    # a legend entry per rule, named with its toolchain, with what it clips and the SQNR it leaves
    legend = {t.name.split(":")[0].removesuffix(", used"): t.name for t in fig.data[2:]}
    assert set(legend) == {rule_tag(m) for m in calibration.methods}
    assert "entropy (TensorRT)" in legend and "ort-entropy (ONNX Runtime)" in legend
    assert all("clips" in name and " dB" in name for name in legend.values())
    assert legend[rule_tag(calibration.method)].startswith(rule_tag(calibration.method) + ", used:")
    for m, by in calibration.bounds.items():  # the asymmetric ONNX Runtime rules give (lowest, highest)
        lo, hi = by[tensor]
        assert lo != -hi and f"[{lo:.4g}, {hi:.4g}]" in legend[rule_tag(m)]
    # short labels on the plot: every rule named once, at distinct heights, left to right
    notes = [a.text for a in fig.layout.annotations]
    assert sorted(n for text in notes for n in text.split(":")[0].replace(" (used)", "").split(" = ")) \
        == sorted(calibration.methods)
    assert sum("(used)" in text for text in notes) == 1
    ys = [(a.y, a.yshift) for a in fig.layout.annotations]
    assert len(set(ys)) == len(ys), "labels are staggered, never on one line"
    assert [a.x for a in fig.layout.annotations] == sorted(a.x for a in fig.layout.annotations)
    assert len(fig.data[0].x) <= 512, "bars are merged to stay light"
    assert sum(fig.data[0].y) == pytest.approx(1.0)
    plain = calibration_histogram(calibration, tensor, show_eval=False)
    assert [t.name.split(" ")[0] for t in plain.data[:1]] == ["calibration"]
    assert len(plain.data) == 1 + len(calibration.methods)  # no evaluation trace


def test_threshold_labels_merge_where_lines_coincide(calibration):
    from workbench.plots.calibration import calibration_histogram

    tensor = calibration.sensitivity[0].tensor
    report = copy.copy(calibration)
    report.ranges = {m: dict(r) for m, r in calibration.ranges.items()}
    report.ranges["mse"][tensor] = report.ranges["max"][tensor]  # two rules on one threshold: one label
    fig = calibration_histogram(report, tensor)
    assert len(fig.layout.shapes) == 6 and len(fig.layout.annotations) <= 5
    assert any("max" in a.text and "mse" in a.text and " = " in a.text for a in fig.layout.annotations)


def test_every_rule_has_its_own_color():
    from workbench.calibrate.methods import METHODS
    from workbench.plots.calibration import EVAL_COLOR, METHOD_COLORS

    colors = [METHOD_COLORS[m] for m in (*METHODS, "imported")]
    assert len(set(colors)) == len(colors) and EVAL_COLOR not in colors


def test_sensitivity_bars_one_trace_per_method(calibration):
    from workbench.plots.calibration import rule_tag, sensitivity_bars

    fig = sensitivity_bars(calibration, top=5)
    assert [t.name for t in fig.data] == [rule_tag(m) for m in calibration.methods]
    assert "entropy (TensorRT)" in fig.layout.title.text
    assert list(fig.data[0].y) == [e.tensor for e in calibration.sensitivity[:5]]


def test_scopes_collapse_and_reveal():
    assert scope_of("/a/b/Conv") == ("a", "b") and scope_of("Conv_3") == () and scope_of("/Relu") == ()
    view = GraphView.from_graph(_synthetic(1000))
    ids, members = items_at(view, 1)
    assert all(i.startswith("scope:/layers.") for i in ids)
    assert sorted(k for m in members for k in m) == list(range(len(view.names)))
    depth = auto_depth(view, 200)
    assert depth is not None and len(items_at(view, depth)[0]) <= 200
    assert auto_depth(view, 5000) is None
    flat = GraphView([f"n{i}" for i in range(300)], ["Relu"] * 300, [(i, i + 1) for i in range(299)],
                     [()] * 300, [""] * 300, [""] * 300)
    assert flat.max_depth == 0 and auto_depth(flat, 200) is None, "no scopes: nothing to collapse"
    node = view.names[500]
    opened = reveal(view, node, 1)
    assert node in items_at(view, 1, opened)[0]


def test_graph_payload_layout_and_overlays(clamp_result):
    from workbench import load_model

    view = GraphView.from_graph(load_model(SAMPLES / "fp16_clamp_constant.onnx").graph)
    p = graph_payload(view, overlay="introduced", result=clamp_result)
    assert p["ids"] == view.names and len(p["x"]) == len(p["y"]) == len(p["color"]) == 7
    edges = list(zip(p["edges"][::2], p["edges"][1::2]))
    assert edges and all(p["y"][a] < p["y"][b] for a, b in edges)
    colors = dict(zip(p["ids"], p["color"]))
    assert colors["/bn_big_var/BatchNormalization"] == "#b71c1c"
    assert "culprit #1" in p["tips"][p["ids"].index("/bn_big_var/BatchNormalization")]
    diverged = graph_payload(view, overlay="diverged", result=clamp_result)
    assert dict(zip(diverged["ids"], diverged["color"]))["/bn_big_var/BatchNormalization"] == "#fb8c00"
    assert graph_payload(view, overlay="diverged")["overlay"] == "op_type", "no result: falls back"
    precision = graph_payload(view, overlay="precision", result=clamp_result)
    assert ["fp16", "#42a5f5"] in precision["legend"]
    assert graph_figure(view, overlay="error", result=clamp_result).data


def test_error_ratio_is_relative_to_the_tolerance(clamp_result):
    crit = clamp_result.criterion  # sqnr_db < 30
    assert error_ratio({"sqnr_db": 30.0}, crit) == 0
    assert error_ratio({"sqnr_db": 60.0}, crit) == pytest.approx(-3)
    assert error_ratio({"sqnr_db": math.inf}, crit) == -math.inf
    from workbench.compare.criterion import Criterion

    assert error_ratio({"max_abs": 1e-5}, Criterion("max_abs", 1e-3)) == pytest.approx(-2)
    assert error_ratio({"cosine": 0.99}, Criterion("cosine", 0.999)) == pytest.approx(1)


def test_layered_layout_is_legible():
    """5,000 nodes laid out in layers, none overlapping (how fast: benchmarks/bench_ui.py's python_layout_s)."""
    graph = _synthetic(5000)
    view = GraphView.from_graph(graph)
    x, layer = layered_layout(len(view.names), view.edges)
    assert all(layer[u] < layer[v] for u, v in view.edges)
    rows: dict[int, list[float]] = {}
    for xi, li in zip(x, layer):
        rows.setdefault(li, []).append(xi)
    assert all(b - a >= 1 - 1e-9 for xs in rows.values() for a, b in zip(sorted(xs), sorted(xs)[1:]))


# --- comparison plots: precision floor, output-led verdict, inf/NaN, JSON compliance ----------------------------

def assert_json_finite(fig) -> None:
    """No NaN or infinity anywhere in ``fig`` (JupyterLab: "Out of range float values are not JSON compliant"):
    checked on plotly's own dict (before its encoder could quietly turn them into null) and on its JSON."""
    def walk(o, where):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{where}.{k}")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{where}[{i}]")
        elif isinstance(o, np.ndarray):
            assert o.dtype.kind not in "fc" or np.isfinite(o).all(), f"non-finite values in {where}"
            if o.dtype == object:
                walk(o.tolist(), where)
        elif isinstance(o, (float, np.floating)):
            assert math.isfinite(o), f"{o} at {where}"

    walk(fig.to_plotly_json(), "figure")

    def refuse(token):
        raise AssertionError(f"{token} in the figure JSON")

    json.loads(fig.to_json(), parse_constant=refuse)


def at_floor_result(folder):
    """x * 0.5 -> Relu on inputs ~1e-7, run with FP16 arithmetic (ref:fp16): about half the values sit below FP16's
    smallest subnormal and flush to zero, so the output fails sqnr_db<30 only because FP16 cannot hold them: it is
    at its precision floor (not diverged), and fixing the Mul gains almost nothing (a harmless culprit)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from workbench.compare.api import compare

    w = numpy_helper.from_array(np.full((1, 64), 0.5, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "W"], ["h"], name="/scale/Mul"),
         helper.make_node("Relu", ["h"], ["y"], name="/act/Relu")], "tiny_values",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tiny_values.onnx"
    onnx.save(model, path)
    feeds = {"x": (np.random.default_rng(0).standard_normal((1, 64)) * 1e-7).astype(np.float32)}
    return compare(path, "ort", "ref:fp16", feeds=feeds)


@pytest.fixture(scope="module")
def dips_result():
    from workbench.compare.api import compare

    return compare(SAMPLES / "transformer_block.onnx", "ort", "ort:fp16",
                   feeds=SAMPLES / "transformer_block_inputs.npz")


@pytest.fixture(scope="module")
def overflow_result():
    from workbench.compare.api import compare

    return compare(SAMPLES / "cnn_fp16_overflow.onnx", "ref", "ref:fp16")


@pytest.fixture(scope="module")
def floor_result(tmp_path_factory):
    return at_floor_result(tmp_path_factory.mktemp("floor"))


def _trace(fig, name):
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"{name!r} not in {[t.name for t in fig.data]}"
    return found[0]


def test_error_curve_draws_the_floor_band_outputs_and_the_first_divergent(clamp_result):
    from workbench.compare.floor import FLOOR_MARGIN_DB
    from workbench.plots.compare import layer_error_curve

    result = clamp_result
    assert result.diverged and result.precision["candidate"]["precision"] == "fp16"
    fig = layer_error_curve(result)
    assert [t.name for t in fig.data] == ["sqnr_db", "FP16 floor band edge", "FP16 floor (reference held in FP16)",
                                         "diverged", "graph output", "first divergent"]
    tensors = sorted(result.tensors, key=lambda t: t.topo_index)
    floor = _trace(fig, "FP16 floor (reference held in FP16)")
    assert floor.fill == "tonexty" and floor.customdata is not None  # shaded towards the band edge; clickable
    assert list(floor.y) == pytest.approx([t.floor["sqnr_db"] for t in tensors])
    assert list(fig.data[1].y) == pytest.approx([t.floor["sqnr_db"] - FLOOR_MARGIN_DB for t in tensors])
    assert fig.data[1].showlegend is False
    # the floor sits ~90 dB above the clamped layers: a defect, far beyond what FP16 storage costs
    bn = result.tensor("/bn_big_var/BatchNormalization_output_0")
    assert bn.floor["sqnr_db"] > 70 > 0 > bn.metrics["sqnr_db"] and bn.diverged and not bn.at_floor
    assert list(_trace(fig, "graph output").x) == [result.tensor("logits").topo_index]
    assert list(_trace(fig, "first divergent").x) == [result.first_divergent.topo_index]
    assert f"FP16 floor {bn.floor['sqnr_db']:.4g} dB" in fig.data[0].customdata[bn.topo_index][5]
    assert "DIVERGED" in fig.data[0].customdata[bn.topo_index][6]
    assert fig.layout.title.text.endswith("(fp32 vs fp16): DIVERGED")
    assert_json_finite(fig)


def test_error_curve_of_a_passing_run_marks_internal_dips_but_no_star(dips_result):
    from workbench.plots.compare import layer_error_curve, metric_histogram

    result = dips_result
    assert not result.diverged and result.first_divergent is None
    dips = [t.tensor for t in result.internal_dips]
    assert "/block/ln2/Pow_output_0" in dips
    fig = layer_error_curve(result)
    names = [t.name for t in fig.data]
    assert "first divergent" not in names and "diverged" not in names
    assert not any("first divergent" in (a.text or "") for a in fig.layout.annotations)
    dip = _trace(fig, "internal dip (outputs pass)")
    assert sorted(dip.x) == sorted(result.tensor(t).topo_index for t in dips)
    assert list(_trace(fig, "graph output").x) == [result.tensor("y").topo_index]
    assert result.tensor("/block/ln2/Pow_output_0").topo_index in list(_trace(fig, "inf/NaN mismatch").x)
    assert fig.layout.title.text.endswith(": ok")
    hist = metric_histogram(result)
    assert {t.name: int(sum(t.y)) for t in hist.data} == {"within tolerance": len(result.tensors) - len(dips),
                                                          "internal dip (outputs pass)": len(dips)}
    for f in (fig, hist):
        assert_json_finite(f)


def test_inf_nan_layers_are_drawn_at_a_cap_not_as_gaps(overflow_result):
    from workbench.plots.compare import culprit_bars, layer_error_curve, metric_histogram

    result = overflow_result
    logits = result.tensor("logits")
    assert result.diverged and logits.metrics["nonfinite_mismatch"] > 0 and logits.metrics.get("sqnr_db") is None
    fig = layer_error_curve(result)
    line = fig.data[0]
    assert all(v is not None and math.isfinite(v) for v in line.y), "no gap in the curve"
    finite = [t for t in result.tensors if isinstance(t.metrics.get("sqnr_db"), float)]
    capped = [i for i, row in enumerate(line.customdata) if "drawn at the cap" in row[3]]
    assert capped and len(capped) == len(result.tensors) - len(finite)
    cap = line.y[capped[0]]
    assert all(line.y[i] == cap for i in capped)
    assert cap < min(t.metrics["sqnr_db"] for t in finite) and cap < result.criterion.threshold
    assert logits.topo_index in list(_trace(fig, "inf/NaN mismatch").x)
    assert any("inf/NaN values drawn at" in (a.text or "") for a in fig.layout.annotations)
    unbinned = len(result.tensors) - len(finite)
    assert f"{unbinned} with an inf/NaN sqnr_db not binned" in metric_histogram(result).layout.title.text
    for m in ("sqnr_db", "cosine", "max_abs", "norm_mean_abs"):
        curve = layer_error_curve(result, m)
        assert all(v is not None for v in curve.data[0].y), m
        for f in (curve, metric_histogram(result, m), culprit_bars(result, m)):
            assert_json_finite(f)
    log = layer_error_curve(result, "max_abs")  # error metrics: inf/NaN drawn above the worst finite error
    assert log.layout.yaxis.type == "log"
    ys = [y for y, row in zip(log.data[0].y, log.data[0].customdata) if "drawn at the cap" not in row[3]]
    assert min(y for y, row in zip(log.data[0].y, log.data[0].customdata) if "drawn at the cap" in row[3]) > max(ys)


def test_nonfinite_metrics_get_their_own_marker_and_finite_json(overflow_result):
    """Issue 13.8: layers whose metric is inf/NaN are named by a marker of their own, and the figure's JSON holds
    only finite numbers."""
    from workbench.plots.compare import layer_error_curve

    result = overflow_result
    fig = layer_error_curve(result)
    bad = [t.topo_index for t in result.tensors if not isinstance(t.metrics.get("sqnr_db"), float)
           or not math.isfinite(t.metrics["sqnr_db"])]
    marked = _trace(fig, "sqnr_db inf/NaN (drawn at the cap)")
    assert bad and sorted(marked.x) == sorted(bad)
    assert all("drawn at the cap" in row[3] for row in marked.customdata)
    assert_json_finite(fig)


def test_only_exact_matches_sit_on_the_exact_line(clamp_result):
    """Issue 13.9: a diverged tensor whose SQNR is +inf (finite values equal, inf/NaN where the reference has none)
    is drawn with the bad values, not on the "exact matches drawn at 200 dB" line; the star stays below tolerance."""
    from workbench.plots.compare import SQNR_EXACT_DB, layer_error_curve

    result = copy.copy(clamp_result)
    result.tensors = [copy.copy(t) for t in clamp_result.tensors]  # the module fixture stays as it was
    tensors = sorted(result.tensors, key=lambda t: t.topo_index)
    first = result.first_divergent
    exact = next(t for t in tensors if not t.diverged)
    exact.metrics = {**exact.metrics, "sqnr_db": math.inf, "nonfinite_mismatch": 0}
    first.metrics = {**first.metrics, "sqnr_db": math.inf, "nonfinite_mismatch": 3}
    assert first.diverged and result.first_divergent.tensor == first.tensor
    fig = layer_error_curve(result)
    y = dict(zip(fig.data[0].x, fig.data[0].y))
    assert y[exact.topo_index] == SQNR_EXACT_DB
    assert y[first.topo_index] < result.criterion.threshold, "a diverged tensor is never drawn as exact"
    assert [v for v in y.values() if v == SQNR_EXACT_DB] == [SQNR_EXACT_DB]
    star = _trace(fig, "first divergent")
    assert list(star.y) == [y[first.topo_index]] and star.y[0] < result.criterion.threshold
    assert first.topo_index in list(_trace(fig, "sqnr_db inf/NaN (drawn at the cap)").x)
    assert any("exact matches drawn at" in (a.text or "") for a in fig.layout.annotations)
    assert_json_finite(fig)


def test_error_curve_marks_outputs_at_their_floor(floor_result):
    from workbench.plots.compare import layer_error_curve

    result = floor_result
    y = result.tensor("y")
    assert not result.diverged and y.at_floor and not y.diverged and y.floor["share_flushed"] > 0
    assert "1 at the candidate format's floor" in result.verdict()["reason"]
    fig = layer_error_curve(result)
    at_floor = _trace(fig, "at its FP16 floor (not diverged)")
    assert y.topo_index in list(at_floor.x)
    assert at_floor.marker.symbol != _trace(fig, "graph output").marker.symbol
    assert "first divergent" not in [t.name for t in fig.data]
    assert "at its FP16 floor" in fig.data[0].customdata[y.topo_index][6]
    assert_json_finite(fig)


def test_culprit_bars_label_harmless_culprits_and_show_the_gain(clamp_result, floor_result):
    from workbench.plots.compare import BAD_COLOR, HARMLESS_COLOR, culprit_bars

    harmful = clamp_result.culprits[0]
    assert not harmful.harmless and harmful.impact["best_gain_db"] > 50
    bars = culprit_bars(clamp_result)
    assert not bars.data[0].y[0].endswith("(harmless)") and bars.data[0].marker.color[0] == BAD_COLOR
    assert bars.data[0].customdata[0][2].startswith("fixing it gains 99.")
    floor = _trace(bars, "its output's precision floor")
    assert floor.x[0] == pytest.approx(harmful.floor["sqnr_db"])
    harmless = [c for c in floor_result.culprits if c.harmless]
    assert harmless, [c.impact for c in floor_result.culprits]
    bars = culprit_bars(floor_result)
    k = floor_result.culprits.index(harmless[0])
    assert bars.data[0].y[k].endswith("(harmless)") and bars.data[0].marker.color[k] == HARMLESS_COLOR
    assert "HARMLESS: fixing it gains" in bars.data[0].customdata[k][2]
    assert "harmless" in bars.layout.title.text
    for fig in (bars, culprit_bars(clamp_result)):
        assert_json_finite(fig)
