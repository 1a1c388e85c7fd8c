"""Plots of what a model is made of: the operator inventory. Pure functions, plotly figures out."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.graph_objects import Bar, Figure, Scatter  # noqa: F401 - resolve plotly's lazy classes at import

from . import esc, fit_title

DOMAIN_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#9c755f"]


def _rows(source: Any) -> list[dict]:
    """Op rows from an Inventory, an Inspection, or inspect JSON (``{"ops": [...]}``)."""
    if isinstance(source, dict):
        return list(source.get("ops", []))
    inventory = getattr(source, "inventory", source)
    return [r.to_json() for r in inventory.ops]


def inventory_bar(source: Any, top: int | None = 40) -> go.Figure:
    """Operator counts, most used first (horizontal bars), one colour per domain; the hover tells the schema
    version at the model's opset and whether the op is deprecated. ``top`` keeps the most used op types."""
    rows = sorted(_rows(source), key=lambda r: (-r["count"], r["op_type"]))
    left = rows[top:] if top else []
    rows = rows[:top] if top else rows
    domains = list(dict.fromkeys(r["domain"] for r in rows))
    fig = go.Figure()
    for k, domain in enumerate(domains):
        mine = [r for r in rows if r["domain"] == domain]
        fig.add_trace(go.Bar(
            y=[esc(r["op_type"]) for r in mine], x=[r["count"] for r in mine], orientation="h", name=esc(domain),
            marker_color=DOMAIN_COLORS[k % len(DOMAIN_COLORS)], text=[r["count"] for r in mine],
            # each count level, right of its bar: "auto" turned it 90 degrees to fit a short bar
            textposition="outside", textangle=0, cliponaxis=False,
            customdata=[[r.get("since_version"), "deprecated" if r.get("deprecated") else "",
                         r.get("in_subgraphs", 0)] for r in mine],
            hovertemplate="%{y}: %{x} nodes<br>since opset %{customdata[0]} %{customdata[1]}"
                          "<br>in subgraphs: %{customdata[2]}<extra>" + esc(domain) + "</extra>"))
    total = sum(r["count"] for r in rows) + sum(r["count"] for r in left)
    title = f"operator inventory: {len(rows) + len(left)} op types, {total} nodes"
    if left:
        title += f" (top {len(rows)} shown)"
    # counts are whole: integer ticks, one per node when the longest bar is short (plotly would tick 0.2, 0.4...)
    most = max((r["count"] for r in rows), default=0)
    xaxis = {"title": "nodes", "tickformat": ",d", "range": [0, most * 1.15 + 0.5],  # room for the counts
             **({"dtick": 1} if most <= 10 else {})}
    fig.update_layout(title=title, template="plotly_white", barmode="stack", xaxis=xaxis,
                      yaxis={"autorange": "reversed", "categoryorder": "array", "automargin": True,
                             "categoryarray": [esc(r["op_type"]) for r in rows]},
                      height=max(260, 90 + 22 * len(rows)), legend={"title": "domain"},
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fit_title(fig)
