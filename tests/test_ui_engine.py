"""Issue 15 item 3 without a browser: the graph view's engine overlays (execution provider, runtime precision,
latency) and fused-group boxes from a real ONNX Runtime engine graph of a sample model, set on the shared state by
the Engine tab's Inspect; and Compare's provider-fallback warning, on evidence only.

This CPU-only machine cannot make ONNX Runtime fall back for real (its one provider is the CPU's), so the fallback
tests take a real ORT engine graph and a real comparison, saved as JSON and edited to read as an ort-cuda run
that placed one node on the CPU (the file a GPU machine would write), then loaded back."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLES

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.engine_graphs.api import engine_graph  # noqa: E402
from workbench.engine_graphs.result import EngineGraph  # noqa: E402
from workbench.plots.graph_engine import (  # noqa: E402
    FOLDED,
    LATENCY_BANDS,
    NO_ENGINE,
    NOT_EXECUTED,
    PROVIDER_COLORS,
    RUNTIME_PRECISION_COLORS,
)
from workbench.ui import ComparePanel, EnginePanel, GraphPanel, Workbench, WorkbenchState  # noqa: E402

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
FUSED = ["/conv/Conv", "/bn_big_var/BatchNormalization", "/relu/Relu"]  # ORT's NCHWc Conv fuses BN and Relu
FELL = "/head/fc/Gemm"


@pytest.fixture(scope="module")
def ort_graph() -> EngineGraph:
    return engine_graph(CLAMP, "ort", runs=3)


def _colors(panel: GraphPanel) -> dict[str, str]:
    return dict(zip(panel.canvas.data["ids"], panel.canvas.data["color"]))


def test_engine_overlays_colour_each_node_from_the_inspected_ort_graph():
    state = WorkbenchState.of(CLAMP)
    graph_panel = GraphPanel(state=state)
    # no engine graph yet: each engine overlay says where to get one, and draws the operator types
    for overlay in ("provider", "runtime_precision", "latency"):
        graph_panel.overlay.value = overlay
        assert NO_ENGINE in graph_panel.overlay_note.value and "inspect an engine in the Engine tab first" in \
            graph_panel.overlay_note.value
        assert graph_panel.canvas.data["overlay"] == "op_type" and graph_panel.canvas.data["groups"] == []
    assert not graph_panel.fused.value

    engine = EnginePanel(state=state)
    engine.engine.value, engine.runs.value = "ort", 3
    engine.inspect()
    assert engine.wait(120)
    graph = state.engine_graph
    assert graph is engine.graph and graph.engine == "ort" and graph.runs == 3, engine.message.value

    # provider: every executed ONNX node on ORT's CPU provider, in the first (requested) colour
    graph_panel.overlay.value = "provider"
    data = graph_panel.canvas.data
    assert data["overlay"] == "provider" and "engine graph of ort" in graph_panel.overlay_note.value
    assert data["legend"][0] == ["CPUExecutionProvider", PROVIDER_COLORS[0]]
    colors = _colors(graph_panel)
    index = {o: n for n in graph.compute_nodes for o in n.onnx_nodes}
    for name, color in colors.items():
        if name in index:
            assert index[name].provider == "CPUExecutionProvider" and color == PROVIDER_COLORS[0], name
        else:
            assert color == (FOLDED[0] if name in graph.folded else NOT_EXECUTED[0]), name
    assert all(colors[n] == PROVIDER_COLORS[0] for n in FUSED)

    # fused groups: ticked by the new engine graph; one box around the NCHWc Conv's three ONNX nodes
    assert graph_panel.fused.value
    boxes = data["groups"]
    fused = next(b for b in boxes if {data["ids"][k] for k in b["items"]} == set(FUSED))
    assert "com.microsoft.nchwc.Conv" in fused["label"] and "3 ONNX nodes" in fused["tip"]
    assert len(boxes) == sum(1 for n in graph.fused_nodes if len(n.onnx_nodes) > 1)
    graph_panel.fused.value = False
    assert graph_panel.canvas.data["groups"] == []
    graph_panel.fused.value = True

    # runtime precision: ORT's profiler says f32 for every kernel of this FP32 model
    graph_panel.overlay.value = "runtime_precision"
    assert graph_panel.canvas.data["legend"][0] == ["f32", RUNTIME_PRECISION_COLORS["f32"]]
    assert {_colors(graph_panel)[n] for n in index if n in _colors(graph_panel)} == {RUNTIME_PRECISION_COLORS["f32"]}

    # latency: each node in the band of its executed node's share of a run; a fused group's nodes share one
    graph_panel.overlay.value = "latency"
    colors = _colors(graph_panel)
    total = graph.end_to_end_mean_ms or graph.end_to_end_ms
    for name in colors:
        if name in index:
            share = index[name].latency_mean_ms / total
            assert colors[name] == next(c for upper, c, _ in LATENCY_BANDS if share <= upper), name
    assert len({colors[n] for n in FUSED}) == 1
    assert [label for label, _ in graph_panel.canvas.data["legend"][:len(LATENCY_BANDS)]] == \
        [b[2] for b in LATENCY_BANDS]

    # tooltips and the selected node's details name the executed node
    tip = graph_panel.canvas.data["tips"][graph_panel.canvas.data["ids"].index(FUSED[1])]
    assert "fuses 3 ONNX nodes" in tip and "CPUExecutionProvider" in tip and " ms (" in tip
    state.selected = FUSED[1]
    assert "com.microsoft.nchwc.Conv" in graph_panel.info.value


def test_engine_overlays_of_another_model_say_so_and_a_new_model_clears_them(ort_graph):
    wb = Workbench(SAMPLES / "healthy_cnn.onnx")
    graph_panel, engine = wb.graph_panel, wb.engine_panel
    wb.state.engine_graph = ort_graph  # inspected on fp16_clamp_constant
    assert engine.graph is ort_graph, "the Engine tab shows the state's engine graph"
    graph_panel.overlay.value = "provider"
    assert "not of this model" in graph_panel.overlay_note.value and graph_panel.canvas.data["overlay"] == "op_type"
    wb.state.load(CLAMP)
    assert wb.state.engine_graph is None and engine.graph is None and "model changed" in engine.message.value
    assert NO_ENGINE in graph_panel.overlay_note.value


def test_the_static_graph_figure_boxes_fused_groups(ort_graph):
    from workbench.model.load import load_model
    from workbench.plots.graph import GraphView, graph_figure, graph_payload

    view = GraphView.from_graph(load_model(CLAMP).graph)
    fig = graph_figure(view, overlay="provider", engine=ort_graph, groups=True)
    assert len(fig.layout.shapes) == 1 and any(t.name == "fused group (1)" for t in fig.data)
    assert graph_payload(view, overlay="latency")["overlay"] == "op_type", "no engine graph: falls back"


# --- Compare's fallback warning --------------------------------------------------------------------------------
def _as_cuda(graph: EngineGraph, tmp_path, engine: str = "ort-cuda") -> EngineGraph:
    """The real ORT graph, saved and edited to read as an ort-cuda run that put FELL on the CPU provider."""
    path = graph.save_json(tmp_path / "engine_graph.json")
    doc = json.loads(path.read_text())
    doc["engine"] = engine
    doc["details"].update(requested_provider="CUDAExecutionProvider",
                          session_providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    for node in doc["nodes"]:
        node["provider"] = "CPUExecutionProvider" if FELL in node["onnx_nodes"] and node["role"] == "compute" \
            else "CUDAExecutionProvider"
    path.write_text(json.dumps(doc))
    return EngineGraph.load_json(path)


@pytest.fixture(scope="module")
def cuda_result(tmp_path_factory):
    """A real comparison of the sample model, saved and edited to read as ort against ort-cuda."""
    from workbench.compare.api import compare
    from workbench.compare.result import CompareResult

    result = compare(CLAMP, "ort", "ort", culprits=False)
    path = result.save_json(tmp_path_factory.mktemp("cuda") / "result.json")
    doc = json.loads(path.read_text())
    doc["candidate"] = "ort-cuda"
    doc["engines"]["candidate"] = {**doc["engines"]["candidate"], "engine": "ort-cuda", "device": "cuda:0",
                                   "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    path.write_text(json.dumps(doc))
    return CompareResult.load_json(path)


def test_compare_warns_when_the_engine_graph_shows_a_node_fell_back(ort_graph, cuda_result, tmp_path):
    state = WorkbenchState.of(CLAMP)
    panel = ComparePanel(state=state)
    state.result = cuda_result
    note = panel.provider_note.value
    # the session registered the CPU provider too: a hint to inspect, not a warning (no node is known to fall back)
    assert "wb-info" in note and "Inspect ort-cuda in the Engine tab" in note and "wb-warn" not in note

    state.engine_graph = _as_cuda(ort_graph, tmp_path)
    note = panel.provider_note.value
    assert "wb-warn" in note and "candidate ort-cuda: 1 node(s) fell back from CUDAExecutionProvider to " \
        "CPUExecutionProvider" in note and "CPUExecutionProvider)" in note
    assert "reference" not in note, "the reference ran on the CPU provider it asked for"

    # the graph view shows the same node in the fallback colour
    graph_panel = GraphPanel(state=state)
    graph_panel.overlay.value = "provider"
    legend = dict(map(tuple, graph_panel.canvas.data["legend"]))
    assert "CPUExecutionProvider (fell back)" in legend and "CUDAExecutionProvider" in legend
    assert _colors(graph_panel)[FELL] == legend["CPUExecutionProvider (fell back)"] != legend["CUDAExecutionProvider"]


def test_compare_warns_only_on_evidence(ort_graph, cuda_result, tmp_path):
    state = WorkbenchState.of(CLAMP)
    panel = ComparePanel(state=state)
    state.engine_graph = ort_graph  # a real CPU run: every node on the provider it asked for
    state.result = cuda_result
    assert "wb-warn" not in panel.provider_note.value
    # an engine graph of another variant, or of another model, is no evidence about this comparison
    state.engine_graph = _as_cuda(ort_graph, tmp_path, engine="ort-cuda:fp16")
    assert "wb-warn" not in panel.provider_note.value
    other = _as_cuda(ort_graph, tmp_path)
    other.model["sha256"] = "0" * 64
    state.engine_graph = other
    assert "wb-warn" not in panel.provider_note.value
    # a session whose requested provider was dropped altogether (the engine description says so)
    cuda_result.engines["candidate"]["providers"] = ["CPUExecutionProvider"]
    state.result = None
    state.result = cuda_result
    assert "wb-warn" in panel.provider_note.value and "every node fell back" in panel.provider_note.value
    # plain CPU on both sides, no engine graph: nothing to say
    state.engine_graph = None
    cuda_result.engines["candidate"] = dict(cuda_result.engines["reference"])
    cuda_result.candidate = "ort"
    state.result = None
    state.result = cuda_result
    assert panel.provider_note.value == ""
