"""Engine graphs (issue 15): what each engine fused, where each node ran, in what precision and how long it took;
fusion-aware comparison; engine graph diffs; TensorRT records. Real engines (ONNX Runtime and OpenVINO on CPU) on
real PP-OCR models; TensorRT from hand-written records of its documented formats (tests/data/trt/README.md), and
its live path only where tensorrt imports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.cli import main
from workbench.engine_graphs.api import engine_graph
from workbench.engine_graphs.granularity import observe
from workbench.engine_graphs.onnx_side import OnnxGraph
from workbench.engine_graphs.result import SCHEMA, EngineGraph
from workbench.engine_graphs.tensorrt_graph import from_records
from workbench.errors import EngineUnavailableError, SpecError, WorkbenchError

TRT = Path(__file__).parent / "data" / "trt"
PPOCR = ("ppocr-det", "ppocr-rec", "ppocr-cls", "ppocrv3-det", "ppocrv3-rec")
SHAPES = {"det": [1, 3, 320, 320], "rec": [1, 3, 48, 320], "cls": [1, 3, 48, 192]}


def trt_model() -> onnx.ModelProto:
    """The model tests/data/trt/ describes: Conv, Relu, Conv, residual Add, GlobalAveragePool, Flatten, Gemm,
    Softmax, named as torch.onnx names them."""
    rng = np.random.default_rng(0)
    w = {k: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k) for k, s in
         (("w1", (8, 3, 3, 3)), ("w2", (8, 8, 3, 3)), ("wf", (4, 8)), ("bf", (4,)))}
    t = "{}_output_0".format
    nodes = [
        helper.make_node("Conv", ["x", "w1"], [t("/conv1/Conv")], "/conv1/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [t("/conv1/Conv")], [t("/relu1/Relu")], "/relu1/Relu"),
        helper.make_node("Conv", [t("/relu1/Relu"), "w2"], [t("/conv2/Conv")], "/conv2/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", [t("/conv2/Conv"), t("/relu1/Relu")], [t("/add/Add")], "/add/Add"),
        helper.make_node("GlobalAveragePool", [t("/add/Add")], [t("/pool/GlobalAveragePool")],
                         "/pool/GlobalAveragePool"),
        helper.make_node("Flatten", [t("/pool/GlobalAveragePool")], [t("/flatten/Flatten")], "/flatten/Flatten"),
        helper.make_node("Gemm", [t("/flatten/Flatten"), "wf", "bf"], [t("/fc/Gemm")], "/fc/Gemm", transB=1),
        helper.make_node("Softmax", [t("/fc/Gemm")], ["y"], "/softmax/Softmax"),
    ]
    graph = helper.make_graph(nodes, "trt-tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], list(w.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def trt_path(tmp_path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(trt_model(), path)
    return path


def check_covers(graph: EngineGraph, model) -> None:
    """Every executed node maps to >= 1 ONNX node; every ONNX compute node is run or folded by the engine."""
    og = OnnxGraph.build(model)
    assert [n.name for n in graph.nodes if not n.onnx_nodes] == []
    assert set(og.nodes) - graph.covered() == set()
    assert graph.unmapped == []
    assert {o for n in graph.nodes for o in n.onnx_nodes} <= set(og.nodes)


# --- TensorRT records (hand-written from the documented formats) ----------------------------------------------------
def test_trt10_layer_info_maps_metadata_myelin_ranges_and_reformats(trt_path):
    graph = from_records(trt_path, TRT / "layers_trt10.json", TRT / "profile.json", TRT / "times.json")
    by = {n.name: n for n in graph.nodes}
    conv1 = by["/conv1/Conv + /relu1/Relu"]
    assert (conv1.onnx_nodes, conv1.mapped_by, conv1.precision) == (["/conv1/Conv", "/relu1/Relu"], "metadata", "f16")
    assert by["/conv2/Conv + /add/Add"].onnx_nodes == ["/conv2/Conv", "/add/Add"]
    myelin = by["{ForeignNode[/pool/GlobalAveragePool.../softmax/Softmax]}"]
    assert myelin.mapped_by == "range" and myelin.kind == "Myelin" and myelin.precision == "f32"
    assert myelin.onnx_nodes == ["/pool/GlobalAveragePool", "/flatten/Flatten", "/fc/Gemm", "/softmax/Softmax"]
    reformat = by["Reformatting CopyNode for Input Tensor 0 to /conv1/Conv + /relu1/Relu"]
    assert reformat.role == "layout" and reformat.onnx_nodes == ["/conv1/Conv"]
    check_covers(graph, trt_model())
    # latency: the profile's medians and means; end to end: computeMs of the times file
    assert conv1.latency_ms == pytest.approx(0.0195) and conv1.latency_mean_ms == pytest.approx(0.02)
    assert graph.end_to_end_ms == pytest.approx(0.082) and graph.runs == 200
    assert graph.latency_sum_ms == pytest.approx(0.080)
    assert graph.latency_share == pytest.approx(0.080 / 0.0826) and abs(graph.latency_share - 1) < 0.15
    assert conv1.outputs == ["/relu1/Relu_output_0"] and conv1.provider == "TensorRT"
    assert graph.observable_tensors() == {"/relu1/Relu_output_0", "/add/Add_output_0", "y"}


def test_trt11_layer_info_maps_layers_by_their_names(trt_path):
    graph = from_records(trt_path, TRT / "layers_trt11.json")
    by = {n.name: n for n in graph.nodes}
    assert by["PWN(/add/Add)"].onnx_nodes == ["/add/Add"]
    assert by["/flatten/Flatten + /fc/Gemm"].onnx_nodes == ["/flatten/Flatten", "/fc/Gemm"]
    assert {n.mapped_by for n in graph.nodes} == {"names"}
    assert {n.precision for n in graph.nodes} == {"f32"}
    assert graph.end_to_end_ms is None and graph.latency_sum_ms is None
    check_covers(graph, trt_model())


def test_trt_layer_names_only_and_bad_records(trt_path, tmp_path):
    names = {"Layers": ["/conv1/Conv + /relu1/Relu", "/conv2/Conv + /add/Add",
                        "{ForeignNode[/pool/GlobalAveragePool_output_0.../softmax/Softmax]}"], "Bindings": ["x", "y"]}
    graph = from_records(trt_path, names)
    assert graph.nodes[2].onnx_nodes[0] == "/pool/GlobalAveragePool"  # a range may start at a tensor name
    check_covers(graph, trt_model())
    bad = tmp_path / "bad.json"
    bad.write_text('{"layers": []}')
    with pytest.raises(WorkbenchError, match="no 'Layers' list"):
        from_records(trt_path, bad)
    bad.write_text("not json")
    with pytest.raises(WorkbenchError, match="exportLayerInfo"):
        from_records(trt_path, bad)


def test_trt_live_needs_tensorrt(trt_path):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(EngineUnavailableError, match="--layer-info"):
            engine_graph(trt_path, "trt", runs=1)
        pytest.skip("tensorrt is not installed (needs an NVIDIA GPU): the live TensorRT path cannot run here")
    graph = engine_graph(trt_path, "trt", runs=3)
    check_covers(graph, trt_model())
    assert graph.end_to_end_ms is not None and all(n.latency_ms is not None for n in graph.compute_nodes)


# --- ONNX Runtime and OpenVINO: small checks -------------------------------------------------------------------------
def test_openvino_per_run_times_keep_a_node_whose_average_truncates_to_zero():
    """OpenVINO's counters are running averages in whole microseconds, and a node whose average truncates to 0 is
    reported NOT_RUN from then on: by hand, node a ran 2 us, then ~0, then is NOT_RUN; it stays in every run
    (2, 0, 0 us), while b (never EXECUTED: folded or in place) is in none."""
    from workbench.engine_graphs.openvino_graph import per_run

    averages = [{"a": (0.002, True), "b": (0.0, False)}, {"a": (0.001, True), "b": (0.0, False)},
                {"a": (0.0, False), "b": (0.0, False)}]
    runs = per_run(averages)
    assert [set(r) for r in runs] == [{"a"}, {"a"}, {"a"}]
    assert [r["a"] for r in runs] == [pytest.approx(0.002), pytest.approx(0.0), 0.0]


def test_ort_trace_dispatch_and_overhead_by_hand():
    """A hand-written ORT profiler trace (µs): a warmup run, then a run from 1000 to 1100 with kernels A 1010-1040,
    B 1050-1070, C 1075-1090 (and a fence event, not a kernel). By hand: kernels 30 + 20 + 15 = 65 µs; dispatch
    before B 10, before C 5, none before the first kernel; 15 between, 10 + 10 outside."""
    from workbench.engine_graphs.ort_graph import _profile

    def node(name, ts, dur):
        return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": {"provider": "CPUExecutionProvider"}}

    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 500}, node("A_kernel_time", 5, 400),
              {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 100}, node("A_kernel_time", 1010, 30),
              node("B_fence_before", 1045, 2), node("B_kernel_time", 1050, 20), node("C_kernel_time", 1075, 15)]
    p = _profile(events, warmup=1)
    assert p["model_run"] == [0.1]
    assert {k: v for k, v in p["runs"][0].items()} == {"A": [0.03], "B": [0.02], "C": [0.015]}
    assert {k: v for k, v in p["dispatch"][0].items()} == {"A": [0.0], "B": [0.01], "C": [0.005]}
    assert p["between"] == [pytest.approx(0.015)] and p["outside"] == [pytest.approx(0.02)]


def test_ort_engine_graph_json_round_trip_and_bad_input(trt_path, tmp_path):
    graph = engine_graph(trt_path, "ort", runs=2)
    check_covers(graph, trt_model())
    doc = graph.to_json()
    assert doc["schema"] == SCHEMA and doc["engine"] == "ort" and doc["runs"] == 2
    assert {"name", "kind", "onnx_nodes", "provider", "precision", "latency_ms"} <= set(doc["nodes"][0])
    again = EngineGraph.from_json(json.loads(json.dumps(doc)))
    assert [n.onnx_nodes for n in again.nodes] == [n.onnx_nodes for n in graph.nodes]
    with pytest.raises(WorkbenchError, match="not an engine graph"):
        EngineGraph.from_json({"schema": "workbench.compare/1"})
    with pytest.raises(SpecError, match="no engine graph"):
        engine_graph(trt_path, "ref")
    with pytest.raises(ValueError, match=r"engine_graph\(\): runs must be"):
        engine_graph(trt_path, "ort", runs=-1)
    with pytest.raises(SpecError, match="optimization levels are ONNX Runtime's"):
        engine_graph(trt_path, "openvino", optimization="basic")


def test_cli_inspect_engine_writes_engine_graph_json(trt_path, tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["inspect", str(trt_path), "--engine", "ort", "--runs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA and doc["end_to_end_ms"] > 0 and doc["nodes"]
    assert "executed nodes" in capsys.readouterr().out
    rec = tmp_path / "trt.json"
    assert main(["inspect", str(trt_path), "--layer-info", str(TRT / "layers_trt10.json"), "--layer-profile",
                 str(TRT / "profile.json"), "--json", str(rec)]) == 0
    assert json.loads(rec.read_text())["engine"] == "trt"
    assert main(["inspect", str(trt_path), "--engine", "ort", "--layer-profile", str(TRT / "profile.json")]) == 2
    assert main(["inspect", str(trt_path), "--engine", "openvino", "--layer-info", str(TRT / "layers_trt10.json")]) == 2
    assert "--layer-info" in capsys.readouterr().err
    assert main(["inspect", str(trt_path), "--engine", "ref"]) == 2


def test_fused_granularity_on_a_small_model_and_its_bad_input(trt_path):
    from workbench.compare.api import compare
    from workbench.compare.text import render

    fused = compare(trt_path, "ort", "ort:fp16", granularity="fused", impact=0)
    g = fused.granularity
    assert g["mode"] == "fused" and g["engine"] == "ort" and g["compared"] == len(fused.tensors)
    assert set(g["groups"]) == {t.tensor for t in fused.tensors}
    assert {t.tensor for t in fused.tensors} | {u["tensor"] for u in g["unobservable"]} == \
        {t.tensor for t in compare(trt_path, "ort", "ort:fp16", impact=0, culprits=False).tensors}
    assert "granularity: fused" in render(fused)
    with pytest.raises(SpecError, match="no engine graph"):
        compare(trt_path, "ort", "ref:fp16", granularity="fused")
    with pytest.raises(WorkbenchError, match="unknown granularity"):
        compare(trt_path, "ort", "ort", granularity="layers")


# --- real PP-OCR models ----------------------------------------------------------------------------------------------
def _ocr(name: str, fetch_model):
    """The model's path and one rendered-text feed (tests/ocr_truth.py: det 1x3x480x640, rec 1x3x48xW)."""
    from ocr_truth import make_feeds

    return fetch_model(name), make_feeds(name, small=True)[:1]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ort", "openvino"])
