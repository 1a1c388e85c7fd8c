"""ONNX Runtime's TensorRT execution provider (``ort-trt``) engine graph from ORT's records: the profiler trace and
the subgraphs the TensorRT EP dumps (``trt_dump_subgraphs``). Hand-written records of the documented formats
(tests/data/ort_trt/README.md); the live path only where onnxruntime has the TensorrtExecutionProvider."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from test_engine_graph import trt_model

from workbench.engine_graphs.onnx_side import OnnxGraph
from workbench.engine_graphs.ort_trt_graph import from_ort_trt_records, load_subgraphs, ort_trt_engine_graph
from workbench.errors import EngineUnavailableError, WorkbenchError

DATA = Path(__file__).parent / "data" / "ort_trt"
TRACE = DATA / "profile.json"
HASH = "7046012155409425519"
T0 = f"TensorrtExecutionProvider_TRTKernel_graph_trt-tiny_{HASH}_0_0"
T1 = f"TensorrtExecutionProvider_TRTKernel_graph_trt-tiny_{HASH}_1_1"
TRT_NODES = {T0: ["/conv1/Conv", "/relu1/Relu", "/conv2/Conv", "/add/Add"], T1: ["/fc/Gemm", "/softmax/Softmax"]}


def tiny_model() -> onnx.ModelProto:
    """tests/test_engine_graph.py's model (graph "trt-tiny"): Conv, Relu, Conv, residual Add (TensorRT EP subgraph 0
    here), GlobalAveragePool (CUDA EP), Flatten (CPU fallback), Gemm, Softmax (TensorRT EP subgraph 1)."""
    return trt_model()


def dumped(model: onnx.ModelProto, names: list[str], *, keep_names: bool = True) -> onnx.ModelProto:
    """What the TensorRT EP dumps for a fused node (GraphViewer::ToProto of its nodes): the nodes as they are (names,
    inputs, outputs), the tensors read from outside as graph inputs, those read outside or the model's outputs as
    graph outputs, the initializers they read. ``keep_names=False``: unnamed nodes (a model exported without
    names), to exercise the tensor-name fallback."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.input) +
             list(inferred.graph.output)}
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.name in names]
    made = {o for n in nodes for o in n.output}
    outside = {i for n in model.graph.node if n.name not in names for i in n.input}
    ins = list(dict.fromkeys(i for n in nodes for i in n.input if i not in made and i not in inits))
    outs = [o for n in nodes for o in n.output if o in outside or o in {g.name for g in model.graph.output}]
    copies = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        if not keep_names:
            c.name = ""
        copies.append(c)
    graph = helper.make_graph(copies, model.graph.name, [types[i] for i in ins], [types[o] for o in outs],
                              [inits[i] for n in nodes for i in n.input if i in inits])
    return helper.make_model(graph, opset_imports=list(model.opset_import))


