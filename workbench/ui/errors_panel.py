"""Errors panel: the per-layer error curve (precision floor band, tolerance line, graph outputs, at-floor tensors
and, for a diverged run, the first divergent layer marked); click a layer to see its error next to its floor, its
reference/candidate value histograms, the error histogram, a sampled scatter and a per-channel heat map."""

from __future__ import annotations

import html
import logging
import threading
from typing import Any

import ipywidgets as widgets

from ..core.metric_info import JUDGED
from .figures import clear, show_figure
from .jobs import JobControls
from .messages import error_html, fallback_repr, message_html
from .state import WorkbenchState
from .style import heading, style_tag

log = logging.getLogger(__name__)

SELECTED_TRACE = "selected layer"


class ErrorsPanel(widgets.VBox):
    """``ErrorsPanel(result, model=...)`` or ``ErrorsPanel(state=...)``; ``select(node)`` = clicking that layer."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, result: Any = None, *, model: Any = None, state: WorkbenchState | None = None,
                 **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        if result is not None:
            self.state.result = result
        self.metric = widgets.Dropdown(options=list(JUDGED),
                                       description="metric", layout=widgets.Layout(width="260px"))
        self.feed = widgets.BoundedIntText(value=0, min=0, max=0, description="feed",
                                           layout=widgets.Layout(width="150px"))
        self.axis = widgets.BoundedIntText(value=1, min=-8, max=8, description="channel axis",
                                           layout=widgets.Layout(width="180px"))
        self.message = widgets.HTML()
        self.curve = None  # a go.FigureWidget, made when the first result arrives (it carries plotly.js)
        self.curve_box = widgets.VBox()
        self.overview = widgets.Output()
        self.culprit_chart = widgets.Output()
        more = widgets.Accordion(children=[self.overview, self.culprit_chart])
        more.set_title(0, "Distribution of the metric over tensors")
        more.set_title(1, "Culprits: error introduced vs received")
        self.more = more
        self.detail_title = widgets.HTML()
        self.jobs = JobControls()
        self.values_plot = widgets.Output()
        self.scatter_plot = widgets.Output(layout=widgets.Layout(width="50%"))
        self.channel_plot = widgets.Output(layout=widgets.Layout(width="50%"))
        # the layer-values probe (engines ready for one result): built on the job's worker, kept for the result
        # it serves (checked by identity); read, set and dropped only under the lock, never held while building
        self._probe = None
        self._probe_for = None
        self._probe_lock = threading.Lock()
        self._updating = False
        self.metric.observe(lambda _: self._draw_curve(), "value")
        for w in (self.feed, self.axis):
            w.observe(lambda _: self._show_detail(self.state.selected), "value")
        self.state.observe(lambda _: self.refresh(), "result")
        self.state.observe(lambda ch: self._show_detail(ch["new"]), "selected")
        super().__init__([
            style_tag(), widgets.HBox([self.metric, self.feed, self.axis]), self.message, self.curve_box,
            self.more, heading("Selected layer"), self.detail_title, self.jobs, self.values_plot,
            widgets.HBox([self.scatter_plot, self.channel_plot]),
        ])
        self.add_class("wb-root")
        self.refresh()

    # --- curve -----------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw everything for the state's result (a failure is a message in the panel)."""
        try:
            self._refresh()
        except Exception as e:  # noqa: BLE001 - shown in the panel, never raised into the comparison's thread
            self.message.value = error_html(e, "drawing the comparison")

    def _refresh(self) -> None:
        result = self.state.result
        with self._probe_lock:  # a new result: the probe of the old one goes (a job may rebuild it)
            if self._probe_for is not result:
                self._probe, self._probe_for = None, None
        if result is None:
            self.message.value = message_html("no comparison yet: run one in the Compare panel", "info")
            self.curve_box.children = ()
            return
        verdict = result.verdict()
        dips = len(verdict["internal_dips"])
        self.message.value = message_html(
            f"{'DIVERGED' if result.diverged else 'ok'}: {verdict['reason']}"
            + (f"; {dips} internal dip(s)" if dips else "") + ". Click a point (a layer) to see its values"
            + ("; the shaded band is the precision floor (the error of merely holding the reference in the "
               "candidate's format)." if any(t.floor for t in result.tensors) else "."),
            "error" if result.diverged else "info")
        with self.hold_trait_notifications():
            count = int((result.feeds or {}).get("count") or 1)
            self.feed.max = max(0, count - 1)
            self.feed.value = min(self.feed.value, self.feed.max)
        if self.metric.value != result.criterion.metric:
            self.metric.value = result.criterion.metric  # redraws
        else:
            self._draw_curve()
        from ..plots.compare import culprit_bars, metric_histogram

        show_figure(self.overview, metric_histogram(result))
        show_figure(self.culprit_chart, culprit_bars(result))
        self._show_detail(self.state.selected)

    def _draw_curve(self) -> None:
        import plotly.graph_objects as go

        from ..plots.compare import layer_error_curve

        result = self.state.result
        if result is None:
            return
        fig = layer_error_curve(result, self.metric.value)
        ring = {"size": 20, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": "#1a73e8"}}
        fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name=SELECTED_TRACE, hoverinfo="skip", marker=ring))
        fig.update_layout(height=420, clickmode="event")
        if self.curve is None:
            self.curve = go.FigureWidget(fig)
        else:
            with self.curve.batch_update():
                self.curve.data = ()
                self.curve.add_traces(list(fig.data))
                self.curve.layout = fig.layout
        self.curve_box.children = (self.curve,)  # a cleared result (a new run started) emptied the box
        for trace in self.curve.data:
            if trace.customdata is not None:
                trace.on_click(self._on_click)
        self._mark(self.state.selected)
        tensor = self._tensor_of(self.state.selected)
        if tensor is not None:  # the detail follows the metric shown
            self.detail_title.value = layer_html(result, tensor, self.metric.value)

    def _on_click(self, trace: Any, points: Any, _selector: Any) -> None:
        if not points.point_inds:
            return
        node = trace.customdata[points.point_inds[0]][1]
        self.select(node)

    def select(self, node: str) -> None:
        """Select layer ``node`` (as a click on its point does): every linked panel follows."""
        if self.state.selected == node:
            self._show_detail(node)
        else:
            self.state.selected = node

    def _tensor_of(self, node: str):
        result = self.state.result
        if result is None or not node:
            return None
        return next((t for t in result.tensors if t.node == node), None)

    def _mark(self, node: str) -> None:
        if self.curve is None:
            return
        tensor = self._tensor_of(node)
        trace = next((t for t in self.curve.data if t.name == SELECTED_TRACE), None)
        if trace is None:
            return
        if tensor is None:
            trace.x, trace.y = [], []
            return
        main = next((tr for tr in self.curve.data if tr.name == self.metric.value), self.curve.data[0])
        y = next((main.y[i] for i, x in enumerate(main.x) if x == tensor.topo_index), None)
        trace.x, trace.y = [tensor.topo_index], [y]

    # --- detail ----------------------------------------------------------------------------------------------
    def _show_detail(self, node: str) -> None:
        self._mark(node)
        tensor = self._tensor_of(node)
        if tensor is None:
            self.detail_title.value = message_html(
                f"{node} was not compared (no paired output)" if node else "no layer selected", "info")
            for out in (self.values_plot, self.scatter_plot, self.channel_plot):
                clear(out)
            return
        result = self.state.result
        self.detail_title.value = layer_html(result, tensor, self.metric.value or result.criterion.metric)
        feed, axis, model = int(self.feed.value), int(self.axis.value), self.state.model

        def work(progress, cancel):
            from ..inspect_tensor import probe_for
            from ..plots.compare import channel_error_heatmap, ref_vs_cand_scatter, value_histograms

            with self._probe_lock:
                probe = self._probe if self._probe_for is result else None
            if probe is None:
                progress(0.1, "preparing both engines")
                probe = probe_for(result, model)
                with self._probe_lock:
                    self._probe, self._probe_for = probe, result
            progress(0.4, f"running both sides for {tensor.tensor}")
            ref, cand = probe.values(tensor.tensor, feed)
            progress(0.8, "drawing")
            return (value_histograms(ref, cand, tensor.tensor),
                    ref_vs_cand_scatter(ref, cand, name=tensor.tensor),
                    channel_error_heatmap(ref, cand, axis=axis if ref.ndim > 1 else 0, name=tensor.tensor))

        def done(figures):
            if self.state.selected != node or self.state.result is not result:
                return  # the user moved on while this ran
            for out, fig in zip((self.values_plot, self.scatter_plot, self.channel_plot), figures):
                show_figure(out, fig)

        self.jobs.start("layer values", work, done, replace=True)

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)