def test_ppocr_every_node_mapped_and_every_onnx_node_covered(engine, fetch_model):
    from workbench.model.load import load_model

    for name in PPOCR:
        path = fetch_model(name)
        loaded = load_model(path)
        graph = engine_graph(loaded, engine, input_shapes={"x": SHAPES[name.split("-")[1]]}, runs=0)
        check_covers(graph, loaded.proto)
        assert graph.fused_nodes, f"{name}: {engine} fused nothing?"
        convs = [n.precision for n in graph.compute_nodes if "Conv" in n.kind]
        assert convs and set(convs) == {"f32"}, f"{name}: {engine} ran convolutions in {set(convs)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppocr-det", "ppocr-rec", "ppocr-cls"])
def test_ppocr_node_latencies_add_up_to_the_run(name, fetch_model):
    """The node times and the engine's overhead add up to the run, from the same measured runs, whatever the
    machine's load (a busy machine stretches the runs, not these identities; how close the node times alone come to
    the run on an idle machine is benchmarks/bench_engine_graph.py's to report). ORT: each run is its kernels, the
    dispatch between them and the time before the first and after the last (one thread: no overlap), so the nodes'
    mean latencies (every kernel attributed to a node) plus the mean overheads are the mean run. OpenVINO: its per-run
    node times (recovered from its running averages, whole microseconds) plus the rest of each run are its own time
    of the same infer() calls."""
    from workbench.engine_graphs.api import timing_notes

    path, feeds = _ocr(name, fetch_model)
    ort = engine_graph(path, "ort", feeds=feeds, runs=10)
    assert ort.end_to_end_source.startswith("ORT profiler")
    over = ort.overhead
    parts = ort.latency_sum_ms + over["between_nodes_mean_ms"] + over["outside_nodes_mean_ms"]
    assert parts == pytest.approx(ort.end_to_end_mean_ms, rel=1e-9), (parts, ort.end_to_end_mean_ms, over)
    assert 0 < ort.latency_share <= ort.accounted_share <= 1 + 1e-9, (ort.latency_share, ort.accounted_share)
    assert over["between_nodes_ms"] >= 0 and over["outside_nodes_ms"] >= 0
    assert all(n.provider == "CPUExecutionProvider" and n.latency_ms is not None for n in ort.nodes)
    assert all(n.dispatch_ms is not None and n.dispatch_ms >= 0 for n in ort.nodes)
    # what profiling costs: the same session's runs once its profiler ended
    assert ort.details["unprofiled_wall_ms"] > 0 and ort.overhead["profiler_ms"] == pytest.approx(
        ort.details["wall_ms"] - ort.details["unprofiled_wall_ms"])
    assert ort.latency_sum_ms == pytest.approx(sum(n.latency_mean_ms for n in ort.nodes))
    assert ort.notes == timing_notes(ort)  # no fallback, nothing unmapped: only notes the measured numbers imply
    ov = engine_graph(path, "openvino", feeds=feeds, runs=20)
    assert ov.end_to_end_source.startswith("OpenVINO's own time of each infer()")
    # a run's counters that fall short of it leave the rest as overhead (exactly); counters over it (their whole-
    # microsecond truncation: up to k us per node on the k-th inference, 1 warm-up + 20 runs) leave none
    parts = ov.latency_sum_ms + ov.overhead["outside_nodes_mean_ms"]
    slack = ov.overhead["counter_resolution_ms"] * (20 + 2 * 1 + 1) / 2
    assert ov.end_to_end_mean_ms * (1 - 1e-9) <= parts <= ov.end_to_end_mean_ms + slack, (parts, ov.overhead)
    assert ov.latency_share > 0 and ov.overhead["outside_nodes_ms"] >= 0
    # 1 us per executed node (a node OpenVINO stops reporting once its average truncates to 0 still counts)
    assert ov.overhead["counter_resolution_ms"] == pytest.approx(0.001 * len(ov.nodes), abs=0.0015)
    assert all(n.latency_ms is not None for n in ov.nodes) and {n.provider for n in ov.nodes} == {"CPU"}
    # the Python call around each infer() holds OpenVINO's own time of it
    assert ov.overhead["python_call_ms"] is not None and ov.details["wall_ms"] >= ov.end_to_end_ms * 0.9
    assert ov.notes == timing_notes(ov)
    if name == "ppocr-rec":  # text lines of two widths: OpenVINO is compiled at the first one, the other is left out
        from ocr_truth import make_feeds

        both = make_feeds(name, small=True)
        assert len({f["x"].shape for f in both}) == 2
        two = engine_graph(path, "openvino", feeds=both, runs=2)
        # then only the notes its measured times imply (a busy machine adds "per-node times add up to ...")
        assert two.runs == 2 and two.notes == ["1 feed(s) of other input shapes than the first were left out: the "
                                               "engine is compiled at one shape", *timing_notes(two)]


