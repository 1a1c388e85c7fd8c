"""Plots the panels and reports share: pure functions from results to plotly figures (and the graph view's data)."""

from __future__ import annotations

import math
import time

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


def test_calibration_histogram_marks_every_method(calibration):
    from workbench.plots.calibration import calibration_histogram

    tensor = calibration.sensitivity[0].tensor
    fig = calibration_histogram(calibration, tensor)
    assert fig.layout.yaxis.type == "log"
    assert len(fig.layout.shapes) == len(calibration.methods)  # one vertical line per method
    xs = sorted(s.x0 for s in fig.layout.shapes)
    assert xs == sorted(calibration.ranges[m][tensor] for m in calibration.methods)
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert all(m in notes for m in calibration.methods) and "clips" in notes and "(used)" in notes
    assert [t.name.split(" ")[0] for t in fig.data] == ["calibration", "evaluation"]
    assert len(fig.data[0].x) <= 512, "bars are merged to stay light"
    assert sum(fig.data[0].y) == pytest.approx(1.0)
    assert len(calibration_histogram(calibration, tensor, show_eval=False).data) == 1


def test_sensitivity_bars_one_trace_per_method(calibration):
    from workbench.plots.calibration import sensitivity_bars

    fig = sensitivity_bars(calibration, top=5)
    assert [t.name for t in fig.data] == calibration.methods
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


def test_layered_layout_is_fast_and_legible():
    graph = _synthetic(5000)
    view = GraphView.from_graph(graph)
    t0 = time.perf_counter()
    x, layer = layered_layout(len(view.names), view.edges)
    assert time.perf_counter() - t0 < 2.0
    assert all(layer[u] < layer[v] for u, v in view.edges)
    rows: dict[int, list[float]] = {}
    for xi, li in zip(x, layer):
        rows.setdefault(li, []).append(xi)
    assert all(b - a >= 1 - 1e-9 for xs in rows.values() for a, b in zip(sorted(xs), sorted(xs)[1:]))
