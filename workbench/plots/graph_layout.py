"""Layered (Sugiyama-style) layout of a DAG, fast enough for 5,000 nodes in pure Python.

Layers by longest path (sources pulled down next to their first consumer), order within a layer by
barycentre sweeps, x by averaging each node's neighbours under a minimum spacing of 1. Nodes are given in
topological order (index = position); edges going backwards (possible after collapsing name scopes) are
drawn but ignored for layering.
"""

from __future__ import annotations

from collections.abc import Sequence


def layered_layout(n: int, edges: Sequence[tuple[int, int]], sweeps: int = 4) -> tuple[list[float], list[int]]:
    """(x, layer) per node for nodes ``0..n-1`` in topological order joined by ``edges`` (u, v)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        if u < v:
            preds[v].append(u)
            succs[u].append(v)
    layer = _layers(n, preds, succs)
    rows: list[list[int]] = [[] for _ in range(max(layer, default=-1) + 1)]
    for v in range(n):
        rows[layer[v]].append(v)
    x = [0.0] * n
    _centre(rows, x)
    for _ in range(sweeps):
        _sweep(rows, preds, x, range(len(rows)))
        _sweep(rows, succs, x, range(len(rows) - 1, -1, -1))
    _place(rows, preds, x, range(len(rows)), weight=1.0)
    _place(rows, succs, x, range(len(rows) - 1, -1, -1), weight=0.5)
    _place(rows, preds, x, range(len(rows)), weight=0.5)
    return x, layer


def _layers(n: int, preds: list[list[int]], succs: list[list[int]]) -> list[int]:
    layer = [0] * n
    for v in range(n):
        if preds[v]:
            layer[v] = max(layer[u] for u in preds[v]) + 1
    for v in range(n - 1, -1, -1):  # a constant or a graph-input reader sits just above its first consumer
        if not preds[v] and succs[v]:
            layer[v] = max(0, min(layer[s] for s in succs[v]) - 1)
    return layer


def _centre(rows: list[list[int]], x: list[float]) -> None:
    for row in rows:
        half = (len(row) - 1) / 2
        for i, v in enumerate(row):
            x[v] = i - half


def _sweep(rows: list[list[int]], neighbours: list[list[int]], x: list[float], order) -> None:
    """Reorder each row by the barycentre of its neighbours' positions (crossing reduction)."""
    for r in order:
        row = rows[r]
        if len(row) < 2:
            continue
        keys = {}
        for v in row:
            near = neighbours[v]
            keys[v] = sum(x[u] for u in near) / len(near) if near else x[v]
        row.sort(key=keys.__getitem__)
        half = (len(row) - 1) / 2
        for i, v in enumerate(row):
            x[v] = i - half


def _place(rows: list[list[int]], neighbours: list[list[int]], x: list[float], order, weight: float) -> None:
    """Pull each node toward its neighbours' mean x, keeping the row's order and a spacing of at least 1."""
    for r in order:
        row = rows[r]
        want = []
        for v in row:
            near = neighbours[v]
            target = sum(x[u] for u in near) / len(near) if near else x[v]
            want.append(weight * target + (1 - weight) * x[v])
        fwd = list(want)
        for i in range(1, len(row)):
            fwd[i] = max(fwd[i], fwd[i - 1] + 1)
        back = list(want)
        for i in range(len(row) - 2, -1, -1):
            back[i] = min(back[i], back[i + 1] - 1)
        for i, v in enumerate(row):
            x[v] = (fwd[i] + back[i]) / 2
