"""How ``ref:fp16`` does FP16 arithmetic: FP16 storage between nodes, each node's arithmetic as GPU kernels do it.

GPU FP16 kernels (cuBLAS/cuDNN tensor-core GEMMs and convolutions, PyTorch's reductions, softmax and
normalizations, TensorRT's INormalizationLayer) read FP16, accumulate in FP32 and round the result to FP16 once.
Element-wise kernels compute each value in FP32 and round it, which numpy's float16 ufuncs already do. So the
emulation keeps every tensor in FP16 (a node's output overflows to inf where the GPU's does) and, for the nodes
that accumulate, casts their FP16 inputs to FP32 and their outputs back to FP16 (:func:`accumulate_in_float32`).
Without it onnx's evaluator computes e.g. LayerNormalization's squared deviations in FP16, which overflow for
|x - mean| > 256 and zero the whole row where a GPU gives the right answer (``scripts/gpu_check.py`` measures
the emulation against CUDA FP16 kernels; README "GPU arithmetic").
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

#: ONNX ops whose GPU FP16 kernels accumulate (sums of products, reductions, normalizations) in FP32
ACCUMULATING = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum",
    "ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "CumSum", "Softmax", "LogSoftmax",
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
    "LpNormalization", "MeanVarianceNormalization",
    "AveragePool", "GlobalAveragePool", "LpPool", "GlobalLpPool",
})
#: the modes of :class:`~workbench.engines.reference.ReferenceEngine`'s ``accumulate`` option
MODES = ("float32", "float16")


def accumulate_in_float32(model: onnx.ModelProto, elem_types: dict[str, int]) -> tuple[onnx.ModelProto, int]:
    """``model`` (a copy is changed, never the argument) with every top-level accumulating node that reads FP16
    wrapped in Casts: its FP16 inputs cast to FP32, its FP16 outputs computed in FP32 and cast back under their
    own names (so marked tensors keep their names). ``elem_types``: tensor name -> ONNX element type.
    Returns (model, wrapped node count). Nodes inside If/Loop/Scan bodies are left as they are."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes: list[onnx.NodeProto] = []
    cast_up: dict[str, str] = {}  # fp16 tensor -> its fp32 copy (one Cast per tensor)
    taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | \
        {t.name for t in graph.initializer}
    wrapped = 0

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    for node in graph.node:
        half_in = [i for i in node.input if i and elem_types.get(i) == TensorProto.FLOAT16]
        if node.domain not in ("", "ai.onnx") or node.op_type not in ACCUMULATING or not half_in:
            nodes.append(node)
            continue
        wrapped += 1
        label = node.name or node.output[0]
        for tensor in half_in:
            if tensor not in cast_up:
                cast_up[tensor] = fresh(f"{tensor}__fp32")
                nodes.append(helper.make_node("Cast", [tensor], [cast_up[tensor]], to=TensorProto.FLOAT,
                                              name=fresh(f"{label}/fp32_in")))
        for k, name in enumerate(node.input):
            if name in cast_up:
                node.input[k] = cast_up[name]
        casts_down = []
        for k, name in enumerate(node.output):
            if name and elem_types.get(name) == TensorProto.FLOAT16:
                wide = fresh(f"{name}__fp32")
                node.output[k] = wide
                casts_down.append(helper.make_node("Cast", [wide], [name], to=TensorProto.FLOAT16,
                                                   name=fresh(f"{label}/fp16_out")))
        nodes.append(node)
        nodes.extend(casts_down)
    del graph.node[:]
    graph.node.extend(nodes)
    return out, wrapped
