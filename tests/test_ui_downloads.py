"""Download links: the kernel's download server sends a file's bytes when its link is clicked, in chunks, and says
what went wrong in one line when it cannot (a browser test clicks real links: test_browser_workbench)."""

from __future__ import annotations

import html
import os

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.ui import downloads  # noqa: E402


def _sent(token: str) -> list[tuple[dict, list]]:
    """What the server sends for ``token`` (``SERVER:TOKEN``), as its message handler sends it."""
    server = downloads.server()
    sent = []
    server.send = lambda content, buffers=None: sent.append((content, list(buffers or [])))
    try:
        server._on_msg(server, {"get": token.split(":")[1]}, [])
    finally:
        del server.send
    return sent


@pytest.mark.parametrize("size", [0, 1, 3 * 1024, 4 * 1024, 10 * 1024 + 7])
def test_files_come_back_whole_in_chunks(tmp_path, monkeypatch, size):
    monkeypatch.setattr(downloads, "CHUNK_BYTES", 1024)
    data = os.urandom(size)
    path = tmp_path / "model name & <x>.onnx"
    path.write_bytes(data)
    link = downloads.download_html(path, "Download it")
    assert "base64" not in link and html.escape(path.name, quote=True) in link  # no bytes in the page
    token = link.split('data-wb-download="')[1].split('"')[0]
    sent = _sent(token)
    assert [m["last"] for m, _ in sent] == [False] * (len(sent) - 1) + [True]
    assert len(sent) == size // 1024 + 1  # a last, short (maybe empty) chunk ends it
    assert b"".join(bytes(b) for _, bufs in sent for b in bufs) == data
    assert all(m["name"] == path.name and m["size"] == size for m, _ in sent)


def test_a_file_gone_or_a_stale_link_is_one_line(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("{}")
    token = downloads.download_html(path, "x").split('data-wb-download="')[1].split('"')[0]
    path.unlink()
    [(message, buffers)] = _sent(token)
    assert buffers == [] and "can no longer be read" in message["error"] and str(path) in message["error"]
    [(message, _)] = _sent(token.split(":")[0] + ":0123456789abcdef")
    assert "earlier run of the kernel" in message["error"]


def test_files_over_the_limit_are_offered_by_path(tmp_path, monkeypatch):
    monkeypatch.setattr(downloads, "MAX_SERVED_BYTES", 100)
    path = tmp_path / "big.onnx"
    path.write_bytes(b"x" * 101)
    link = downloads.download_html(path, "Download it")
    assert "data-wb-download" not in link and "too big for an in-page download" in link and str(path) in link
