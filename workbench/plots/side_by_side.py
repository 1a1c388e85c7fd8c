"""The reference and the candidate graph side by side, both coloured by one comparison: which candidate node is
each reference node's counterpart, which candidate nodes have none (the Casts an FP16 conversion inserts, the Q/DQ
pairs of an INT8 model), and the candidate's graph coloured by the numbers of the reference node it stands for.

Counterparts: a node of the same name (converters keep names), else the producer of the candidate tensor the
comparison paired with the reference node's output (``TensorResult.candidate_tensor``: renamed tensors, a user's own
file), looking back through inserted Cast / Q / DQ nodes to the computing node; else the candidate node producing a
tensor of the same name. Pure functions: graphs and a result in, dicts out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .graph import GraphView, graph_payload

#: op types a converter or a quantizer inserts (a candidate-only node of these is "inserted", not "extra")
INSERTED_OPS = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
#: the colour of a candidate-only node (no reference counterpart)
CANDIDATE_ONLY = "#8d6e63"


@dataclass
class NodeMatch:
    """Reference node -> candidate node and back; the candidate's nodes without a counterpart, and why."""

    ref_to_cand: dict[str, str] = field(default_factory=dict)
    cand_to_ref: dict[str, str] = field(default_factory=dict)
    #: candidate node -> its op type, for nodes no reference node maps to (Cast, Q/DQ, or anything else added)
    candidate_only: dict[str, str] = field(default_factory=dict)
    reference_only: list[str] = field(default_factory=list)

    def counterpart(self, name: str, side: str) -> str | None:
        """The other side's node for ``name`` on ``side`` ("reference" or "candidate"), None when it has none."""
        return (self.ref_to_cand if side == "reference" else self.cand_to_ref).get(name)

    def summary(self) -> str:
        """``7 nodes matched; 2 only in the candidate (Cast x2)``."""
        from collections import Counter

        text = f"{len(self.ref_to_cand)} node(s) matched"
        if self.candidate_only:
            ops = Counter(self.candidate_only.values()).most_common(4)
            text += f"; {len(self.candidate_only)} only in the candidate (" + ", ".join(
                f"{op} x{n}" for op, n in ops) + ")"
        if self.reference_only:
            text += f"; {len(self.reference_only)} reference node(s) without a counterpart"
        return text


def _walk_back(cand: Any, node: str | None, known_ref: set[str]) -> str | None:
    """From a candidate node, back through inserted nodes (not named as a reference node) to the one computing."""
    seen: set[str] = set()
    while node is not None and node not in seen:
        seen.add(node)
        info = cand.node(node)
        if info.op_type not in INSERTED_OPS or node in known_ref:
            return node
        first = next((t for t in info.inputs if t), None)
        node = cand.producer.get(first) if first else None
    return None


def match_nodes(ref: Any, cand: Any, result: Any = None) -> NodeMatch:
    """Pair the nodes of ``ref`` and ``cand`` (:class:`~workbench.model.graph.GraphInfo`), using ``result``'s tensor
    pairing (a :class:`~workbench.compare.result.CompareResult`) where names differ."""
    ref_names = [n.name for n in ref.nodes]
    known_ref = set(ref_names)
    cand_names = {n.name for n in cand.nodes}
    match = NodeMatch()

    def pair(r: str, c: str | None) -> None:
        if c is not None and r not in match.ref_to_cand and c not in match.cand_to_ref:
            match.ref_to_cand[r] = c
            match.cand_to_ref[c] = r

    for r in ref_names:  # 1. the same name
        if r in cand_names:
            pair(r, r)
    for t in (result.tensors if result is not None else []):  # 2. the comparison's tensor pairing
        if t.node in match.ref_to_cand:
            continue
        produced = cand.producer.get(t.candidate_tensor or t.tensor)
        pair(t.node, _walk_back(cand, produced, known_ref) if produced else None)
    for r in ref_names:  # 3. a tensor of the same name
        if r in match.ref_to_cand:
            continue
        for out in ref.node(r).outputs:
            produced = cand.producer.get(out) if out else None
            if produced:
                pair(r, _walk_back(cand, produced, known_ref))
                break
    match.candidate_only = {n.name: n.op_type for n in cand.nodes if n.name not in match.cand_to_ref}
    match.reference_only = [r for r in ref_names if r not in match.ref_to_cand]
    return match


