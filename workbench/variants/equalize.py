"""Per-channel equalization of depthwise-convolution inputs, before per-tensor INT8 quantization.

A depthwise Conv (``group`` = input channels, one input channel per filter) reads channels whose ranges differ by
orders of magnitude (a PP-OCRv3 recognizer's: 1e3 between its widest and narrowest channel). TensorRT quantizes an
activation with one scale per tensor, set by the widest channel, and the narrow channels are left a few INT8 steps:
every per-tensor INT8 copy of that recognizer reads every held-out crop wrong. NNCF quantizes such inputs with one
scale per channel, which TensorRT cannot build. The same effect in a form it builds: channel ``c`` of the input is
scaled by ``s_c = (max_k m_k / m_c) ** alpha`` (``m_c``: its largest magnitude on the calibration feeds) and the
filter reading it by ``1 / s_c``, which a depthwise Conv's per-output-channel weight scales absorb without loss.
The float function is unchanged (to float32 rounding).

The scale is folded into the tensor's producer where that is exact and the tensor has no other reader: a
BatchNormalization (its scale and bias), a Mul or Div by a per-channel or scalar constant, a Conv (its filters and
bias per output channel), through Relu, LeakyRelu and MaxPool (``f(x * s) = f(x) * s`` for ``s > 0``) and Adds of a
constant (``(x * a + b) * s = x * (a * s) + b * s``). Otherwise a Mul by the per-channel constant is put before the
depthwise Conv (a pointwise op TensorRT fuses with its neighbours). Tensors whose values change are renamed, so a
layer-by-layer comparison never pairs them with the original's."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..engines.outputs import mark_outputs
from ..model.mapped import tensor_array
from .graph_names import copy_model
from .ort_session import ort_session

log = logging.getLogger(__name__)

#: the default strength: 1 = every channel to the widest one's range; 0.5 = half-way on a log scale (held out,
#: read as in FP32 with 0.5 / 1: v4 rec 32 / 27, v3 rec 35 / 34, v5 rec 36 / 38 of 40 crops, v5 det 8 / 7 of 8 pages)
ALPHA = 0.5
#: no channel's scale beyond this (a nearly dead channel is not blown up to the widest one's range)
MAX_SCALE = 1e4


@dataclass
class Equalization:
    """What :func:`equalize_depthwise` did: the depthwise Convs equalized, by how the scale was placed."""

    alpha: float
    folded: dict[str, str] = field(default_factory=dict)  # conv -> the producer that took the scale (op type)
    inserted: list[str] = field(default_factory=list)  # convs given a Mul before them
    widest_ratio: float = 1.0  # the largest max/min channel-range ratio among the equalized inputs

    @property
    def convs(self) -> list[str]:
        return [*self.folded, *self.inserted]

    def describe(self) -> str:
        how = (f"scales folded into the producer of {len(self.folded)}" if self.folded else "")
        if self.inserted:
            how += (", " if how else "") + f"a per-channel Mul before {len(self.inserted)}"
        return (f"the inputs of {len(self.convs)} depthwise Conv(s) equalized per channel before quantizing "
                f"(alpha {self.alpha:g}; channel ranges up to {self.widest_ratio:.0f}x apart; {how})")


def depthwise_convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Convs with one input channel per filter group (``group`` > 1, weight ``[C*k, 1, ...]``) and a constant
    weight, in graph order."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        w = inits.get(n.input[1]) if n.op_type == "Conv" and len(n.input) > 1 else None
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        if w is not None and group > 1 and len(w.dims) >= 3 and w.dims[1] == 1 and w.dims[0] % group == 0:
            out.append(n)
    return out


def channel_absmax(array: np.ndarray) -> np.ndarray:
    """The largest magnitude of each channel (axis 1) of ``array`` in float64, NaN and +-inf counted as 0."""
    axes = tuple(i for i in range(array.ndim) if i != 1)
    return np.nan_to_num(np.abs(array), posinf=0.0).max(axis=axes).astype(np.float64)


def live_channels(widths: np.ndarray) -> np.ndarray:
    """Which channels are not all zeros: wider than 1e-12 of the widest (``widths``: :func:`channel_absmax`)."""
    return widths > widths.max() * 1e-12


def channel_ranges(model: onnx.ModelProto, tensors: list[str], feeds: list[dict]) -> dict[str, np.ndarray]:
    """:func:`channel_absmax` of ``tensors`` over ``feeds``, on ONNX Runtime CPU."""
    session = ort_session(mark_outputs(model, tensors))
    out: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, v in zip(tensors, session.run(tensors, feed)):
            m = channel_absmax(v)
            out[name] = m if name not in out else np.maximum(out[name], m)
    return out


def equalize_depthwise(model: onnx.ModelProto, feeds: list[dict], alpha: float = ALPHA
                       ) -> tuple[onnx.ModelProto, Equalization]:
    """A copy of ``model`` with its depthwise Convs' inputs equalized per channel (the module docstring), and what
    was done; ``model`` itself, untouched, when it has no depthwise Conv whose input channels differ."""
    report = Equalization(alpha)
    convs = depthwise_convs(model)
    if not convs or not feeds:
        return model, report
    ranges = channel_ranges(model, list(dict.fromkeys(n.input[0] for n in convs)), feeds)
    position = {id(n): i for i, n in enumerate(model.graph.node)}
    scales: dict[int, np.ndarray] = {}  # by the Conv's position in the graph (names may be empty)
    for n in convs:
        m = ranges[n.input[0]]
        widest = float(m.max())
        live = live_channels(m)
        if widest <= 0 or not np.isfinite(widest) or live.sum() < 2:
            continue
        s = np.ones_like(m)
        s[live] = np.minimum((widest / m[live]) ** alpha, MAX_SCALE)
        if float(s.max()) < 1.01:  # the channels are as wide as each other already
            continue
        scales[position[id(n)]] = s
        report.widest_ratio = max(report.widest_ratio, widest / float(m[live].min()))
    if not scales:
        return model, report
    out = copy_model(model)
    _Rescaler(out).apply(scales, report)
    return out, report


class _Rescaler:
    """Edits a model in place: each depthwise Conv's filters divided by its input's channel scales, the scales
    put into the input's producer (or a new Mul)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                self.readers[i].append(n)
        self.outputs = {o.name for o in g.output}
        self.dropped: set[str] = set()
        self.taken = {t.name for t in g.initializer} | {i.name for i in g.input} | set(self.producer) | {
            n.name for n in g.node}

    def fresh(self, base: str) -> str:
        name, k = f"{base}.eq", 1
        while name in self.taken:
            k += 1
            name = f"{base}.eq{k}"
        self.taken.add(name)
        return name

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            return tensor_array(self.inits[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant" and p.attribute and p.attribute[0].name == "value":
            return numpy_helper.to_array(p.attribute[0].t)
        return None

    def set_input(self, node: onnx.NodeProto, slot: int, value: np.ndarray, dtype: np.dtype) -> None:
        """``node``'s input ``slot`` replaced by a new constant (``value`` in ``dtype``); the old one dropped when
        nothing else reads it."""
        old = node.input[slot]
        name = self.fresh(old)
        tensor = numpy_helper.from_array(np.asarray(value).astype(dtype), name)
        self.model.graph.initializer.append(tensor)
        self.inits[name] = tensor
        node.input[slot] = name
        self.readers[old] = [r for r in self.readers[old] if r is not node]
        self.readers[name] = [node]
        if not self.readers[old] and old not in self.outputs:
            self.dropped.add(old)

    def drop_unused(self) -> None:
        """The constants no node reads any more (the replaced filters, their Constant nodes)."""
        g = self.model.graph
        keep = [t for t in g.initializer if t.name not in self.dropped]
        if len(keep) != len(g.initializer):
            del g.initializer[:]
            g.initializer.extend(keep)
        nodes = [n for n in g.node if not (n.op_type == "Constant" and n.output[0] in self.dropped)]
        if len(nodes) != len(g.node):
            del g.node[:]
            g.node.extend(nodes)

    def apply(self, scales: dict[int, np.ndarray], report: Equalization) -> None:
        """``scales``: by the depthwise Conv's position in the graph."""
        nodes = list(self.model.graph.node)
        inserts: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []
        for at, s in scales.items():
            conv = nodes[at]
            name = conv.name or f"{conv.op_type}#{at}"
            w = tensor_array(self.inits[conv.input[1]])
            per_out = np.repeat(s, w.shape[0] // s.size).reshape((-1,) + (1,) * (w.ndim - 1))
            self.set_input(conv, 1, w.astype(np.float64) / per_out, w.dtype)
            rank = w.ndim  # the input's rank: [N, C, spatial...]
            folded = self.fold(conv, s, rank)
            if folded:
                report.folded[name] = folded
                continue
            const = self.fresh(f"{name}.input_scale")
            self.model.graph.initializer.append(numpy_helper.from_array(
                s.astype(np.float32).reshape((1, -1) + (1,) * (rank - 2)), const))
            scaled = self.fresh(conv.input[0])
            inserts.append((conv, helper.make_node("Mul", [conv.input[0], const], [scaled], name=self.fresh(name))))
            conv.input[0] = scaled
            report.inserted.append(name)
        self.drop_unused()
        if inserts:
            order = list(self.model.graph.node)
            for conv, mul in inserts:
                order.insert(next(i for i, n in enumerate(order) if n is conv), mul)
            del self.model.graph.node[:]
            self.model.graph.node.extend(order)

    def fold(self, conv: onnx.NodeProto, s: np.ndarray, rank: int) -> str | None:
        """Put ``s`` into the producer chain of ``conv``'s input where exact (module docstring) -> the op type
        that took it, or None (nothing changed)."""
        shape = (1, -1) + (1,) * (rank - 2)
        edits: list[tuple[onnx.NodeProto, int, np.ndarray, np.dtype]] = []
        chain: list[onnx.NodeProto] = []
        t = conv.input[0]
        while True:
            p = self.producer.get(t)
            if p is None or len(self.readers[t]) != 1 or t in self.outputs or p.output[0] != t:
                return None
            chain.append(p)
            if p.op_type in _POSITIVE_HOMOGENEOUS:  # f(x * s) = f(x) * s for s > 0: on to its input
                t = p.input[0]
                continue
            consts = {k: self.constant(i) for k, i in enumerate(p.input) if i}
            if p.op_type == "BatchNormalization" and consts.get(1) is not None and consts.get(2) is not None:
                edits += [(p, 1, consts[1] * s, consts[1].dtype), (p, 2, consts[2] * s, consts[2].dtype)]
                break
            if p.op_type in ("Mul", "Div", "Add"):
                k = next((k for k in (1, 0) if consts.get(k) is not None and _per_channel(consts[k], s.size, rank)
                          and not (p.op_type == "Div" and k == 0)), None)
                if k is None:
                    return None
                c = consts[k].astype(np.float64)
                new = c / s.reshape(shape) if p.op_type == "Div" else c * s.reshape(shape)
                edits.append((p, k, new, consts[k].dtype))
                if p.op_type != "Add":
                    break
                t = p.input[1 - k]
                continue
            if p.op_type == "Conv" and consts.get(1) is not None and consts[1].shape[0] == s.size:
                w = consts[1]
                edits.append((p, 1, w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1)), w.dtype))
                if consts.get(2) is not None:
                    edits.append((p, 2, consts[2] * s, consts[2].dtype))
                break
            return None
        for node, slot, value, dtype in edits:
            self.set_input(node, slot, value, dtype)
        for node in reversed(chain):  # the tensors that now hold scaled values get new names
            old = node.output[0]
            new = self.fresh(old)
            node.output[0] = new
            self.producer[new] = self.producer.pop(old)
            self.readers[new] = self.readers.pop(old)
            for reader in self.readers[new]:
                for j, i in enumerate(reader.input):
                    if i == old:
                        reader.input[j] = new
        log.debug("equalized %s: its input's scales folded into %s", conv.name, chain[-1].name)
        return chain[-1].op_type


#: ops that commute with a positive per-channel scale (the walk to a producer goes through them)
_POSITIVE_HOMOGENEOUS = ("Relu", "LeakyRelu", "MaxPool")


def _per_channel(c: np.ndarray, channels: int, rank: int) -> bool:
    """``c`` broadcasts over an [N, C, ...] tensor as one value, or one per channel (no other axis)."""
    if c.size == 1:
        return c.ndim <= rank
    dims = list(c.shape)
    while dims and dims[0] == 1 and len(dims) > rank - 1:
        dims.pop(0)
    return len(dims) == rank - 1 and dims[0] == channels and all(d == 1 for d in dims[1:])
