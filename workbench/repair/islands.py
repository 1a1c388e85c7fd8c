"""Keep chosen nodes of a reduced-precision candidate in the reference's precision.

FP16/BF16 candidates (:func:`keep_fp32_islands`): each kept node reads its float inputs in FP32 -- constants
restored from the reference model by name (a converter's clamp undone), activations through a Cast to FLOAT, or
straight from a kept producer's FP32 output so adjacent kept nodes pass FP32 between them -- computes in FP32, and
its outputs are cast back to the candidate's type under their original names, so consumers are unchanged.
(A converter's ``node_block_list`` is not enough: its Constant inputs are still converted, clamped, and cast back.)

INT8 Q/DQ candidates (:func:`remove_qdq`): a kept node reads float activations (``DequantizeLinear(
QuantizeLinear(x))`` rewired to ``x``) and float weights (restored from the reference: ORT's quantizer stores
weight ``W`` as ``W_quantized``), and the Q/DQ pair on its own output is dropped for its consumers.

:class:`IslandBuilder` also builds a *switchable* model: every node of a pool gets its island beside the original
and boolean graph inputs choose, per run, which nodes are kept. One session then evaluates any subset, exactly as
the model built for that subset computes it (the same islands, the same casts), so a search costs runs, not
builds. Inputs are never modified.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import onnx
from onnx import TensorProto, helper

from ..model.graph import sort_nodes
from .graph import FLOATS, NARROW, PREFIX, QDQ_OPS, GraphIndex, Names, RepairError, cast, constants, prune, use_counts

log = logging.getLogger(__name__)

KINDS = ("float", "qdq")


def candidate_kind(model: onnx.ModelProto) -> str:
    """"qdq" for a model with QuantizeLinear/DequantizeLinear nodes, else "float" (FP16/BF16 islands)."""
    return "qdq" if any(n.op_type in QDQ_OPS for n in model.graph.node) else "float"


def keep_fp32_islands(candidate: onnx.ModelProto, reference: onnx.ModelProto, nodes: Iterable[str]
                      ) -> onnx.ModelProto:
    """A new FP16/BF16 ``candidate`` whose ``nodes`` compute in FP32 (see the module docstring)."""
    return IslandBuilder(candidate, reference, "float").build(nodes)


def remove_qdq(candidate: onnx.ModelProto, reference: onnx.ModelProto, nodes: Iterable[str]) -> onnx.ModelProto:
    """A new Q/DQ ``candidate`` whose ``nodes`` read and write float (see the module docstring)."""
    return IslandBuilder(candidate, reference, "qdq").build(nodes)


def holds_subgraphs(node: onnx.NodeProto) -> bool:
    """An If/Loop/Scan (or any node with a graph attribute): repair keeps nodes outside them only."""
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


class IslandBuilder:
    """Builds repaired variants of one candidate: :meth:`build` for a set of nodes, :meth:`switchable` for a pool.
    ``kind``: "float" (FP16/BF16 islands), "qdq" (Q/DQ removal) or None (read from the candidate)."""

    def __init__(self, candidate: onnx.ModelProto, reference: onnx.ModelProto | None, kind: str | None = None, *,
                 ref_consts: dict | None = None, ref_nodes: dict | None = None):
        self.candidate = candidate
        #: the model the kept nodes' reference-precision constants come from (a worker builds from the same one)
        self.reference = reference
        self.kind = kind or candidate_kind(candidate)
        if self.kind not in KINDS:
            raise RepairError(f"unknown island kind {self.kind!r}", f"use one of {', '.join(KINDS)}")
        self.idx = GraphIndex(candidate)
        # the reference's constants and nodes by name (given: shared with another builder of the same reference)
        self.ref_consts = ref_consts if ref_consts is not None else constants(reference)
        self.ref_nodes = ref_nodes if ref_nodes is not None else {n.name: n for n in reference.graph.node if n.name}
        self.position = self.idx.position
        #: the search's units where they are not every node around a pair (set by the placement rewrite:
        #: :func:`workbench.repair.qdq_placement.pair_readers`); None: :func:`.qdq_order.quantized_nodes` finds them
        self.units: list[str] | None = None
        if self.kind == "qdq":  # Relu/Clip the quantizer folded into Q/DQ ranges (float readers need them back)
            from .qdq_folded import folded_activations

            self.folded = folded_activations(candidate, reference)
        else:
            self.folded = {}

    def spill_weights(self, folder, min_bytes: int) -> int:
        """Move the candidate's initializers and the reference's float constants of at least ``min_bytes`` into
        files in ``folder``, mapped (:func:`workbench.model.mapped.spilled`): every build then copies a proto of the
        graph and small constants, and the engine reads the weights from those files (a Q/DQ build of a 2-layer BERT
        with its 94 MB word embedding restored: 0.2-0.7 s -> ~0.15 s). Builds differ from unspilled ones only in
        where the bytes sit (:func:`workbench.model.mapped.materialized` reads them back). Returns the bytes moved."""
        from pathlib import Path

        from ..core.shapes import tensor_nbytes
        from ..model.mapped import spilled

        folder = Path(folder)
        cand = spilled(((t.name, t) for t in self.candidate.graph.initializer), folder / "candidate.weights",
                       min_bytes)
        floats = ((k, t) for k, t in self.ref_consts.items() if t.data_type == TensorProto.FLOAT)
        ref = spilled(floats, folder / "reference.weights", min_bytes)
        if cand:
            model = onnx.ModelProto()
            model.CopyFrom(self.candidate)  # the same nodes in the same places: positions stay valid
            for t in model.graph.initializer:
                if t.name in cand:
                    t.CopyFrom(cand[t.name])
            self.candidate = model
        self.ref_consts = {name: ref.get(name, t) for name, t in self.ref_consts.items()}
        return sum(tensor_nbytes(t) for t in (*cand.values(), *ref.values()))

    def check(self, nodes: Iterable[str]) -> list[str]:
        """``nodes`` deduplicated, each a top-level compute node of the candidate (else a one-line error)."""
        names = list(dict.fromkeys(nodes))
        for name in names:
            node = self.idx.node(name)
            if node.op_type in QDQ_OPS:
                raise RepairError(f"node {name!r} is a {node.op_type}", "name the node it quantizes for instead")
            if holds_subgraphs(node):
                raise RepairError(f"node {name!r} is a{'n' if node.op_type[0] in 'AEIOU' else ''} {node.op_type} "
                                  "holding subgraphs: keeping it in reference precision is not supported",
                                  "name nodes outside it (workbench compare shows the nodes inside its branch "
                                  "when every feed takes the same one)")
        return names

    def build(self, nodes: Iterable[str]) -> onnx.ModelProto:
        """The candidate with ``nodes`` kept in the reference's precision (a new model)."""
        return self._edit(self.check(nodes), switches=False)[0]

    def switchable(self, pool: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, str]]:
        """(model, node -> boolean graph input): feed True to keep that node. Every float graph input of the
        candidate stays as is; the switches are scalars."""
        return self._edit(self.check(pool), switches=True)

    # --- the edit -------------------------------------------------------------------------------------------
    def _edit(self, names: list[str], switches: bool) -> tuple[onnx.ModelProto, dict[str, str]]:
        model = onnx.ModelProto()
        model.CopyFrom(self.candidate)
        g = model.graph
        before = use_counts(g)
        edit = _Edit(self, model, set(names), Names(self.idx.names | {n.name for n in g.node}))
        flags = {}
        if switches:
            for name in names:
                flags[name] = edit.fresh(f"{PREFIX}_keep/{name}")
                g.input.append(helper.make_tensor_value_info(flags[name], TensorProto.BOOL, []))
        edit.run(flags)
        if not switches:
            prune(g, before)
        sort_nodes(model)
        return model, flags