@pytest.mark.slow
def test_marking_group_boundaries_keeps_fusion(fetch_model):
    """Marking every boundary tensor leaves ORT's det fusions as they were; on OpenVINO, marking the input of an
    in-place residual Add breaks that fusion, so those tensors are dropped and the rebuilt engine fuses as before."""
    from workbench.model.load import load_model

    det = load_model(fetch_model("ppocr-det")).proto
    feeds = [{"x": np.zeros(SHAPES["det"], np.float32)}]
    graph, observable, dropped = observe(det, "ort", feeds)
    assert dropped == {} and "same fusions" in graph.details["fusion_checked"]
    assert len(observable) < len(OnnxGraph.build(det).producer)  # tensors inside fused nodes are left out
    cls = load_model(fetch_model("ppocr-cls")).proto
    graph, observable, dropped = observe(cls, "openvino", [{"x": np.zeros(SHAPES["cls"], np.float32)}])
    assert dropped and all("changes how the engine fuses" in why for why in dropped.values())
    assert "same fusions" in graph.details["fusion_checked"] and not set(dropped) & observable


@pytest.mark.slow
@pytest.mark.parametrize("candidate", ["ort:fp16", "openvino:fp16"])
def test_fused_compare_finds_the_same_culprit(candidate, fetch_model):
    """PP-OCR det's FP16 conversion clamps a BatchNormalization's variance: comparing only the candidate engine's
    group boundaries finds the group that runs it, with the clamp in its explanation."""
    from workbench.compare.api import compare

    path = fetch_model("ppocr-det")
    every = compare(path, "ort", candidate, input_shapes={"x": SHAPES["det"]}, impact=0)
    fused = compare(path, "ort", candidate, input_shapes={"x": SHAPES["det"]}, impact=0, granularity="fused")
    top, group_top = every.culprits[0], fused.culprits[0]
    assert top.op_type == "BatchNormalization" and top.introduces_divergence
    assert group_top.introduces_divergence and top.node in group_top.group["onnx_nodes"]
    assert "clamped constant 'batch_norm_0.w_2'" in group_top.explanation
    assert fused.first_divergent.node in fused.granularity["groups"][fused.first_divergent.tensor]["onnx_nodes"]
    assert top.node in fused.granularity["groups"][fused.first_divergent.tensor]["onnx_nodes"]
    assert len(fused.tensors) < len(every.tensors) and fused.granularity["unobservable"]
    assert all(u["reason"] for u in fused.granularity["unobservable"])
    doc = fused.to_json()
    assert doc["granularity"]["mode"] == "fused" and doc["culprits"][0]["group"]["engine_node"]


