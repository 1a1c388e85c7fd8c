"""What the INT8 anchors count as float (benchmarks/anchors_int8.py ``high_precision``) and how they put NNCF's
models in TensorRT's activation format (benchmarks/nncf_tensorrt_format.py ``tensorrt_format``), on small Q/DQ
graphs built here and judged with numpy and onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from conftest import load_file
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]


def _qdq_model(input_pair: bool, activation_dtype=TensorProto.INT8, per_channel_input: bool = False):
    """x -> [Q/DQ] -> MatMul(DQ(int8 weight, per column)) -> y. The input pair: int8 or uint8 (zero point 0), one
    scale or one per input column (axis 1)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.full(3, 0.01, np.float32), "w_s"),
             numpy_helper.from_array(np.zeros(3, np.int8), "w_z")]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=1)]
    x = "x"
    if input_pair:
        scale = np.array([0.02, 0.01, 0.04, 0.03], np.float32) if per_channel_input else np.array(0.04, np.float32)
        zero = np.zeros(scale.shape, np.uint8 if activation_dtype == TensorProto.UINT8 else np.int8)
        inits += [numpy_helper.from_array(scale, "x_s"), numpy_helper.from_array(zero, "x_z")]
        axis = {"axis": 1} if per_channel_input else {}
        nodes += [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], **axis),
                  helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], **axis)]
        x = "x_dq"
    nodes.append(helper.make_node("MatMul", [x, "w"], ["y"], name="mm"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_layer_whose_input_is_float_counts_as_float(tmp_path):
    anchors = load_file(REPO / "benchmarks" / "anchors_int8.py")
    for input_pair, want in ((True, (0, 0)), (False, (1, 4 * 3 * 4))):
        path = tmp_path / f"m{int(input_pair)}.onnx"
        onnx.save(_qdq_model(input_pair), path)
        assert anchors.high_precision(path) == want  # the dequantized weight counted at 4 bytes a value


def test_tensorrt_format_makes_activation_pairs_signed_and_per_tensor():
    fmt = load_file(REPO / "benchmarks" / "nncf_tensorrt_format.py")
    x = np.abs(np.random.default_rng(1).standard_normal((2, 4))).astype(np.float32)
    for dtype, per_channel in ((TensorProto.UINT8, False), (TensorProto.INT8, True)):
        model = _qdq_model(True, dtype, per_channel)
        converted, unsigned, channels = fmt.tensorrt_format(model)
        assert (unsigned, channels) == (int(dtype == TensorProto.UINT8), int(per_channel))
        inits = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
        assert inits["x_z"].dtype == np.int8 and inits["x_z"].shape == inits["x_s"].shape == ()
        assert inits["w_s"].shape == (3,)  # the weight keeps its per-column scales
        scale = 0.04 * (255 / 127 if dtype == TensorProto.UINT8 else 1)
        expect = np.clip(np.round(x / scale), -128, 127) * scale  # numpy: the signed per-tensor pair
        w_q = next(t for t in model.graph.initializer if t.name == "w_q")
        w = numpy_helper.to_array(w_q).astype(np.float32) * 0.01
        session = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
        got = session.run(None, {"x": x})
        np.testing.assert_allclose(got[0], expect.astype(np.float32) @ w, rtol=1e-5, atol=1e-6)