def candidate_result(result: Any, match: NodeMatch) -> Any:
    """``result`` told in the candidate's node names (each tensor, culprit and the first divergent one under its
    counterpart), so the candidate's graph is coloured by the same numbers; reference nodes without a counterpart
    are left out."""
    if result is None:
        return None
    tensors = [dataclasses.replace(t, node=match.ref_to_cand[t.node]) for t in result.tensors
               if t.node in match.ref_to_cand]
    culprits = [dataclasses.replace(c, node=match.ref_to_cand[c.node]) for c in result.culprits
                if c.node in match.ref_to_cand]
    told = dataclasses.replace(result, tensors=tensors, culprits=culprits)
    return told


def side_payloads(ref_view: GraphView, cand_view: GraphView, match: NodeMatch, result: Any, *,
                  overlay: str = "error", bands: Any = None, ref_options: dict | None = None,
                  cand_options: dict | None = None) -> tuple[dict, dict]:
    """What the two graph widgets draw: the reference coloured by ``result`` (``overlay``, ``bands``), the
    candidate by the same numbers under its own node names, its candidate-only nodes in CANDIDATE_ONLY (a legend
    entry counts them). ``*_options``: each side's collapse (``depth``, ``expanded``, ``focus``, ``hops``).
    Each payload's ``counterpart`` lists, per item, the other side's node ("" for none); ``side`` names it."""
    ref_opts, cand_opts = dict(ref_options or {}), dict(cand_options or {})
    if overlay == "precision":  # each side its own dtypes (the candidate's fp16 is its own, not the reference's)
        left = graph_payload(ref_view, overlay=overlay, **ref_opts)
        right = graph_payload(cand_view, overlay=overlay, **cand_opts)
    else:
        left = graph_payload(ref_view, overlay=overlay, result=result, bands=bands, **ref_opts)
        right = graph_payload(cand_view, overlay=overlay, result=candidate_result(result, match), bands=bands,
                              **cand_opts)
    extra = 0
    for k, item in enumerate(right["ids"]):
        if item in match.candidate_only and cand_view.ops[cand_view.index[item]] != "Constant":
            right["color"][k] = CANDIDATE_ONLY
            op = match.candidate_only[item]
            right["tips"][k] += ("\ninserted by the conversion: no reference counterpart" if op in INSERTED_OPS
                                 else "\nonly in the candidate: no reference counterpart")
            extra += 1
    if extra:
        right["legend"].append([f"only in the candidate ({extra} shown)", CANDIDATE_ONLY])
    left["side"], right["side"] = "reference", "candidate"
    left["counterpart"] = [match.ref_to_cand.get(i, "") for i in left["ids"]]
    right["counterpart"] = [match.cand_to_ref.get(i, "") for i in right["ids"]]
    return left, right


def pair_numbers(result: Any, match: NodeMatch, ref: Any, cand: Any, name: str, side: str) -> dict:
    """Both sides' numbers of a selected node: ``{"reference": {node, op, tensor, type}, "candidate": {...},
    "metrics": {...}, "floor": the candidate format's floor or None, "diverged", "at_floor", "culprit": rank or None,
    "only": "candidate"|"reference"|""}``."""
    if side == "reference":
        r, c = name, match.ref_to_cand.get(name)
    else:
        r, c = match.cand_to_ref.get(name), name
    out: dict[str, Any] = {"only": "" if r and c else side, "metrics": {}, "floor": None, "diverged": None,
                           "at_floor": None,
                           "culprit": None, "reference": None, "candidate": None}
    tensor = next((t for t in (result.tensors if result is not None else []) if r and t.node == r), None)
    for key, graph, node, wanted in (("reference", ref, r, tensor.tensor if tensor else None),
                                     ("candidate", cand, c, (tensor.candidate_tensor or tensor.tensor)
                                      if tensor else None)):
        if not node:
            continue
        info = graph.node(node)
        shown = wanted if wanted in graph.tensors else next((o for o in info.outputs if o), "")
        ti = graph.tensors.get(shown)
        dims = "?" if ti is None or ti.shape is None else "[" + ", ".join(
            "?" if d is None else str(d) for d in ti.shape) + "]"
        out[key] = {"node": node, "op": info.op_type, "tensor": shown,
                    "type": f"{(ti.dtype if ti is not None else None) or '?'} {dims}"}
    if tensor is not None:
        out["metrics"] = dict(tensor.metrics)
        out["floor"] = dict(tensor.floor) if tensor.floor else None
        out["diverged"], out["at_floor"] = bool(tensor.diverged), bool(tensor.at_floor)
        out["culprit"] = next((k for k, cu in enumerate(result.culprits, 1) if cu.node == r), None)
    return out
