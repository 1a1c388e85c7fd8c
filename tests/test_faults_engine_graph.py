"""Hostile and careless input to what the engine graphs added: ``inspect --engine ort-trt`` from recorded files (a
trace edited by hand, outputs written into the dumps folder, node names with newlines), the engine-graph notes and
text of a model whose engine runs no node, the Compare panel's own candidate file (typed paths and uploaded file
names), and the Graph panel's node inspector (hostile names and values). Each fault: one clear line, bounded and
escaped, nothing written where it does not belong."""

from __future__ import annotations

import copy
import datetime
import json
import shutil
from pathlib import Path

import pytest
from test_engine_graph_ort_trt import TRACE, events, recorded_files, subgraphs, tiny_model

from workbench.engine_graphs.ort_trt_graph import from_ort_trt_records
from workbench.engine_graphs.result import EngineGraph, EngineNode
from workbench.errors import WorkbenchError

HOSTILE = "a\nb<img src=x onerror=alert(1)>\"'\x1b[31m"


def _last_run_ts(evs: list[dict]) -> int:
    return [e for e in evs if e.get("name") == "model_run"][-1]["ts"]


# --- 1. ort-trt records ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("inf"), 1e999, 10**30, 10**5000], ids=["inf", "1e999", "1e30", "1e5000"])
def test_a_trace_edited_to_an_infinite_or_huge_duration_is_refused_in_one_line(value):
    """Before: a kernel with dur Infinity (JSON's `Infinity`, `1e999`) passed, and every node time and share
    became nan/inf (`nan%` printed, numpy RuntimeWarning); a huge integer made a run last 1e26 ms."""
    evs = events()
    kernel = next(e for e in evs if e.get("name", "").endswith("_kernel_time"))
    kernel["dur"] = value
    with pytest.raises(WorkbenchError, match="lacks a name, a ts or a dur") as err:
        from_ort_trt_records(tiny_model(), evs, subgraphs(tiny_model()), warmup=1)
    assert len(str(err.value)) < 1000 and "\n" not in str(err.value)


@pytest.mark.parametrize("field,value", [("provider", 5), ("op_name", ["Relu"]), ("output_type", {"a": 1})])
def test_args_of_the_wrong_type_are_refused_in_one_line(field, value):
    """Before: an op_name list raised TypeError (unhashable) deep in the mapping; a provider number went through
    as the provider's name."""
    evs = events()
    kernel = next(e for e in evs if e.get("name", "").endswith("_kernel_time") and e["ts"] > _last_run_ts(evs))
    if field == "output_type":
        kernel["args"]["output_type_shape"] = [{5: [1]}]
    else:
        kernel["args"][field] = value
    with pytest.raises(WorkbenchError, match="is not a string"):
        from_ort_trt_records(tiny_model(), evs, subgraphs(tiny_model()), warmup=1)


def test_a_node_name_with_a_newline_cannot_forge_a_line_and_is_bounded_in_the_text(tmp_path, capsys):
    """Before: the FELL BACK line printed the trace's node name as it is: its newline started a new line of the
    output, and a 5,000-character name made every table row 5,000 characters wide."""
    from workbench.cli import main

    model, dumps = recorded_files(tmp_path)
    evs = events()
    name = HOSTILE + "x" * 5000
    evs.append({"cat": "Node", "name": name + "_kernel_time", "ts": _last_run_ts(evs) + 1, "dur": 1,
                "args": {"provider": "CPUExecutionProvider", "op_name": "Relu"}})
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(evs), encoding="utf-8")
    report = tmp_path / "r.html"
    assert main(["inspect", str(model), "--engine", "ort-trt", "--ort-trace", str(trace), "--trt-subgraphs",
                 str(dumps), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("b<img") for line in out.splitlines()), "a forged line"
    assert "\x1b" not in out and max(len(line) for line in out.splitlines()) < 1000
    html = report.read_text(encoding="utf-8")
    assert "<img src=x" not in html.split('id="workbench-result"')[0]  # escaped as text (the JSON is inert)


@pytest.mark.parametrize("option,where", [("--report", "new.onnx"), ("--json", "sub/g.json")])
def test_an_output_inside_the_dumps_folder_is_refused(tmp_path, capsys, option, where):
    """Before: `--report dumps/new.onnx` was written into the dumps folder, and the next `inspect` of that folder
    failed with "the dumped subgraph new.onnx is not an ONNX model"."""
    from workbench.cli import main

    model, dumps = recorded_files(tmp_path)
    before = sorted(p.name for p in dumps.iterdir())
    assert main(["inspect", str(model), "--engine", "ort-trt", "--ort-trace", str(TRACE), "--trt-subgraphs",
                 str(dumps), option, str(dumps / where)]) == 2
    err = capsys.readouterr().err
    assert "inside the --trt-subgraphs folder" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in dumps.iterdir()) == before
    assert main(["inspect", str(model), "--engine", "ort-trt", "--ort-trace", str(TRACE), "--trt-subgraphs",
                 str(dumps), option, str(tmp_path / "elsewhere.html")]) == 0


