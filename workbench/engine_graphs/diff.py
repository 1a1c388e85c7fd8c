"""What changed between two engine graphs (two ORT versions, two optimization levels, two engines): fusions,
providers, precisions and latency, matched by the ONNX nodes each executed node runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkbenchError
from ..textfmt import safe_name, table
from .result import SCHEMA as GRAPH_SCHEMA
from .result import EngineGraph, EngineNode

SCHEMA = "workbench.engine_graph_diff/1"
METRICS = ("latency_ms", "latency_mean_ms", "latency_p90_ms")


def load_graph(source: Any) -> EngineGraph | None:
    """An EngineGraph from itself or a ``workbench.engine_graph/1`` JSON file (its ``schema`` written first, as
    the workbench writes it); None for anything else (a comparison result, a bundle)."""
    import os

    if isinstance(source, EngineGraph):
        return source
    if not isinstance(source, (str, os.PathLike)) or not str(source).lower().endswith(".json"):
        return None
    from .._files import open_regular
    from ..errors import WorkbenchError

    try:
        if not os.path.isfile(source):
            return None
        with open_regular(source, "engine graph") as fh:
            head = fh.read(256).decode("utf-8", "replace")
    except (OSError, WorkbenchError):
        return None
    if f'"schema": "{GRAPH_SCHEMA}"' not in head.replace(" ", "").replace('":"', '": "'):
        return None
    return EngineGraph.load_json(source)


def _key(n: EngineNode) -> frozenset:
    return frozenset(n.onnx_nodes)


def _brief(n: EngineNode, metric: str) -> dict:
    return {"engine_node": n.name, "kind": n.kind, "onnx_nodes": n.onnx_nodes, "provider": n.provider,
            "precision": n.precision, metric: getattr(n, metric)}


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


@dataclass
class EngineGraphDiff:
    """Two engine graphs side by side: ``fusions`` lists each set of ONNX nodes grouped differently (with the
    groups before and after and their summed latency); ``latency`` the groups both run, largest change first."""

    before: EngineGraph
    after: EngineGraph
    metric: str
    labels: tuple[str, str]
    fusions: list[dict]
    latency: list[dict]
    providers: list[dict]
    precisions: list[dict]
    notes: list[str] = field(default_factory=list)

    @property
    def end_to_end(self) -> dict:
        a, b = self.before.end_to_end_ms, self.after.end_to_end_ms
        return {"before": a, "after": b, "change": _change(a, b)}

    def to_json(self, top: int = 20) -> dict:
        return {"schema": SCHEMA, "labels": list(self.labels), "engines": [self.before.engine, self.after.engine],
                "metric": self.metric, "end_to_end_ms": self.end_to_end,
                "nodes": [len(self.before.nodes), len(self.after.nodes)],
                "fused_nodes": [len(self.before.fused_nodes), len(self.after.fused_nodes)],
                "fusions_changed": self.fusions, "latency": self.latency[:top], "providers_changed": self.providers,
                "precisions_changed": self.precisions, "notes": list(self.notes)}

    def render(self, top: int = 10) -> str:
        a, b = self.labels
        e2e = self.end_to_end
        lines = [f"engine graphs: {a} ({self.before.engine}, {len(self.before.nodes)} nodes, "
                 f"{len(self.before.fused_nodes)} fused) vs {b} ({self.after.engine}, {len(self.after.nodes)} nodes, "
                 f"{len(self.after.fused_nodes)} fused)",
                 f"end to end: {_ms(e2e['before'])} -> {_ms(e2e['after'])} ({_signed(e2e['change'])})",
                 f"fusions changed: {len(self.fusions)}"]
        for f in self.fusions[:top]:
            lines.append(f"  {len(f['onnx_nodes'])} ONNX node(s) from {f['onnx_nodes'][0]}: "
                         f"{len(f['before'])} node(s) {_names(f['before'])} -> {len(f['after'])} node(s) "
                         f"{_names(f['after'])}; {_ms(f['before_ms'])} -> {_ms(f['after_ms'])}")
        if self.latency:
            lines += ["", f"largest latency changes ({self.metric}):", table(
                ["engine node (before)", "ONNX nodes", a, b, "change"],
                [[r["before"]["engine_node"], len(r["onnx_nodes"]), _ms(r["before"][self.metric]),
                  _ms(r["after"][self.metric]), _signed(r["change"])] for r in self.latency[:top]])]
        for r in self.providers[:top]:
            lines.append(f"provider of {r['engine_node']}: {r['before']} -> {r['after']}")
        for r in self.precisions[:top]:
            lines.append(f"precision of {r['engine_node']}: {r['before']} -> {r['after']}")
        lines += [f"note: {safe_name(n, 400)}" for n in self.notes]
        return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} ms"


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f} ms"


def _names(groups: list[dict]) -> str:
    shown = [f"{g['engine_node']} ({len(g['onnx_nodes'])})" for g in groups[:3]]
    return "[" + ", ".join(shown) + (", ..." if len(groups) > 3 else "") + "]"


_GRAPH_HINT = "pass two files written by `workbench inspect MODEL --engine SPEC --json OUT`"


def diff_graphs(before: Any, after: Any, *, metric: str | None = None,
                labels: tuple[str, str] = ("before", "after")) -> EngineGraphDiff:
    """Diff two engine graphs (EngineGraph objects or ``workbench.engine_graph/1`` files)."""
    a, b = load_graph(before), load_graph(after)
    if a is None or b is None:
        bad = [src for src, g in ((before, a), (after, b)) if g is None]
        raise WorkbenchError(f"engine graph diff needs two engine graphs: {_not_a_graph(bad[0])}", _GRAPH_HINT)
    m = metric or "latency_ms"
    if m not in METRICS:
        raise WorkbenchError(f"unknown metric {m!r} for engine graphs", f"use one of {', '.join(METRICS)}")
    ka = {_key(n): n for n in a.compute_nodes}
    kb = {_key(n): n for n in b.compute_nodes}
    same = [k for k in ka if k in kb]
    latency = sorted(({"onnx_nodes": sorted(k), "before": _brief(ka[k], m), "after": _brief(kb[k], m),
                       "change": _change(getattr(ka[k], m), getattr(kb[k], m))} for k in same),
                     key=lambda r: -abs(r["change"] or 0))
    providers = [{"engine_node": ka[k].name, "before": ka[k].provider, "after": kb[k].provider} for k in same
                 if ka[k].provider != kb[k].provider]
    precisions = [{"engine_node": ka[k].name, "before": ka[k].precision, "after": kb[k].precision} for k in same
                  if ka[k].precision != kb[k].precision]
    out = EngineGraphDiff(a, b, m, labels, _fusions([n for k, n in ka.items() if k not in kb],
                                                    [n for k, n in kb.items() if k not in ka], m),
                          latency, providers, precisions)
    sha_a, sha_b = (g.model.get("sha256") for g in (a, b))
    if sha_a and sha_b and sha_a != sha_b:
        out.notes.append(f"the two engine graphs are of different models ({a.model.get('name')} sha256 {sha_a[:12]}, "
                         f"{b.model.get('name')} sha256 {sha_b[:12]}): a fusion 'change' may be a change of the model")
    if a.engine != b.engine:
        out.notes.append(f"the two graphs come from different engines ({a.engine}, {b.engine}): providers are named "
                         "by each engine, so a provider 'change' may only be a name")
    return out


def _not_a_graph(source: Any) -> str:
    """Why ``source`` is not an engine graph, in a few words; a file that cannot be read as JSON (not regular, over
    the size cap, binary, invalid) raises the one-line error of :func:`workbench._files.read_json`."""
    import os

    from .._files import read_json

    if not isinstance(source, (str, os.PathLike)):
        return f"a {type(source).__name__} is neither an EngineGraph nor a path"
    path = str(source)
    if not os.path.lexists(path):
        return f"not found: {path}"
    doc = read_json(path, "engine graph diff: the file", hint=_GRAPH_HINT)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    return f"{path} holds {('a ' + repr(schema)) if schema else 'JSON without a schema'}, not an engine graph"


def _fusions(only_a: list[EngineNode], only_b: list[EngineNode], metric: str) -> list[dict]:
    """Sets of ONNX nodes grouped differently: connected components of the groups found in one graph only,
    linked where they share ONNX nodes."""
    nodes = [("a", n) for n in only_a] + [("b", n) for n in only_b]
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, (_, n) in enumerate(nodes):
        for o in n.onnx_nodes:
            if o in owner:
                parent[find(i)] = find(owner[o])
            owner.setdefault(o, i)
    parts: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        parts.setdefault(find(i), []).append(i)
    out = []
    for members in parts.values():
        side = {s: [nodes[i][1] for i in members if nodes[i][0] == s] for s in ("a", "b")}
        covered = sorted({o for i in members for o in nodes[i][1].onnx_nodes})

        def total(ns: list[EngineNode]) -> float | None:
            values = [getattr(n, metric) for n in ns]
            return sum(values) if values and None not in values else None

        out.append({"onnx_nodes": covered, "before": [_brief(n, metric) for n in side["a"]],
                    "after": [_brief(n, metric) for n in side["b"]], "before_ms": total(side["a"]),
                    "after_ms": total(side["b"])})
    return sorted(out, key=lambda f: -len(f["onnx_nodes"]))


def _groups(source: Any) -> dict[frozenset, dict]:
    """Fused groups (executed nodes that run more than one ONNX node) of an engine graph, or of a fused-granularity
    comparison's record (``result.granularity``: only the groups whose boundary it compared), by their ONNX nodes."""
    if isinstance(source, EngineGraph):
        return {frozenset(n.onnx_nodes): {"engine_node": n.name, "kind": n.kind, "onnx_nodes": list(n.onnx_nodes)}
                for n in source.fused_nodes}
    groups = (source or {}).get("groups") if isinstance(source, dict) else None
    if not isinstance(groups, dict):
        raise WorkbenchError("not an engine graph nor a fused-granularity record (no 'groups')")
    out = {}
    for g in groups.values():
        onnx = g.get("onnx_nodes") if isinstance(g, dict) else None
        if isinstance(onnx, list) and len(onnx) > 1:
            out[frozenset(onnx)] = {"engine_node": g.get("engine_node"), "kind": g.get("kind"),
                                    "onnx_nodes": list(onnx)}
    return out


