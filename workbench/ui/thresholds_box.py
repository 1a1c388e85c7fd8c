"""The colour bands box: the user sets the divergence colour thresholds once ("good" at or better than X, "bad"
worse than Y, in the current run's metric) and every divergence colouring (the Graph's error colours on one graph
or side by side, the Errors curve and its distribution chart) follows them through the shared state's ``bands``.
Until set, the bands are the current run's criterion's defaults (:meth:`~workbench.plots.thresholds.Bands.
from_criterion`). Several boxes (one per tab) show the same state."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ..plots.thresholds import Bands
from .messages import error_html, message_html
from .state import WorkbenchState


def bands_in_use(state: WorkbenchState) -> Bands | None:
    """The bands the views colour by: the user's when they are of the current run's metric, else the run's
    criterion's defaults; the user's (or None) when there is no current comparison."""
    result, mine = state.result, state.bands
    if result is None:
        return mine
    if mine is not None and mine.metric == result.criterion.metric:
        return mine
    return Bands.from_criterion(result.criterion)


class ThresholdsBox(widgets.VBox):
    """Two fields (good, bad), Apply and "Defaults"; one clear line for input that cannot be used."""

    def __init__(self, state: WorkbenchState) -> None:
        self.state = state
        self.label = widgets.HTML("<b>colour bands</b>")
        self.good = widgets.Text(description="good", layout=widgets.Layout(width="170px"),
                                 tooltip="at or better than this: good (green)")
        self.bad = widgets.Text(description="bad", layout=widgets.Layout(width="170px"),
                                tooltip="worse than this: bad (red); between the two: marginal (amber)")
        for w in (self.good, self.bad):
            w.style.description_width = "40px"
        self.apply_button = widgets.Button(description="Apply", icon="check", layout=widgets.Layout(width="auto"),
                                           tooltip="colour the graph and the error plots by these thresholds")
        self.reset_button = widgets.Button(description="Defaults", icon="undo",
                                           layout=widgets.Layout(width="auto"),
                                           tooltip="the thresholds of the current run's criterion")
        self.note = widgets.HTML("")
        self.apply_button.on_click(lambda _: self.apply())
        self.reset_button.on_click(lambda _: self.reset())
        state.observe(lambda _: self.show(), "bands")
        state.observe(lambda _: self.show(), "result")
        super().__init__([widgets.HBox([self.label, self.good, self.bad, self.apply_button, self.reset_button],
                                       layout=widgets.Layout(flex_flow="row wrap", align_items="center")),
                          self.note])
        self.add_class("wb-bands")
        self.show()

    def metric(self) -> str | None:
        result = self.state.result
        if result is not None:
            return result.criterion.metric
        return self.state.bands.metric if self.state.bands is not None else None

    def show(self) -> None:
        """The fields and the note follow the bands in use."""
        bands = bands_in_use(self.state)
        if bands is None:
            self.good.value = self.bad.value = ""
            self.note.value = message_html("colour bands: run a comparison first (they default to its criterion)",
                                           "info")
            return
        self.good.value, self.bad.value = f"{bands.good:g}", f"{bands.bad:g}"
        self.label.value = f"<b>colour bands</b> <span class='wb-muted'>{bands.metric}</span>"
        self.note.value = message_html(f"in use: {bands.describe()}", "info")

    def apply(self, good: Any = None, bad: Any = None) -> Bands | None:
        """Set the bands from the fields (or ``good`` / ``bad``); returns them, None (and one line) when unusable."""
        if good is not None:
            self.good.value = str(good)
        if bad is not None:
            self.bad.value = str(bad)
        metric = self.metric()
        if metric is None:
            self.note.value = message_html("no comparison yet: run one first, then set its colour bands", "warn")
            return None
        try:
            bands = Bands.parse(metric, self.good.value, self.bad.value)
        except Exception as e:  # noqa: BLE001 - bad input is one line in the box, never a traceback
            kept = bands_in_use(self.state)
            self.note.value = error_html(e, "") + (message_html(f"still in use: {kept.describe()}", "info")
                                                   if kept is not None else "")
            return None
        self.state.bands = bands  # every view redraws (observers); show() writes the note
        self.show()
        return bands

    def reset(self) -> None:
        """Back to the current run's criterion's defaults."""
        self.state.bands = None
        self.show()
