"""Inline If branches that the feeds decide, so nodes inside them can be compared and isolated.

Tensors inside a subgraph cannot be marked as outputs. When every feed takes the same branch of an If
(its condition is a graph input or a tensor the reference computes), the If is replaced by the nodes of
that branch (plus Identity nodes onto the If's outputs). For those feeds the model computes the same
values, and the branch's nodes become ordinary top-level nodes.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper

log = logging.getLogger(__name__)


def if_conditions(model: onnx.ModelProto) -> dict[str, str]:
    """If node name -> the tensor holding its condition (top-level Ifs only)."""
    return {n.name: n.input[0] for n in model.graph.node if n.op_type == "If"}


def inline_ifs(model: onnx.ModelProto, taken: dict[str, bool]) -> onnx.ModelProto:
    """A copy of ``model`` with each If named in ``taken`` replaced by its then (True) or else (False) branch."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type != "If" or node.name not in taken:
            nodes.append(node)
            continue
        attr = "then_branch" if taken[node.name] else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == attr)
        out.graph.initializer.extend(branch.initializer)
        nodes.extend(branch.node)
        for branch_out, if_out in zip(branch.output, node.output):
            nodes.append(helper.make_node("Identity", [branch_out.name], [if_out], name=f"{node.name}/{attr}/out"))
        out.graph.value_info.extend(branch.value_info)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def decide_branches(conditions: dict[str, str], values: list[dict[str, np.ndarray]]) -> tuple[dict[str, bool], dict]:
    """Which Ifs every feed sends down the same branch; the others (and why) for a note."""
    taken, undecided = {}, {}
    for node, cond in conditions.items():
        seen = {bool(np.asarray(v[cond]).reshape(-1)[0]) for v in values if cond in v}
        if len(seen) == 1 and all(cond in v for v in values):
            taken[node] = seen.pop()
        else:
            undecided[node] = "feeds take different branches" if seen else "condition not computed"
    return taken, undecided
