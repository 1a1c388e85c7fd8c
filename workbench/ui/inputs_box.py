"""Where a comparison's inputs come from: seeded random feeds (shapes and value ranges overridable), an uploaded
.npz / Polygraphy JSON, or a path on the server. Parsing and checking are the core's (workbench.inputs).

The shapes field is prefilled from the model (``x:[1,3,?,?]``: a dynamic batch becomes 1, every other dynamic
dimension a ``?`` for the user to fill) and shared through :class:`~workbench.ui.WorkbenchState` (``input_shapes``)
with the Calibration panel."""

from __future__ import annotations

import html
import logging
import tempfile
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from ..errors import InputError
from .messages import error_html, message_html

log = logging.getLogger(__name__)

RANDOM, UPLOAD, PATH = "random", "upload", "file on the server"


#: marks a dimension the user has to fill in the shapes field
UNKNOWN = "?"


def shapes_template(model: Any) -> str:
    """The shapes field's text for ``model`` (a LoadedModel or ModelProto): every input as ``name:[d,...]`` when
    some input has a dynamic dimension (a dynamic leading/batch dimension written 1, any other ``?``), else ""
    (nothing to choose)."""
    from ..inputs.spec import model_inputs

    if model is None:
        return ""
    specs = [s for s in model_inputs(model) if s.dtype is not None]
    if all(s.shape is not None and all(isinstance(d, int) for d in s.shape) for s in specs):
        return ""
    return " ".join(f"{s.name}:[{_dims_text(s.shape)}]" for s in specs)


def _dims_text(shape: Any) -> str:
    if shape is None:
        return UNKNOWN
    return ",".join(str(d) if isinstance(d, int) else ("1" if i == 0 else UNKNOWN) for i, d in enumerate(shape))


def shapes_hint(model: Any, text: str = "") -> str:
    """A line for under the shapes field: the model's input shapes, dynamic dimensions named (asking to fill each
    ``?`` while the field ``text`` is empty or still holds one)."""
    from ..inputs.spec import model_inputs

    if model is None:
        return ""
    specs = [s for s in model_inputs(model) if s.dtype is not None]
    parts = []
    for s in specs:
        if s.shape is None:
            parts.append(f"{s.name}: unknown rank (give its full shape)")
            continue
        dyn = [f"{i} ({d})" if d else str(i) for i, d in enumerate(s.shape) if not isinstance(d, int)]
        parts.append(f"{s.name} {s.shape_text}" + (f": dynamic dim {', '.join(dyn)}" if dyn else ""))
    dynamic = any(s.shape is None or any(not isinstance(d, int) for d in s.shape[1:]) for s in specs)
    head = "fill each ? with a number; " if dynamic and (not text.strip() or UNKNOWN in text) else ""
    return head + "model inputs: " + "; ".join(parts) if parts else ""


def parse_shapes(model: Any, text: str) -> dict[str, list[int]] | None:
    """The shapes field's text as compare()/calibrate()'s ``input_shapes`` (None when empty), checked first for
    what the core cannot guess: a ``?`` left unfilled, or an input with a dynamic non-leading dimension that the
    field does not give. Raises InputError naming the field."""
    from ..inputs import parse_shape_overrides
    from ..inputs.spec import model_inputs

    items = (text or "").split()
    unfilled = [item for item in items if UNKNOWN in item.partition(":")[2]]
    if unfilled:
        raise InputError(f"shapes: fill in the dynamic dimension(s) marked {UNKNOWN} in {' '.join(unfilled)}",
                         f"replace each {UNKNOWN} with a number, e.g. "
                         + " ".join(_example(item) for item in unfilled))
    given = parse_shape_overrides(items) if items else {}
    if model is not None:
        for s in model_inputs(model):
            if s.dtype is None or s.name in given:
                continue
            if s.shape is None or any(not isinstance(d, int) for d in s.shape[1:]):
                raise InputError(f"input '{s.name}' has dynamic dimensions {s.shape_text if s.shape else ''}".rstrip(),
                                 f"give its shape in the shapes field, e.g. {s.name}:[{_dims_text(s.shape)}] with "
                                 f"each {UNKNOWN} a number")
    return given or None


def _example(item: str) -> str:
    name, _, body = item.partition(":")
    return f"{name}:" + body.replace(UNKNOWN, "224")