def subgraphs(model: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    return {T0: dumped(model, TRT_NODES[T0]), T1: dumped(model, TRT_NODES[T1], keep_names=False)}


def recorded_files(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny model and its dumped subgraphs as files (what `inspect --ort-trace` reads): (model, dumps folder)."""
    model = tiny_model()
    onnx.save(model, tmp_path / "tiny.onnx")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for name, sub in subgraphs(model).items():
        onnx.save(sub, dumps / f"{name}.onnx")
    return tmp_path / "tiny.onnx", dumps


def events() -> list[dict]:
    return json.loads(TRACE.read_text(encoding="utf-8"))


# --- records -----------------------------------------------------------------------------------------------------
def test_records_map_fused_nodes_to_their_subgraphs_with_providers_and_trace_latencies():
    model = tiny_model()
    graph = from_ort_trt_records(model, TRACE, subgraphs(model), warmup=1)
    by = {n.name: n for n in graph.nodes}
    assert [n.name for n in graph.nodes] == [T0, "/pool/GlobalAveragePool", "Memcpy", "/flatten/Flatten",
                                             "Memcpy_token_2", T1]  # the order the runs ran them
    # every ONNX compute node is run by exactly one compute node; the fused nodes carry their subgraph's nodes
    og = OnnxGraph.build(model)
    ran = [o for n in graph.compute_nodes for o in n.onnx_nodes]
    assert sorted(ran) == sorted(og.nodes) and len(ran) == len(set(ran))
    assert graph.unmapped == [] and graph.folded == []
    assert (by[T0].onnx_nodes, by[T0].mapped_by) == (TRT_NODES[T0], "names")
    assert (by[T1].onnx_nodes, by[T1].mapped_by) == (TRT_NODES[T1], "tensors")  # unnamed dump: by tensor names
    assert by[T0].kind == "TRTKernel" and by[T0].kernel == f"TRTKernel_graph_trt-tiny_{HASH}_0" and by[T0].fused
    assert by[T0].outputs == ["/add/Add_output_0"] and by[T1].outputs == ["y"]
    assert by["/pool/GlobalAveragePool"].onnx_nodes == ["/pool/GlobalAveragePool"]
    assert by["/flatten/Flatten"].onnx_nodes == ["/flatten/Flatten"]
    # copies are layout nodes on the tensor they move; the TensorRT EP's own MemcpyFromHost is no subgraph
    assert (by["Memcpy"].role, by["Memcpy"].kind, by["Memcpy"].onnx_nodes) == \
        ("layout", "MemcpyToHost", ["/pool/GlobalAveragePool"])
    assert (by["Memcpy_token_2"].role, by["Memcpy_token_2"].onnx_nodes) == ("layout", ["/flatten/Flatten"])
    # providers per node, from the kernel_time events' args
    assert {n.name: n.provider for n in graph.nodes} == {
        T0: "TensorrtExecutionProvider", "/pool/GlobalAveragePool": "CUDAExecutionProvider",
        "Memcpy": "CUDAExecutionProvider", "/flatten/Flatten": "CPUExecutionProvider",
        "Memcpy_token_2": "TensorrtExecutionProvider", T1: "TensorrtExecutionProvider"}
    assert {n.name for n in graph.fallbacks()} == {"/pool/GlobalAveragePool", "/flatten/Flatten"}
    assert {n.precision for n in graph.nodes} == {"f32"}
    # latencies: the two runs after the warm-up (checked by hand against profile.json, in microseconds)
    assert by[T0].latency_ms == pytest.approx(0.19)  # 200, 180
    assert by[T0].latency_p90_ms == pytest.approx(0.198)
    assert by[T1].latency_ms == pytest.approx(0.11)  # 100, 120
    assert by["Memcpy_token_2"].latency_ms == pytest.approx(0.0125)  # 10, 15
    assert by["/pool/GlobalAveragePool"].dispatch_ms == pytest.approx(0.01)  # 220 - 210, 200 - 190
    assert by["Memcpy_token_2"].dispatch_ms == pytest.approx(0.0075)  # 290 - 280, 265 - 260
    assert graph.runs == 2 and graph.end_to_end_ms == pytest.approx(0.48)  # 500, 460
    assert graph.end_to_end_p90_ms == pytest.approx(0.496)
    assert graph.latency_sum_ms == pytest.approx(0.19 + 0.03 + 0.01 + 0.005 + 0.0125 + 0.11)
    assert graph.latency_share == pytest.approx((0.355 / 0.5 + 0.36 / 0.46) / 2)
    assert graph.overhead["between_nodes_ms"] == pytest.approx(0.0375)  # 40, 35
    assert graph.overhead["outside_nodes_ms"] == pytest.approx(0.085)  # 10 + 95, 10 + 55
    assert graph.details["trt_subgraphs"] == {T0: 4, T1: 2}
    assert graph.engine == "ort-trt" and graph.notes == []
    # the JSON round trip keeps it all
    from workbench.engine_graphs.result import EngineGraph

    again = EngineGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert [n.onnx_nodes for n in again.nodes] == [n.onnx_nodes for n in graph.nodes]


def test_records_without_warmup_count_every_run_and_read_a_dump_folder(tmp_path):
    model = tiny_model()
    folder = tmp_path / "cwd"  # what the EP leaves in its working directory
    folder.mkdir()
    for name, sub in subgraphs(model).items():
        onnx.save(sub, folder / f"{name}.onnx")
    onnx.save(dumped(model, [n.name for n in model.graph.node]), folder / "TensorrtExecutionProvider_TRT_Subgraph.onnx")
    assert set(load_subgraphs(folder)) == {T0, T1}  # GetSupportedList's candidate graph is no fused node
    graph = from_ort_trt_records(model, events(), folder)
    t0 = next(n for n in graph.nodes if n.name == T0)
    assert graph.runs == 3 and t0.latency_ms == pytest.approx(0.2)  # 8000 (first run), 200, 180
    assert t0.latency_mean_ms == pytest.approx((8.0 + 0.2 + 0.18) / 3)


def test_structure_only_drops_every_time():
    from workbench.engine_graphs.ort_trt_graph import _drop_times

    model = tiny_model()
    graph = from_ort_trt_records(model, TRACE, subgraphs(model), warmup=1)
    _drop_times(graph)  # what the live path does for runs=0 after its one profiled run
    assert graph.latency_sum_ms is None and graph.end_to_end_ms is None and graph.runs == 0
    assert all(n.dispatch_ms is None for n in graph.nodes) and graph.to_json()["overhead"] == {}
    assert {n.name: n.onnx_nodes for n in graph.nodes if n.name in TRT_NODES} == TRT_NODES


def test_a_fused_node_without_its_dump_keeps_provider_and_latency_with_a_note():
    model = tiny_model()
    graph = from_ort_trt_records(model, TRACE, {T0: dumped(model, TRT_NODES[T0])}, warmup=1)
    by = {n.name: n for n in graph.nodes}
    assert by[T0].onnx_nodes == TRT_NODES[T0]
    assert by[T1].provider == "TensorrtExecutionProvider" and by[T1].latency_ms == pytest.approx(0.11)
    assert any(T1 in note and "topology" in note for note in graph.notes)
    assert set(OnnxGraph.build(model).nodes) <= graph.covered()


@pytest.mark.parametrize("trace, subs, message", [
    ({"traceEvents": []}, None, "not a list of events"),
    ([{"cat": "Node", "name": "x_kernel_time", "dur": 3}], None, "lacks a name, a ts or a dur"),
    ([e for e in json.loads(TRACE.read_text()) if e["name"] != "model_run"], None, "no model_run event"),
    ([e for e in json.loads(TRACE.read_text()) if not e["name"].endswith("_kernel_time")], None,
     "no kernel_time events"),
    ([{**e, "args": {"op_name": "Flatten"}} if e["name"] == "/flatten/Flatten_kernel_time" else e
      for e in json.loads(TRACE.read_text())], None, "has no provider"),
    (None, {"TensorrtExecutionProvider_TRTKernel_graph_other_1_0_0": "sub"}, "not an ONNX ModelProto"),
    (None, "stray", "match no TensorRT EP node of the trace"),
    (None, "foreign", "names no node and no tensor of the model"),
])
def test_malformed_records_say_what_to_pass(trace, subs, message):
    model = tiny_model()
    given = subgraphs(model)
    if subs == "stray":
        given["TensorrtExecutionProvider_TRTKernel_graph_other_1_0_0"] = given[T0]
    elif subs == "foreign":
        other = dumped(model, TRT_NODES[T0], keep_names=False)
        for n in other.graph.node:
            n.output[:] = [f"elsewhere_{o}" for o in n.output]
        for o in other.graph.output:
            o.name = f"elsewhere_{o.name}"
        given[T0] = other
    elif subs is not None:
        given = subs
    with pytest.raises(WorkbenchError, match=message) as err:
        from_ort_trt_records(model, trace if trace is not None else TRACE, given, warmup=1)
    assert err.value.hint  # what to do


def test_unreadable_trace_and_dump_files_say_what_to_pass(tmp_path):
    model = tiny_model()
    bad = tmp_path / "profile.json"
    bad.write_text("[\n{not json", encoding="utf-8")
    with pytest.raises(WorkbenchError, match="cannot read the ONNX Runtime trace") as err:
        from_ort_trt_records(model, bad, {})
    assert "enable_profiling" in err.value.hint
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / f"{T0}.onnx").write_bytes(b"\x00not a model")
    with pytest.raises(WorkbenchError, match="is not an ONNX model") as err:
        from_ort_trt_records(model, TRACE, tmp_path / "dumps")
    assert "trt_dump_subgraphs" in err.value.hint


def test_a_real_onnxruntime_trace_reads_with_every_node_mapped(tmp_path):
    """A trace this onnxruntime really writes (CPU EP: no TensorRT EP here) goes through the same reader and mapping:
    the format is ORT's own, whatever the EP."""
    import onnxruntime as ort

    model = tiny_model()
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})
    graph = from_ort_trt_records(model, session.end_profiling(), {}, warmup=1)
    ran = [o for n in graph.compute_nodes for o in n.onnx_nodes]
    assert sorted(ran) == sorted(OnnxGraph.build(model).nodes) and len(ran) == len(set(ran))
    assert {n.provider for n in graph.nodes} == {"CPUExecutionProvider"} and graph.runs == 2
    assert all(n.latency_ms is not None for n in graph.nodes) and graph.end_to_end_ms > 0
    assert graph.notes == ["the TensorRT EP took no subgraph: every node ran on CUDA or CPU"]


