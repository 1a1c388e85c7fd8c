"""The Workbench's saved runs (:mod:`workbench.ui.run_store`): the last runs of this model, saved as bundles by
earlier sessions (a kernel restart loses none), and a Reopen button that loads one back into the run state, so
every view (Compare, Errors, Graph, Calibration, Repair, Dataset) shows it as ``run #N, reopened from BUNDLE``."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from . import run_store
from .messages import error_html, message_html
from .runs import Run

log = logging.getLogger(__name__)


class SavedRunsBox(widgets.VBox):
    """``SavedRunsBox(workbench)``: a picker of the saved runs of the workbench's model (newest first), Reopen."""

    def __init__(self, workbench: Any) -> None:
        self.workbench = workbench
        self.state = workbench.state
        self.picker = widgets.Dropdown(options=[], layout=widgets.Layout(flex="1 1 320px", width="auto",
                                                                         min_width="0", max_width="760px"))
        self.reopen_button = widgets.Button(description="Reopen", icon="folder-open",
                                            tooltip="load the chosen run back from its bundle into every view",
                                            layout=widgets.Layout(width="auto"))
        self.reopen_button.on_click(lambda _: self.reopen())
        self.title = widgets.HTML('<span class="wb-muted">saved runs:</span>')
        self.row = widgets.HBox([self.title, self.picker, self.reopen_button],
                                layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        self.note = widgets.HTML()
        self.saved: list[run_store.SavedRun] = []
        self._picked: str | None = None  # a run the user chose (kept while listed); else the newest is selected
        self._listing = False
        self.picker.observe(self._on_pick, "value")
        super().__init__([self.row, self.note])
        self.add_class("wb-saved-runs")
        self.state.observe(lambda _: self.refresh(), "saved")
        self.state.observe(lambda _: self.refresh(), "model")
        self.state.observe(self._on_runs, "runs")
        self.refresh()

    def _on_runs(self, change: dict) -> None:
        """A new run started here: the note on the last reopened one goes (it is no longer what was done last)."""
        log = change["new"]
        if log is not None and log.runs and not log.runs[-1].source:
            self.note.value = ""

    def refresh(self) -> None:
        """List the saved runs of the current model again (the choice kept when it is still there)."""
        model = self.state.model
        try:
            self.saved = run_store.saved_runs(model.fingerprint) if model is not None else []
        except OSError as e:
            self.saved = []
            log.warning("saved runs not listed: %s", e)
        paths = [str(r.path) for r in self.saved]
        self._listing = True
        try:
            self.picker.options = [(r.describe(), p) for r, p in zip(self.saved, paths)]
            # the user's choice while it is listed, else the newest: a run saved since moves an unchosen selection
            self.picker.value = self._picked if self._picked in paths else (paths[0] if paths else None)
        finally:
            self._listing = False
        shown = bool(self.saved)
        self.picker.layout.display = self.reopen_button.layout.display = "" if shown else "none"
        self.title.value = ('<span class="wb-muted">saved runs of this model (kept across kernel restarts):</span>'
                            if shown else '<span class="wb-muted">no saved runs of this model yet: finished runs '
                            f'are saved to {html.escape(str(run_store.runs_dir()))}</span>')

    def _on_pick(self, change: dict) -> None:
        if not self._listing:
            self._picked = change["new"]

    def chosen(self) -> run_store.SavedRun | None:
        return next((r for r in self.saved if str(r.path) == self.picker.value), None)

    def reopen(self, saved: run_store.SavedRun | None = None) -> Run | None:
        """Load ``saved`` (else the chosen run) back: a new run ``#N`` of its kind, current in every view."""
        saved = saved or self.chosen()
        if saved is None:
            self.note.value = message_html("choose a saved run first", "info")
            return None
        try:
            run = reopen(self.workbench, saved)
        except Exception as e:  # noqa: BLE001 - a damaged or foreign bundle is a message
            self.note.value = error_html(e, f"reopening {saved.path.name}")
            return None
        said = []
        if saved.kind == "comparison":  # the pickers and inputs as the run had them: Run compares the same again
            said = self.workbench.panel("compare").take_options(run.result)
        self.note.value = message_html(f"{run.tag} ({saved.describe()})", "ok") + \
            "".join(message_html(line, "info") for line in said)
        return run


def reopen(workbench: Any, saved: run_store.SavedRun) -> Run:
    """Load ``saved`` into ``workbench``'s run state as a finished run ``run #N, reopened from BUNDLE`` (its tag,
    which every view shows): the current comparison (Compare, Errors, Graph), calibration, repair or dataset run."""
    value = run_store.open_saved(saved)
    state = workbench.state
    state.runs, run = state.log.start(saved.kind, saved.label, value, status="done", source=saved.path.name)
    if saved.kind == "comparison":
        state.selected = ""
        state.result = value
    elif saved.kind == "calibration":
        state.calibration = value
    elif saved.kind == "repair":
        workbench.panel("repair").show_result(value)
    else:
        workbench.panel("dataset").show_result(value)
    return run
