"""BatchNormalizations folded into the Conv before them (workbench.repair.qdq_fold): the folded model computes what
the original does, on onnx's reference evaluator, and only pairs that fold are folded."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from workbench.repair.qdq_fold import fold_batchnorms, foldable_batchnorms


def _model(shared_conv_output: bool = False, transpose_group: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name, *shape, low=-1.0, high=1.0):
        return numpy_helper.from_array(rng.uniform(low, high, shape).astype(np.float32), name)

    inits = [init("w0", 6, 3, 3, 3), init("b0", 6), init("w1", 6, 4, 2, 2)]
    for i, c in ((0, 6), (1, 4 * transpose_group)):
        inits += [init(f"g{i}", c, low=0.5, high=2.0), init(f"be{i}", c), init(f"m{i}", c, low=-50, high=50),
                  init(f"v{i}", c, low=1e2, high=1e6)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "g0", "be0", "m0", "v0"], ["n0"], name="bn0"),
             helper.make_node("ConvTranspose", ["n0", "w1"], ["c1"], name="deconv1", strides=[2, 2],
                              group=transpose_group),
             helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["y"], name="bn1")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 * transpose_group, 16, 16])]
    if shared_conv_output:
        outputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, [1, 6, 8, 8]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_folded_model_computes_the_original():
    model = _model()
    rewrites = foldable_batchnorms(model)
    assert [(rw.node, rw.into, rw.kind) for rw in rewrites] == [("bn0", "conv0", "fold-bn"),
                                                                ("bn1", "deconv1", "fold-bn")]
    folded = fold_batchnorms(model, rewrites)
    onnx.checker.check_model(folded, full_check=True)
    assert [n.op_type for n in folded.graph.node] == ["Conv", "ConvTranspose"]
    assert [r.to_json()["into"] for r in rewrites] == ["conv0", "deconv1"]
    assert [n.output[0] for n in folded.graph.node] == ["n0", "y"]  # the BatchNormalizations' names stay
    assert len(model.graph.node) == 4  # the original is not changed
    x = {"x": np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, x)[0]
    got = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_only_pairs_that_fold_are_folded():
    """A Conv output read elsewhere (here: a graph output) or a grouped ConvTranspose stays unfolded."""
    assert [rw.node for rw in foldable_batchnorms(_model(shared_conv_output=True))] == ["bn1"]
    assert [rw.node for rw in foldable_batchnorms(_model(transpose_group=2))] == ["bn0"]


def _same_function(model: onnx.ModelProto, folded: onnx.ModelProto, shape=(1, 3, 8, 8)) -> None:
    x = {"x": np.random.default_rng(2).normal(0, 1, shape).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, x)
    got = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
    for w, g in zip(want, got):
        assert np.abs(w).max() > 0.1
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def _conv_bn(x: str, y: str, w: str, bn: str, c: int, rng, epsilon: float | None = 1e-3, var=(1e2, 1e6)):
    """A Conv reading ``w`` (no bias) then a BatchNormalization named ``bn``: (nodes, its parameters)."""
    p = f"{y}_p"
    inits = [numpy_helper.from_array(rng.uniform(*a, c).astype(np.float32), f"{p}{k}")
             for k, a in enumerate([(0.5, 2.0), (-1, 1), (-5, 5), var])]
    kw = {} if epsilon is None else {"epsilon": epsilon}
    return [helper.make_node("Conv", [x, w], [f"{y}_c"], name=f"conv_{y}", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{y}_c", *(t.name for t in inits)], [y], name=bn, **kw)], inits


def _shared_weight_model(bn_names=("bn_y1", "bn_y2")) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    weight = helper.make_node("Constant", [], ["w"], name="w_const",
                              value=numpy_helper.from_array(rng.uniform(-1, 1, (3, 3, 3, 3)).astype(np.float32), "w"))
    n1, i1 = _conv_bn("x", "y1", "w", bn_names[0], 3, rng, epsilon=None, var=(1e-6, 1e-4))
    n2, i2 = _conv_bn("x", "y2", "w", bn_names[1], 3, rng, epsilon=None, var=(1e-6, 1e-4))
    out = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 3, 8, 8]) for y in ("y1", "y2")]
    graph = helper.make_graph([weight, *n1, *n2], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [1, 3, 8, 8])], out, i1 + i2)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_epsilon_default_shared_weights_and_constant_nodes():
    """Two Convs share one weight held by a Constant node, each followed by its own BatchNormalization (no epsilon
    attribute, variances near 0 where the default epsilon 1e-5 counts): both fold, into two new weights, the
    Constant and the BatchNormalization parameters are pruned, value_info of the Convs' old outputs is dropped, and
    the folded model computes the original (onnx's reference evaluator)."""
    model = _shared_weight_model()
    assert {v.name for v in model.graph.value_info} >= {"y1_c", "y2_c"}
    rewrites = foldable_batchnorms(model)
    assert [rw.into for rw in rewrites] == ["conv_y1", "conv_y2"]
    folded = fold_batchnorms(model, rewrites)
    onnx.checker.check_model(folded, full_check=True)
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Conv"]
    assert len({n.input[1] for n in folded.graph.node}) == 2  # a folded weight of its own for each Conv
    assert not {v.name for v in folded.graph.value_info} & {"y1_c", "y2_c"}
    assert len(folded.graph.initializer) == 4  # two weights, two biases: nothing of the originals left
    assert all(t.data_type == TensorProto.FLOAT for t in folded.graph.initializer)
    assert all(v is None for rw in rewrites for v in rw.values.values())  # no second copy of the weights held
    _same_function(model, folded)


def test_duplicate_names_are_left_unless_the_loader_named_them():
    """Two BatchNormalizations both named "bn" are not folded by name (either could be meant); the workbench's
    loader names them apart (as every model it loads), and then both fold."""
    from workbench.model.load import name_nodes

    model = _shared_weight_model(("bn", "bn"))
    assert foldable_batchnorms(model) == []
    name_nodes(model)
    rewrites = foldable_batchnorms(model)
    assert len(rewrites) == 2 and len({rw.node for rw in rewrites}) == 2
    _same_function(model, fold_batchnorms(model, rewrites))


def test_parameters_not_one_per_channel_or_training_mode_stay_unfolded():
    rng = np.random.default_rng(4)
    nodes, inits = _conv_bn("x", "y", "w", "bn", 3, rng)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (3, 3, 3, 3)).astype(np.float32), "w")

    def model_with(bn_attrs=None, scale_dims=None):
        ps = [onnx.TensorProto() for _ in inits]
        for p, t in zip(ps, inits):
            p.CopyFrom(t)
        if scale_dims is not None:
            ps[0].CopyFrom(numpy_helper.from_array(np.ones(scale_dims, np.float32), ps[0].name))
        bn = onnx.NodeProto()
        bn.CopyFrom(nodes[1])
        bn.attribute.extend(helper.make_attribute(k, v) for k, v in (bn_attrs or {}).items())
        graph = helper.make_graph([nodes[0], bn], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, *ps])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])

    assert len(foldable_batchnorms(model_with())) == 1
    assert foldable_batchnorms(model_with({"training_mode": 1})) == []
    assert foldable_batchnorms(model_with(scale_dims=[1])) == []
    assert foldable_batchnorms(model_with(), skip=["bn"]) == [] == foldable_batchnorms(model_with(), skip=["conv_y"])


def test_a_fold_never_takes_a_name_the_model_already_uses():
    """A model that already holds a tensor named like a fold's new weight (a model repaired before, say) keeps it:
    the fold's constants get fresh names."""
    from workbench.repair.graph import PREFIX

    model = _model()
    taken = np.arange(6, dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(taken, f"w0::{PREFIX}_fold"))
    model.graph.node.append(helper.make_node("Identity", [f"w0::{PREFIX}_fold"], ["kept"], name="keep"))
    model.graph.output.append(helper.make_tensor_value_info("kept", TensorProto.FLOAT, [6]))
    folded = fold_batchnorms(model, foldable_batchnorms(model))
    onnx.checker.check_model(folded, full_check=True)
    assert [n.op_type for n in folded.graph.node].count("BatchNormalization") == 0
    _same_function(model, folded)  # "kept" included: the tensor of that name is untouched
