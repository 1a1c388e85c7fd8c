"""Small HTML tables for panels (formatting only: the numbers come from the core)."""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Iterable, Sequence
from typing import Any


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    return str(value)


#: a cell's text that reads as one number (with a short unit): it never wraps (class "wb-num")
NUMBER = re.compile(r"[-+]?(\d[\d,.]*|\.\d+|inf|nan|–)(e[-+]?\d+)?\s?(dB|%|x|×|ms|s|[kMG]?B)?", re.IGNORECASE)


#: a text cell whose words are all at most this long wraps between words only ("entropy" broke as "entrop/y" in a
#: squeezed column); longer tokens (tensor paths) may break anywhere
WORD_CHARS = 24


def cell_html(value: Any) -> str:
    """One ``<td>``: numbers (and texts that read as one) get class "wb-num", so they stay on one line."""
    text = fmt(value)
    number = (isinstance(value, numbers.Number) and not isinstance(value, bool)) or NUMBER.fullmatch(text.strip())
    if number:
        return f'<td class="wb-num">{html.escape(text)}</td>'
    if max((len(w) for w in text.split()), default=0) > WORD_CHARS:  # a long name may break anywhere
        return f'<td class="wb-long">{html.escape(text)}</td>'
    return f"<td>{html.escape(text)}</td>"  # ordinary words: wrapped between them only


def table_html(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, max_rows: int = 200,
               classes: Sequence[str] | None = None, empty: str = "nothing to show") -> str:
    """An HTML table; ``classes`` gives each row a CSS class (e.g. "bad")."""
    rows = list(rows)
    if not rows:
        return f'<div class="wb-empty">{html.escape(empty)}</div>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for k, row in enumerate(rows[:max_rows]):
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        body.append(f"<tr{cls}>" + "".join(cell_html(v) for v in row) + "</tr>")
    more = f'<div class="wb-empty">{len(rows) - max_rows} more rows not shown</div>' if len(rows) > max_rows else ""
    return f'<div class="wb-table-wrap"><table class="wb-table"><tr>{head}</tr>{"".join(body)}</table></div>{more}'


def frame_html(frame: Any, columns: Sequence[str] | None = None, **kwargs: Any) -> str:
    """A pandas DataFrame (selected ``columns``) as :func:`table_html`."""
    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    return table_html(cols, frame[cols].itertuples(index=False, name=None), **kwargs)


def kv_html(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column key/value table."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th>{cell_html(v)}</tr>" for k, v in pairs)
    return f'<table class="wb-kv">{rows}</table>'
