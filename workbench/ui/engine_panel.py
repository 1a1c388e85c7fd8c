"""Engine panel: what an engine made of the model (fused nodes, providers, precisions) and the slowest nodes next to
their error in the latest comparison; warns when a node fell back to another provider. A view only: the engine
graph comes from :func:`workbench.engine_graph`, the rows from :func:`workbench.engine_graphs.layers.layer_rows`.
The graph shown is the state's ``engine_graph``: the graph view draws its overlays from it and Compare warns about
its fallbacks."""

from __future__ import annotations

import logging
from typing import Any

import ipywidgets as widgets

from ..engine_graphs.layers import layer_rows
from ..engine_graphs.text import overhead_summary
from ..plots.engine_graph import slowest_layers
from .figures import clear, show_figure
from .inputs_box import shapes_placeholder
from .jobs import JobControls
from .messages import error_html, error_text, fallback_repr, message_html
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import kv_html, table_html
from .thresholds_box import bands_in_use

log = logging.getLogger(__name__)

ENGINES = ("ort", "ort:fp16", "openvino", "openvino:fp16", "ort-cuda", "ort-trt", "trt")


class EnginePanel(widgets.VBox):
    """``EnginePanel(model)``: Inspect runs the engine graph on a thread; ``show(graph)`` displays one made
    elsewhere. The slowest nodes carry the error of the state's latest comparison (``state.result``)."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, top: int = 15,
                 **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.top = top
        self.graph = None
        self.engine = widgets.Combobox(value="ort", options=ENGINES, description="engine", ensure_option=False,
                                       layout=widgets.Layout(width="260px"))
        self.runs = widgets.BoundedIntText(value=10, min=0, max=10_000, description="runs",
                                           layout=widgets.Layout(width="160px"))
        self.shapes = widgets.Text(value=self.state.input_shapes, description="shapes",
                                   placeholder=shapes_placeholder(self.state.model),
                                   layout=widgets.Layout(width="320px"))
        self.inspect_button = widgets.Button(description="Inspect", icon="search")
        self.inspect_button.on_click(lambda _: self.inspect())
        self.jobs = JobControls(locks=[self.inspect_button])
        self.message = widgets.HTML()
        self.warning = widgets.HTML()
        self.summary = widgets.HTML()
        self.table = widgets.HTML()
        self.chart = widgets.Output()
        self.state.observe(lambda _: self._redraw(), "result")  # the error column follows the current comparison
        self.state.observe(self._on_state_graph, "engine_graph")
        self.state.observe(lambda _: self._redraw(), "bands")  # the user's colour thresholds
        self.state.observe(lambda change: setattr(self.shapes, "value", change["new"]), "input_shapes")
        self.state.observe(lambda change: setattr(self.shapes, "placeholder", shapes_placeholder(change["new"])),
                           "model")
        super().__init__([
            style_tag(), self.message,
            widgets.HBox([self.engine, self.runs, self.shapes, self.inspect_button]), self.jobs,
            self.warning, self.summary, heading("Slowest nodes, with their error"), self.table, self.chart,
        ])
        self.add_class("wb-root")
        if self.state.engine_graph is not None:
            self.show(self.state.engine_graph)

    def inspect(self):
        """Build the engine graph of the state's model on the chosen engine (on a thread) and show it."""
        from ..engine_graphs.api import engine_graph
        from ..inputs import parse_shape_overrides

        try:
            model = self.state.require_model()
            shapes = parse_shape_overrides(self.shapes.value.split()) if self.shapes.value.strip() else None
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.message.value = error_html(e, "reading the options")
            return None
        if self.jobs.running:
            return self.jobs.start("engine graph", lambda _p, _c: None)  # says: wait for it, or cancel it
        spec, runs = self.engine.value.strip(), int(self.runs.value)
        run = self.state.begin_run("engine", spec)  # the previous engine graph goes everywhere
        self.message.value = message_html(f"{run.tag}: looking inside {spec}...", "info")

        def work(_progress, _cancel):
            return engine_graph(model, spec, input_shapes=shapes, runs=runs)

        def done(graph):
            self.state.end_run(run, "done", graph)
            self.show(graph)

        def failed(e):
            self.state.end_run(run, "cancelled" if self.jobs.cancelled else "failed", error=error_text(e))
            self.message.value = error_html(e, f"{run.tag}, inspecting {spec}")

        return self.jobs.start("engine graph", work, done, failed)

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)

    def show(self, graph) -> None:
        """Display ``graph`` (an EngineGraph) and make it the state's ``engine_graph`` (the graph view's engine
        overlays and Compare's fallback warning follow it)."""
        self.graph = graph
        self.message.value = ""
        self._redraw()
        self.state.engine_graph = graph

    def _on_state_graph(self, change: dict) -> None:
        graph = change["new"]
        if graph is self.graph:
            return
        if graph is not None:
            self.show(graph)
            return
        self.graph = None  # a new model, or a new inspection started: the graph shown was of another run
        for w in (self.warning, self.summary, self.table):
            w.value = ""
        clear(self.chart)
        run = self.state.current_run("engine")
        if run is None or run.status == "done":
            said = "the model changed: press Inspect to look inside an engine"
        elif run.status == "running":
            said = f"{run.tag}: looking inside {run.label}..."
        else:
            said = f"{run.tag} ({run.label}) {run.status}: no current engine graph (the previous one was cleared)"
        self.message.value = message_html(said, "info")

    def _redraw(self) -> None:
        graph = self.graph
        if graph is None:
            return
        result = self.state.result
        try:
            rows = layer_rows(graph, result)
        except Exception as e:  # noqa: BLE001 - a comparison of another model must not break the view
            log.info("errors not joined: %s", e)
            rows, result = layer_rows(graph), None
        fell = [r for r in rows if r["fell_back"]]
        self.warning.value = message_html(
            f"{len(fell)} node(s) fell back from {graph.details.get('requested_provider')} to another provider: "
            + ", ".join(f"{r['name']} ({r['provider']})" for r in fell[:5]), "warn") if fell else ""
        d = graph.details
        run, compared = self.state.run_of(graph), self.state.run_of(result)
        self.summary.value = kv_html([
            ("run", run.tag if run is not None else "-"),
            ("error column", f"from comparison {compared.tag}" if compared is not None else
             "from the current comparison" if result is not None else "no current comparison"),
            ("engine", graph.engine), ("executed nodes", f"{len(graph.nodes)} ({len(graph.fused_nodes)} fused)"),
            ("ONNX nodes", f"{d.get('onnx_compute_nodes')} ({len(graph.folded)} folded, {len(graph.unmapped)} "
                           "unmapped)"),
            ("end to end", "-" if graph.end_to_end_ms is None else
             f"{graph.end_to_end_ms:.3f} ms median over {graph.runs} runs ({graph.end_to_end_source})"),
            ("outside the nodes", overhead_summary(graph.overhead, graph.accounted_share) or "-"),
            ("notes", "; ".join(graph.notes) or "-"),
        ])
        shown = rows[:self.top]
        metric = result.criterion.metric if result is not None else "error"
        self.table.value = table_html(
            ["node", "kind", "provider", "precision", "ms", "p90", "share", metric, "tensor", "ONNX nodes"],
            [(r["name"], r["kind"], r["provider"], r["precision"], r["latency_ms"], r["latency_p90_ms"],
              None if r["share"] is None else f"{r['share']:.1%}", r["error"], r["tensor"],
              ", ".join(r["onnx_nodes"][:4]) + (" ..." if len(r["onnx_nodes"]) > 4 else "")) for r in shown],
            classes=["bad" if r["fell_back"] or r["diverged"] else "" for r in shown], empty="no executed nodes")
        show_figure(self.chart, slowest_layers(rows, top=self.top, bands=bands_in_use(self.state)))
