"""Download links for files a panel wrote (a result JSON, a cache, a QDQ model, a repaired model, a bug report):
the bytes inline as a data: URL, so the browser saves them wherever the user wants, even when the kernel runs on
another machine and the file sits in a temporary folder there."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from .messages import message_html

#: files up to this size are offered as an in-page download (a data: URL in the widget); bigger ones by path
MAX_INLINE_BYTES = 8 * 2**20

def download_html(path: Path, label: str, *, show_path: bool = True) -> str:
    """A download link for ``path``: the bytes inline (a data: URL) up to MAX_INLINE_BYTES, else its path (the
    browser cannot reach files outside the notebook server's folder). ``show_path``: say where it was saved
    (leave it out when the message beside the link says so)."""
    path = Path(path)
    size = path.stat().st_size
    where = f'<div class="wb-culprit">saved at <code>{html.escape(str(path))}</code> ({size:,} bytes)</div>' \
        if show_path else ""
    if size > MAX_INLINE_BYTES:
        return message_html(f"{path.name} is {size / 2**20:.0f} MiB: too big for an in-page download; copy it "
                            f"from {path}", "info") + where
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<a class="wb-download" download="{html.escape(path.name, quote=True)}" '
            f'title="{html.escape(str(path), quote=True)}" data-path="{html.escape(str(path), quote=True)}" '
            f'href="data:application/octet-stream;base64,{data}">&#x2B07; {html.escape(label)} '
            f'({html.escape(path.name)})</a>' + where)
