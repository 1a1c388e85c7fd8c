"""Issue 22 defect 9: the Engine tab's error colours are absolute (the margin to the comparison's criterion: red
when a node's error fails it, green well within), and each node's share is its ms over the run time shown, computed
by the core (:meth:`EngineGraph.share_of`) and shown as such by the panel."""

from __future__ import annotations

import html
import math

import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")

from workbench.compare.api import compare  # noqa: E402
from workbench.compare.criterion import Criterion  # noqa: E402
from workbench.engine_graphs.api import engine_graph  # noqa: E402
from workbench.engine_graphs.layers import layer_rows, margin_db  # noqa: E402
from workbench.plots.engine_graph import MARGIN_RANGE, slowest_layers  # noqa: E402
from workbench.ui import EnginePanel, WorkbenchState  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"


@pytest.fixture(scope="module")
def graph():
    return engine_graph(CLAMP, "ort", runs=3)


@pytest.fixture(scope="module")
def result():
    return compare(CLAMP, "ort", "ort:fp16", culprits=False)


def test_margin_is_absolute_and_tied_to_the_threshold():
    assert margin_db(-19.5, "sqnr_db", 30.0) == pytest.approx(-49.5)
    assert margin_db(113.0, "sqnr_db", 30.0) == pytest.approx(83.0)
    assert margin_db(30.0, "sqnr_db", 30.0) == 0.0 and margin_db(math.inf, "sqnr_db", 30.0) == math.inf
    assert margin_db(1e-4, "max_abs", 1e-3) == pytest.approx(20.0)  # ten times under an error threshold
    assert margin_db(1e-2, "max_abs", 1e-3) == pytest.approx(-20.0)
    assert margin_db(0.9999, "cosine", 0.999) == pytest.approx(10.0)
    assert margin_db(0.0, "max_abs", 1e-3) == math.inf and margin_db(None, "sqnr_db", 30.0) is None


def _colours(graph, result) -> list[float]:
    return list(slowest_layers(layer_rows(graph, result), top=len(graph.nodes)).data[0].marker.color)


@pytest.mark.parametrize("name, failing", [("fp16_clamp_constant", True), ("healthy_cnn", False)])
def test_error_colours_are_absolute_red_when_failing_green_well_within(name, failing):
    path = SAMPLES / f"{name}.onnx"
    graph, result = engine_graph(path, "ort", runs=1), compare(path, "ort", "ort:fp16", culprits=False)
    rows = [r for r in layer_rows(graph, result) if r["latency_ms"] is not None]
    crit = result.criterion
    marker = slowest_layers(rows, top=len(rows)).data[0].marker
    assert (marker.cmin, marker.cmax) == MARGIN_RANGE and not marker.reversescale
    title = marker.colorbar.title.text
    assert crit.metric in title and f"threshold {crit.threshold:g}" in title and "red: fails" in title
    colours = list(marker.color)
    judged = [(r, c) for r, c in zip(rows, colours) if r["error"] is not None]
    assert judged and all(math.isnan(c) for r, c in zip(rows, colours) if r["error"] is None)
    for r, c in judged:
        assert MARGIN_RANGE[0] <= c <= MARGIN_RANGE[1]
        fails = crit.badness({crit.metric: r["error"]}) > crit.badness({crit.metric: crit.threshold})
        assert fails == failing and (c < 0) == fails, (r["name"], r["error"], c)  # under the threshold: red
        if not failing:  # ~65 dB against 30: well within, at the green end
            assert c >= 0.75 * MARGIN_RANGE[1], (r["name"], r["error"], c)
    # the same errors against a stricter criterion are redder: the scale does not stretch to the values shown
    if not failing:
        result.criterion = Criterion(crit.metric, crit.threshold + 30)
        try:
            stricter = _colours(graph, result)
        finally:
            result.criterion = crit
        pairs = [(a, b) for a, b in zip(colours, stricter) if not math.isnan(a)]
        assert pairs and all(b < a for a, b in pairs)


def test_share_is_the_node_ms_over_the_run_time_shown(graph, result):
    assert graph.end_to_end_ms
    rows = layer_rows(graph, result)
    for r in rows:
        if r["latency_ms"] is None:
            assert r["share"] is None
            continue
        assert r["run_ms"] == graph.end_to_end_ms
        assert r["share"] == pytest.approx(r["latency_ms"] / graph.end_to_end_ms, rel=1e-12)
    panel = EnginePanel(state=WorkbenchState.of(CLAMP))
    panel.state.result = result
    panel.show(graph)
    assert f"{graph.end_to_end_ms:.3f} ms median" in panel.summary.value
    cells = panel.table.value
    for r in rows[:panel.top]:
        if r["latency_ms"] is not None:
            assert html.escape(f"{r['latency_ms'] / graph.end_to_end_ms:.1%}") in cells, r["name"]