class InputsBox(widgets.VBox):
    """``feed_options()`` gives compare()'s feed keywords for what the user chose. With ``state``, the shapes
    field is the state's ``input_shapes`` (prefilled from the model, shared with the Calibration panel)."""

    def __init__(self, state: Any = None, **kwargs: Any) -> None:
        self.source = widgets.ToggleButtons(options=[RANDOM, UPLOAD, PATH], value=RANDOM, description="inputs")
        self.seed = widgets.IntText(value=0, description="seed", layout=widgets.Layout(width="160px"))
        self.count = widgets.BoundedIntText(value=1, min=1, max=10_000, description="feeds",
                                            layout=widgets.Layout(width="160px"))
        self.shapes = widgets.Text(placeholder=shapes_placeholder(None), description="shapes",
                                   layout=widgets.Layout(width="420px"))
        self.shapes_note = widgets.HTML()
        self.ranges = widgets.Text(placeholder=ranges_placeholder(None), description="ranges",
                                   layout=widgets.Layout(width="420px"))
        self.upload = widgets.FileUpload(accept=".npz,.json", multiple=True, description="Upload .npz")
        self.path = widgets.Text(placeholder="/path/to/feeds.npz, a folder of .npz, or Polygraphy inputs .json",
                                 layout=widgets.Layout(width="520px"))
        self.status = widgets.HTML()
        self._random = widgets.VBox([widgets.HBox([self.seed, self.count]), self.shapes, self.shapes_note,
                                     self.ranges])
        self._upload = widgets.VBox([self.upload])
        self._path = widgets.VBox([self.path])
        self.source.observe(self._on_source, "value")
        self.upload.observe(self._on_upload, "value")
        self._uploaded: list[dict] = []
        self.state = state
        self._model = None
        super().__init__([self.source, self._random, self._upload, self._path, self.status], **kwargs)
        self._on_source()
        self.shapes.observe(lambda ch: setattr(self.shapes_note, "value", shapes_note_html(self._model, ch["new"])),
                            "value")
        if state is not None:
            self._link = traitlets.link((state, "input_shapes"), (self.shapes, "value"))
            state.observe(lambda ch: self.set_model(ch["new"]), "model")
            self.set_model(state.model)

    def set_model(self, model: Any) -> None:
        """Describe ``model``'s input shapes under the shapes field (the field itself follows the state)."""
        self._model = model
        self.shapes_note.value = shapes_note_html(model, self.shapes.value)
        self.shapes.placeholder = shapes_placeholder(model)
        self.ranges.placeholder = ranges_placeholder(model)

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
        from ..inputs import parse_range_overrides

        if self.source.value == UPLOAD:
            if not self._uploaded:
                raise InputError("no feeds uploaded", "upload an .npz (keys = input names) or choose random inputs")
            return {"feeds": self._uploaded}
        if self.source.value == PATH:
            text = self.path.value.strip()
            if not text:
                raise InputError("no feed file given", "type the path of an .npz, a folder of .npz or a JSON")
            return {"feeds": str(Path(text).expanduser())}
        ranges = self.ranges.value.split()
        return {"feeds": None, "seed": int(self.seed.value), "feed_count": int(self.count.value),
                "input_shapes": parse_shapes(self._model, self.shapes.value),
                "val_ranges": parse_range_overrides(ranges) if ranges else None}

    def take_feeds(self, feeds: dict | None) -> bool:
        """Show random inputs as a run recorded them (``result.feeds``: seed, count, shapes); False, changing
        nothing, for inputs that were not random (a file or a list the run was given)."""
        if not isinstance(feeds, dict) or feeds.get("source") != "random":
            return False
        self.source.value = RANDOM
        self.seed.value = int(feeds.get("seed") or 0)
        self.count.value = max(1, int(feeds.get("count") or 1))
        shapes = feeds.get("shapes") or {}
        if shapes:
            self.shapes.value = " ".join(f"{name}:[{','.join(str(int(d)) for d in dims)}]"
                                         for name, dims in shapes.items())
        ranges = feeds.get("ranges") or {}
        self.ranges.value = " ".join(f"{name}:[{lo},{hi}]" for name, (lo, hi) in ranges.items()) if ranges else ""
        return True

    def describe(self) -> str:
        if self.source.value == RANDOM:
            return html.escape(f"{self.count.value} random feed(s), seed {self.seed.value}")
        if self.source.value == UPLOAD:
            return html.escape(f"{len(self._uploaded)} uploaded feed(s)")
        return html.escape(self.path.value)


def shapes_note_html(model: Any, text: str = "") -> str:
    hint = shapes_hint(model, text)
    return f'<div class="wb-culprit">{html.escape(hint)}</div>' if hint else ""


def shapes_placeholder(model: Any) -> str:
    """The shapes field's placeholder: the model's own inputs (``image:[1,4,?,?]``), never names it does not have."""
    if model is None:
        return "load a model: its inputs' shapes are filled in here"
    template = shapes_template(model)
    return f"{template} (fill each ?)" if template else "the model's input shapes are fixed: nothing to fill"


def ranges_placeholder(model: Any) -> str:
    """The value-ranges field's placeholder on the model's first input (``image:[0,1]``)."""
    from ..inputs.spec import model_inputs

    specs = [s for s in model_inputs(model) if s.dtype is not None] if model is not None else []
    return f"{specs[0].name}:[0,1] (optional: the random values' range per input)" if specs else \
        "NAME:[0,1] (optional: the random values' range per input)"