def test_a_hostile_field_is_named_cut_short_in_the_message():
    evs = events()
    kernel = next(e for e in evs if e.get("name", "").endswith("_kernel_time"))
    kernel["ts"] = "x" * 100_000
    with pytest.raises(WorkbenchError) as err:
        from_ort_trt_records(tiny_model(), copy.deepcopy(evs), subgraphs(tiny_model()), warmup=1)
    assert len(str(err.value)) < 1000


# --- 2. engine graphs with nothing executed ------------------------------------------------------------------------
def test_a_graph_whose_engine_ran_no_node_says_so_instead_of_zero_percent():
    """Before: an Identity-only model on OpenVINO (the node folded away) got "per-node times add up to 0% of a run:
    the rest is the engine's own overhead between nodes" and empty "providers:" / "precisions:" lines."""
    from workbench.engine_graphs.api import _notes
    from workbench.engine_graphs.text import render

    graph = EngineGraph(engine="openvino", nodes=[], end_to_end_ms=0.02, latency_share=0.0, runs=2,
                        overhead={"outside_nodes_ms": 0.02}, folded=["id"], details={"onnx_compute_nodes": 1})
    _notes(graph)
    assert not any("0% of a run" in n for n in graph.notes) and any("no compute node" in n for n in graph.notes)
    text = render(graph)
    assert "providers: none" in text and "precisions: none" in text
    doc = json.loads(json.dumps(graph.to_json(), allow_nan=False))
    assert EngineGraph.from_json(doc).to_json() == doc


def test_a_round_trip_never_writes_nan_or_inf():
    node = EngineNode(name="n", kind="Relu", onnx_nodes=["n"], latency_ms=float("nan"), dispatch_ms=float("inf"))
    graph = EngineGraph(engine="ort", nodes=[node], end_to_end_ms=float("inf"), accounted_share=float("nan"),
                        overhead={"between_nodes_ms": float("nan"), "source": "x"}, runs=1)
    text = json.dumps(graph.to_json(), allow_nan=False)
    assert EngineGraph.from_json(json.loads(text)).to_json() == json.loads(text)


# --- 3. the Compare panel's candidate file ------------------------------------------------------------------------
@pytest.fixture
def compare_panel():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from conftest import SAMPLES

    from workbench.ui import ComparePanel

    return ComparePanel(SAMPLES / "fp16_clamp_constant.onnx")


def _upload(panel, name: str, data: bytes) -> None:
    panel.cand_upload.value = ({"name": name, "type": "", "size": len(data), "content": memoryview(data),
                                "last_modified": datetime.datetime.now(datetime.timezone.utc)},)


@pytest.mark.parametrize("name,kept", [("a" * 300 + ".onnx", None), ("..", "candidate.onnx"),
                                       ("a\x00b.onnx", "a_b.onnx"), ("a\nb.onnx", "a_b.onnx"),
                                       ("\U0001F600" * 200 + ".onnx", None), ("../../x.onnx", "x.onnx"),
                                       ("..\\..\\x.onnx", "x.onnx")])
