"""``Workbench(model)``: every panel in one tabbed layout, sharing one state (model, result, selected node)."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from .calibration_panel import CalibrationPanel
from .compare_panel import ComparePanel
from .dataset_panel import DatasetPanel
from .engine_pair import pickable
from .engine_panel import EnginePanel
from .errors_panel import ErrorsPanel
from .graph_panel import GraphPanel
from .messages import error_html, fallback_repr, message_html
from .model_panel import ModelPanel
from .plot_fit import PlotFit
from .repair_panel import RepairPanel
from .reveal import RevealAnchor
from .saved_runs import SavedRunsBox
from .state import WorkbenchState
from .style import style_tag

log = logging.getLogger(__name__)

#: tab key -> title, in display order
PANELS = {"model": "Model", "compare": "Compare", "errors": "Errors", "graph": "Graph", "calibration": "Calibration",
          "repair": "Repair", "dataset": "Dataset", "engine": "Engine"}


class Workbench(widgets.VBox):
    """The notebook workbench on ``model`` (a path, bytes, ModelProto, LoadedModel, or a torch.nn.Module with
    ``example_inputs=``). Panels are built when their tab is first opened; ``panel("compare")`` builds one on
    demand. A culprit clicked in Compare, a point clicked in Errors, a node clicked in Graph and a kept node
    clicked in Repair select the same node everywhere; Repair shares Compare's inputs and engine choice, and its
    kept nodes are ringed in Graph. Dataset runs many samples (a clicked sample opens in Compare and Errors);
    Engine looks inside an engine (fused nodes, providers, latency next to the latest comparison's error); the
    engine graph it shows colours Graph (provider, runtime precision, latency, fused-group boxes) and backs
    Compare's provider-fallback warning."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, reference: str = "ort", candidate: str = "ort:fp16",
                 output_dir: str | None = None, state: WorkbenchState | None = None, **load_kwargs: Any) -> None:
        self.header = widgets.HTML()
        self._options = {"reference": reference, "candidate": candidate}
        self.spec_note = widgets.HTML()  # a reference/candidate the pickers cannot show: what was used instead
        said = []
        for side, default in (("reference", "ort"), ("candidate", "ort:fp16")):
            self._options[side], why = pickable(self._options[side], side, default)
            if why:
                said.append(message_html(why, "error"))
        self.spec_note.value = "".join(said)
        self._panels: dict[str, widgets.Widget] = {}
        self._anchors: dict[str, RevealAnchor] = {}  # at each tab's top: a request to show it scrolls to it
        self.tabs = widgets.Tab(children=[widgets.VBox() for _ in PANELS], titles=list(PANELS.values()))
        self.tabs.observe(self._on_tab, "selected_index")
        try:
            self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        except Exception as e:  # noqa: BLE001 - a bad model is a message in the widget, not a dead cell
            self.state = state or WorkbenchState()
            self.header.value = error_html(e, "loading the model")
        if output_dir:
            self.state.output_dir = str(output_dir)
        self.state.observe(self._on_show, "show")
        self.state.observe(lambda _: self._title(), "model")
        self.saved_runs = SavedRunsBox(self)  # the runs of this model saved by earlier sessions: Reopen
        super().__init__([style_tag(), self.header, self.spec_note, self.saved_runs, self.tabs])
        self.add_class("wb-root")
        self._title()
        self.panel("model")

    def _title(self) -> None:
        model = self.state.model
        if model is None:
            return
        self.header.value = (f'<div class="wb-title">onnx-drift-workbench &middot; {html.escape(model.name)} '
                             f'&middot; {len(model.proto.graph.node)} nodes</div>')

    def panel(self, key: str) -> widgets.Widget:
        """The panel under tab ``key`` ("model", "compare", "errors", "graph", "calibration", "repair", "dataset",
        "engine"), built if needed."""
        if key not in PANELS:
            raise KeyError(f"no panel {key!r}; use one of {', '.join(PANELS)}")
        if key not in self._panels:
            self._panels[key] = self._build(key)
            index = list(PANELS).index(key)
            self._anchors[key] = RevealAnchor()
            # the fitter last: a figure drawn while its tab was hidden gets the tab's width when it is revealed
            self.tabs.children[index].children = (self._anchors[key], self._panels[key], PlotFit())
            self._connect(key)
        return self._panels[key]

    def _connect(self, key: str) -> None:
        """Ring Repair's kept nodes in Graph once both exist."""
        if key in ("repair", "graph"):
            repair, graph = self._panels.get("repair"), self._panels.get("graph")
            if isinstance(repair, RepairPanel) and isinstance(graph, GraphPanel):
                try:
                    repair.link_graph(graph)
                except Exception:  # noqa: BLE001 - the panels still work unlinked
                    log.exception("linking the Repair and Graph panels failed")

    def _build(self, key: str) -> widgets.Widget:
        try:
            if key == "model":
                return ModelPanel(state=self.state)
            if key == "compare":
                return ComparePanel(state=self.state, **self._options)
            if key == "errors":
                return ErrorsPanel(state=self.state)
            if key == "graph":
                return GraphPanel(state=self.state)
            if key == "repair":
                compare = self.panel("compare")
                return RepairPanel(state=self.state, compare=compare if isinstance(compare, ComparePanel) else None,
                                   **self._options)
            if key == "dataset":
                return DatasetPanel(state=self.state, **self._options)
            if key == "engine":
                return EnginePanel(state=self.state)
            return CalibrationPanel(state=self.state)
        except Exception as e:  # noqa: BLE001 - one broken panel must not take the others down
            return widgets.HTML(error_html(e, f"building the {PANELS[key]} panel"))

    def show(self, key: str) -> widgets.Widget:
        """Bring tab ``key`` forward (building its panel)."""
        panel = self.panel(key)
        self.tabs.selected_index = list(PANELS).index(key)
        return panel

    def reopen(self, saved: Any = None):
        """Reopen a saved run (a :class:`~workbench.ui.run_store.SavedRun`, else the one chosen in the saved-runs
        picker): it becomes run #N of its kind, shown by every view. Returns the run (None: why is shown)."""
        return self.saved_runs.reopen(saved)

    def _on_tab(self, change: dict) -> None:
        index = change["new"]
        if index is not None:
            self.panel(list(PANELS)[index])

    def _on_show(self, change: dict) -> None:
        """A panel asked for another (a click on a kept node, a culprit): bring it forward and scroll it into view
        (the page may be scrolled down to the table clicked in): the graph to its canvas, another to its top."""
        if change["new"] in PANELS:
            panel = self.show(change["new"])
            reveal = getattr(panel, "reveal", None)
            (reveal if callable(reveal) else self._anchors[change["new"]].reveal)()

    # shortcuts for scripts and tests
    @property
    def model_panel(self):
        return self.panel("model")

    @property
    def compare_panel(self):
        return self.panel("compare")

    @property
    def errors_panel(self):
        return self.panel("errors")

    @property
    def graph_panel(self):
        return self.panel("graph")

    @property
    def calibration_panel(self):
        return self.panel("calibration")

    @property
    def repair_panel(self):
        return self.panel("repair")

    @property
    def dataset_panel(self):
        return self.panel("dataset")

    @property
    def engine_panel(self):
        return self.panel("engine")