@pytest.mark.slow
def test_diff_of_two_optimization_levels_lists_changed_fusions(fetch_model, tmp_path, capsys):
    path = fetch_model("ppocr-cls")
    a, b = tmp_path / "all.json", tmp_path / "basic.json"
    for level, out in (("all", a), ("basic", b)):
        assert main(["inspect", str(path), "--engine", "ort", "--input-shapes", "x:[1,3,48,192]", "--runs", "3",
                     "--optimization", level, "--json", str(out)]) == 0
    capsys.readouterr()
    diff_out = tmp_path / "diff.json"
    assert main(["diff", str(a), str(b), "--json", str(diff_out)]) == 0
    doc = json.loads(diff_out.read_text())
    assert doc["schema"] == "workbench.engine_graph_diff/1" and doc["fusions_changed"]
    assert doc["end_to_end_ms"]["before"] > 0 and doc["end_to_end_ms"]["after"] > 0
    nchwc = [f for f in doc["fusions_changed"] if any("nchwc" in g["kind"] for g in f["before"])]
    assert nchwc and all(not any("nchwc" in g["kind"] for g in f["after"]) for f in nchwc)
    assert "fusions changed" in capsys.readouterr().out
    assert main(["diff", str(a), str(TRT / "profile.json")]) == 2


