"""The graph canvas: an anywidget around ``static/graph.js`` (shipped in the package: works offline).

Python sends the laid-out view (:func:`workbench.plots.graph.graph_payload`) in ``data``; the browser draws,
pans, zooms and reports a click by setting ``selected`` (a node name or ``scope:/a/b``) and a double click on a
collapsed scope with the message ``{"event": "expand", "id": ...}``."""

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
    height = Int(560).tag(sync=True)
