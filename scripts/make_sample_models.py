"""Generate the deterministic ONNX sample models (each with one planted numerical fault) in sample_models/.

Usage: ``python scripts/make_sample_models.py [--out DIR]``. Graphs are built with ``onnx.helper`` and
weights come from ``numpy.random.default_rng`` with fixed seeds, so repeated runs give identical bytes.
``build_all(out_dir)`` writes every model plus ``manifest.json`` and returns the manifest dict.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import math
import os
import pathlib
import shutil
import tempfile
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

logger = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_models"
OPSET = 17
IR_VERSION = 8
PRODUCER = "workbench.samples"
SCHEMA = "workbench.samples/1"
GENERATOR = "scripts/make_sample_models.py"
FP16_PAIR = {"reference": "ort", "candidate": "ort:fp16"}
#: FP16 arithmetic overflow reaches the outputs only where FP16 is computed in FP16: ONNX Runtime's CPU provider
#: computes most FP16 ops in FP32, so there it stays an internal inf (an "internal dip"); ref:fp16 emulates a GPU
OVERFLOW_PAIR = {"reference": "ref", "candidate": "ref:fp16"}
INT8_PAIR = {"reference": "ort", "candidate": "ort:int8"}
NORMAL = "standard normal, numpy.random.default_rng(0)"
FILE_MODE = 0o644


class GraphBuilder:
    """Collects nodes and initializers with scoped names like ``/stage2/conv/Conv`` (node) and
    ``/stage2/conv/Conv_output_0`` (tensor); every name must be unique within the model."""

    def __init__(self, names: set[str] | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._names = names if names is not None else set()

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate name {name!r}")
        self._names.add(name)
        return name

    def init(self, name: str, array: np.ndarray | float, dtype=np.float32) -> str:
        """Add an initializer and return its name."""
        arr = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        self.initializers.append(numpy_helper.from_array(arr, self._claim(name)))
        return name

    def node(self, op: str, scope: str, inputs: list[str], *, suffix: str = "", output: str | None = None,
             **attrs) -> str:
        """Add a single-output node named ``{scope}/{op}{suffix}``; return its output tensor name."""
        name = self._claim(f"{scope}/{op}{suffix}")
        out = self._claim(output or f"{name}_output_0")
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def graph(self, name: str, inputs: list, outputs: list, doc: str) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, inputs, outputs, self.initializers, doc_string=doc)


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name=PRODUCER, producer_version="1", doc_string=doc)
    onnx.checker.check_model(model, full_check=True)
    return model


def _vi(name: str, shape: list[int], elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _conv(b: GraphBuilder, rng, scope: str, x: str, c_in: int, c_out: int, *, stride: int = 1,
          weight: np.ndarray | None = None, bias: np.ndarray | None = None) -> str:
    """3x3 same-padded Conv with He-initialised weights unless ``weight`` is given."""
    if weight is None:
        weight = _normal(rng, (c_out, c_in, 3, 3), math.sqrt(2.0 / (c_in * 9)))
    if bias is None:
        bias = np.zeros(c_out, np.float32)
    w = b.init(f"{scope}/weight", weight)
    bb = b.init(f"{scope}/bias", bias)
    return b.node("Conv", scope, [x, w, bb], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride])


def _linear(b: GraphBuilder, scope: str, x: str, weight: np.ndarray, bias: np.ndarray | None = None,
            output: str | None = None) -> str:
    """MatMul (+ Add bias) with weight ``[in, out]``."""
    w = b.init(f"{scope}/weight", weight)
    if bias is None:
        return b.node("MatMul", scope, [x, w], output=output)
    y = b.node("MatMul", scope, [x, w])
    return b.node("Add", scope, [y, b.init(f"{scope}/bias", bias)], output=output)


# --------------------------------------------------------------------------------------------------- models


def build_cnn_fp16_overflow() -> tuple[onnx.ModelProto, dict]:
    """(a) One Conv with large positive weights whose activations exceed the FP16 range."""
    rng = np.random.default_rng(101)
    b = GraphBuilder()
    doc = ("Planted fault (fp16_overflow): /stage2/conv/Conv has positive weights U(1000, 5000), so for "
           "standard-normal or uniform[0,1] images its output /stage2/conv/Conv_output_0 reaches ~1e5-4e5 "
           "> 65504 (FP16 max) -> inf in FP16 -> NaN logits; /stage2/scale/Mul (x1e-4) brings FP32 values "
           "back to ~10-40, and every other tensor stays below ~100.")
    h = _conv(b, rng, "/stage1/conv", "image", 3, 8, bias=np.full(8, 0.5, np.float32))
    h = b.node("Relu", "/stage1/relu", [h])
    big = rng.uniform(1000.0, 5000.0, (16, 8, 3, 3)).astype(np.float32)
    h = _conv(b, rng, "/stage2/conv", h, 8, 16, stride=2, weight=big)
    h = b.node("Mul", "/stage2/scale", [h, b.init("/stage2/scale/factor", 1e-4)])
    h = b.node("Relu", "/stage2/relu", [h])
    h = _conv(b, rng, "/stage3/conv", h, 16, 16, weight=_normal(rng, (16, 16, 3, 3), 0.02))
    h = b.node("Relu", "/stage3/relu", [h])
    h = b.node("GlobalAveragePool", "/head/pool", [h])
    h = b.node("Flatten", "/head/flatten", [h], axis=1)
    w = b.init("/head/fc/weight", _normal(rng, (10, 16), 0.1))
    bias = b.init("/head/fc/bias", np.zeros(10, np.float32))
    b.node("Gemm", "/head/fc", [h, w, bias], output="logits", transB=1)
    graph = b.graph("cnn_fp16_overflow", [_vi("image", [1, 3, 32, 32])], [_vi("logits", [1, 10])], doc)
    meta = {
        "description": "Small 3-stage CNN (10 logits) with an FP16 activation overflow in stage 2.",
        "inputs": {"image": {"shape": [1, 3, 32, 32], "dtype": "float32",
                             "recipe": NORMAL + " (uniform [0,1] triggers the fault too)"}},
        "fault": {
            "kind": "fp16_overflow", "node": "/stage2/conv/Conv", "tensor": "/stage2/conv/Conv_output_0",
            "op_type": "Conv", "pair": OVERFLOW_PAIR,
            "explanation": ("Conv weights U(1000, 5000) drive /stage2/conv/Conv_output_0 to ~1e5-4e5 "
                            "(> 65504) while every upstream tensor stays below ~10, so FP16 turns it into "
                            "inf and the logits into NaN/inf; this is the first tensor to overflow."),
        },
    }
    return _model(graph, doc), meta


def causal_mask(seq: int = 16) -> np.ndarray:
    """Additive causal mask [1, 1, seq, seq]: 0 on and below the diagonal, -inf above."""
    mask = np.zeros((seq, seq), np.float32)
    mask[np.triu_indices(seq, k=1)] = -np.inf
    return mask[None, None]


def transformer_block_inputs() -> dict[str, np.ndarray]:
    """The recommended feed for transformer_block.onnx (seed 0)."""
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((1, 16, 64)).astype(np.float32), "attention_mask": causal_mask(16)}


def build_transformer_block() -> tuple[onnx.ModelProto, dict]:
    """(b) Pre-norm transformer block whose decomposed second LayerNorm squares values beyond FP16 range."""
    rng = np.random.default_rng(202)
    seq, dim, heads = 16, 64, 4
    hd = dim // heads
    b = GraphBuilder()
    doc = ("Planted fault (fp16_overflow): the attention output projection /block/attn/out_proj has large "
           "weights (std 40), so the residual stream entering the decomposed LayerNorm /block/ln2 has "
           "deviations of several hundred; /block/ln2/Pow (d^2) reaches ~1e5-1e6 > 65504 -> inf in FP16 "
           "while everything before it stays < ~2000. attention_mask is an additive causal mask whose -inf "
           "entries (and /block/attn/mask/Add_output_0) are non-finite by design, not errors.")
    n1 = b.node("LayerNormalization", "/block/ln1",
                ["x", b.init("/block/ln1/weight", 1.0 + _normal(rng, (dim,), 0.1)),
                 b.init("/block/ln1/bias", _normal(rng, (dim,), 0.1))], axis=-1, epsilon=1e-5)
    shape4 = b.init("/block/attn/heads_shape", np.array([1, seq, heads, hd]), dtype=np.int64)

    def proj(name: str) -> str:
        scope = f"/block/attn/{name}_proj"
        weight = _normal(rng, (dim, dim), 1.0 / math.sqrt(dim))
        return _linear(b, scope, n1, weight, _normal(rng, (dim,), 0.02))

    q, k, v = proj("q"), proj("k"), proj("v")
    q = b.node("Reshape", "/block/attn/q_heads", [q, shape4])
    q = b.node("Transpose", "/block/attn/q_heads", [q], perm=[0, 2, 1, 3])
    k = b.node("Reshape", "/block/attn/k_heads", [k, shape4])
    k = b.node("Transpose", "/block/attn/k_heads", [k], perm=[0, 2, 3, 1])
    v = b.node("Reshape", "/block/attn/v_heads", [v, shape4])
    v = b.node("Transpose", "/block/attn/v_heads", [v], perm=[0, 2, 1, 3])
    s = b.node("MatMul", "/block/attn/scores", [q, k])
    s = b.node("Mul", "/block/attn/scale", [s, b.init("/block/attn/scale/factor", 1.0 / math.sqrt(hd))])
    s = b.node("Add", "/block/attn/mask", [s, "attention_mask"])
    p = b.node("Softmax", "/block/attn/softmax", [s], axis=-1)
    ctx = b.node("MatMul", "/block/attn/context", [p, v])
    ctx = b.node("Transpose", "/block/attn/merge", [ctx], perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", "/block/attn/merge", [ctx, b.init("/block/attn/merge_shape", np.array(
        [1, seq, dim]), dtype=np.int64)])
    a = _linear(b, "/block/attn/out_proj", ctx, _normal(rng, (dim, dim), 40.0), _normal(rng, (dim,), 1.0))
    h = b.node("Add", "/block/residual1", ["x", a])
    # Second LayerNorm, decomposed the way torch.onnx exports it.
    ln = "/block/ln2"
    mu = b.node("ReduceMean", ln, [h], axes=[-1], keepdims=1)
    d = b.node("Sub", ln, [h, mu])
    sq = b.node("Pow", ln, [d, b.init(f"{ln}/exponent", 2.0)])
    var = b.node("ReduceMean", ln, [sq], suffix="_1", axes=[-1], keepdims=1)
    var = b.node("Add", ln, [var, b.init(f"{ln}/epsilon", 1e-5)])
    std = b.node("Sqrt", ln, [var])
    n2 = b.node("Div", ln, [d, std])
    n2 = b.node("Mul", ln, [n2, b.init(f"{ln}/weight", 1.0 + _normal(rng, (dim,), 0.1))])
    n2 = b.node("Add", ln, [n2, b.init(f"{ln}/bias", _normal(rng, (dim,), 0.1))], suffix="_1")
    m = _linear(b, "/block/mlp/fc1", n2, _normal(rng, (dim, 4 * dim), 1.0 / math.sqrt(dim)),
                _normal(rng, (4 * dim,), 0.02))
    act = "/block/mlp/act"  # GELU(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
    g = b.node("Div", act, [m, b.init(f"{act}/sqrt2", math.sqrt(2.0))])
    g = b.node("Erf", act, [g])
    g = b.node("Add", act, [g, b.init(f"{act}/one", 1.0)])
    g = b.node("Mul", act, [m, g])
    g = b.node("Mul", act, [g, b.init(f"{act}/half", 0.5)], suffix="_1")
    # MLP output of the same order as the residual stream, so the FP16 fault is visible at y too.
    m = _linear(b, "/block/mlp/fc2", g, _normal(rng, (4 * dim, dim), 50.0 / math.sqrt(4 * dim)),
                _normal(rng, (dim,), 0.02))
    b.node("Add", "/block/residual2", [h, m], output="y")
    graph = b.graph("transformer_block", [_vi("x", [1, seq, dim]), _vi("attention_mask", [1, 1, seq, seq])],
                    [_vi("y", [1, seq, dim])], doc)
    meta = {
        "description": ("Pre-norm transformer block (4 heads, d=64, seq 16, causal additive mask, GELU MLP) "
                        "with a decomposed second LayerNorm whose squared deviation overflows FP16."),
        "inputs": {
            "x": {"shape": [1, seq, dim], "dtype": "float32", "recipe": NORMAL},
            "attention_mask": {"shape": [1, 1, seq, seq], "dtype": "float32", "recipe": "causal -inf mask"},
        },
        "recommended_inputs": {"attention_mask": "causal -inf mask"},
        "nonfinite_by_design": ["attention_mask", "/block/attn/mask/Add_output_0"],
        "fault": {
            "kind": "fp16_overflow", "node": "/block/ln2/Pow", "tensor": "/block/ln2/Pow_output_0",
            "op_type": "Pow", "pair": OVERFLOW_PAIR,
            "explanation": ("The attention out-projection (weight std 40) puts residual deviations of "
                            "several hundred into /block/ln2, so /block/ln2/Pow_output_0 = d^2 reaches "
                            "~1e5-1e6 (> 65504) while earlier tensors stay < ~2000; the causal mask's -inf "
                            "is expected and is not an error."),
        },
    }
    return _model(graph, doc), meta


def build_fp16_clamp_constant() -> tuple[onnx.ModelProto, dict]:
    """(c) BatchNorm running variance 9.8e7 that FP16 converters clamp to 1e4, plus a harmless 1e-9 eps."""
    rng = np.random.default_rng(303)
    big_ch, c = 3, 8
    b = GraphBuilder()
    doc = ("Planted fault (fp16_constant_clamp): /bn_big_var/running_var[3] = 9.8e7 (channel 3 of /conv/Conv "
           "has weights ~N(0, 1500^2) so its output is ~1e4 and BN rescales it to ~1). FP16 converters "
           "(onnxconverter_common float16, max_finite_val=1e4) clamp it to 1e4, making channel 3 ~99x too "
           "large. /head/eps = 1e-9 is also clamped (to 1e-7) but harmlessly.")
    w = _normal(rng, (c, 4, 3, 3), math.sqrt(2.0 / 36))
    w[big_ch] = _normal(rng, (4, 3, 3), 1500.0)
    h = _conv(b, rng, "/conv", "image", 4, c, weight=w)
    var = rng.uniform(0.8, 1.2, c).astype(np.float32)
    var[big_ch] = 9.8e7
    bn = "/bn_big_var"
    h = b.node("BatchNormalization", bn, [
        h, b.init(f"{bn}/weight", np.ones(c, np.float32)), b.init(f"{bn}/bias", np.zeros(c, np.float32)),
        b.init(f"{bn}/running_mean", np.zeros(c, np.float32)), b.init(f"{bn}/running_var", var)],
        epsilon=1e-5)
    h = b.node("Relu", "/relu", [h])
    h = b.node("GlobalAveragePool", "/head/pool", [h])
    h = b.node("Flatten", "/head/flatten", [h], axis=1)
    h = b.node("Add", "/head/eps", [h, b.init("/head/eps", 1e-9)])
    fc_w = _normal(rng, (5, c), 0.5)
    fc_w[:, big_ch] *= 2.0
    b.node("Gemm", "/head/fc", [h, b.init("/head/fc/weight", fc_w), b.init("/head/fc/bias", np.zeros(5))],
           output="logits", transB=1)
    graph = b.graph("fp16_clamp_constant", [_vi("image", [1, 4, 16, 16])], [_vi("logits", [1, 5])], doc)
    meta = {
        "description": ("Conv -> BatchNorm -> Relu -> pool -> Gemm whose BN variance constant is clamped by "
                        "FP16 converters."),
        "inputs": {"image": {"shape": [1, 4, 16, 16], "dtype": "float32", "recipe": NORMAL}},
        "fault": {
            "kind": "fp16_constant_clamp", "node": "/bn_big_var/BatchNormalization",
            "tensor": "/bn_big_var/BatchNormalization_output_0", "op_type": "BatchNormalization",
            "pair": FP16_PAIR, "initializer": "/bn_big_var/running_var",
            "constants": [
                {"initializer": "/bn_big_var/running_var", "index": big_ch, "value": 9.8e7, "clamped_to": 1e4,
                 "harmful": True},
                {"initializer": "/head/eps", "index": 0, "value": 1e-9, "clamped_to": 1e-7, "harmful": False},
            ],
            "explanation": ("running_var[3] = 9.8e7 (sqrt ~9900) normalises a conv channel of magnitude ~1e4 "
                            "to ~1, but convert_float_to_float16 clamps it to max_finite_val 1e4 (sqrt 100), "
                            "so that channel comes out ~99x too large; the 1e-9 /head/eps clamp to 1e-7 is "
                            "harmless and should rank below it."),
        },
    }
    return _model(graph, doc), meta


def build_int8_outlier() -> tuple[onnx.ModelProto, dict]:
    """(d) MLP whose hidden tensor has one outlier channel that ruins max-calibrated INT8 scales."""
    rng = np.random.default_rng(404)
    d_in, h1, h2, out, col = 64, 32, 2048, 10, 7
    b = GraphBuilder()
    doc = ("Planted fault (int8_outlier): column 7 of /mlp/fc2/Add_output_0 (bias 350) is always ~300-400 "
           "while the other 2047 columns are ~N(0,1); a max-calibrated INT8 scale (amax/127 ~ 3.1) collapses "
           "ordinary values to a few levels (SQNR ~2 dB), while a 99.9-percentile scale ignores the 0.05% "
           "outlier elements.")
    h = _linear(b, "/mlp/fc1", "x", _normal(rng, (d_in, h1), math.sqrt(1.0 / d_in)), _normal(rng, (h1,), 0.1))
    h = b.node("Relu", "/mlp/relu1", [h])
    w2 = _normal(rng, (h1, h2), math.sqrt(2.0 / h1))
    w2[:, col] *= 30.0
    b2 = _normal(rng, (h2,), 0.1)
    b2[col] = 350.0
    h = _linear(b, "/mlp/fc2", h, w2, b2)
    h = b.node("Relu", "/mlp/relu2", [h])
    w3 = _normal(rng, (h2, out), math.sqrt(1.0 / h2))
    w3[col] *= 0.01
    _linear(b, "/mlp/fc3", h, w3, np.zeros(out, np.float32), output="logits")
    graph = b.graph("int8_outlier", [_vi("x", [1, d_in])], [_vi("logits", [1, out])], doc)
    meta = {
        "description": "3-layer MLP (64 -> 32 -> 2048 -> 10) with a systematic outlier channel for INT8.",
        "inputs": {"x": {"shape": [1, d_in], "dtype": "float32", "recipe": NORMAL}},
        "calibration": {"recipe": "x ~ standard normal", "seed": 0, "count": 32,
                        "generator": "rng = numpy.random.default_rng(0); 32 x rng.standard_normal((1, 64))"},
        "fault": {
            "kind": "int8_outlier", "node": "/mlp/fc2/Add", "tensor": "/mlp/fc2/Add_output_0",
            "op_type": "Add", "pair": INT8_PAIR, "outlier_channel": col,
            "explanation": ("Column 7 of /mlp/fc2/Add_output_0 sits at ~300-400 while the other 2047 "
                            "columns stay within ~5, so max calibration (scale ~3.1) leaves ordinary values "
                            "at SQNR ~2 dB whereas 99.9-percentile calibration (outliers are 0.05% of "
                            "elements) gives ~37 dB."),
        },
    }
    return _model(graph, doc), meta


def build_if_subgraph() -> tuple[onnx.ModelProto, dict]:
    """(e) If node whose then-branch Exp overflows FP16."""
    rng = np.random.default_rng(505)
    names: set[str] = set()
    outer, then_b, else_b = GraphBuilder(names), GraphBuilder(names), GraphBuilder(names)
    doc = ("Planted fault (fp16_overflow) inside a subgraph: /branch/then/Exp computes exp(4*h + 8) with "
           "h = x @ W + 1 ~ N(1, 0.4^2), giving ~5e4-2e6 (mostly > 65504, the FP16 max) before "
           "/branch/then/Div divides by 8192; the overflow is observable at /branch/If_output_0 when use_exp "
           "is True.")
    h = _linear(outer, "/pre", "x", _normal(rng, (8, 8), 0.15), np.ones(8, np.float32))
    t = then_b.node("Mul", "/branch/then", [h, then_b.init("/branch/then/scale", 4.0)])
    t = then_b.node("Add", "/branch/then", [t, then_b.init("/branch/then/shift", 8.0)])
    t = then_b.node("Exp", "/branch/then", [t])
    t = then_b.node("Div", "/branch/then", [t, then_b.init("/branch/then/divisor", 8192.0)])
    e = _linear(else_b, "/branch/else", h, _normal(rng, (8, 8), 0.5))
    e = else_b.node("Relu", "/branch/else", [e])
    then_g = then_b.graph("/branch/then", [], [_vi(t, [1, 8])], "Exp branch (overflows in FP16).")
    else_g = else_b.graph("/branch/else", [], [_vi(e, [1, 8])], "MatMul + Relu branch (healthy).")
    y = outer.node("If", "/branch", ["use_exp"], then_branch=then_g, else_branch=else_g)
    outer.node("Add", "/post", [y, outer.init("/post/bias", _normal(rng, (8,), 0.1))], output="y")
    graph = outer.graph("if_subgraph", [_vi("x", [1, 8]), _vi("use_exp", [], TensorProto.BOOL)],
                        [_vi("y", [1, 8])], doc)
    meta = {
        "description": ("MatMul -> If(use_exp: Exp branch | MatMul+Relu branch) -> Add; fault inside a "
                        "subgraph."),
        "inputs": {
            "x": {"shape": [1, 8], "dtype": "float32", "recipe": NORMAL},
            "use_exp": {"shape": [], "dtype": "bool", "recipe": "True (selects the faulty then-branch)"},
        },
        "fault": {
            "kind": "fp16_overflow", "node": "/branch/then/Exp", "tensor": "/branch/then/Exp_output_0",
            "op_type": "Exp", "pair": OVERFLOW_PAIR, "observed_at": {"node": "/branch/If",
                                                                  "tensor": "/branch/If_output_0"},
            "explanation": ("With use_exp=True, /branch/then/Exp computes exp(4h+8) with h ~ N(1, 0.4^2), "
                            "i.e. up to ~2e6 (> 65504), which is inf in FP16 even though dividing by 8192 "
                            "leaves the FP32 output at ~1-300."),
        },
    }
    return _model(graph, doc), meta


def build_mlp_external() -> tuple[onnx.ModelProto, dict]:
    """(f) MLP stored with external data whose fc2 weights are below the FP16 subnormal range."""
    rng = np.random.default_rng(606)
    b = GraphBuilder()
    doc = ("Planted fault (fp16_subnormal_flush): /fc2/weight has magnitudes 2e-9..2.5e-8, below half the "
           "smallest FP16 subnormal (5.96e-8), so an FP16 cast flushes every weight to 0 and the output "
           "becomes 0; /fc2/Mul (x8000, FP16-representable) keeps the FP32 output normal (~1e-2).")
    h = _linear(b, "/fc1", "x", _normal(rng, (32, 32), 30.0 * math.sqrt(2.0 / 32)), _normal(rng, (32,), 0.1))
    h = b.node("Relu", "/fc1", [h])
    mag = rng.uniform(0.2e-8, 2.5e-8, (32, 8))
    sign = np.where(rng.random((32, 8)) < 0.5, -1.0, 1.0)
    h = b.node("MatMul", "/fc2", [h, b.init("/fc2/weight", mag * sign)])
    b.node("Mul", "/fc2", [h, b.init("/fc2/scale", 8000.0)], output="y")
    graph = b.graph("mlp_external", [_vi("x", [1, 32])], [_vi("y", [1, 8])], doc)
    meta = {
        "description": "Two-layer MLP saved with external data (weights.bin) whose tiny fc2 weights flush to "
                       "zero in FP16.",
        "inputs": {"x": {"shape": [1, 32], "dtype": "float32", "recipe": NORMAL}},
        "fault": {
            "kind": "fp16_subnormal_flush", "node": "/fc2/MatMul", "tensor": "/fc2/MatMul_output_0",
            "op_type": "MatMul", "pair": FP16_PAIR, "initializer": "/fc2/weight",
            "explanation": ("/fc2/weight has |w| in 2e-9..2.5e-8, under half the smallest FP16 subnormal "
                            "(5.96e-8), so a plain FP16 cast makes it all zeros and y = 0 while FP32 y ~ "
                            "1e-2; "
                            "onnxconverter_common instead clamps them to +-1e-7 (min_positive_val), which "
                            "corrupts y differently (sign pattern only, each weight ~5-60x too large)."),
        },
    }
    return _model(graph, doc), meta


def build_healthy_cnn() -> tuple[onnx.ModelProto, dict]:
    """(g) Control CNN: FP16 gives only rounding error."""
    rng = np.random.default_rng(707)
    b = GraphBuilder()
    doc = "No planted fault (control): FP16 only adds rounding error (SQNR > 40 dB on every tensor)."

    def bn(scope: str, x: str, c: int) -> str:
        return b.node("BatchNormalization", scope, [
            x, b.init(f"{scope}/weight", rng.uniform(0.8, 1.2, c)),
            b.init(f"{scope}/bias", _normal(rng, (c,), 0.1)),
            b.init(f"{scope}/running_mean", _normal(rng, (c,), 0.1)),
            b.init(f"{scope}/running_var", rng.uniform(0.5, 2.0, c))], epsilon=1e-5)

    h = _conv(b, rng, "/stage1/conv", "image", 3, 8)
    h = bn("/stage1/bn", h, 8)
    h = b.node("Relu", "/stage1/relu", [h])
    h = b.node("MaxPool", "/stage1/pool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = _conv(b, rng, "/stage2/conv", h, 8, 16)
    h = bn("/stage2/bn", h, 16)
    h = b.node("Relu", "/stage2/relu", [h])
    h = b.node("GlobalAveragePool", "/head/pool", [h])
    h = b.node("Flatten", "/head/flatten", [h], axis=1)
    b.node("Gemm", "/head/fc", [h, b.init("/head/fc/weight", _normal(rng, (10, 16), 0.3)),
                                b.init("/head/fc/bias", _normal(rng, (10,), 0.1))], output="logits", transB=1)
    graph = b.graph("healthy_cnn", [_vi("image", [1, 3, 32, 32])], [_vi("logits", [1, 10])], doc)
    meta = {
        "description": "Healthy control CNN (Conv/BatchNorm/Relu/MaxPool/GlobalAveragePool/Gemm).",
        "inputs": {"image": {"shape": [1, 3, 32, 32], "dtype": "float32", "recipe": NORMAL}},
        "fault": {"kind": None, "node": None, "tensor": None, "op_type": None, "pair": FP16_PAIR,
                  "explanation": "Control model: FP16 only adds rounding error (SQNR > 40 dB on every "
                                 "tensor)."},
    }
    return _model(graph, doc), meta


# --------------------------------------------------------------------------------------------------- writing


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to a temp file next to ``path`` and ``os.replace`` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz archive with fixed timestamps (numpy.savez stamps the current time, so is not reproducible)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            arr_buf = io.BytesIO()
            np.lib.format.write_array(arr_buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, arr_buf.getvalue())
    return buf.getvalue()


def _save_external(model: onnx.ModelProto, path: pathlib.Path, location: str) -> None:
    """Save with all tensors in one external file, staged in a fresh temp dir (onnx appends to existing
    files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    try:
        onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), str(tmp_dir / path.name),
                  save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                  size_threshold=0)
        for name in (location, path.name):
            os.chmod(tmp_dir / name, FILE_MODE)
        os.replace(tmp_dir / location, path.parent / location)
        os.replace(tmp_dir / path.name, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


BUILDERS = [
    ("cnn_fp16_overflow", "cnn_fp16_overflow.onnx", build_cnn_fp16_overflow),
    ("transformer_block", "transformer_block.onnx", build_transformer_block),
    ("fp16_clamp_constant", "fp16_clamp_constant.onnx", build_fp16_clamp_constant),
    ("int8_outlier", "int8_outlier.onnx", build_int8_outlier),
    ("if_subgraph", "if_subgraph.onnx", build_if_subgraph),
    ("mlp_external", "external_data/mlp_external.onnx", build_mlp_external),
    ("healthy_cnn", "healthy_cnn.onnx", build_healthy_cnn),
]


def build_all(out_dir: pathlib.Path) -> dict:
    """Write every sample model (plus auxiliary files and manifest.json) into ``out_dir``; return the
    manifest."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, rel, builder in BUILDERS:
        model, meta = builder()
        path = out_dir / rel
        entry = {"name": name, "file": rel, **meta, "nodes": len(model.graph.node)}
        if name == "mlp_external":
            _save_external(model, path, "weights.bin")
            entry["external_data"] = ["weights.bin"]
            entry["external_data_sha256"] = {"weights.bin": _sha256(path.parent / "weights.bin")}
        else:
            _atomic_write(path, model.SerializeToString())
        if name == "transformer_block":
            npz = out_dir / "transformer_block_inputs.npz"
            _atomic_write(npz, _npz_bytes(transformer_block_inputs()))
            entry["sample_inputs"] = {"file": npz.name, "seed": 0, "sha256": _sha256(npz)}
        entry["sha256"] = _sha256(path)
        entries.append(entry)
        logger.info("wrote %s (%d nodes, %d bytes)", rel, entry["nodes"], path.stat().st_size)
    manifest = {"schema": SCHEMA, "generator": GENERATOR, "models": entries}
    _atomic_write(out_dir / "manifest.json", (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode())
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = build_all(args.out)
    for m in manifest["models"]:
        print(f"{m['file']:40s} nodes={m['nodes']:3d} fault={m['fault']['kind']}")
    print(f"manifest: {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
