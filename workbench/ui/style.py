"""The panels' CSS (``static/workbench.css``), as an HTML widget each panel carries."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import ipywidgets as widgets

STATIC = Path(__file__).parent / "static"


@lru_cache(maxsize=1)
def _css() -> str:
    return (STATIC / "workbench.css").read_text()


def style_tag() -> widgets.HTML:
    return widgets.HTML(f"<style>{_css()}</style>", layout=widgets.Layout(display="none"))


def heading(text: str) -> widgets.HTML:
    import html

    return widgets.HTML(f'<div class="wb-h">{html.escape(text)}</div>')
