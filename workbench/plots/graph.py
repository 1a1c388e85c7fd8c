"""The model graph as drawable data: layered layout, name-scope collapsing, k-hop focus, colour overlays.

:func:`graph_payload` turns a :class:`~workbench.model.graph.GraphInfo` (plus, optionally, a comparison result
and an engine graph: see :mod:`.graph_engine` for the provider, runtime precision and latency overlays and the
fused-group boxes) into the arrays the notebook's graph widget draws (``workbench/ui/static/graph.js``);
:func:`graph_figure` draws the same thing as a static plotly figure for reports. Pure functions: nothing here
runs an engine.

Collapsing: node names such as ``/encoder/layer.3/attn/MatMul`` carry scopes (``encoder``, ``layer.3``,
``attn``). At ``depth`` d every node is shown as its scope's first d levels (one box per scope), except scopes
listed in ``expanded``, which open one level further. Large graphs start at the deepest depth that keeps the
view under ``max_nodes`` boxes.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .graph_engine import (
    ENGINE_OVERLAYS,
    GROUP_COLOR,
    GROUP_FILL,
    EngineView,
    engine_classes,
    engine_color,
    fused_groups,
    scope_class,
)
from .graph_layout import layered_layout

OVERLAYS = {
    "op_type": "operator type",
    "diverged": "diverged (full run)",
    "error": "error vs the colour bands (full run)",
    "introduced": "error introduced (culprits)",
    "precision": "precision",
    **ENGINE_OVERLAYS,
}
#: overlays drawn from a comparison result (the others: from the model alone, or from an engine graph)
RESULT_OVERLAYS = ("diverged", "error", "introduced")
#: most frequent op types first; the rest share OTHER
PALETTE = ["#4e79a7", "#f28e2b", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
           "#d4a6c8", "#a0cbe8", "#ffbe7d"]
OTHER, GROUP, NOT_COMPARED = "#cfd8dc", "#eceff1", "#e0e0e0"
DIVERGED, FIRST, AGREES = "#e53935", "#fb8c00", "#66bb6a"
#: error relative to the tolerance, on a log10 scale (0 = at the tolerance; -1 = ten times below it)
ERROR_BANDS = [(-3.0, "#1b5e20", "over 1000x below tolerance"), (-1.5, "#66bb6a", "30-1000x below"),
               (-0.5, "#d4e157", "3-30x below"), (0.0, "#ffb300", "within 3x of tolerance"),
               (math.inf, "#e53935", "over tolerance")]
NONFINITE = ("#6a1b9a", "non-finite mismatch")
CULPRIT_COLORS = ["#b71c1c", "#e53935", "#ef5350", "#ef9a9a"]
PRECISION_COLORS = {"fp32": "#90a4ae", "float32": "#90a4ae", "fp16": "#42a5f5", "float16": "#42a5f5",
                    "int8": "#ab47bc", "uint8": "#ab47bc", "float64": "#8d6e63"}


def scope_of(name: str) -> tuple[str, ...]:
    """``/a/b/op`` -> ``("a", "b")``; names without ``/`` have no scope."""
    parts = [p for p in name.split("/") if p]
    return tuple(parts[:-1]) if len(parts) > 1 else ()


def scope_id(scope: Iterable[str]) -> str:
    return "scope:/" + "/".join(scope)


@dataclass
class GraphView:
    """A graph's nodes (topological order), edges between them, and each node's scope: built once per model.
    ``edge_tensors[k]``: the tensor(s) edge ``edges[k]`` carries, described ("name  float32 [1, 8]");
    ``hidden``: the nodes left out (Constant, Identity: see :meth:`from_graph`)."""

    names: list[str]
    ops: list[str]
    edges: list[tuple[int, int]]
    scopes: list[tuple[str, ...]]
    outputs: list[str]
    shapes: list[str]
    index: dict[str, int] = field(default_factory=dict)
    edge_tensors: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)

    @classmethod
    def from_graph(cls, graph: Any, constants: bool = False, hide: Iterable[str] = ()) -> GraphView:
        """``constants``: show Constant nodes too (parameters, not layers: hidden by default, as Netron does).
        ``hide``: op types left out as well (``("Identity",)``); an edge through a hidden node is bridged: its
        consumers are joined to what feeds it (its first input)."""
        hidden_ops = set(hide) | (set() if constants else {"Constant"})
        nodes = [n for n in graph.nodes if n.op_type not in hidden_ops]
        gone = [n for n in graph.nodes if n.op_type in hidden_ops]
        alias: dict[str, str] = {}  # a hidden node's output -> the tensor it passes on (its first input)
        for n in gone:  # topological order: a chain of hidden nodes resolves to its first source
            src = next((t for t in n.inputs if t), None)
            if src is not None:
                for o in n.outputs:
                    if o:
                        alias[o] = alias.get(src, src)
        names = [n.name for n in nodes]
        index = {n: i for i, n in enumerate(names)}
        producer_index = {t: index[p] for t, p in graph.producer.items() if p in index}
        carried: dict[tuple[int, int], list[str]] = {}
        for v, n in enumerate(nodes):
            for t in n.inputs:
                u = producer_index.get(alias.get(t, t))
                if u is not None and u != v and t not in carried.setdefault((u, v), []):
                    carried[(u, v)].append(t)
        edges = sorted(carried)
        edge_tensors = ["\n".join(f"{t}  {_describe_tensor(graph.tensors.get(t))}".rstrip() for t in carried[e])
                        for e in edges]
        outputs = [next((o for o in n.outputs if o), "") for n in nodes]
        shapes = [_describe_tensor(graph.tensors.get(o)) for o in outputs]
        return cls(names, [n.op_type for n in nodes], edges, [scope_of(n) for n in names], outputs, shapes, index,
                   edge_tensors, [n.name for n in gone])

    @property
    def max_depth(self) -> int:
        return max((len(s) for s in self.scopes), default=0)

    def neighbourhood(self, centre: str, hops: int) -> list[int]:
        """Indices of nodes within ``hops`` edges of ``centre`` (either direction), in topological order."""
        adj: dict[int, list[int]] = {}
        for u, v in self.edges:
            adj.setdefault(u, []).append(v)
            adj.setdefault(v, []).append(u)
        start = self.index[centre]
        seen, todo = {start: 0}, deque([start])
        while todo:
            u = todo.popleft()
            if seen[u] >= hops:
                continue
            for w in adj.get(u, ()):
                if w not in seen:
                    seen[w] = seen[u] + 1
                    todo.append(w)
        return sorted(seen)


def _describe_tensor(info: Any) -> str:
    if info is None or (info.dtype is None and info.shape is None):
        return ""
    shape = "?" if info.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in info.shape) + "]"
    return f"{info.dtype or '?'} {shape}"


#: values shown of a tensor attribute or initializer in the node inspector
INSPECT_VALUES = 6
#: tensors over this many elements are described by dtype and shape only (decoding them would stall a click)
INSPECT_MAX_ELEMENTS = 1 << 22


def summarize_value(value: Any) -> str:
    """An attribute value as the inspector shows it: scalars and short lists as they are, tensors as dtype, shape
    and their first few values, graphs by their node count."""
    import numpy as np
    import onnx

    from ..model.mapped import tensor_array

    if isinstance(value, onnx.TensorProto):
        dims = list(value.dims)
        if math.prod(dims) > INSPECT_MAX_ELEMENTS:  # a big weight: not decoded to show six values
            return f"tensor {onnx.TensorProto.DataType.Name(value.data_type).lower()} {dims}"
        try:
            arr = np.asarray(tensor_array(value))  # weights left in files: read from there
        except Exception:  # noqa: BLE001 - external or odd data: shape and type only
            return f"tensor {onnx.TensorProto.DataType.Name(value.data_type).lower()} {list(value.dims)}"
        flat = arr.reshape(-1)[:INSPECT_VALUES]
        vals = ", ".join(f"{v:.6g}" if isinstance(v, (float, np.floating)) else str(v) for v in flat.tolist())
        more = ", ..." if arr.size > INSPECT_VALUES else ""
        return f"tensor {arr.dtype.name} {list(arr.shape)}: [{vals}{more}]"
    if isinstance(value, onnx.GraphProto):
        return f"graph {value.name or ''} ({len(value.node)} nodes)".replace("  ", " ")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        shown = [summarize_value(v) for v in value[:16]]
        return "[" + ", ".join(shown) + (f", ... ({len(value)} items)" if len(value) > 16 else "") + "]"
    return str(value)


def node_details(proto: Any, graph: Any, name: str) -> dict:
    """What the inspector shows of node ``name`` (like Netron): op type, domain, its attributes (name, type,
    value summarised), its inputs and outputs (name, kind, dtype and shape; an initializer's first values).
    ``proto``: the ModelProto (attributes); ``graph``: its GraphInfo (tensor shapes and dtypes)."""
    import onnx
    from onnx import helper

    info = graph.node(name)
    node = next((n for n in proto.graph.node if n.name == name), None)
    attributes = []
    for a in node.attribute if node is not None else []:
        try:
            value = summarize_value(helper.get_attribute_value(a))
        except Exception as e:  # noqa: BLE001 - an attribute onnx cannot read is reported, not raised
            value = f"(unreadable: {e})"
        attributes.append({"name": a.name, "type": onnx.AttributeProto.AttributeType.Name(a.type).lower(),
                           "value": value})
    inits = {t.name: t for t in proto.graph.initializer}

    def tensor(t: str) -> dict:
        ti = graph.tensors.get(t)
        row = {"name": t, "kind": ti.kind if ti is not None else "", "type": _describe_tensor(ti)}
        if t in inits:
            row["value"] = summarize_value(inits[t])
        return row

    return {"name": name, "op_type": info.op_type, "domain": info.domain, "index": info.topo_index,
            "attributes": attributes, "inputs": [tensor(t) for t in info.inputs if t],
            "outputs": [tensor(t) for t in info.outputs if t]}


def items_at(view: GraphView, depth: int | None, expanded: Iterable[str] = (),
             members: list[int] | None = None) -> tuple[list[str], list[list[int]]]:
    """(item ids, member node indices) at a collapse ``depth`` (None: every node), in topological order."""
    members = list(range(len(view.names))) if members is None else members
    opened = set(expanded)
    groups: dict[str, list[int]] = {}
    for i in members:
        scope = view.scopes[i]
        key = None
        if depth is not None and scope:
            k = min(depth, len(scope))
            while k < len(scope) and scope_id(scope[:k]) in opened:
                k += 1
            if not (k == len(scope) and scope_id(scope) in opened):
                key = scope_id(scope[:k])
        groups.setdefault(key or view.names[i], []).append(i)
    items = []
    for key, idx in groups.items():
        if key.startswith("scope:") and len(idx) == 1:
            key = view.names[idx[0]]
        items.append((idx[0], key, idx))
    items.sort()
    return [k for _, k, _ in items], [m for _, _, m in items]


def auto_depth(view: GraphView, max_nodes: int = 1500) -> int | None:
    """The deepest collapse depth (1 to ``view.max_depth``) that shows at most ``max_nodes`` boxes, else the
    shallowest (None: the graph fits as it is, or its names have no scopes to collapse)."""
    if len(view.names) <= max_nodes or view.max_depth < 1:
        return None
    best = 1
    for d in range(1, view.max_depth + 1):
        if len(items_at(view, d)[0]) <= max_nodes:
            best = d
        else:
            break
    return best


def reveal(view: GraphView, node: str, depth: int | None, expanded: Iterable[str] = ()) -> set[str]:
    """``expanded`` plus the scopes that must open for ``node`` to show as itself at ``depth``."""
    opened = set(expanded)
    if depth is None or node not in view.index:
        return opened
    scope = view.scopes[view.index[node]]
    for k in range(min(depth, len(scope)), len(scope) + 1):
        opened.add(scope_id(scope[:k]))
    return opened


def rank_matches(view: GraphView, text: str) -> list[int]:
    """Indices of the nodes matching ``text``, best first: the exact name (case-sensitive, then not), the name's
    last path segment exactly, then starting with ``text``, then the op type exactly, then any name containing
    ``text`` (case-insensitive); topological order within each class. "Sigmoid.0" finds ``Sigmoid.0`` before
    ``HardSigmoid.0``."""
    text = (text or "").strip()
    if not text:
        return []
    low = text.lower()
    ranked: list[tuple[int, int]] = []
    for i, name in enumerate(view.names):
        lname = name.lower()
        last = lname.rstrip("/").rsplit("/", 1)[-1]
        if name == text:
            rank = 0
        elif lname == low:
            rank = 1
        elif last == low:
            rank = 2
        elif last.startswith(low):
            rank = 3
        elif view.ops[i].lower() == low:
            rank = 4
        elif low in lname:
            rank = 5
        else:
            continue
        ranked.append((rank, i))
    ranked.sort()
    return [i for _, i in ranked]


# --- overlays ------------------------------------------------------------------------------------------------
def _op_colors(view: GraphView) -> dict[str, str]:
    ranked = [op for op, _ in Counter(view.ops).most_common()]
    return {op: (PALETTE[i] if i < len(PALETTE) else OTHER) for i, op in enumerate(ranked)}


def error_ratio(metrics: dict, criterion: Any) -> float:
    """How far a tensor's error sits from the tolerance, log10 (0: at it, -1: ten times below, >0: over)."""
    from ..core.metric_info import HIGHER_IS_BETTER

    value = metrics.get(criterion.metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -math.inf
    value, threshold = float(value), float(criterion.threshold)
    if criterion.metric == "sqnr_db":
        return (threshold - value) / 10.0
    if criterion.metric in HIGHER_IS_BETTER:  # cosine: compare 1 - value with 1 - threshold
        value, threshold = 1.0 - value, 1.0 - threshold
    if value <= 0:
        return -math.inf
    return math.log10(value / threshold) if threshold > 0 else math.inf


def _band(ratio: float) -> int:
    return next(i for i, (upper, _, _) in enumerate(ERROR_BANDS) if ratio <= upper)


def _node_classes(view: GraphView, overlay: str, result: Any, engine: EngineView | None = None,
                  bands: Any = None) -> tuple[list[Any], list[tuple[str, str]]]:
    """Per node: a sortable class (higher = more remarkable) and the legend ((label, colour) ...). ``bands``
    (:class:`~workbench.plots.thresholds.Bands` of the result's metric): the "error" overlay colours by them."""
    if overlay in ENGINE_OVERLAYS:
        return engine_classes(view.names, overlay, engine)
    n = len(view.names)
    by_node = {}
    if result is not None:
        for t in result.tensors:
            by_node.setdefault(t.node, t)
    if overlay == "diverged":
        first = result.first_divergent.node if result is not None and result.first_divergent else None
        cls = [0 if view.names[i] not in by_node else
               (3 if view.names[i] == first else 2 if by_node[view.names[i]].diverged else 1) for i in range(n)]
        return cls, [("not compared", NOT_COMPARED), ("agrees", AGREES), ("diverged", DIVERGED),
                     ("first divergent", FIRST)]
    if overlay == "error" and _uses(bands, result):
        return _band_classes(view, by_node, bands)
    if overlay == "error":
        cls = []
        for name in view.names:
            t = by_node.get(name)
            if t is None:
                cls.append(-1)
            elif (t.metrics.get("nonfinite_mismatch") or 0) > 0:
                cls.append(len(ERROR_BANDS))
            else:
                cls.append(_band(error_ratio(t.metrics, result.criterion)))
        legend = [(label, color) for _, color, label in ERROR_BANDS] + [(NONFINITE[1], NONFINITE[0]),
                                                                       ("not compared", NOT_COMPARED)]
        return cls, legend
    if overlay == "introduced":
        rank = {c.node: i for i, c in enumerate(result.culprits)} if result is not None else {}
        flagged = {c.node for c in result.culprits if c.introduces_divergence} if result is not None else set()
        cls = [(-1 if view.names[i] not in by_node else 0) if view.names[i] not in rank else
               100 - rank[view.names[i]] if view.names[i] in flagged else 1 for i in range(n)]
        legend = [("culprit #1", CULPRIT_COLORS[0]), ("culprits #2-3", CULPRIT_COLORS[1]),
                  ("other culprits", CULPRIT_COLORS[2]), ("ranked, under tolerance", CULPRIT_COLORS[3]),
                  ("not a culprit", AGREES), ("not compared", NOT_COMPARED)]
        return cls, legend
    if overlay == "precision":
        labels = _precisions(view, result)
        order = sorted(set(labels))
        return labels, [(p, PRECISION_COLORS.get(p, OTHER)) for p in order]
    colors = _op_colors(view)
    legend = [(op, c) for op, c in colors.items() if c != OTHER]
    if any(c == OTHER for c in colors.values()):
        legend.append(("other ops", OTHER))
    return list(view.ops), legend


def _uses(bands: Any, result: Any) -> bool:
    """Whether ``bands`` colour ``result``'s error overlay (they are of its criterion's metric)."""
    return bands is not None and result is not None and bands.metric == result.criterion.metric


def _band_classes(view: GraphView, by_node: dict, bands: Any) -> tuple[list[int], list[tuple[str, str]]]:
    """Per node its band (GOOD 0, MARGINAL 1, BAD 2; 3 a non-finite mismatch, -1 not compared); the legend
    states the thresholds."""
    cls = []
    for name in view.names:
        t = by_node.get(name)
        if t is None:
            cls.append(-1)
        elif (t.metrics.get("nonfinite_mismatch") or 0) > 0:
            cls.append(3)
        else:
            band = bands.classify(t.metrics.get(bands.metric))
            cls.append(-1 if band is None else band)
    return cls, [*bands.legend(), (NONFINITE[1], NONFINITE[0]), ("not compared", NOT_COMPARED)]


def _band_color(cls: int) -> str:
    from .thresholds import BAND_STYLE

    return NOT_COMPARED if cls < 0 else NONFINITE[0] if cls >= 3 else BAND_STYLE[cls][0]


def _precisions(view: GraphView, result: Any) -> list[str]:
    dtypes = [s.split(" ")[0] if s else "?" for s in view.shapes]
    if result is None:
        return dtypes
    from ..engines.spec import EngineSpec

    variant = EngineSpec.parse(result.candidate).variant
    info = result.variant or {}
    kept = set(info.get("kept_fp32") or []) | {e.get("node") for e in info.get("excluded_nodes") or []
                                               if isinstance(e, dict)}
    out = []
    for name, dtype in zip(view.names, dtypes):
        if dtype not in ("float32", "float16"):
            out.append(dtype)
        elif name in kept:
            out.append("fp32 (kept)")
        else:
            out.append(variant if variant != "fp32" else "fp32")
    return out


def _class_color(overlay: str, cls: Any, op_colors: dict[str, str], engine: EngineView | None = None) -> str:
    if overlay in ENGINE_OVERLAYS:
        return engine_color(overlay, cls, engine)
    if overlay == "diverged":
        return [NOT_COMPARED, AGREES, DIVERGED, FIRST][cls]
    if overlay == "error":
        if cls < 0:
            return NOT_COMPARED
        return NONFINITE[0] if cls >= len(ERROR_BANDS) else ERROR_BANDS[cls][1]
    if overlay == "introduced":
        if cls <= -1:
            return NOT_COMPARED
        if cls == 0:
            return AGREES
        if cls == 1:
            return CULPRIT_COLORS[3]
        rank = 100 - cls
        return CULPRIT_COLORS[0] if rank == 0 else CULPRIT_COLORS[1] if rank <= 2 else CULPRIT_COLORS[2]
    if overlay == "precision":
        return PRECISION_COLORS.get(cls, "#ffca28" if cls == "fp32 (kept)" else OTHER)
    return op_colors.get(cls, OTHER)


# --- payload -------------------------------------------------------------------------------------------------
def graph_payload(view: GraphView, *, overlay: str = "op_type", result: Any = None, depth: int | None = None,
                  expanded: Iterable[str] = (), focus: str | None = None, hops: int = 2,
                  title: str = "", engine: Any = None, groups: bool = False, bands: Any = None) -> dict:
    """What the graph widget draws: ids, labels, tooltips, layout (x, layer), colours, flat edge list, legend,
    and with ``engine`` (an :class:`~workbench.engine_graphs.result.EngineGraph` of this model) and ``groups``
    its fused groups (``groups``: ``{"id", "label", "items", "tip"}``, boxes around their items). ``bands``
    (:class:`~workbench.plots.thresholds.Bands`, the user's colour thresholds): the "error" overlay colours each
    compared node good / marginal / bad by them, the legend stating them.

    ``focus``: show only nodes within ``hops`` of that node, uncollapsed. Otherwise collapse to ``depth``
    (None: every node) except the ``expanded`` scopes. An overlay whose data is missing (a comparison, an engine
    graph) falls back to "op_type"."""
    if overlay not in OVERLAYS:
        raise ValueError(f"unknown overlay {overlay!r}; use one of {', '.join(OVERLAYS)}")
    if (overlay in RESULT_OVERLAYS and result is None) or (overlay in ENGINE_OVERLAYS and engine is None):
        overlay = "op_type"
    ev = EngineView.of(engine) if engine is not None else None
    if focus is not None and focus in view.index:
        ids, members = items_at(view, None, members=view.neighbourhood(focus, hops))
        title = title or f"{hops}-hop neighbourhood of {focus}"
    else:
        ids, members = items_at(view, depth, expanded)
    item_of = {i: k for k, idx in enumerate(members) for i in idx}
    carried: dict[tuple[int, int], list[str]] = {}
    for (u, v), tensors in zip(view.edges, view.edge_tensors or [""] * len(view.edges)):
        if u in item_of and v in item_of and item_of[u] != item_of[v]:
            carried.setdefault((item_of[u], item_of[v]), []).append(tensors)
    edges = sorted(carried)
    x, layer = layered_layout(len(ids), edges)
    classes, legend = _node_classes(view, overlay, result, ev, bands)
    banded = overlay == "error" and _uses(bands, result)
    op_colors = _op_colors(view)
    by_node = {t.node: t for t in result.tensors} if result is not None else {}
    culprits = {c.node: (k, c) for k, c in enumerate(result.culprits, 1)} if result is not None else {}
    labels, subs, tips, colors, group = [], [], [], [], []
    for key, idx in zip(ids, members):
        if key.startswith("scope:"):
            worst = scope_class(overlay, [view.names[i] for i in idx], [classes[i] for i in idx], ev) \
                if overlay in ENGINE_OVERLAYS else _group_class(overlay, [classes[i] for i in idx])
            ops = Counter(view.ops[i] for i in idx).most_common(3)
            labels.append(key.rsplit("/", 1)[-1] or "/")
            subs.append(f"{len(idx)} nodes")
            tips.append(f"{key[6:]}\n{len(idx)} nodes: " + ", ".join(f"{op} x{c}" for op, c in ops)
                        + "\ndouble-click to expand")
            colors.append(GROUP if worst is None else _band_color(worst) if banded else
                          _class_color(overlay, worst, op_colors, ev))
            group.append(1)
        else:
            i = idx[0]
            labels.append(view.ops[i])
            subs.append(None)
            tip = _node_tip(view, i, by_node.get(view.names[i]), culprits.get(view.names[i]), result)
            tips.append(tip if ev is None else "\n".join([tip, *ev.describe(view.names[i])]))
            colors.append(_band_color(classes[i]) if banded else _class_color(overlay, classes[i], op_colors, ev))
            group.append(0)
    boxes = fused_groups(ev, item_of_node(ids, members, view)) if ev is not None and groups else []
    return {"ids": ids, "labels": labels, "sub": subs, "tips": tips, "x": [round(v, 3) for v in x], "y": layer,
            "color": colors, "group": group, "edges": [k for e in edges for k in e],
            "edge_tips": [_edge_tip(carried[e]) for e in edges],
            "legend": [list(item) for item in legend], "title": title, "overlay": overlay, "groups": boxes,
            "engine": engine.engine if engine is not None else "",
            "bands": bands.to_json() if banded else None}


def _edge_tip(tensors: list[str]) -> str:
    """What an edge carries: its tensors (name, dtype, shape), the first few of a collapsed scope's many."""
    lines = [line for t in tensors for line in t.split("\n") if line]
    return "\n".join(lines[:4]) + (f"\n+{len(lines) - 4} more tensors" if len(lines) > 4 else "")


def item_of_node(ids: list[str], members: list[list[int]], view: GraphView) -> dict[str, int]:
    """ONNX node name -> the index of the item (node or collapsed scope) that shows it."""
    return {view.names[i]: k for k, idx in enumerate(members) for i in idx}


def _group_class(overlay: str, classes: list[Any]) -> Any:
    """A collapsed scope shows its most remarkable member (its most common precision)."""
    if overlay == "op_type":
        return None
    if overlay == "precision":
        return Counter(classes).most_common(1)[0][0]
    return max(classes)


def _node_tip(view: GraphView, i: int, tensor: Any, culprit: Any, result: Any) -> str:
    lines = [view.names[i], f"{view.ops[i]} -> {view.outputs[i]}  {view.shapes[i]}".rstrip()]
    if tensor is not None and result is not None:
        m = result.criterion.metric
        value = tensor.metrics.get(m)
        shown = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
        lines.append(f"{m} {shown}" + ("  DIVERGED" if tensor.diverged else ""))
        if tensor.metrics.get("nonfinite_mismatch"):
            lines.append(f"non-finite mismatches: {tensor.metrics['nonfinite_mismatch']}")
    if culprit is not None:
        rank, c = culprit
        lines.append(f"culprit #{rank}: {c.explanation[:240]}")
    return "\n".join(lines)


def graph_figure(view: GraphView, **options: Any):
    """The same view as a static plotly figure (for reports and notebooks without widgets)."""
    import plotly.graph_objects as go

    from . import esc, fit_title

    p = graph_payload(view, **options)
    ex, ey = [], []
    edges = p["edges"]
    for k in range(0, len(edges), 2):
        a, b = edges[k], edges[k + 1]
        ex += [p["x"][a], p["x"][b], None]
        ey += [-p["y"][a], -p["y"][b], None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#9aa0a6", "width": 1}, hoverinfo="skip",
                             showlegend=False))
    fig.add_trace(go.Scatter(x=p["x"], y=[-v for v in p["y"]], mode="markers+text", text=[esc(t) for t in p["labels"]],
                             textposition="middle right", customdata=p["ids"],
                             hovertext=[esc(t).replace("\n", "<br>") for t in p["tips"]], hoverinfo="text",
                             marker={"symbol": "square", "size": 14, "color": p["color"],
                                     "line": {"width": 1, "color": "#455a64"}}, showlegend=False))
    for label, color in p["legend"]:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=esc(label),
                                 marker={"symbol": "square", "size": 12, "color": color}))
    for g in p["groups"]:  # fused groups: a box around their items
        xs, ys = [p["x"][k] for k in g["items"]], [-p["y"][k] for k in g["items"]]
        fig.add_shape(type="rect", x0=min(xs) - 0.25, x1=max(xs) + 0.25, y0=min(ys) - 0.35, y1=max(ys) + 0.35,
                      line={"color": GROUP_COLOR, "width": 2}, fillcolor=GROUP_FILL, layer="below")
    if p["groups"]:  # boxes sized in data units: room for the labels right of the nodes, however narrow the graph
        fig.update_xaxes(range=[min(p["x"]) - 1.0, max(p["x"]) + 2.0])
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"fused group ({len(p['groups'])})",
                                 marker={"symbol": "square-open", "size": 12, "color": GROUP_COLOR}))
    fig.update_layout(title=esc(p["title"] or f"graph: {OVERLAYS[p['overlay']]}"), template="plotly_white",
                      xaxis={"visible": False}, yaxis={"visible": False}, hovermode="closest",
                      height=max(400, min(2000, 40 * (max(p["y"], default=0) + 2))))
    return fit_title(fig)
