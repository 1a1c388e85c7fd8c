"""A decoder-style transformer of about 1.5B parameters (6.2 GB FP32) in ONNX with external data, for the compare
benchmark: the graph built with onnx.helper, random weights from torch streamed to the data file tensor by tensor
(never the whole model in memory; no torch.onnx.export).

    python benchmarks/decoder_model.py --out /work/bigcache/decoder-1.5b [--dtype fp32|fp16] [--layers 28]

Architecture (pre-LayerNorm, GPT-like): token embedding 32000x2048 + learned positions, then N layers of
[LayerNorm, q/k/v MatMul 2048->2048 (16 heads of 128), causal attention with the softmax written out (matmul,
* 1/sqrt(128), + additive causal mask, softmax, matmul), output MatMul + residual, LayerNorm, FFN 2048->8192
(x * sigmoid(1.702 x)) ->2048 + residual], final LayerNorm and an untied LM head 2048->32000. Sequence 128, batch
1: input ``input_ids`` (int64 [1,128]), output ``logits`` (float32 [1,128,32000]). 28 layers: 1.54B parameters.
Weights: normal, std 0.02 (LayerNorm scales 1), ``torch.manual_seed(seed)`` per tensor in file order, so FP32 and
FP16 files hold the same values. ``--defect-layer K`` (default 17) scales layer K's FFN down-projection by 3e4: its
output overflows float16, so an FP16 comparison has a culprit to find (-1: none).

Files: ``<out>/decoder.onnx`` and ``<out>/decoder.onnx.data`` (fp16: ``decoder-fp16.onnx`` and its ``.data``), each
tensor at a 4096-byte-aligned offset (ONNX Runtime maps aligned external data), written to temporary names and
renamed when complete; reused when present.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

VOCAB, HIDDEN, HEADS, FFN, SEQ, LAYERS = 32000, 2048, 16, 8192, 128, 28
ALIGN = 4096
DEFECT_SCALE = 3e4


def param_count(layers: int = LAYERS) -> int:
    per_layer = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN + 4 * HIDDEN
    return 2 * VOCAB * HIDDEN + SEQ * HIDDEN + layers * per_layer + 2 * HIDDEN


def _graph(layers: int, fp16: bool, defect: int):
    """(nodes, weight specs [(name, shape, kind)], small initializers) of the decoder."""
    from onnx import TensorProto, helper, numpy_helper

    ft = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    npf = np.float16 if fp16 else np.float32
    nodes, weights, small = [], [], []

    def n(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=f"{out}_node", **kw))
        return out

    def w(name, shape, kind="normal"):
        weights.append((name, tuple(shape), kind))
        return name

    hd = HIDDEN // HEADS
    for name, value in (("split_shape", np.array([1, SEQ, HEADS, hd], np.int64)),
                        ("merge_shape", np.array([1, SEQ, HIDDEN], np.int64)),
                        ("scale", np.array(1 / math.sqrt(hd), npf)), ("gelu_k", np.array(1.702, npf))):
        small.append(numpy_helper.from_array(value, name))
    w("causal_mask", (1, 1, SEQ, SEQ), "causal")
    x = n("Gather", [w("wte", (VOCAB, HIDDEN)), "input_ids"], "tok")
    x = n("Add", [x, w("wpe", (1, SEQ, HIDDEN))], "emb")
    for i in range(layers):
        p = f"h{i}_"
        h = n("LayerNormalization", [x, w(p + "ln1_g", (HIDDEN,), "ones"), w(p + "ln1_b", (HIDDEN,), "zeros")],
              p + "ln1", epsilon=1e-5)
        heads = {}
        for k in ("q", "k", "v"):
            t = n("MatMul", [h, w(p + k + "_w", (HIDDEN, HIDDEN))], p + k)
            t = n("Reshape", [t, "split_shape"], p + k + "_split")
            heads[k] = n("Transpose", [t], p + k + "_t", perm=[0, 2, 3, 1] if k == "k" else [0, 2, 1, 3])
        s = n("MatMul", [heads["q"], heads["k"]], p + "scores")
        s = n("Mul", [s, "scale"], p + "scaled")
        s = n("Add", [s, "causal_mask"], p + "masked")
        s = n("Softmax", [s], p + "probs", axis=-1)
        t = n("MatMul", [s, heads["v"]], p + "ctx")
        t = n("Transpose", [t], p + "ctx_t", perm=[0, 2, 1, 3])
        t = n("Reshape", [t, "merge_shape"], p + "ctx_m")
        t = n("MatMul", [t, w(p + "o_w", (HIDDEN, HIDDEN))], p + "attn_out")
        x = n("Add", [x, t], p + "res1")
        h = n("LayerNormalization", [x, w(p + "ln2_g", (HIDDEN,), "ones"), w(p + "ln2_b", (HIDDEN,), "zeros")],
              p + "ln2", epsilon=1e-5)
        f = n("MatMul", [h, w(p + "up_w", (HIDDEN, FFN))], p + "up")
        g = n("Mul", [f, "gelu_k"], p + "gelu_in")
        g = n("Sigmoid", [g], p + "gelu_sig")
        f = n("Mul", [f, g], p + "gelu")
        f = n("MatMul", [f, w(p + "down_w", (FFN, HIDDEN), "defect" if i == defect else "normal")], p + "down")
        x = n("Add", [x, f], p + "res2")
    x = n("LayerNormalization", [x, w("lnf_g", (HIDDEN,), "ones"), w("lnf_b", (HIDDEN,), "zeros")], "lnf",
          epsilon=1e-5)
    if fp16:
        n("MatMul", [x, w("lm_head", (HIDDEN, VOCAB))], "logits_fp16")
        n("Cast", ["logits_fp16"], "logits", to=TensorProto.FLOAT)
    else:
        n("MatMul", [x, w("lm_head", (HIDDEN, VOCAB))], "logits")
    return nodes, weights, small, ft


def _values(shape, kind: str, seed: int):
    import torch

    if kind == "ones":
        return torch.ones(shape)
    if kind == "zeros":
        return torch.zeros(shape)
    if kind == "causal":
        return torch.triu(torch.full(shape, -10000.0), diagonal=1)
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=gen) * 0.02
    return t * DEFECT_SCALE if kind == "defect" else t


def build(out: Path, *, layers: int = LAYERS, dtype: str = "fp32", defect: int = 17, seed: int = 0) -> Path:
    """Write (or reuse) the model; return the .onnx path."""
    from onnx import TensorProto, helper

    fp16 = dtype == "fp16"
    out.mkdir(parents=True, exist_ok=True)
    final = out / ("decoder-fp16.onnx" if fp16 else "decoder.onnx")
    data_name = final.name + ".data"
    if final.exists() and (out / data_name).exists():
        return final
    nodes, weights, small, ft = _graph(layers, fp16, defect)
    tmp_data = out / f".{data_name}.tmp"
    inits = []
    with open(tmp_data, "wb") as fh:
        for k, (name, shape, kind) in enumerate(weights):
            values = _values(shape, kind, seed + k).numpy().astype(np.float16 if fp16 else np.float32)
            offset = fh.tell()
            pad = (-offset) % ALIGN
            fh.write(b"\0" * pad)
            offset += pad
            raw = values.tobytes()
            fh.write(raw)
            t = TensorProto(name=name, data_type=ft, dims=list(shape))
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = key, value
            inits.append(t)
            del values, raw
    graph = helper.make_graph(nodes, f"decoder-{layers}l-{dtype}",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, SEQ])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, SEQ, VOCAB])],
                              inits + small)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    tmp_model = out / f".{final.name}.tmp"
    tmp_model.write_bytes(model.SerializeToString())
    os.replace(tmp_data, out / data_name)
    os.replace(tmp_model, final)  # last: the .onnx exists only once its data does
    return final


def make_feed(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, VOCAB, size=(1, SEQ), dtype=np.int64)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the model (not inside a repository)")
    parser.add_argument("--dtype", choices=["fp32", "fp16"], nargs="+", default=["fp32"])
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--defect-layer", type=int, default=17)
    args = parser.parse_args(argv)
    for dtype in args.dtype:
        path = build(args.out, layers=args.layers, dtype=dtype, defect=args.defect_layer)
        size = path.stat().st_size + (path.parent / (path.name + ".data")).stat().st_size
        print(f"{dtype}: {param_count(args.layers) / 1e9:.2f}B parameters, {size / 2**30:.2f} GiB -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
