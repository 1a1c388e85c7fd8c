"""Rewrite repairs: fix a culprit in the candidate's own precision (FP16) instead of keeping it in FP32. Not BF16:
it holds FP32's range, so no converter clamps a constant to fit it and no scale overflows it; its culprits are
rounding, which only an island fixes.

A culprit whose cause is a constant the converter changed (clamped to its ``max_finite_val``, flushed below its
``min_positive_val``) can often stay in the low precision:

``restore-constant``
    the reference's value fits the format (a BatchNormalization variance of 1.42e4 that a converter clamped to
    1e4): the constant gets the reference's value rounded to the format, the node stays as it is.
``fold-bn``
    a BatchNormalization parameter the format cannot hold (a variance of 9.8e7): the normalisation is folded into
    the Conv (or ConvTranspose) that feeds it alone -- ``W' = W * s``, ``B' = (B - mean) * s + bias`` with
    ``s = scale / sqrt(var + eps)`` computed in float64 from the reference's values -- and the BatchNormalization
    goes away; only when every folded value fits the format and the folded weights keep their precision there.
``rescale``
    the same BatchNormalization, when it cannot be folded: its variance moved into its scale (``scale' = s``,
    ``var' = 1 - eps``), the same function with every parameter in range.
``fold-scale``
    a constant scale (``Mul``/``Div`` by a scalar or per-output-channel constant) after a linear op with constant
    weights that feeds it alone -- a Conv/ConvTranspose, a MatMul (bare, or followed by the Add of its constant
    bias: an exported Linear) or a Gemm -- moved across the op into its weights and bias (``W' = W * c``,
    ``B' = B * c``), and the Mul/Div removed: an op whose output overflows the format before the scale brings it
    back (values past 65504, then ``* 1e-4``) then computes in range. A scalar after a MatMul of two activations
    (attention scores ``Q @ K^T``) moves across it, and across the Reshape/Transpose on one operand, into the
    linear op that computes that operand (the query projection): the product itself is then in range. Same
    conditions on the folded weights as ``fold-bn``.

A rewrite changes constants only (plus, for ``fold-bn``, removes the BatchNormalization), keeps every other
tensor's name, and is always cheaper than an FP32 island: no node and no weight byte is left in high precision.
:mod:`workbench.repair.api` tries the rewrites first and falls back to islands (``fp32-island``) only for what
they do not fix.

The same finder folds BatchNormalizations of an FP32 model before it is quantized (:mod:`.qdq_fold`:
``RewriteFinder(model, constants(model), formats=(FLOAT,))``, :meth:`RewriteFinder.fold_bn` with ``np.float32``,
:func:`apply_rewrites` with ``default=FLOAT``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..model.mapped import tensor_array
from .graph import NARROW, PREFIX, GraphIndex, Names, constant_tensor, prune, use_counts

log = logging.getLogger(__name__)

#: the kinds of a node kept in reference precision (an FP32 island; a Q/DQ candidate's node with its pairs removed)
KEPT_KINDS = ("fp32-island", "remove-qdq")
KINDS = ("restore-constant", "fold-bn", "rescale", "fold-scale", *KEPT_KINDS)
_NP = {TensorProto.FLOAT16: np.float16, TensorProto.FLOAT: np.float32}
_STANDARD = ("", "ai.onnx")
#: folded weights must keep this SQNR (dB) in the low precision, or the fold would trade one error for another
MIN_FOLD_SQNR_DB = 50.0


@dataclass
class Rewrite:
    """One rewrite of culprit ``node``: ``values`` are the new constants (candidate tensor name -> float64 array,
    stored in the candidate's type); ``remove``: the node the rewrite deletes (fold-bn), whose output the producer
    ``into`` takes over."""

    node: str
    kind: str
    detail: str
    values: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    slots: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)  # tensor -> (node, input slot)
    into: str | None = None
    remove: str | None = None

    def to_json(self) -> dict:
        doc = {"node": self.node, "kind": self.kind, "detail": self.detail, "tensors": sorted(self.values)}
        if self.into:
            doc["into"] = self.into
        return doc


def _array(t: TensorProto) -> np.ndarray:
    return tensor_array(t).astype(np.float64)  # a weight left in its file (a big model) is read mapped


def _fits(values: np.ndarray, dtype) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(values.astype(dtype)).all()) if dtype is not None else False


def _sqnr_db(exact: np.ndarray, dtype) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        got = exact.astype(dtype).astype(np.float64)
    noise = float(np.sum((got - exact) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(max(float(np.sum(exact ** 2)), 1e-300) / noise))


@dataclass
class _Linear:
    """A linear op a scale can move into: ``out`` writes the scaled tensor (the op itself, or the Add of its
    bias), ``weight`` holds the constant weight at input ``slot`` with output channels on ``axis``; ``bias``:
    (node, input slot, constant or None for a slot to fill) or None (a bare MatMul: no bias)."""

    out: onnx.NodeProto
    weight: onnx.NodeProto
    slot: int
    axis: int
    bias: tuple[onnx.NodeProto, int, str | None] | None


class RewriteFinder:
    """Finds the rewrites of a candidate's culprits (see the module docstring); the candidate is never changed."""

    def __init__(self, candidate: onnx.ModelProto, ref_consts: dict[str, TensorProto],
                 index: GraphIndex | None = None, formats: tuple[int, ...] = NARROW):
        """``formats``: the element types of the candidate's constants a rewrite may change (FP16/BF16; FLOAT for
        an FP32 model folded before quantization)."""
        self.candidate = candidate
        self.formats = formats
        self.idx = index or GraphIndex(candidate)
        self.ref_consts = ref_consts  # the reference's constants by name (graph.constants)
        self.uses = use_counts(candidate.graph)
        self.fresh = Names(self.idx.names)  # new constants' names: never one the candidate already has

    def _const(self, t: str) -> str | None:
        """The narrow constant behind input ``t`` (through converter Casts and Identity: torch's exporter puts an
        Identity before a parameter it shares, e.g. each Linear's bias in an exported BERT), or None."""
        for _ in range(8):
            if t in self.idx.consts:
                return t if self.idx.consts[t].data_type in self.formats else None
            p = self.idx.producer.get(t)
            if p is None or p.op_type not in ("Cast", "Identity") or not p.input:
                return None
            t = p.input[0]
        return None

    def _ref(self, name: str, cand: TensorProto) -> np.ndarray | None:
        ref = self.ref_consts.get(name)
        if ref is None or ref.data_type != TensorProto.FLOAT or list(ref.dims) != list(cand.dims):
            return None
        return _array(ref)

    def changed(self, node: onnx.NodeProto) -> list[tuple[int, str, np.ndarray]]:
        """(input slot, candidate constant, reference value) for each constant input the conversion changed
        beyond rounding to the format."""
        out = []
        for slot, t in enumerate(node.input):
            name = self._const(t) if t else None
            if name is None:
                continue
            cand = self.idx.consts[name]
            dtype = _NP.get(cand.data_type)
            ref = self._ref(name, cand)
            if ref is None or dtype is None:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                rounded = ref.astype(np.float32).astype(dtype).astype(np.float64)
            now = _array(cand)
            if now.shape == ref.shape and not np.array_equal(now, rounded, equal_nan=True):
                out.append((slot, name, ref))
        return out

    def find(self, nodes: Iterable[str]) -> list[Rewrite]:
        """The rewrite of each of ``nodes`` (candidate names) that has one, in the given order."""
        found, removed = [], set()
        for name in nodes:
            node = self.idx.by_name.get(name)
            if node is None or node.op_type == "Constant":
                continue
            rewrite = self.rewrite(node) or self._fold_scale(node)
            if rewrite is not None and (rewrite.remove is None or rewrite.remove not in removed):
                found.append(rewrite)
                removed.add(rewrite.remove)
        return found

    def rewrite(self, node: onnx.NodeProto) -> Rewrite | None:
        changed = self.changed(node)
        if not changed:
            return None
        dtype = _NP.get(self.idx.consts[changed[0][1]].data_type)
        if all(_fits(ref, dtype) for _, _, ref in changed):
            parts = []
            for _, name, ref in changed:
                now = _array(self.idx.consts[name])
                i = int(np.argmax(np.abs(now - ref)))
                parts.append(f"{name} {ref.ravel()[i]:.4g} (was {now.ravel()[i]:.4g})")
            values = {name: ref for _, name, ref in changed}
            slots = {name: (node.name, slot) for slot, name, _ in changed}
            return Rewrite(node.name, "restore-constant", "restored " + ", ".join(parts), values, slots)
        if node.op_type == "BatchNormalization":
            return self.fold_bn(node, dtype) or self._rescale_bn(node, dtype)
        return None

    # --- BatchNormalization ---------------------------------------------------------------------------------
    def _bn_params(self, node: onnx.NodeProto) -> tuple[list[str], list[np.ndarray], float] | None:
        """An inference-mode BatchNormalization's constant parameters (reference values) and epsilon, or None."""
        if len(node.input) < 5 or len([o for o in node.output if o]) != 1 or node.domain not in _STANDARD or \
                any(a.name == "training_mode" and a.i for a in node.attribute):
            return None
        names, values = [], []
        for t in node.input[1:5]:
            name = self._const(t)
            if name is None:
                return None
            ref = self._ref(name, self.idx.consts[name])
            if ref is None:
                return None
            names.append(name)
            values.append(ref)
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        return names, values, float(eps)

    def fold_bn(self, node: onnx.NodeProto, dtype) -> Rewrite | None:
        """fold-bn of BatchNormalization ``node`` into the Conv before it (``dtype``: the numpy type the folded
        constants are held in), or None when the pair does not fold (see the module docstring): parameters one per
        output channel, the Conv's output read by the BatchNormalization alone."""
        params = self._bn_params(node)
        conv = self._foldable_conv(node.input[0]) if params is not None else None
        if conv is None:
            return None
        _, (scale, bias, mean, var), eps = params
        w = self.idx.consts[self._const(conv.input[1])]
        channels = w.dims[1 if conv.op_type == "ConvTranspose" else 0] if len(w.dims) >= 3 else None
        if channels is None or any(v.shape != (channels,) for v in (scale, bias, mean, var)):
            return None
        s = scale / np.sqrt(var + eps)
        folded = self._fold_into(self._conv(conv), s, bias - mean * s, dtype)
        if folded is None:
            return None
        values, where, fidelity = folded
        return Rewrite(node.name, "fold-bn", f"folded into {conv.name} (weights {fidelity:.0f} dB in the format)",
                       values, where, into=conv.name, remove=node.name)

    # --- a scale after a Conv -------------------------------------------------------------------------------
    def _foldable_conv(self, x: str) -> onnx.NodeProto | None:
        """The Conv (or group-1 ConvTranspose) writing ``x`` when ``x`` is read by one node only and is no graph
        output, with constant weights (and bias)."""
        conv = self.idx.producer.get(x)
        if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in _STANDARD or \
                not conv.name or len(conv.input) < 2:
            return None
        if self.uses.get(x, 0) != 1 or x in self.idx.graph_outputs:
            return None
        if conv.op_type == "ConvTranspose" and next((a.i for a in conv.attribute if a.name == "group"), 1) != 1:
            return None
        if self._const(conv.input[1]) is None or (len(conv.input) > 2 and conv.input[2] and
                                                  self._const(conv.input[2]) is None):
            return None
        return conv

    def _linear(self, x: str) -> _Linear | None:
        """The linear op writing ``x`` whose output channels a scale can move into: a foldable Conv, a MatMul
        with a constant weight (optionally followed by an Add of a constant bias: an exported Linear), or a Gemm
        with a constant B (and C). Each tensor on the way is read by one node only and is no graph output."""
        def single(t: str) -> onnx.NodeProto | None:
            if self.uses.get(t, 0) != 1 or t in self.idx.graph_outputs:
                return None
            return self.idx.producer.get(t)

        node = single(x)
        if node is None or not node.name:
            return None
        if node.op_type in ("Conv", "ConvTranspose"):
            conv = self._foldable_conv(x)
            return self._conv(conv) if conv is not None else None
        if node.op_type == "Add" and len(node.input) == 2:
            for k in (1, 0):
                b_name = self._const(node.input[k])
                mm = single(node.input[1 - k]) if b_name is not None else None
                lin = self._matmul(mm) if mm is not None and mm.name else None
                if lin is not None:
                    return _Linear(node, lin.weight, 1, lin.axis, (node, k, b_name))
            return None
        if node.op_type == "MatMul":
            return self._matmul(node)
        if node.op_type == "Gemm" and len(node.input) >= 2 and self._const(node.input[1]) is not None:
            c = node.input[2] if len(node.input) > 2 and node.input[2] else None
            if c and self._const(c) is None:
                return None
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            return _Linear(node, node, 1, 0 if trans_b else 1, (node, 2, self._const(c) if c else None))
        return None

    def _conv(self, conv: onnx.NodeProto) -> _Linear:
        """A Conv (output channels on the weight's axis 0) or ConvTranspose (axis 1), its bias in slot 2."""
        b = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
        return _Linear(conv, conv, 1, 1 if conv.op_type == "ConvTranspose" else 0,
                       (conv, 2, self._const(b) if b else None))

    def _matmul(self, node: onnx.NodeProto) -> _Linear | None:
        """A MatMul whose second input is a constant of rank >= 2 (its last axis: the output channels)."""
        if node.op_type != "MatMul" or len(node.input) != 2:
            return None
        w = self._const(node.input[1])
        if w is None or len(self.idx.consts[w].dims) < 2:
            return None
        return _Linear(node, node, 1, len(self.idx.consts[w].dims) - 1, None)

    def _fold_into(self, lin: _Linear, s: np.ndarray, shift: np.ndarray | None, dtype
                   ) -> tuple[dict, dict, float] | None:
        """New weight and bias of the linear op ``lin`` for output channels scaled by ``s`` (then ``+ shift``),
        from the reference's values; None when they do not fit the format or lose precision there."""
        w_name = self._const(lin.weight.input[lin.slot])
        w = self._ref(w_name, self.idx.consts[w_name])
        b_owner, b_slot, b_name = lin.bias if lin.bias is not None else (None, None, None)
        b = self._ref(b_name, self.idx.consts[b_name]) if b_name else None
        if w is None or (b_name and b is None) or (lin.bias is None and shift is not None):
            return None
        channels = w.shape[lin.axis]
        s = np.asarray(s, np.float64).ravel()
        if s.size not in (1, channels):
            return None
        s = np.broadcast_to(s, (channels,))
        shape = [1] * w.ndim
        shape[lin.axis] = -1
        w2 = w * s.reshape(shape)
        new_w = self.fresh(f"{w_name}::{PREFIX}_fold")
        values, where = {new_w: w2}, {new_w: (lin.weight.name, lin.slot)}
        if lin.bias is not None:
            if b is not None and (b.size not in (1, channels) or b.shape[-1] not in (1, channels)):
                return None  # a bias over more than the output channels (a Gemm C of shape [M, N])
            b2 = (b.ravel() if b is not None else 0.0) * s + (shift if shift is not None else 0.0)
            b2 = np.broadcast_to(b2, (channels,)).astype(np.float64)
            if b is not None and b.ndim > 1:
                b2 = b2.reshape([1] * (b.ndim - 1) + [channels])  # the same rank: it broadcasts the same way
            new_b = self.fresh(f"{b_name or lin.weight.name + '/bias'}::{PREFIX}_fold")
            values[new_b], where[new_b] = b2, (b_owner.name, b_slot)
        if not all(_fits(v, dtype) for v in values.values()):
            return None
        fidelity = _sqnr_db(w2, dtype)
        if fidelity < MIN_FOLD_SQNR_DB:
            log.info("fold into %s: folded weights keep %.1f dB in the format, not folding", lin.weight.name,
                     fidelity)
            return None
        return values, where, fidelity

    def _fold_scale(self, node: onnx.NodeProto) -> Rewrite | None:
        """fold-scale for a Mul/Div by a constant after a linear op with constant weights (:meth:`_linear`;
        ``node``: the Mul/Div, or the linear op or its bias Add, whose one reader is the Mul/Div)."""
        for _ in range(2):  # MatMul -> Add (bias) -> Mul
            if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm", "Add") or not node.output:
                break
            readers = self.idx.consumers.get(node.output[0], [])
            if len(readers) != 1:
                return None
            node = readers[0]
        if node.op_type not in ("Mul", "Div") or len(node.input) != 2 or not node.name:
            return None
        slots = [1, 0] if node.op_type == "Mul" else [1]
        for k in slots:
            c_name, x = self._const(node.input[k]), node.input[1 - k]
            lin = self._linear(x) if c_name is not None else None
            across = None  # a MatMul of two activations (attention scores) the scale moves across first
            if lin is None and c_name is not None and int(np.prod(list(self.idx.consts[c_name].dims))) == 1:
                across, lin = self._operand_linear(x)
            if lin is None:
                continue
            c = self._ref(c_name, self.idx.consts[c_name])
            if c is None or not np.all(np.isfinite(c)) or (node.op_type == "Div" and np.any(c == 0)):
                return None
            conv = lin.weight.op_type in ("Conv", "ConvTranspose")
            if c.size > 1 and ((c.ndim < 3 or c.shape[-3] != c.size) if conv else c.shape[-1] != c.size):
                return None  # a scalar, or one scale per output channel: (C, 1, 1) for a Conv, (..., N) else
            s = 1.0 / c if node.op_type == "Div" else c
            dtype = _NP.get(self.idx.consts[c_name].data_type)
            folded = self._fold_into(lin, s.ravel(), None, dtype)
            if folded is None:
                return None
            values, where, fidelity = folded
            shown = f"{float(c.ravel()[0]):.4g}" if c.size == 1 else f"{c.size} channel scales"
            via = f" (through its bias {lin.out.name})" if lin.out is not lin.weight else ""
            if across is not None:
                via += f" across {across.name}, which now multiplies in range"
            return Rewrite(node.name, "fold-scale", f"{node.op_type} by {shown} moved into {lin.weight.name}"
                           f"{via} (weights {fidelity:.0f} dB in the format)", values, where,
                           into=(across or lin.out).name, remove=node.name)
        return None

    def _operand_linear(self, x: str) -> tuple[onnx.NodeProto | None, _Linear | None]:
        """For ``x`` written by a MatMul of two activations (``Q @ K^T``): that MatMul and the linear op with
        constant weights behind one of its operands, reached through ops a scalar commutes with (Reshape,
        Transpose, Squeeze, Unsqueeze, Identity), each tensor read once. A scalar scale after the MatMul equals the
        same scale on that operand, so it folds into those weights: the product is computed in range."""
        if self.uses.get(x, 0) != 1 or x in self.idx.graph_outputs:
            return None, None
        mm = self.idx.producer.get(x)
        if mm is None or mm.op_type != "MatMul" or not mm.name or len(mm.input) != 2 \
                or any(self._const(t) is not None for t in mm.input):
            return None, None
        for t in mm.input:
            for _ in range(8):
                p = self.idx.producer.get(t)
                if p is None or p.op_type not in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity") \
                        or self.uses.get(t, 0) != 1 or t in self.idx.graph_outputs:
                    break
                t = p.input[0]
            lin = self._linear(t)
            if lin is not None:
                return mm, lin
        return None, None

    def _rescale_bn(self, node: onnx.NodeProto, dtype) -> Rewrite | None:
        params = self._bn_params(node)
        if params is None:
            return None
        (n_scale, n_bias, n_mean, n_var), (scale, bias, mean, var), eps = params
        s = scale / np.sqrt(var + eps)
        one = np.full(var.shape, 1.0 - eps)
        if not all(_fits(v, dtype) for v in (s, bias, mean, one)):
            return None
        values = {n_scale: s, n_bias: bias, n_mean: mean, n_var: one}
        slots = {n_scale: (node.name, 1), n_bias: (node.name, 2), n_mean: (node.name, 3), n_var: (node.name, 4)}
        return Rewrite(node.name, "rescale", f"variance (max {var.max():.4g}) moved into the scale", values, slots)


def apply_rewrites(candidate: onnx.ModelProto, rewrites: Iterable[Rewrite],
                   default: int = TensorProto.FLOAT16) -> onnx.ModelProto:
    """A copy of ``candidate`` with ``rewrites`` applied. A constant read by the rewritten node alone is replaced
    in place (same name); a shared one, or a fold's new weights, become new initializers for that node, in the
    type of the node's narrow constants, else ``default``."""
    from ..model.graph import sort_nodes

    model = onnx.ModelProto()
    model.CopyFrom(candidate)
    g = model.graph
    before = use_counts(g)
    nodes = {n.name: n for n in g.node if n.name}
    inits = {t.name: t for t in g.initializer}
    const_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
    names = Names({t.name for t in g.initializer} | {o for n in g.node for o in n.output} | set(nodes) |
                  {i.name for i in g.input})
    types = {t.name: t.data_type for t in g.initializer}
    types.update({k: constant_tensor(n).data_type for k, n in const_nodes.items() if constant_tensor(n) is not None})
    removed: set[str] = set()
    for rw in rewrites:
        dtype = None
        for tensor, value in rw.values.items():
            owner, slot = rw.slots[tensor]
            node = nodes[owner]
            dtype = dtype or types.get(tensor) or _narrow_of(node, types) or default
            array = value.astype(np.float32).astype(_NP[dtype])
            if tensor in inits and before.get(tensor, 0) == 1:
                inits[tensor].CopyFrom(numpy_helper.from_array(array, tensor))
            elif tensor in const_nodes and before.get(tensor, 0) == 1:
                c = const_nodes[tensor]
                del c.attribute[:]
                c.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array, tensor)))
            else:
                fresh = names(tensor if tensor not in names.taken else f"{tensor}::{PREFIX}")
                g.initializer.append(numpy_helper.from_array(array, fresh))
                while len(node.input) <= slot:
                    node.input.append("")
                node.input[slot] = fresh
        if rw.remove:  # fold-bn: the producer writes the removed node's output
            bn, conv = nodes[rw.remove], nodes[rw.into]
            old = conv.output[0]
            conv.output[0] = bn.output[0]
            removed.add(rw.remove)
            keep = [vi for vi in g.value_info if vi.name != old]
            del g.value_info[:]
            g.value_info.extend(keep)
    if removed:
        keep = [n for n in g.node if n.name not in removed]
        del g.node[:]
        g.node.extend(keep)
    prune(g, before)
    sort_nodes(model)
    return model