# --- live ----------------------------------------------------------------------------------------------------------
def _has_trt_ep() -> bool:
    import onnxruntime as ort

    return "TensorrtExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_has_trt_ep(), reason="onnxruntime has the TensorrtExecutionProvider here (the live test runs)")
def test_live_ort_trt_without_the_tensorrt_ep_is_unavailable_with_the_reason():
    from workbench.engine_graphs.api import engine_graph

    with pytest.raises(EngineUnavailableError, match="TensorrtExecutionProvider is not among") as err:
        engine_graph(tiny_model(), "ort-trt", runs=1)  # api -> ort_graph's hook -> this module
    assert "onnxruntime-gpu" in err.value.hint


@pytest.mark.skipif(not _has_trt_ep(), reason="onnxruntime here has no TensorrtExecutionProvider "
                    "(onnxruntime.get_available_providers()): the live ort-trt path needs onnxruntime-gpu, an NVIDIA "
                    "GPU and the TensorRT libraries")
def test_live_ort_trt_engine_graph_maps_the_dumped_subgraphs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the EP dumps into the child's working directory, never into this one
    model = tiny_model()
    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}]
    graph = ort_trt_engine_graph(model, feeds, runs=3, warmup=1)
    og = OnnxGraph.build(model)
    ran = [o for n in graph.compute_nodes for o in n.onnx_nodes]
    assert set(og.nodes) <= graph.covered() and len(ran) == len(set(ran))
    trt = [n for n in graph.compute_nodes if n.provider == "TensorrtExecutionProvider"]
    assert trt and all(n.onnx_nodes and n.latency_ms is not None for n in trt)
    assert graph.details["trt_subgraphs"] and list(tmp_path.iterdir()) == []