def test_a_loop_body_is_not_counted_twice_in_the_latency_share(tmp_path):
    """ORT profiles a Loop's body kernels inside the Loop node's own time: the per-node times of a one-node Loop
    model added up to 124% of a run on one thread (and a note blamed concurrency). They are counted once now."""
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(np.ones((64, 64), np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], name="loop", body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(np.array(20, np.int64), "n"), numpy_helper.from_array(np.array(True), "c")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "loop.onnx")
    g = engine_graph(tmp_path / "loop.onnx", "ort", runs=5, threads=1)
    assert [n.name for n in g.compute_nodes] == ["loop"]
    # the Loop node's own time is part of the run: its share is at most the whole run
    assert 0 < g.latency_share <= 1.0, (g.latency_share, g.notes)
    assert not any("concurrently" in n for n in g.notes), g.notes


def test_diff_of_engine_graphs_says_what_is_wrong_with_a_file_and_when_models_differ(tmp_path, capsys):
    """A missing, damaged or non-graph file is named with its problem (each was "needs two engine graphs"); two
    graphs of different models diff with a note saying so."""
    from conftest import SAMPLES

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for model, out in ((SAMPLES / "healthy_cnn.onnx", a), (SAMPLES / "cnn_fp16_overflow.onnx", b)):
        assert main(["inspect", str(model), "--engine", "ort", "--runs", "1", "--json", str(out)]) == 0
    (tmp_path / "broken.json").write_text(a.read_text()[:40])
    (tmp_path / "other.json").write_text('{"schema": "workbench.compare/1"}')
    capsys.readouterr()
    for other, said in (("missing.json", "not found: "), ("broken.json", "JSON"),
                        ("other.json", "holds a 'workbench.compare/1', not an engine graph")):
        assert main(["diff", str(a), str(tmp_path / other)]) == 2
        err = capsys.readouterr().err
        assert said in err and other in err, err
    assert main(["diff", str(a), str(b), "--json", str(tmp_path / "d.json")]) == 0
    assert "note: the two engine graphs are of different models (healthy_cnn.onnx" in capsys.readouterr().out
    assert "different models" in json.loads((tmp_path / "d.json").read_text())["notes"][0]