class _Edit:
    """One edit of a copy of the candidate (node objects of the copy share positions with the original's)."""

    def __init__(self, builder: IslandBuilder, model: onnx.ModelProto, kept: set[str], fresh: Names):
        self.b, self.idx, self.model, self.kept, self.fresh = builder, builder.idx, model, kept, fresh
        self.twin: dict[str, str] = {}  # candidate tensor -> what an island reads for it
        self.restored: dict[str, str] = {}
        self.widened: dict[str, str] = {}
        self.before: dict[int, list[onnx.NodeProto]] = {}  # position -> nodes to insert before it
        self.after: dict[int, list[onnx.NodeProto]] = {}
        self.drop: set[int] = set()  # positions of nodes replaced by their islands

    def copy_of(self, node: onnx.NodeProto) -> onnx.NodeProto:
        return self.model.graph.node[self.b.position[id(node)]]

    def run(self, flags: dict[str, str]) -> None:
        order = sorted(self.kept, key=lambda n: self.b.position[id(self.idx.by_name[n])])
        if self.b.kind == "float":
            for name in order:
                self._name_float_outputs(self.idx.by_name[name], flags.get(name))
            for name in order:
                self._float_island(self.idx.by_name[name], flags.get(name))
        else:
            for name in order:
                self._qdq_island(self.idx.by_name[name], flags.get(name))
        g = self.model.graph
        nodes = []
        for i, node in enumerate(g.node):
            nodes += self.before.get(i, [])
            if i not in self.drop:
                nodes.append(node)
            nodes += self.after.get(i, [])
        copies = [onnx.NodeProto() for _ in nodes]
        for c, n in zip(copies, nodes):
            c.CopyFrom(n)
        del g.node[:]
        g.node.extend(copies)

    # --- FP16/BF16 islands --------------------------------------------------------------------------------
    def _narrow_type(self, node: onnx.NodeProto, out: str) -> int:
        """The candidate's element type of ``out`` when it is FP16/BF16 (unknown: that of the node's inputs)."""
        t = self.idx.type(out)
        if t in NARROW:
            return t
        if t == 0:
            return next((self.idx.type(i) for i in node.input if i and self.idx.type(i) in NARROW), 0)
        return 0

    def _name_float_outputs(self, node: onnx.NodeProto, flag: str | None) -> None:
        """Decide what downstream islands read for each output (before any island is built)."""
        for o in node.output:
            if not o:
                continue
            if flag is None:
                self.twin[o] = self.fresh(f"{o}::fp32") if self._narrow_type(node, o) else o
            else:  # switchable: the wide selection, Where(keep, island, Cast(original))
                self.twin[o] = self.fresh(f"{o}::wide") if self._narrow_type(node, o) else o

    def _float_island(self, node: onnx.NodeProto, flag: str | None) -> None:
        pos = self.b.position[id(node)]
        island = onnx.NodeProto()
        island.CopyFrom(node)
        del island.input[:]
        island.input.extend([self._float_input(t, pos) if t else "" for t in node.input])
        self._reference_attributes(island)
        post: list[onnx.NodeProto] = []
        original = self.copy_of(node)
        if flag is not None:
            island.name = self.fresh(f"{node.name}::fp32")
        for j, o in enumerate(node.output):
            if not o:
                continue
            narrow = self._narrow_type(node, o)
            if flag is None:
                if narrow:
                    island.output[j] = self.twin[o]
                    post.append(cast(self.twin[o], o, narrow, self.fresh(f"{node.name}/{PREFIX}_cast_out{j}")))
                continue
            mine, orig = self.fresh(f"{o}::fp32"), self.fresh(f"{o}::orig")
            island.output[j], original.output[j] = mine, orig
            if narrow:
                orig32 = self.fresh(f"{o}::orig32")
                post += [cast(orig, orig32, TensorProto.FLOAT, self.fresh(f"{node.name}/{PREFIX}_orig{j}")),
                         helper.make_node("Where", [flag, mine, orig32], [self.twin[o]],
                                          name=self.fresh(f"{node.name}/{PREFIX}_select{j}")),
                         cast(self.twin[o], o, narrow, self.fresh(f"{node.name}/{PREFIX}_cast_out{j}"))]
            else:
                post.append(helper.make_node("Where", [flag, mine, orig], [o],
                                             name=self.fresh(f"{node.name}/{PREFIX}_select{j}")))
        for o in node.output:  # a converter's Cast back to FP32 (e.g. to an FP32 graph output) reads the FP32 value
            if o and self._narrow_type(node, o):
                for c in self.idx.consumers.get(o, []):
                    if c.op_type == "Cast" and c.name not in self.b.ref_nodes and c.name not in self.kept \
                            and any(a.name == "to" and a.i == TensorProto.FLOAT for a in c.attribute):
                        copy = self.copy_of(c)
                        copy.input[list(copy.input).index(o)] = self.twin[o]
        if flag is None:
            self.drop.add(pos)
        self.after.setdefault(pos, []).extend([island, *post])

    def _float_input(self, t: str, pos: int) -> str:
        src = self._cast_source(t)
        if src in self.twin:  # a kept producer: its FP32 value
            return self.twin[src]
        if src in self.idx.consts and self.idx.type(src) in NARROW:
            restored = self._restore(src, src)
            if restored:
                return restored
        if self.idx.type(src) == TensorProto.FLOAT:
            return src
        if self.idx.type(t) in NARROW:
            if t not in self.widened:
                self.widened[t] = self.fresh(f"{t}::to_fp32")
                self.before.setdefault(pos, []).append(
                    cast(t, self.widened[t], TensorProto.FLOAT, self.fresh(f"{t}/{PREFIX}_cast_in")))
            return self.widened[t]
        return t

    def _cast_source(self, t: str) -> str:
        """Follow Casts the converter inserted (float to float, absent from the reference) back to their source."""
        for _ in range(16):
            p = self.idx.producer.get(t)
            if p is None or p.op_type != "Cast" or p.name in self.b.ref_nodes or p.name in self.kept or not p.input:
                return t
            src = p.input[0]
            if self.idx.type(src) not in FLOATS or self.idx.type(t) not in FLOATS:
                return t
            t = src
        return t

    def _reference_attributes(self, island: onnx.NodeProto) -> None:
        """Type attributes (Cast.to, ...) and float tensor attributes the converter narrowed: the reference's."""
        ref = self.b.ref_nodes.get(island.name)
        ref_attrs = {a.name: a for a in ref.attribute} if ref is not None and ref.op_type == island.op_type else {}
        for a in island.attribute:
            r = ref_attrs.get(a.name)
            if a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i in NARROW:
                a.i = r.i if r is not None and r.i in FLOATS else TensorProto.FLOAT
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type in NARROW:
                if r is not None and r.type == a.type and r.t.data_type == TensorProto.FLOAT:
                    a.t.CopyFrom(r.t)
                else:
                    from onnx import numpy_helper

                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype("float32"), a.t.name))

    def _restore(self, cand_name: str, ref_name: str) -> str | None:
        """An FP32 initializer holding the reference's value of ``ref_name`` (cached per edit), or None when the
        reference has no float32 constant of that name and shape."""
        if cand_name in self.restored:
            return self.restored[cand_name]
        ref = self.b.ref_consts.get(ref_name)
        cand = self.idx.consts.get(cand_name)
        if ref is None or ref.data_type != TensorProto.FLOAT or cand is None or list(ref.dims) != list(cand.dims):
            return None
        name = ref_name if ref_name not in self.fresh.taken else self.fresh(f"{ref_name}::fp32")
        self.fresh.taken.add(name)
        tensor = onnx.TensorProto()
        tensor.CopyFrom(ref)
        tensor.name = name
        self.model.graph.initializer.append(tensor)
        self.restored[cand_name] = name
        return name

    # --- Q/DQ removal ---------------------------------------------------------------------------------------
    def _qdq_island(self, node: onnx.NodeProto, flag: str | None) -> None:
        pos = self.b.position[id(node)]
        original = self.copy_of(node)
        inputs = [self._qdq_input(t) if t else "" for t in node.input]
        if flag is None:  # in place: float inputs, and the output's own Q/DQ dropped for its consumers
            del original.input[:]
            original.input.extend(inputs)
            for o in original.output:
                for dq in self._own_dequantize(o):
                    copy = self.copy_of(dq)
                    dq_out = copy.output[0]
                    copy.CopyFrom(helper.make_node("Identity", [self._activated(o)], [dq_out], name=copy.name))
            return
        island = onnx.NodeProto()
        island.CopyFrom(node)
        island.name = self.fresh(f"{node.name}::float")
        del island.input[:]
        island.input.extend(inputs)
        post = [island]
        for j, o in enumerate(node.output):
            if not o:
                continue
            mine, orig = self.fresh(f"{o}::float"), self.fresh(f"{o}::orig")
            island.output[j], original.output[j] = mine, orig
            post.append(helper.make_node("Where", [flag, mine, orig], [o],
                                         name=self.fresh(f"{node.name}/{PREFIX}_select{j}")))
            mine_act = self._activated(o, mine, pos)
            for dq in self._own_dequantize(o):
                copy = self.copy_of(dq)
                dq_out, dq_orig = copy.output[0], self.fresh(f"{copy.output[0]}::orig")
                copy.output[0] = dq_orig
                self.after.setdefault(self.b.position[id(dq)], []).append(helper.make_node(
                    "Where", [flag, mine_act, dq_orig], [dq_out], name=self.fresh(f"{copy.name}/{PREFIX}_select")))
        self.after.setdefault(pos, []).extend(post)

    def _activated(self, tensor: str, source: str | None = None, pos: int | None = None) -> str:
        """``tensor`` (its float value ``source``, default itself) through the Relu/Clip the quantizer folded into
        its Q/DQ range, built once per edit after ``source``'s producer; ``tensor`` itself when none was folded."""
        ref = self.b.folded.get(tensor)
        if ref is None:
            return source or tensor
        source = source or tensor
        key = f"{source}\0act"
        if key not in self.widened:
            from .qdq_folded import activation_node

            out = self.fresh(f"{tensor}::{ref.op_type.lower()}")
            node, inits = activation_node(ref, source, out, self.fresh(f"{ref.name}::{PREFIX}_refolded"),
                                          self.b.ref_consts, self.fresh)
            self.model.graph.initializer.extend(inits)
            if pos is None:
                producer = self.idx.producer.get(tensor)
                pos = self.b.position[id(producer)] if producer is not None else 0
            self.after.setdefault(pos, []).append(node)
            self.widened[key] = out
        return self.widened[key]

    def _own_dequantize(self, tensor: str) -> list[onnx.NodeProto]:
        """DequantizeLinear nodes reading QuantizeLinear(``tensor``): the Q/DQ pair(s) on that output."""
        found = []
        for q in self.idx.consumers.get(tensor, []):
            if q.op_type == "QuantizeLinear" and q.input and q.input[0] == tensor:
                found += [d for d in self.idx.consumers.get(q.output[0], []) if d.op_type == "DequantizeLinear"
                          and d.input[0] == q.output[0]]
        return found

    def _qdq_input(self, t: str) -> str:
        p = self.idx.producer.get(t)
        if p is None or p.op_type != "DequantizeLinear" or not p.input:
            return t
        src = p.input[0]
        q = self.idx.producer.get(src)
        if q is not None and q.op_type == "QuantizeLinear" and q.input:
            return self._activated(q.input[0])  # the float value (a kept producer's: the same name)
        if src in self.idx.consts:  # a quantized weight: the reference's float value
            base = src[: -len("_quantized")] if src.endswith("_quantized") else src
            return self._restore(src, base) or t
        return t

