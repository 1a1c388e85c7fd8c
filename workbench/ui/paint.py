"""A hidden widget that tells Python when the browser has painted it: heavy content (plotly figures) can then
follow the first paint instead of delaying it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget

_ESM = """export default { render({ model, el }) {
  el.style.display = "none";
  requestAnimationFrame(() => requestAnimationFrame(() => model.send({ event: "painted" })));
} };"""


class PaintBeacon(anywidget.AnyWidget):
    """``on_painted(fn)``: ``fn()`` runs (once per view) when a view of this widget has been painted."""

    _esm = _ESM

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._callbacks: list[Callable[[], None]] = []
        self.on_msg(self._on_msg)

    def on_painted(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "painted":
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()
