"""The graph canvas: an anywidget around ``static/graph.js`` (shipped in the package: works offline).

Python sends the laid-out view (:func:`workbench.plots.graph.graph_payload`) in ``data`` (plus ``view``: "fit"
or "keep" the pan/zoom, and ``anchor``); the browser draws, pans, zooms and reports a click by setting
``selected`` (a node name or ``scope:/a/b``) and a double click on a collapsed scope with the message
``{"event": "expand", "id": ...}``. The search box sets ``query``; Python answers with ``matches`` (best first)
and selects the first; the browser lists them and steps through them (Enter / Shift+Enter, arrows, buttons).
Edges carry their tensors (``data["edge_tips"]``: name, dtype, shape), shown on hover and, zoomed in, as labels;
a minimap (the Map button) shows the whole graph and the viewport (click or drag it to move the view); PNG and
SVG download the current view (done in the browser: nothing goes through the kernel). Incrementing
``scroll_into_view`` scrolls the page to the graph (once it is shown: a tab switch may still be drawing it)."""

from __future__ import annotations

from pathlib import Path

import anywidget
from traitlets import Dict, Int, List, Unicode

STATIC = Path(__file__).parent / "static"


class GraphWidget(anywidget.AnyWidget):
    """A layered DAG on a 2D canvas; ``selected`` and ``highlight`` sync both ways / to the browser."""

    _esm = STATIC / "graph.js"
    _css = STATIC / "graph.css"
    data = Dict().tag(sync=True)
    selected = Unicode("").tag(sync=True)
    highlight = List(Unicode()).tag(sync=True)
    #: what the orange rings of ``highlight`` mean, for the legend ("kept in reference precision", "search match")
    highlight_label = Unicode("").tag(sync=True)
    height = Int(560).tag(sync=True)
    query = Unicode("").tag(sync=True)
    matches = List().tag(sync=True)
    match_total = Int(0).tag(sync=True)
    #: a counter: each increment scrolls the page so the graph is in view (after a tab switch that reveals it)
    scroll_into_view = Int(0).tag(sync=True)
