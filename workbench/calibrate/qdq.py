"""Q/DQ pairs on chosen activation tensors of a float model (weights stay float): the sweep's variants.

Each tensor t gets ``QuantizeLinear(t, amax/127, 0:int8) -> DequantizeLinear`` and every reader of t (graph
outputs and subgraphs included) reads the dequantized value: the producer's output is renamed
``t__wb_float`` and the DequantizeLinear writes ``t``. A graph input's readers are re-pointed to its
dequantized copy instead. ONNX Runtime's QuantizeLinear rounds half to even and clips to [-128, 127].
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .exceptions import CalibrationError

_SUFFIX = "__wb"


def insert_qdq(model: onnx.ModelProto, amax: dict[str, float]) -> onnx.ModelProto:
    """A copy of ``model`` with an int8 Q/DQ pair after each tensor of ``amax`` (positive, finite values)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 10:
        raise CalibrationError(f"the model's opset {opset} has no QuantizeLinear", "re-export with opset >= 13")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    initializers = {t.name for t in g.initializer}
    graph_inputs = {i.name for i in g.input} - initializers
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.value_info, *g.input, *g.output]}
    producer = {o: i for i, node in enumerate(g.node) for o in node.output if o}
    after: dict[int, list[onnx.NodeProto]] = {}  # producer index -> Q/DQ nodes to place after it
    front: list[onnx.NodeProto] = []
    for name, a in amax.items():
        a = float(a)
        if not (math.isfinite(a) and a > 0):
            raise CalibrationError(f"amax {a} of tensor {name} is not a positive finite number")
        if types.get(name, TensorProto.FLOAT) not in (TensorProto.FLOAT, 0):
            raise CalibrationError(f"tensor {name} is not float32", "Q/DQ pairs are placed on float32 tensors")
        scale, zero = f"{name}{_SUFFIX}_scale", f"{name}{_SUFFIX}_zero_point"
        g.initializer.extend([numpy_helper.from_array(np.array(a / 127, np.float32), scale),
                              numpy_helper.from_array(np.array(0, np.int8), zero)])
        if name in producer:
            node = g.node[producer[name]]
            source, target = f"{name}{_SUFFIX}_float", name
            node.output[list(node.output).index(name)] = source
        elif name in graph_inputs:
            source, target = name, f"{name}{_SUFFIX}_dq"
            for reader in g.node:
                for i, inp in enumerate(reader.input):
                    if inp == name:
                        reader.input[i] = target
        else:
            raise CalibrationError(f"tensor {name} is neither a node output nor a graph input of the model")
        pair = [helper.make_node("QuantizeLinear", [source, scale, zero], [f"{name}{_SUFFIX}_int8"],
                                 name=f"{name}{_SUFFIX}_QuantizeLinear"),
                helper.make_node("DequantizeLinear", [f"{name}{_SUFFIX}_int8", scale, zero], [target],
                                 name=f"{name}{_SUFFIX}_DequantizeLinear")]
        (after.setdefault(producer[name], []) if name in producer else front).extend(pair)
    nodes = list(front)
    for i, node in enumerate(g.node):
        nodes += [node, *after.get(i, [])]
    copies = []
    for node in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(node)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)
    return out
