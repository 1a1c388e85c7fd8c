"""Plots: pure functions from results (or arrays) to plotly Figures; they never run an engine.

Import the submodules (``workbench.plots.compare``, ...) directly: this package imports nothing heavy.
"""

from __future__ import annotations

import html


def esc(text: object) -> str:
    """``text`` for a plotly string (title, annotation, legend name, tick or hover label): plotly reads a subset of
    HTML there (``<a href>``, ``<b>``, ``<br>``), so a model's node called ``<a href=...>`` would become a live
    link. ``<``, ``>`` and ``&`` are escaped; plotly shows the characters themselves."""
    return html.escape(str(text), quote=False)
