"""Small HTML tables for panels (formatting only: the numbers come from the core)."""

from __future__ import annotations

import html
import math
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
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>")
    more = f'<div class="wb-empty">{len(rows) - max_rows} more rows not shown</div>' if len(rows) > max_rows else ""
    return f'<div class="wb-table-wrap"><table class="wb-table"><tr>{head}</tr>{"".join(body)}</table></div>{more}'


def frame_html(frame: Any, columns: Sequence[str] | None = None, **kwargs: Any) -> str:
    """A pandas DataFrame (selected ``columns``) as :func:`table_html`."""
    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    return table_html(cols, frame[cols].itertuples(index=False, name=None), **kwargs)


def kv_html(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column key/value table."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(fmt(v))}</td></tr>" for k, v in pairs)
    return f'<table class="wb-kv">{rows}</table>'
