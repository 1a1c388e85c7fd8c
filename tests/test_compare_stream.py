"""Segment-streamed comparison (workbench.compare.stream) against the whole-model path on a 12-layer BERT-like
encoder (hidden 32, external data), and the cut points it streams at.

Tolerance: none is needed where both paths run the same ONNX Runtime kernels on the same values; per-tensor metrics
are compared with rel 1e-4 (SQNR: 1e-3 dB) in case a sub-graph's optimisation orders a sum differently."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.cli import main
from workbench.compare.api import compare
from workbench.compare.stream import StreamPlan
from workbench.compare.text import render
from workbench.model.segments import crossing, frontiers, plan_segments, side_nodes

LAYERS, HIDDEN, HEADS, FFN, SEQ, VOCAB = 12, 32, 2, 64, 16, 50
BAD_LAYER = 7  # its FFN output overflows float16: the culprit
TINY = ("l3_ffn_in_w", "l9_o_w")  # weights the FP16 converter clamps (underflow; harmless)


def _encoder() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def w(name, *shape, scale=0.2):
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name in TINY:  # values under FP16's smallest subnormal: the converter raises them (a clamp record)
            value.reshape(-1)[:3] = [1e-9, -2e-9, 3e-10]
        inits.append(numpy_helper.from_array(value, name))
        return name

    def c(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def n(op, ins, outs, **kw):
        nodes.append(helper.make_node(op, ins, outs, name=f"{outs[0]}_node", **kw))
        return outs[0]

    hd = HIDDEN // HEADS
    c("split_shape", np.array([1, SEQ, HEADS, hd], np.int64))
    c("merge_shape", np.array([1, SEQ, HIDDEN], np.int64))
    c("scale", np.array(1 / math.sqrt(hd), np.float32))
    c("one", np.array(1.0, np.float32))
    c("neg", np.array(-10000.0, np.float32))
    c("axes12", np.array([1, 2], np.int64))
    m = n("Unsqueeze", ["attention_mask", "axes12"], ["mask4"])
    m = n("Cast", [m], ["maskf"], to=TensorProto.FLOAT)
    m = n("Sub", ["one", m], ["maskinv"])
    mask = n("Mul", [m, "neg"], ["additive_mask"])
    x = n("Gather", [w("word", VOCAB, HIDDEN), "input_ids"], ["emb_word"])
    x = n("Add", [x, w("pos", 1, SEQ, HIDDEN)], ["emb_sum"])
    x = n("LayerNormalization", [x, w("emb_g", HIDDEN, scale=1.0), w("emb_b", HIDDEN)], ["emb"], epsilon=1e-5)
    for i in range(LAYERS):
        p = f"l{i}_"

        def lin(inp, fan_in, fan_out, name, scale=0.2, p=p):
            y = n("MatMul", [inp, w(p + name + "_w", fan_in, fan_out, scale=scale)], [p + name + "_mm"])
            return n("Add", [y, w(p + name + "_b", fan_out)], [p + name])

        heads = {}
        for h in ("q", "k", "v"):
            t = n("Reshape", [lin(x, HIDDEN, HIDDEN, h), "split_shape"], [p + h + "_split"])
            heads[h] = n("Transpose", [t], [p + h + "_t"], perm=[0, 2, 3, 1] if h == "k" else [0, 2, 1, 3])
        s = n("MatMul", [heads["q"], heads["k"]], [p + "scores"])
        s = n("Mul", [s, "scale"], [p + "scaled"])
        s = n("Add", [s, mask], [p + "masked"])
        s = n("Softmax", [s], [p + "probs"], axis=-1)
        t = n("MatMul", [s, heads["v"]], [p + "ctx"])
        t = n("Transpose", [t], [p + "ctx_t"], perm=[0, 2, 1, 3])
        t = n("Reshape", [t, "merge_shape"], [p + "ctx_m"])
        t = n("Add", [x, lin(t, HIDDEN, HIDDEN, "o")], [p + "res1"])
        x = n("LayerNormalization", [t, w(p + "ln1_g", HIDDEN, scale=1.0), w(p + "ln1_b", HIDDEN)], [p + "ln1"],
              epsilon=1e-5)
        f = lin(x, HIDDEN, FFN, "ffn_in")
        f = n("Relu", [f], [p + "relu"])
        f = lin(f, FFN, HIDDEN, "ffn_out", scale=3e4 if i == BAD_LAYER else 0.2)
        t = n("Add", [x, f], [p + "res2"])
        x = n("LayerNormalization", [t, w(p + "ln2_g", HIDDEN, scale=1.0), w(p + "ln2_b", HIDDEN)],
              ["last_hidden_state" if i == LAYERS - 1 else p + "ln2"], epsilon=1e-5)
    graph = helper.make_graph(
        nodes, "bert12", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, SEQ]),
                          helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, SEQ])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, SEQ, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module", params=["external", "embedded"])
def encoder(request, tmp_path_factory):
    """The encoder with its weights in external data, or in the .onnx file (streaming writes them out once)."""
    folder = tmp_path_factory.mktemp("stream")
    path = folder / "bert12.onnx"
    if request.param == "external":
        onnx.save_model(_encoder(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="bert12.onnx.data", size_threshold=1024)
    else:
        onnx.save_model(_encoder(), str(path))
    rng = np.random.default_rng(1)
    mask = np.ones((1, SEQ), np.int64)
    mask[:, -3:] = 0
    feeds = [{"input_ids": rng.integers(0, VOCAB, (1, SEQ)).astype(np.int64), "attention_mask": mask}]
    return path, feeds


def test_cut_points_are_single_tensor_frontiers(encoder):
    path, _ = encoder
    g = onnx.load(str(path), load_external_data=False).graph
    cuts = frontiers(g)
    side = side_nodes(g)
    # the additive mask's four nodes are side computation, recomputed where read; nothing else is
    assert {g.node[i].output[0] for i in side} == {"mask4", "maskf", "maskinv", "additive_mask"}
    # a layer boundary is a cut point, crossed by that layer's output alone
    boundaries = {f"l{i}_ln2" for i in range(LAYERS - 1)} | {"emb"}
    assert boundaries <= set(cuts.values())
    cross = crossing(g)
    producer = {o: i for i, nd in enumerate(g.node) for o in nd.output}
    for i, tensor in cuts.items():
        assert cross[i] == [tensor]
        # independently: exactly one non-side tensor made at or before i is read after i
        later = {r for nd in g.node[i + 1:] for r in nd.input}
        live = {o for j, nd in enumerate(g.node[:i + 1]) if j not in side for o in nd.output if o in later}
        assert live == {tensor}
        assert producer[tensor] <= i
    # inside a layer (q, k and v all read the layer input) there is no cut point
    assert not any(g.node[i].output[0] in ("l3_q", "l3_k_mm") for i in cuts)
    segments = plan_segments(g, 40_000)  # two layers of FFN weights (16 KB each) per segment
    assert len(segments) > 3
    assert segments[0].start == 0 and segments[-1].stop == len(g.node)
    for a, b in zip(segments, segments[1:]):
        assert a.stop == b.start and a.leaves == b.enters and cuts[a.stop - 1] == a.leaves


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, va in a.items():
        vb = b[key]
        if isinstance(va, float) and isinstance(vb, float):
            if math.isnan(va) or math.isinf(va):
                assert (math.isnan(va) and math.isnan(vb)) or va == vb, key
            else:
                assert vb == pytest.approx(va, rel=1e-4, abs=1e-3 if key == "sqnr_db" else 1e-7), key
        else:
            assert va == vb, key


def test_streamed_equals_whole_model(encoder):
    path, feeds = encoder
    common = dict(feeds=feeds, impact=0)
    whole = compare(str(path), "ort", "ort:fp16", stream="off", **common)
    plan = StreamPlan(str(path), "ort", "ort:fp16", feeds=feeds, impact=0, segment_size="40K")
    assert len(plan.segments) >= 6  # a few layers per segment
    streamed = plan.run()
    plan.close()
    assert whole.diverged and streamed.diverged
    assert streamed.failed == whole.failed
    assert [t.tensor for t in streamed.tensors] == [t.tensor for t in whole.tensors]
    for a, b in zip(whole.tensors, streamed.tensors):
        assert a.diverged == b.diverged, a.tensor
        _same(a.metrics, b.metrics)
        _same(a.floor or {}, b.floor or {})
    assert [c.node for c in streamed.culprits] == [c.node for c in whole.culprits]
    assert streamed.culprits[0].node.startswith(f"l{BAD_LAYER}_ffn_out")
    for a, b in zip(whole.culprits, streamed.culprits):
        _same(a.introduced, b.introduced)
        assert a.introduces_divergence == b.introduces_divergence
    assert streamed.first_divergent.tensor == whole.first_divergent.tensor
    assert set(TINY) <= {c["name"] for c in whole.variant["clamped"]}
    assert streamed.variant["clamped"] == whole.variant["clamped"]
    assert any("streamed in" in n for n in streamed.notes)
    doc = streamed.to_json()
    assert doc["culprits"][0]["node"] == whole.to_json()["culprits"][0]["node"]
    assert doc["verdict"] == whole.to_json()["verdict"]
    text = render(streamed)
    assert streamed.culprits[0].node in text


def test_cli_stream(encoder, tmp_path, capsys):
    path, _ = encoder
    out = tmp_path / "out.json"
    bundle = tmp_path / "bundle"
    assert main(["compare", str(path), "--stream", "on", "--segment-size", "40K", "--json", str(out),
                 "--bundle", str(bundle)]) == 1
    doc = json.loads(out.read_text())
    assert doc["verdict"]["diverged"] and doc["culprits"][0]["node"].startswith(f"l{BAD_LAYER}_ffn_out")
    assert any(n.startswith("streamed in 6 segment(s)") for n in doc["notes"])
    # auto streams only past the memory budget; "on" where streaming cannot apply is one line, exit 2
    assert main(["compare", str(path), "--memory-budget", "300K", "--segment-size", "40K", "--json", str(out)]) == 1
    assert any(n.startswith("streamed in") for n in json.loads(out.read_text())["notes"])
    assert main(["compare", str(path), "--mode", "bisect", "--json", str(out)]) in (0, 1)
    assert not any(n.startswith("streamed in") for n in json.loads(out.read_text())["notes"])
    capsys.readouterr()
    main(["rerun", str(bundle)])  # the bundle's own model file, streamed again: the same results
    assert "per-tensor sqnr_db: no change" in capsys.readouterr().out
    assert main(["compare", str(path), "--stream", "on", "--mode", "bisect"]) == 2
    assert "cannot stream this comparison" in capsys.readouterr().err