def _narrow_of(node: onnx.NodeProto, types: dict[str, int]) -> int | None:
    return next((types[i] for i in node.input if types.get(i) in NARROW), None)


def describe(rewrites: Iterable[Rewrite], islands: Iterable[str], kind: str = "float") -> list[dict]:
    """``repairs`` of the JSON: every rewrite, then every kept node (``kind``: one of :data:`KINDS`): an FP32
    island of an FP16/BF16 candidate, its Q/DQ pairs removed in a Q/DQ one (builder kind ``"qdq"``)."""
    kept = "remove-qdq" if kind == "qdq" else "fp32-island"
    return [rw.to_json() for rw in rewrites] + [{"node": n, "kind": kept} for n in islands]


# --- the search's first phase -----------------------------------------------------------------------------------
def rewrite_first(ev, pool: list[str], baseline, notes: list[str]):
    """Try rewrites before islands (each rewrite costs no high-precision node, so any set of rewrites is cheaper
    than any island). -> (rewrites kept, the island pool on the new base, the new baseline evaluation).

    All rewrites of the pool's culprits are applied at once (one build); when that meets the target, rewrites are
    dropped one at a time while it still holds (1-minimal); when it does not, the search for islands runs on the
    rewritten model (``ev`` is rebased onto it) and the rewrites of nodes it keeps as islands are superseded."""
    from .islands import IslandBuilder

    builder = ev.builder
    if builder.kind != "float" or baseline.met or not pool:
        return [], pool, baseline
    rewrites = RewriteFinder(builder.candidate, builder.ref_consts, builder.idx).find(pool)
    if not rewrites:
        return [], pool, baseline

    def run(chosen: list[Rewrite]):
        model = apply_rewrites(builder.candidate, chosen)
        label = [f"{rw.kind}:{rw.node}" for rw in chosen]
        return ev.evaluate(label, model=model, role="rewrite"), model

    evaluation, model = run(rewrites)
    if evaluation.met and len(rewrites) > 1:
        for rw in list(reversed(rewrites)):
            trial = [r for r in rewrites if r is not rw]
            e, m = run(trial)
            if e.met:
                rewrites, evaluation, model = trial, e, m
    if not evaluation.met and evaluation.judgement.failing > baseline.judgement.failing:
        notes.append(f"rewrites of {', '.join(rw.node for rw in rewrites)} did not help: not applied")
        return [], pool, baseline
    ev.rebase(IslandBuilder(model, builder.reference, "float", ref_consts=builder.ref_consts,
                            ref_nodes=builder.ref_nodes))
    removed = {rw.remove for rw in rewrites if rw.remove}
    return rewrites, [n for n in pool if n not in removed], evaluation