@pytest.mark.slow
def test_plots_and_panel_show_slowest_nodes_with_their_error(fetch_model):
    from workbench.compare.api import compare
    from workbench.engine_graphs.layers import layer_rows
    from workbench.plots.engine_graph import latency_by_node, slowest_layers
    from workbench.ui.engine_panel import EnginePanel

    path = fetch_model("ppocr-cls")
    graph = engine_graph(path, "ort:fp16", input_shapes={"x": SHAPES["cls"]}, runs=3)
    result = compare(path, "ort", "ort:fp16", input_shapes={"x": SHAPES["cls"]}, culprits=False)
    rows = layer_rows(graph, result)
    assert rows[0]["latency_ms"] == max(r["latency_ms"] for r in rows)
    with_error = [r for r in rows if r["error"] is not None]
    assert with_error and all(r["metric"] == result.criterion.metric for r in with_error)
    fig = slowest_layers(rows, top=8)
    assert len(fig.data[0].x) == 8 and result.criterion.metric in fig.data[0].marker.colorbar.title.text
    assert {t.name for t in latency_by_node(graph, "precision").data} == {"f32"}
    panel = EnginePanel(path)
    panel.state.result = result
    panel.show(graph)
    assert "ONNX nodes" in panel.table.value and panel.warning.value == ""
    # the view's fallback warning (a node whose provider differs from the requested one)
    graph.compute_nodes[0].provider = "CUDAExecutionProvider"
    panel.show(graph)
    assert "fell back" in panel.warning.value and "CUDAExecutionProvider" in panel.warning.value


