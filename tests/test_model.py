"""Loading, fingerprints, structure and inventory, checked against direct counts with onnx."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import tiny_model
from onnx import TensorProto, helper

from workbench.model.graph import GraphInfo
from workbench.model.inventory import inventory
from workbench.model.load import load_model
from workbench.model.walk import iter_nodes


def test_load_from_path_bytes_and_proto_agree(tmp_path, tiny):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny, path)
    a, b, c = load_model(path), load_model(path.read_bytes()), load_model(tiny)
    assert a.source == "path" and b.source == "bytes" and c.source == "proto"
    assert a.fingerprint == b.fingerprint  # same bytes, same hash
    assert len(a.fingerprint) == 64
    assert a.path == path.absolute() and b.path is None
    assert [n.name for n in a.proto.graph.node] == ["/fc/MatMul", "/act/Relu"]


def test_callers_model_is_never_mutated(tmp_path):
    original = tiny_model(named=False)
    before = original.SerializeToString()
    loaded = load_model(original)
    assert [n.name for n in loaded.proto.graph.node] == ["MatMul_0", "Relu_1"]
    assert original.SerializeToString() == before
    loaded.proto.graph.node[0].name = "changed"
    assert original.graph.node[0].name == ""


def test_nothing_written_to_the_working_directory(tmp_path, monkeypatch, external_model_dir):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    load_model(external_model_dir / "model.onnx").graph  # noqa: B018 - builds the structure
    assert list(work.iterdir()) == []


def test_external_data_loaded_and_fingerprinted(external_model_dir, tiny):
    loaded = load_model(external_model_dir / "model.onnx")
    assert loaded.external_files == [external_model_dir / "weights.bin"]
    w = onnx.numpy_helper.to_array(loaded.proto.graph.initializer[0])
    np.testing.assert_array_equal(w, onnx.numpy_helper.to_array(tiny.graph.initializer[0]))
    # the fingerprint covers the weights: change one byte of weights.bin, the hash changes
    weights = external_model_dir / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[0] ^= 1
    weights.write_bytes(bytes(data))
    assert load_model(external_model_dir / "model.onnx").fingerprint != loaded.fingerprint


def test_external_data_in_subfolder_is_allowed(tmp_path):
    folder = tmp_path / "m"
    (folder / "data").mkdir(parents=True)
    onnx.save(tiny_model(), folder / "model.onnx", save_as_external_data=True, location="data/w.bin",
              size_threshold=0)
    assert load_model(folder / "model.onnx").external_files == [folder / "data" / "w.bin"]


def test_runs_in_onnxruntime_after_loading(external_model_dir):
    loaded = load_model(external_model_dir / "model.onnx")
    sess = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((1, 4), np.float32)
    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x @ w, 0), rtol=1e-6)


def test_unnamed_and_duplicate_nodes_get_stable_unique_names():
    m = tiny_model(named=False)
    m.graph.node[1].name = "dup"
    extra = helper.make_node("Identity", ["y"], ["y2"], name="dup")
    m.graph.node.append(extra)
    m.graph.output[0].name = "y2"
    first = load_model(m)
    names = [n.name for n in first.proto.graph.node]
    assert len(set(names)) == 3 and names[0] == "MatMul_0" and names[1] == "dup" and names[2].startswith("dup__")
    assert names == [n.name for n in load_model(m).proto.graph.node]  # stable


def _shuffled_model() -> onnx.ModelProto:
    """Nodes stored out of topological order (legal to build, common from hand-edited graphs)."""
    nodes = [
        helper.make_node("Relu", ["b"], ["c"], name="third"),
        helper.make_node("Neg", ["x"], ["a"], name="first"),
        helper.make_node("Abs", ["a"], ["b"], name="second"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_topological_order_and_maps():
    info = GraphInfo.build(_shuffled_model())
    assert [n.name for n in info.nodes] == ["first", "second", "third"]
    assert [n.topo_index for n in info.nodes] == [0, 1, 2]
    assert info.node("third").index == 0
    assert info.producer == {"c": "third", "a": "first", "b": "second"}
    assert info.consumers == {"b": ["third"], "x": ["first"], "a": ["second"]}
    assert info.topo_tensors == ["a", "b", "c"]


def test_shapes_dtypes_and_parameters(tiny):
    loaded = load_model(tiny)
    t = loaded.graph.tensors
    assert t["x"].kind == "input" and t["x"].shape == (1, 4) and t["x"].dtype == "float32"
    assert t["h"].kind == "intermediate" and t["h"].shape == (1, 4)
    assert t["W"].kind == "initializer"
    assert loaded.graph.param_count == 16 and loaded.graph.param_bytes == 64
    assert loaded.problems == []


def test_checker_problems_are_listed_not_raised():
    m = tiny_model()
    m.graph.node[0].input[1] = "does_not_exist"
    loaded = load_model(m)
    assert any(p.severity == "error" for p in loaded.problems)
    assert loaded.graph.nodes  # structure still available


def test_deprecated_op_flagged():
    node = helper.make_node("Upsample", ["x", "s"], ["y"], name="up", mode="nearest")
    s = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)])
    m.ir_version = 5
    inv = inventory(m)
    assert inv.deprecated_ops == ["Upsample"]
    assert any(p.code == "deprecated-op" and p.node == "up" for p in load_model(m).problems)


def test_subgraph_nodes_counted_and_listed():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"], name="abs"),
                                helper.make_node("Relu", ["e"], ["e2"], name="relu")], "else", [],
                               [helper.make_tensor_value_info("e2", TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("Identity", ["x0"], ["x"], name="pre"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2]),
                                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    loaded = load_model(m)
    subs = sorted((s.node, s.attribute, s.nodes, s.depth) for s in loaded.graph.subgraphs)
    assert subs == [("branch", "else_branch", 2, 1), ("branch", "then_branch", 1, 1)]
    inv = inventory(loaded.proto)
    assert sum(r.count for r in inv.ops) == len(list(iter_nodes(m.graph))) == 5
    assert {r.op_type: r.in_subgraphs for r in inv.ops}["Relu"] == 1
    # the If reads 'x' from the outer scope: it must come after 'pre' in topological order
    assert loaded.graph.consumers["x"] == ["branch"]


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_torch_module_export(exporter):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return torch.relu(self.drop(self.fc(x)))

    torch.manual_seed(0)
    net = Net().train()  # training mode on purpose: export must use eval semantics and restore it
    x = torch.randn(2, 4)
    loaded = load_model(net, example_inputs=(x,), opset=17, exporter=exporter, input_names=["x"],
                        output_names=["y"], dynamic_axes={"x": {0: "batch"}} if exporter == "legacy" else None)
    assert net.training, "the caller's module was switched to eval mode"
    assert loaded.source == "torch" and loaded.export.exporter == exporter
    assert loaded.export.requested_opset == 17
    assert loaded.export.actual_opset == {i.domain or "ai.onnx": i.version for i in loaded.proto.opset_import}[
        "ai.onnx"]
    sess = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = torch.relu(net.fc(x)).detach().numpy()
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not any(p.severity == "error" for p in loaded.problems)


def test_torch_export_failure_is_one_clear_error():
    torch = pytest.importorskip("torch")
    from workbench.errors import TorchExportError

    with pytest.raises(TorchExportError, match="example"):
        load_model(torch.nn.Linear(4, 3))
    with pytest.raises(TorchExportError, match="failed"):
        load_model(torch.nn.Linear(4, 3), example_inputs=(torch.randn(2, 5),))


def test_import_is_light():
    import subprocess
    import sys

    # what it imports, not how long that took (a loaded machine slows any import)
    code = ("import sys; import workbench; heavy = [m for m in ('torch', 'tensorrt', 'openvino', 'ipywidgets', "
            "'onnxruntime', 'plotly', 'scipy', 'pandas', 'ray') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}).stdout
    assert out.strip() == "[]"
