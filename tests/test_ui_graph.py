"""Graph view, Python side (issue 13, "Graph"): tensor shapes and dtypes on the edges, the hide Identity/Constant
toggle (elided nodes, bridged edges) and the node attribute inspector. The browser side (minimap, export, edge
labels, the 5,000-node timing) is tests/test_browser_graph.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench import load_model  # noqa: E402
from workbench.plots.graph import GraphView, graph_payload, node_details, summarize_value  # noqa: E402
from workbench.ui import GraphPanel  # noqa: E402


def netron_model() -> onnx.ModelProto:
    """x -> Conv (attributes, a weight) -> Identity -> Identity -> Add (+ a Constant) -> Relu -> y."""
    weight = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3) / 10, "conv.weight")
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=[1, 1], auto_pad="NOTSET"),
        helper.make_node("Identity", ["c"], ["i1"], name="id1"),
        helper.make_node("Identity", ["i1"], ["i2"], name="id2"),
        helper.make_node("Constant", [], ["k"], name="const",
                         value=numpy_helper.from_array(np.linspace(0, 1, 20, dtype=np.float32).reshape(4, 5)[:1], "k")),
        helper.make_node("Add", ["i2", "k"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 5, 5])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_edges_carry_their_tensor_name_dtype_and_shape():
    view = GraphView.from_graph(load_model(netron_model()).graph, constants=True)
    payload = graph_payload(view)
    ids, edges, tips = payload["ids"], payload["edges"], payload["edge_tips"]
    assert len(tips) == len(edges) // 2
    by_pair = {(ids[edges[k]], ids[edges[k + 1]]): tips[k // 2] for k in range(0, len(edges), 2)}
    assert by_pair[("conv", "id1")] == "c  float32 [1, 1, 5, 5]"
    assert by_pair[("add", "relu")] == "a  float32 [1, 1, 5, 5]"
    assert by_pair[("const", "add")] == "k  float32 [1, 5]"


def test_collapsed_scopes_list_the_tensors_their_edges_carry():
    nodes, prev = [], "x"
    for k in range(6):
        nodes.append(helper.make_node("Relu", [prev], [f"t{k}"], name=f"/s{k // 3}/Relu_{k}"))
        prev = f"t{k}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2, 3])])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    payload = graph_payload(GraphView.from_graph(model.graph), depth=1)
    assert payload["ids"] == ["scope:/s0", "scope:/s1"]
    assert payload["edge_tips"] == ["t2  float32 [2, 3]"]


def test_hiding_identity_and_constant_elides_them_and_bridges_their_edges():
    graph = load_model(netron_model()).graph
    shown = GraphView.from_graph(graph, constants=True)
    assert {"id1", "id2", "const"} <= set(shown.names)
    hidden = GraphView.from_graph(graph, hide=("Identity",))
    assert hidden.names == ["conv", "add", "relu"]
    assert sorted(hidden.hidden) == ["const", "id1", "id2"]
    pairs = {(hidden.names[u], hidden.names[v]) for u, v in hidden.edges}
    assert pairs == {("conv", "add"), ("add", "relu")}, "the edge through two Identity nodes is bridged"
    # the bridged edge is labelled with the tensor its consumer reads
    assert hidden.edge_tensors[hidden.edges.index((0, 1))] == "i2  float32 [1, 1, 5, 5]"


def test_the_panel_toggle_hides_and_shows_identity_and_constant_nodes():
    panel = GraphPanel(netron_model())
    assert panel.hide_trivial.value is True
    assert panel.canvas.data["ids"] == ["conv", "add", "relu"]
    ids, edges = panel.canvas.data["ids"], panel.canvas.data["edges"]
    assert (ids[edges[0]], ids[edges[1]]) == ("conv", "add")
    panel.hide_trivial.value = False
    assert set(panel.canvas.data["ids"]) == {"conv", "id1", "id2", "const", "add", "relu"}
    panel.hide_trivial.value = True
    panel.state.selected = "id1"  # picked in another panel while hidden: the toggle opens to show it
    assert panel.hide_trivial.value is False and panel.canvas.selected == "id1"


def test_attribute_inspector_shows_attributes_tensors_and_typed_inputs_outputs():
    model = load_model(netron_model())
    d = node_details(model.proto, model.graph, "conv")
    assert (d["op_type"], d["domain"]) == ("Conv", "ai.onnx")
    attrs = {a["name"]: (a["type"], a["value"]) for a in d["attributes"]}
    assert attrs["kernel_shape"] == ("ints", "[3, 3]")
    assert attrs["pads"] == ("ints", "[1, 1, 1, 1]")
    assert attrs["auto_pad"] == ("string", "NOTSET")
    x, w = d["inputs"]
    assert (x["name"], x["kind"], x["type"]) == ("x", "input", "float32 [1, 1, 5, 5]")
    assert (w["name"], w["kind"], w["type"]) == ("conv.weight", "initializer", "float32 [1, 1, 3, 3]")
    assert w["value"] == "tensor float32 [1, 1, 3, 3]: [0, 0.1, 0.2, 0.3, 0.4, 0.5, ...]"
    assert d["outputs"] == [{"name": "c", "kind": "intermediate", "type": "float32 [1, 1, 5, 5]"}]
    const = node_details(model.proto, model.graph, "const")
    assert const["attributes"][0]["value"].startswith("tensor float32 [1, 5]: [0, 0.0526316, ")
    assert summarize_value([1.5, 2.0]) == "[1.5, 2]"
    assert summarize_value(b"abc") == "abc"


def test_selecting_a_node_shows_the_inspector_in_the_panel():
    panel = GraphPanel(netron_model())
    panel.select("conv")
    info = panel.info.value
    assert "wb-inspector" in info
    for text in ("kernel_shape", "[1, 1, 1, 1]", "conv.weight", "initializer", "float32 [1, 1, 3, 3]",
                 "tensor float32 [1, 1, 3, 3]: [0, 0.1,", "outputs (1)", "float32 [1, 1, 5, 5]"):
        assert text in info, text


def test_the_inspector_is_a_side_pane_right_of_the_graph_with_a_hint_when_empty():
    from workbench.ui.graph_panel import HINT, PANE_WIDTH, TOOLBAR_HEIGHT

    panel = GraphPanel(netron_model(), height=400)
    assert panel.body in panel.children and panel.canvas not in panel.children
    assert panel.body.children == (panel.canvas, panel.side) and panel.side.children == (panel.info,)
    assert panel.side.layout.width == f"{PANE_WIDTH}px" and panel.side.layout.max_height == f"{400 + TOOLBAR_HEIGHT}px"
    assert panel.canvas.layout.flex.startswith("1 1")
    assert HINT in panel.info.value and "wb-inspector" not in panel.info.value
    panel.select("conv")
    assert "wb-inspector" in panel.info.value and HINT not in panel.info.value
    panel.canvas.height = 300  # the pane follows the graph's height
    assert panel.side.layout.max_height == f"{300 + TOOLBAR_HEIGHT}px"


def test_long_names_and_values_are_cut_with_the_whole_value_in_the_tooltip():
    import html

    from workbench.ui.graph_panel import MAX_SHOWN, inspector_html

    long = "n" * 1000
    out = inspector_html({"op_type": "Wide", "domain": "com.example", "attributes": [
        {"name": "note", "type": "string", "value": long}], "inputs": [], "outputs": [
        {"name": "/a/" + "b" * 500, "kind": "output", "type": "float32 [1]"}]})
    assert f"title='{long}'" in out, "the whole value in the tooltip"
    assert f">{'n' * (MAX_SHOWN - 1)}\u2026</code>" in out, "cut in the cell"
    assert html.escape("/a/" + "b" * 500) in out
    assert "style=" not in out, "colours come from the theme's CSS, not inline"


def test_a_big_weight_is_summarised_by_type_and_shape_without_decoding_it():
    big = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4096, 4096])  # no data: never decoded
    assert summarize_value(big) == "tensor float [4096, 4096]"


def test_a_reset_selection_clears_the_ring_so_the_node_can_be_picked_again():
    """A new run resets the selection: the canvas must drop its ring, else a click on that node sends the value it
    already holds (no change event) and selects nothing."""
    panel = GraphPanel(netron_model())
    panel.state.selected = "conv"
    assert panel.canvas.selected == "conv"
    panel.state.selected = ""
    assert panel.canvas.selected == ""
    panel.canvas.selected = "conv"  # what the front end sends on a click
    assert panel.state.selected == "conv"