def layer_html(result: Any, tensor: Any, metric: str) -> str:
    """The selected layer's error next to its precision floor (and how far beyond it), and its state."""
    from ..compare.floor import excess_db
    from ..compare.text import fmt

    m = html.escape(metric)
    text = (f"<b>{html.escape(tensor.node)}</b> ({html.escape(tensor.op_type)}, #{tensor.topo_index}) &rarr; "
            f"{html.escape(tensor.tensor)}: {m} {html.escape(fmt(tensor.metrics.get(metric), metric))}")
    bad = tensor.metrics.get("nonfinite_mismatch") or 0
    if bad:
        text += f", {bad} inf/NaN where the reference is finite"
    floor = tensor.floor
    if floor:
        name = html.escape(str(floor.get("format", "")).upper())
        text += f"; {name} floor {m} {html.escape(fmt(floor.get(metric), metric))}"
        excess = excess_db(metric, tensor.metrics, floor)
        if excess is not None and excess > 0:
            text += f" ({html.escape(fmt(excess))} dB beyond it)"
        elif excess is not None:
            text += " (no error beyond it)"
        shares = [(floor.get("share_flushed"), "flush to zero"), (floor.get("share_over_max"), "exceed its range")]
        said = [f"{100 * s:.3g}% of the reference values {what} in {name}" for s, what in shares
                if isinstance(s, (int, float)) and s > 0]
        if said:
            text += " &mdash; " + "; ".join(said)
    else:
        text += "; no precision floor (the candidate holds it in float32 or wider)"
    if tensor.tensor in set(result.outputs):
        text += " &middot; <b>graph output</b>"
    if tensor.diverged:
        text += (" <b class='wb-bad'>diverged</b>" if result.diverged else
                 " <b class='wb-dip'>internal dip</b> (the outputs pass)")
    elif tensor.at_floor:
        text += " <b class='wb-floor'>at its floor</b> (the format cannot hold the values; not diverged)"
    return text
