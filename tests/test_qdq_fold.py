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
    pairs = foldable_batchnorms(model)
    assert [(bn.name, conv.name) for bn, conv in pairs] == [("bn0", "conv0"), ("bn1", "deconv1")]
    folded, rewrites = fold_batchnorms(model, pairs)
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
    assert foldable_batchnorms(_model(shared_conv_output=True))[0][0].name == "bn1"
    assert len(foldable_batchnorms(_model(shared_conv_output=True))) == 1
    assert [bn.name for bn, _ in foldable_batchnorms(_model(transpose_group=2))] == ["bn0"]
