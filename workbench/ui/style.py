"""The panels' CSS (``static/workbench.css``), as an HTML widget each panel carries (first child), with the note a
saved notebook shows before it is run (in place of ipywidgets' broken-link icons, see the CSS)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import ipywidgets as widgets

STATIC = Path(__file__).parent / "static"


@lru_cache(maxsize=1)
def _css() -> str:
    return (STATIC / "workbench.css").read_text()


#: shown by the CSS only while the widgets are a saved picture (no kernel behind them)
SAVED_NOTE = ("A saved view of the last run: run the notebook (Run &gt; Run All Cells) to use the workbench; "
              "until then the controls do nothing.")


def style_tag() -> widgets.HTML:
    """The CSS and the saved-view note; takes no room in a live panel (the note shows only in a saved one)."""
    tag = widgets.HTML(f'<style>{_css()}</style><div class="wb-saved-note">{SAVED_NOTE}</div>')
    tag.add_class("wb-style")
    return tag



def heading(text: str) -> widgets.HTML:
    import html

    return widgets.HTML(f'<div class="wb-h">{html.escape(text)}</div>')