def test_cli_inspect_reads_the_recorded_trace_and_dumps(tmp_path, capsys):
    """`workbench inspect MODEL --engine ort-trt --ort-trace FILE --trt-subgraphs DIR` maps the records (no GPU);
    the two flags go together, with --engine ort-trt."""
    from workbench.cli import main

    model_path, dumps = recorded_files(tmp_path)
    out = tmp_path / "g.json"
    assert main(["inspect", str(model_path), "--engine", "ort-trt", "--ort-trace",
                 str(DATA / "profile.json"), "--trt-subgraphs", str(dumps), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    trt = [n for n in doc["nodes"] if n["provider"] == "TensorrtExecutionProvider" and n["role"] == "compute"]
    assert [n["onnx_nodes"] for n in trt] == [["/conv1/Conv", "/relu1/Relu", "/conv2/Conv", "/add/Add"],
                                              ["/fc/Gemm", "/softmax/Softmax"]]
    assert doc["end_to_end_ms"] == pytest.approx(0.48)
    assert "TRTKernel" in capsys.readouterr().out
    assert main(["inspect", str(model_path), "--engine", "ort", "--ort-trace",
                 str(DATA / "profile.json")]) == 2
    assert "--ort-trace and --trt-subgraphs go together" in capsys.readouterr().err


def test_a_trace_saved_again_on_one_line_reads_the_same(tmp_path):
    """ORT writes one event per line; the same list re-saved with json.dump (one line) gives the same graph."""
    model = tiny_model()
    one_line = tmp_path / "trace.json"
    one_line.write_text(json.dumps(json.loads((DATA / "profile.json").read_text())))
    a = from_ort_trt_records(model, DATA / "profile.json", subgraphs(model), warmup=1)
    b = from_ort_trt_records(model, one_line, subgraphs(model), warmup=1)
    assert [(n.name, n.onnx_nodes, n.latency_ms) for n in a.nodes] == [(n.name, n.onnx_nodes, n.latency_ms)
                                                                        for n in b.nodes]


def test_pipes_and_folders_are_refused_not_read(tmp_path):
    """A FIFO as the trace, or among the dumps (or a folder named like a dump), is refused with one line instead of
    blocking the read."""
    import os

    model = tiny_model()
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    with pytest.raises(WorkbenchError, match="not a regular file"):
        from_ort_trt_records(model, fifo, subgraphs(model))
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    os.mkfifo(dumps / f"{T0}.onnx")
    with pytest.raises(WorkbenchError, match="not a regular file"):
        from_ort_trt_records(model, DATA / "profile.json", dumps, warmup=1)
    (dumps / f"{T0}.onnx").unlink()
    (dumps / f"{T0}.onnx").mkdir()
    with pytest.raises(WorkbenchError, match="not a regular file"):
        from_ort_trt_records(model, DATA / "profile.json", dumps, warmup=1)
