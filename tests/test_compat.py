"""Target-runtime compatibility: the data tables, the static check and the live runtime probes."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.compat import (
    ProbeResult,
    check_model,
    default_targets,
    find_target,
    list_targets,
    probe_onnxruntime,
    probe_openvino,
)
from workbench.compat.probe import parse_ort_error
from workbench.errors import WorkbenchError

IR = 8  # old enough for every runtime under test (onnx.helper would stamp its own, newer IR)


def _vi(name: str, shape=(1, 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape) if shape else None)


def _model(nodes, opset: int = 17, extra_opsets=(), inputs=None, outputs=None, inits=()) -> onnx.ModelProto:
    inputs, outputs = inputs or [_vi("x")], outputs or [_vi("y")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=imports, producer_name="tests")
    model.ir_version = IR
    return model


def valid_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="/fc/MatMul"),
        helper.make_node("Relu", ["h"], ["y"], name="/act/Relu"),
    ]
    return _model(nodes, inits=[w])


def custom_op_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="/act/Relu"),
        helper.make_node("Frobnicate", ["h"], ["y"], name="/custom/frob", domain="custom.test"),
    ]
    return _model(nodes, extra_opsets=[("custom.test", 1)])


def future_opset_model(opset: int = 30) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="/act/Relu")], opset=opset)


def _report(reports, name):
    return next(r for r in reports if r.target == name)


# --- (a) the data files -------------------------------------------------------------------------


def test_data_files_load_with_schema():
    data = resources.files("workbench.compat") / "data"
    runtimes = set()
    for fname in ("onnxruntime.json", "tensorrt.json", "openvino.json"):
        doc = json.loads((data / fname).read_text(encoding="utf-8"))
        assert doc["schema"] == "workbench.compat/1"
        assert doc["targets"], fname
        runtimes.add(doc["runtime"])
    assert runtimes == {"onnxruntime", "tensorrt", "openvino"}


def test_every_target_records_source_and_version():
    targets = list_targets()
    assert len(targets) >= 5
    for t in targets:
        assert t.source.strip(), t.name
        assert t.source_version.strip(), t.name
        assert t.version.strip(), t.name
        for ref in t.unsupported_ops + t.supported_ops:
            assert ref.domain and ref.op_type, t.name
        assert not {(r.domain, r.op_type) for r in t.unsupported_ops} & {
            (r.domain, r.op_type) for r in t.supported_ops
        }, t.name


def test_ort_rows_cover_114_onwards_and_opsets_increase():
    rows = sorted(
        (t for t in list_targets() if t.runtime == "onnxruntime"),
        key=lambda t: tuple(int(p) for p in t.version.split(".")),
    )
    versions = [t.version for t in rows]
    assert {"1.14", "1.15", "1.16", "1.17", "1.18"} <= set(versions)
    onnx_max = [t.max_opset["ai.onnx"] for t in rows]
    ml_max = [t.max_opset["ai.onnx.ml"] for t in rows]
    assert onnx_max == sorted(onnx_max) and onnx_max[0] < onnx_max[-1]
    assert ml_max == sorted(ml_max)


def test_tensorrt_tables_are_allow_lists():
    for name in ("TensorRT 8.6", "TensorRT 10.x"):
        t = find_target(name)
        assert t.is_allow_list
        supported = {r.op_type for r in t.supported_ops}
        assert {"Conv", "MatMul", "Relu"} <= supported
        assert "Unique" in {r.op_type for r in t.unsupported_ops}


def test_default_targets():
    names = [t.name for t in default_targets()]
    newest_ort = max(
        (t for t in list_targets() if t.runtime == "onnxruntime"),
        key=lambda t: tuple(int(p) for p in t.version.split(".")),
    )
    assert names == [newest_ort.name, "TensorRT 8.6", "TensorRT 10.x", "TensorRT 11.x", "OpenVINO"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("trt10", "TensorRT 10.x"),
        ("tensorrt-10", "TensorRT 10.x"),
        ("TensorRT 10.x", "TensorRT 10.x"),
        ("trt-10.15", "TensorRT 10.x"),
        ("TRT8.6", "TensorRT 8.6"),
        ("ort-1.18", "ONNX Runtime 1.18"),
        ("onnxruntime 1.16.3", "ONNX Runtime 1.16"),
        ("openvino", "OpenVINO"),
        ("ov", "OpenVINO"),
    ],
)
def test_find_target_forgiving_names(query, expected):
    assert find_target(query).name == expected


def test_find_target_unknown_lists_known_names():
    with pytest.raises(WorkbenchError) as err:
        find_target("coreml-7")
    assert "trt-10" in str(err.value) and "openvino" in str(err.value) and "ort-1.18" in str(err.value)
    for typed in str(err.value).split("(as typed): ")[1].split(", "):  # each spelling listed resolves
        assert find_target(typed).name


# --- (b) the static check -----------------------------------------------------------------------


def test_check_flags_unsupported_op_and_new_opset_with_node_names():
    # Unique is marked N in the onnx-tensorrt tables; opset 18 is past TensorRT 8.6's max (17).
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="/act/Relu"),
        helper.make_node("Unique", ["h"], ["y"], name="/post/Unique", sorted=1),
    ]
    model = _model(nodes, opset=18, outputs=[_vi("y", None)])
    reports = check_model(model, ["trt8.6", "trt10", "ort-1.18"])
    trt86 = _report(reports, "TensorRT 8.6")
    assert not trt86.ok and trt86.opset_ok is False
    assert trt86.model_opset == 18 and trt86.max_opset == 17
    assert [(u.op_type, u.nodes) for u in trt86.unsupported] == [("Unique", ["/post/Unique"])]
    trt10 = _report(reports, "TensorRT 10.x")
    assert not trt10.ok and trt10.opset_ok is True
    assert trt10.unsupported[0].nodes == ["/post/Unique"]
    assert _report(reports, "ONNX Runtime 1.18").ok
    json.dumps([r.to_json() for r in reports])  # plain data


def test_check_walks_subgraphs_and_flags_custom_domains():
    then_branch = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["t"], name="/if/then/frob", domain="custom.test")],
        "then",
        [],
        [_vi("t")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="/if/else/id")], "else", [], [_vi("e")]
    )
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], name="/cond", value=helper.make_tensor("v", TensorProto.BOOL, [], [True])
        ),
        helper.make_node("If", ["c"], ["y"], name="/if", then_branch=then_branch, else_branch=else_branch),
    ]
    model = _model(nodes, opset=17, extra_opsets=[("custom.test", 1)])
    reports = {r.target: r for r in check_model(model)}
    for name in ("TensorRT 10.x", "TensorRT 11.x", "OpenVINO", "ONNX Runtime 1.18"):
        rep = reports[name]
        assert not rep.ok, name
        (usage,) = rep.unsupported
        assert (usage.domain, usage.op_type, usage.nodes) == ("custom.test", "Frobnicate", ["/if/then/frob"])
        assert "custom domain" in usage.reason


def test_check_counts_and_samples_nodes():
    nodes = [helper.make_node("Det", ["x"], [f"d{i}"], name=f"/det{i}") for i in range(7)]
    model = _model(nodes, outputs=[_vi(f"d{i}", None) for i in range(7)], inputs=[_vi("x", (2, 2))])
    (rep,) = check_model(model, ["TensorRT 10.x"])
    (usage,) = rep.unsupported
    assert usage.count == 7 and len(usage.nodes) == 5


def test_check_valid_model_passes_everywhere():
    for rep in check_model(valid_model()):
        assert rep.ok, rep.to_json()


# --- (c) onnxruntime probe ----------------------------------------------------------------------


def test_probe_onnxruntime_valid_model():
    res = probe_onnxruntime(valid_model())
    assert isinstance(res, ProbeResult)
    assert res.ok is True and res.error is None
    assert res.providers_used == ["CPUExecutionProvider"]
    assert res.version


def test_probe_onnxruntime_names_custom_op_node():
    res = probe_onnxruntime(custom_op_model())
    assert res.ok is False
    assert res.rejected_node == "/custom/frob"
    assert (res.rejected_op_type, res.rejected_domain) == ("Frobnicate", "custom.test")
    assert "Frobnicate" in res.error and "\n" not in res.error


def test_probe_onnxruntime_future_opset_is_a_clear_error():
    res = probe_onnxruntime(future_opset_model(30))
    assert res.ok is False
    assert "Opset 30" in res.error and "under development" in res.error
    assert "onnxruntime_src" not in res.error and "\n" not in res.error
    assert res.rejected_node is None


def test_probe_onnxruntime_names_node_without_kernel():
    # Acos has no double kernel on the CPU EP: "Could not find an implementation for Acos(7) node ..."
    nodes = [helper.make_node("Acos", ["x"], ["y"], name="/math/acos")]
    vi = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, [2]) for n in ("x", "y")]
    res = probe_onnxruntime(_model(nodes, inputs=vi[:1], outputs=vi[1:]))
    assert res.ok is False
    assert (res.rejected_node, res.rejected_op_type, res.rejected_domain) == ("/math/acos", "Acos", "ai.onnx")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Could not find an implementation for Foo(13) node with name 'bar'", ("bar", "Foo", None)),
        (
            "[ONNXRuntimeError] : 10 : INVALID_GRAPH : x Node (bar) Op (Foo) [ShapeInferenceError] y",
            ("bar", "Foo", None),
        ),
        ("Fatal error: custom:MyOp(-1) is not a registered function/op", (None, "MyOp", "custom")),
        ("Opset 30 is under development", (None, None, None)),
    ],
)
def test_parse_ort_error(text, expected):
    got = parse_ort_error(text)
    assert (got["name"], got["op_type"], got["domain"]) == expected


# --- (d) openvino probe -------------------------------------------------------------------------

needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="openvino is not installed (optional extra)"
)


@needs_openvino
def test_probe_openvino_valid_model():
    res = probe_openvino(valid_model())
    assert res.ok is True and res.error is None and res.version


@needs_openvino
def test_probe_openvino_names_custom_op_node():
    res = probe_openvino(custom_op_model())
    assert res.ok is False
    assert res.rejected_node == "/custom/frob"
    assert (res.rejected_op_type, res.rejected_domain) == ("Frobnicate", "custom.test")
    assert "Frobnicate" in res.error and "\n" not in res.error


def test_probe_openvino_without_openvino(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError("no openvino")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    res = probe_openvino(valid_model())
    assert res.ok is None
    assert res.error == "openvino is not installed: pip install onnx-drift-workbench[openvino]"