def test_an_upload_with_a_hostile_name_is_kept_in_its_temporary_folder(compare_panel, name, kept):
    """Before: a 300-character (or 200-emoji) name raised OSError (File name too long), '..' IsADirectoryError and
    a NUL ValueError out of the upload observer: no message, the kernel log had the traceback."""
    from conftest import SAMPLES

    _upload(compare_panel, name, (SAMPLES / "fp16_clamp_constant.onnx").read_bytes())
    path = Path(compare_panel.cand_file.value)
    assert path.is_file() and path.parent.name.startswith("workbench-upload-")
    assert len(path.name.encode()) <= 200 and path.name.endswith(".onnx")
    assert kept is None or path.name == kept
    info = compare_panel.candidate_file_info()
    shutil.rmtree(path.parent)  # the panel keeps each upload for the session: this test's go now
    assert "error" not in info and "\n" not in info["name"]


@pytest.mark.parametrize("typed", ["{model}\nfoo", "/tmp/a\x00b.onnx", "/tmp/" + "a" * 100_000])
def test_a_typed_path_with_a_newline_nul_or_a_megabyte_gives_one_clear_bounded_line(compare_panel, typed):
    """Before: a newline cut the message at the path's first line ("model file not found: <an existing model>"),
    a NUL raised ValueError out of the observer, a 100 kB path was an "internal error" 100 kB long."""
    from conftest import SAMPLES

    compare_panel.cand_file.value = typed.format(model=SAMPLES / "fp16_clamp_constant.onnx")
    info = compare_panel.candidate_file_info()
    assert "error" in info and "\n" not in info["error"] and "internal error" not in info["error"]
    assert len(info["error"]) <= 600 and len(info["name"]) <= 120
    if "\n" in typed:
        assert "\\n" in info["error"]
    assert "\n" not in compare_panel.precision.value and len(compare_panel.precision.value) < 3000


# --- 4. the Graph panel's node inspector ----------------------------------------------------------------------------
def test_the_inspector_escapes_control_characters_and_bounds_every_field():
    """Before: the op type, domain, attribute type and tensor kind were escaped but not cut (a 1 MB op type gave a
    4 MB pane), and control characters (newline, NUL, ESC) went into the HTML and the tooltips as they are."""
    pytest.importorskip("ipywidgets")
    from workbench.ui.graph_panel import inspector_html

    big = HOSTILE + "\x00" + "y" * 1_000_000
    out = inspector_html({"op_type": big, "domain": big, "attributes": [{"name": big, "type": big, "value": big}],
                          "inputs": [{"name": big, "kind": big, "type": big, "value": big}], "outputs": []})
    assert len(out) < 60_000
    assert not [c for c in out if ord(c) < 32], "control characters escaped"
    assert "<img" not in out and "\"'" not in out and "onerror=alert(1)&gt;&quot;&#x27;" in out


def test_two_dumps_that_run_the_same_onnx_nodes_are_refused():
    """Before: a dump copied over another (or dumps of two sessions in one folder) was mapped as it came: the second
    fused node ran no ONNX node, its nodes were silently given to a CPU node by topology, and no note said so."""
    model = tiny_model()
    subs = subgraphs(model)
    first = next(iter(subs))
    with pytest.raises(WorkbenchError, match="both run ONNX node"):
        from_ort_trt_records(model, TRACE, dict.fromkeys(subs, subs[first]), warmup=1)


def test_run_with_a_candidate_path_that_is_a_folder_or_a_device_says_what_it_is(compare_panel, tmp_path):
    """Before: Run with a folder or /dev/zero typed said "candidate file /dev/zero not found"."""
    from workbench.errors import InputError

    for typed, what in ((str(tmp_path), "it is a folder"), ("/dev/zero", "it is not a regular file"),
                        (str(tmp_path / "a\nb.onnx"), "not found")):
        compare_panel.cand_file.value = typed
        with pytest.raises(InputError, match=what) as err:
            compare_panel.candidate_file()
        assert "\n" not in str(err.value)
