"""Where a comparison's inputs come from: seeded random feeds (shapes and value ranges overridable), an uploaded
.npz / Polygraphy JSON, or a path on the server. Parsing and checking are the core's (workbench.inputs)."""

from __future__ import annotations

import html
import logging
import tempfile
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ..errors import InputError
from .messages import error_html, message_html

log = logging.getLogger(__name__)

RANDOM, UPLOAD, PATH = "random", "upload", "file on the server"


class InputsBox(widgets.VBox):
    """``feed_options()`` gives compare()'s feed keywords for what the user chose."""

    def __init__(self, **kwargs: Any) -> None:
        self.source = widgets.ToggleButtons(options=[RANDOM, UPLOAD, PATH], value=RANDOM, description="inputs")
        self.seed = widgets.IntText(value=0, description="seed", layout=widgets.Layout(width="160px"))
        self.count = widgets.BoundedIntText(value=1, min=1, max=10_000, description="feeds",
                                            layout=widgets.Layout(width="160px"))
        self.shapes = widgets.Text(placeholder="x:[1,3,224,224] ids:[1,128]", description="shapes",
                                   layout=widgets.Layout(width="420px"))
        self.ranges = widgets.Text(placeholder="x:[0,1]", description="ranges", layout=widgets.Layout(width="420px"))
        self.upload = widgets.FileUpload(accept=".npz,.json", multiple=True, description="Upload .npz")
        self.path = widgets.Text(placeholder="/path/to/feeds.npz, a folder of .npz, or Polygraphy inputs .json",
                                 layout=widgets.Layout(width="520px"))
        self.status = widgets.HTML()
        self._random = widgets.VBox([widgets.HBox([self.seed, self.count]), self.shapes, self.ranges])
        self._upload = widgets.VBox([self.upload])
        self._path = widgets.VBox([self.path])
        self.source.observe(self._on_source, "value")
        self.upload.observe(self._on_upload, "value")
        self._uploaded: list[dict] = []
        super().__init__([self.source, self._random, self._upload, self._path, self.status], **kwargs)
        self._on_source()

    def _on_source(self, _change: Any = None) -> None:
        for box, name in ((self._random, RANDOM), (self._upload, UPLOAD), (self._path, PATH)):
            box.layout.display = "" if self.source.value == name else "none"

    def _on_upload(self, _change: Any = None) -> None:
        from ..inputs import load_feeds

        feeds: list[dict] = []
        try:
            with tempfile.TemporaryDirectory(prefix="workbench-upload-") as tmp:
                for item in self.upload.value:
                    name = Path(str(item["name"])).name or "feeds.npz"
                    path = Path(tmp) / name
                    path.write_bytes(bytes(item["content"]))
                    feeds += load_feeds(path)
        except Exception as e:  # noqa: BLE001 - shown next to the upload button
            self._uploaded = []
            self.status.value = error_html(e, "reading the upload")
            return
        self._uploaded = feeds
        names = sorted({k for f in feeds for k in f})
        self.status.value = message_html(f"{len(feeds)} feed(s) uploaded; inputs: {', '.join(names)}", "ok")

    def set_uploaded(self, feeds: list[dict]) -> None:
        """Use ``feeds`` as if uploaded (scripts, tests)."""
        self._uploaded = list(feeds)
        self.source.value = UPLOAD
        self.status.value = message_html(f"{len(feeds)} feed(s) given", "ok")

    def feed_options(self) -> dict:
        """compare()'s ``feeds`` / ``seed`` / ``feed_count`` / ``input_shapes`` / ``val_ranges``."""
        from ..inputs import parse_range_overrides, parse_shape_overrides

        if self.source.value == UPLOAD:
            if not self._uploaded:
                raise InputError("no feeds uploaded", "upload an .npz (keys = input names) or choose random inputs")
            return {"feeds": self._uploaded}
        if self.source.value == PATH:
            text = self.path.value.strip()
            if not text:
                raise InputError("no feed file given", "type the path of an .npz, a folder of .npz or a JSON")
            return {"feeds": str(Path(text).expanduser())}
        shapes = self.shapes.value.split()
        ranges = self.ranges.value.split()
        return {"feeds": None, "seed": int(self.seed.value), "feed_count": int(self.count.value),
                "input_shapes": parse_shape_overrides(shapes) if shapes else None,
                "val_ranges": parse_range_overrides(ranges) if ranges else None}

    def describe(self) -> str:
        if self.source.value == RANDOM:
            return html.escape(f"{self.count.value} random feed(s), seed {self.seed.value}")
        if self.source.value == UPLOAD:
            return html.escape(f"{len(self._uploaded)} uploaded feed(s)")
        return html.escape(self.path.value)