def test_engine_graph_json_with_a_timing_that_is_not_a_number_says_where(trt_path):
    doc = engine_graph(trt_path, "ort", runs=1).to_json()
    EngineGraph.from_json(json.loads(json.dumps(doc)))  # as written: reads
    for where, edit in (("accounted_share", lambda d: d.update(accounted_share="x")),
                        ("overhead.between_nodes_ms", lambda d: d["overhead"].update(between_nodes_ms=[1])),
                        ("nodes[0].dispatch_ms", lambda d: d["nodes"][0].update(dispatch_ms=True))):
        bad = json.loads(json.dumps(doc))
        edit(bad)
        with pytest.raises(WorkbenchError, match=r"malformed \(" + re.escape(where)):
            EngineGraph.from_json(bad)


def test_a_cast_between_two_nodes_the_engine_runs_counts_as_elided_not_unmapped():
    """OpenVINO names a float-to-float Cast in no runtime node, or in its Multiply's, from one compile to the next:
    between two covered nodes it is elided (listed as folded); a Cast whose consumer nothing runs stays unmapped."""
    from workbench.engine_graphs.onnx_side import OnnxGraph
    from workbench.engine_graphs.partition import uncovered

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Cast", ["a"], ["b"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["b", "b"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    og = OnnxGraph.build(helper.make_model(graph))
    folded, unmapped = uncovered(og, {"relu", "mul"}, set())
    assert folded == ["cast"] and unmapped == []
    folded, unmapped = uncovered(og, {"relu"}, set())
    assert folded == [] and {u["node"] for u in unmapped} == {"cast", "mul"}
