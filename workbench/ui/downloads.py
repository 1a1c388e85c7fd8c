"""Download links for files a panel wrote (a result JSON, a cache, a QDQ model, a repaired model, a bug report).

A link carries a token, not the bytes: clicking it asks this kernel's :class:`DownloadServer` (an anywidget around
``static/downloads.js``) for the file, which it reads then and sends in :data:`CHUNK_BYTES` chunks as binary
buffers; the browser saves them under the file's name, wherever the user wants, even when the kernel runs on
another machine and the file sits in a temporary folder there. The page and the notebook's saved widget state
hold only the link (before, the bytes were inlined as a base64 data: URL: a 6.5 MB report travelled with every
update of its panel, and files over 8 MiB could not be downloaded at all)."""

from __future__ import annotations

import html
import logging
import uuid
from pathlib import Path
from typing import Any

import anywidget
from traitlets import Unicode

from .._files import human_size
from .messages import message_html

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

#: files up to this size are offered as an in-page download; bigger ones by path (a browser holds the whole file
#: in memory before saving it)
MAX_SERVED_BYTES = 2**30
#: bytes per message sent to the browser
CHUNK_BYTES = 4 * 2**20


class DownloadServer(anywidget.AnyWidget):
    """Serves the files offered by :func:`download_html` to this kernel's pages (one per kernel: :func:`server`).
    It draws nothing; panels that offer downloads hold it so that its script is loaded wherever they are shown."""

    _esm = STATIC / "downloads.js"
    server_id = Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(server_id=uuid.uuid4().hex[:12], **kwargs)
        self.layout.display = "none"
        self._files: dict[str, Path] = {}
        self.on_msg(self._on_msg)

    def offer(self, path: Path) -> str:
        """A token for ``path`` (``SERVER:TOKEN``), valid while this kernel runs."""
        token = uuid.uuid4().hex[:16]
        self._files[token] = Path(path)
        return f"{self.server_id}:{token}"

    def chunks(self, token: str):
        """(message, buffers) pairs that send the file of ``token``: its chunks, the last one marked, or one
        message with the error that stops it (the file is read now, as it is now)."""
        path = self._files.get(token)
        if path is None:
            yield {"token": token, "error": "this link is from an earlier run of the kernel: run the cell again"}, []
            return
        try:
            size = path.stat().st_size
            if size > MAX_SERVED_BYTES:
                yield {"token": token, "error": f"{path.name} is now {size / 2**20:.0f} MiB: copy it from {path}"}, []
                return
            with open(path, "rb") as f:
                sent = 0
                while True:
                    data = f.read(CHUNK_BYTES)
                    sent += len(data)
                    last = len(data) < CHUNK_BYTES
                    yield ({"token": token, "name": path.name, "size": size, "sent": sent, "last": last},
                           [data] if data else [])
                    if last:
                        return
        except OSError as e:
            yield {"token": token, "error": f"{path} can no longer be read ({e.strerror or e})"}, []

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or not isinstance(content.get("get"), str):
            return
        for message, buffers in self.chunks(content["get"]):
            self.send(message, buffers)
        log.debug("download %s sent", content["get"])


_SERVER: DownloadServer | None = None


def server() -> DownloadServer:
    """This kernel's download server (made on first use)."""
    global _SERVER
    if _SERVER is None or _SERVER.comm is None:  # none yet, or closed (Widget.close_all())
        _SERVER = DownloadServer()
    return _SERVER


def download_html(path: Path, label: str, *, show_path: bool = True) -> str:
    """A download link for ``path``, served by :func:`server` when clicked (see the module docstring), up to
    MAX_SERVED_BYTES; bigger files by path. ``show_path``: say where it was saved (leave it out when the message
    beside the link says so)."""
    path = Path(path)
    size = path.stat().st_size
    where = f'<div class="wb-culprit">saved at <code>{html.escape(str(path))}</code> ({size:,} bytes)</div>' \
        if show_path else ""
    if size > MAX_SERVED_BYTES:
        return message_html(f"{path.name} is {size / 2**30:.1f} GiB: too big for an in-page download; copy it "
                            f"from {path}", "info") + where
    token = server().offer(path)
    return (f'<a class="wb-download" href="#" data-wb-download="{token}" '
            f'data-name="{html.escape(path.name, quote=True)}" title="{html.escape(str(path), quote=True)}" '
            f'data-path="{html.escape(str(path), quote=True)}">&#x2B07; {html.escape(label)} '
            f'({html.escape(path.name)}, {human_size(size)})</a>' + where)