def fusion_change(before: Any, after: Any) -> dict:
    """Whether the set of fused groups differs between two engine graphs (or two fused-granularity records,
    ``CompareResult.granularity``): ``{"changed", "source", "before", "after"`` (group counts), ``"only_before",
    "only_after"`` (the groups one side has, largest first)}."""
    a, b = _groups(before), _groups(after)
    source = "engine graphs" if isinstance(before, EngineGraph) and isinstance(after, EngineGraph) else \
        "compared groups"

    def only(x: dict, y: dict) -> list[dict]:
        return sorted((g for k, g in x.items() if k not in y), key=lambda g: (-len(g["onnx_nodes"]),
                                                                               g["onnx_nodes"][0]))

    only_a, only_b = only(a, b), only(b, a)
    return {"changed": bool(only_a or only_b), "source": source, "before": len(a), "after": len(b),
            "only_before": only_a, "only_after": only_b}


def render_fusion_change(change: dict, labels: tuple[str, str] = ("saved", "now"), top: int = 5) -> str:
    """One line (plus the first ``top`` differing groups) saying whether the fusions changed."""
    a, b = labels
    if not change["changed"]:
        return f"fusions: unchanged ({_groups_text(change['before'])}, {safe_name(change['source'])})"
    lines = [f"fusions CHANGED ({safe_name(change['source'])}): {_groups_text(change['before'])} {a}, "
             f"{change['after']} {b}; "
             f"{len(change['only_before'])} only {a}, {len(change['only_after'])} only {b}"]
    for label, key in ((a, "only_before"), (b, "only_after")):
        for g in change[key][:top]:
            lines.append(f"  only {label}: {g['engine_node']} ({g['kind']}) runs {len(g['onnx_nodes'])} ONNX nodes: "
                         + ", ".join(g["onnx_nodes"][:4]) + (" ..." if len(g["onnx_nodes"]) > 4 else ""))
    return "\n".join(lines)


def _groups_text(n: int) -> str:
    return f"{n} fused group{'' if n == 1 else 's'}"
