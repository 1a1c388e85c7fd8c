"""Errors panel: the per-layer error curve (precision floor band, tolerance line, graph outputs, at-floor tensors
and, for a diverged run, the first divergent layer marked); click a layer to see its error next to its floor, its
reference/candidate value histograms, the error histogram, a sampled scatter, a per-channel heat map and the
reference / candidate / difference side by side (image-like tensors as images, one channel at a time). The layers'
values can be sent to a notebook variable (IPython's ``user_ns``). The curve names the first divergent and the worst
layers; zoom buttons (and, for 500+ layers, a range slider) narrow it without losing the selection."""

from __future__ import annotations

import html
import keyword
import logging
import threading
from typing import Any

import ipywidgets as widgets

from ..core.metric_info import JUDGED
from .figures import clear, figure_widget, show_figure
from .jobs import JobControls
from .messages import error_html, fallback_repr, message_html
from .runs import no_result_text
from .state import WorkbenchState
from .style import heading, style_tag
from .thresholds_box import ThresholdsBox, bands_in_use

log = logging.getLogger(__name__)

SELECTED_TRACE = "selected layer"
#: how many layers a zoom to the selected (or first divergent) layer shows
ZOOM_SPAN = 60


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
        # side by side when there is room, one under the other in a narrow window (their row wraps)
        self.scatter_plot = widgets.Output(layout=widgets.Layout(flex="1 1 45%", min_width="320px"))
        self.channel_plot = widgets.Output(layout=widgets.Layout(flex="1 1 45%", min_width="320px"))
        # side by side: reference / candidate / difference of the selected tensor (a channel at a time for images)
        self.view_channel = widgets.BoundedIntText(value=0, min=0, max=0, description="image channel",
                                                   style={"description_width": "initial"},
                                                   layout=widgets.Layout(width="200px", display="none"))
        self.view_note = widgets.HTML()
        self.views_plot = widgets.Output()
        self._values: tuple | None = None  # (node, tensor, reference, candidate) of the layer shown, kernel thread
        # zoom: the whole curve, around the selected layer, around the first divergent one (the selection stays)
        self.zoom_all = widgets.Button(description="all layers", icon="arrows-alt-h",
                                       tooltip="show every layer", layout=widgets.Layout(width="auto"))
        self.zoom_selected = widgets.Button(description="zoom to selected", icon="search-plus",
                                            tooltip=f"show the {ZOOM_SPAN} layers around the selected one",
                                            layout=widgets.Layout(width="auto"))
        self.zoom_first = widgets.Button(description="zoom to first divergent", icon="search-plus",
                                         tooltip=f"show the {ZOOM_SPAN} layers around the first divergent one",
                                         layout=widgets.Layout(width="auto"))
        self.zoom_all.on_click(lambda _: self.zoom("all"))
        self.zoom_selected.on_click(lambda _: self.zoom("selected"))
        self.zoom_first.on_click(lambda _: self.zoom("first"))
        self.zoom_note = widgets.HTML()
        self.zoom_bar = widgets.HBox([widgets.HTML("<span class='wb-muted'>zoom:</span>"), self.zoom_all,
                                      self.zoom_selected, self.zoom_first, self.zoom_note])
        # send the selected layer's arrays to the user's notebook namespace
        self.var_name = widgets.Text(value="layer_values", description="variable",
                                     layout=widgets.Layout(width="260px"))
        self.send_button = widgets.Button(description="Send arrays to notebook variable", icon="share",
                                          disabled=True, layout=widgets.Layout(width="auto"))
        self.send_button.on_click(lambda _: self.send_arrays())
        self.send_note = widgets.HTML(message_html(
            "puts {'reference': array, 'candidate': array} of the selected layer (for the feed above) into your "
            "notebook's namespace (IPython's user_ns) under the name typed", "info"))
        # the layer-values probe (engines ready for one result): built on the job's worker, kept for the result
        # it serves (checked by identity); read, set and dropped only under the lock, never held while building
        self._probe = None
        self._probe_for = None
        self._probe_lock = threading.Lock()
        self._updating = False
        self.metric.observe(lambda _: self._draw_curve(), "value")
        for w in (self.feed, self.axis):
            w.observe(lambda _: self._show_detail(self.state.selected), "value")
        self.view_channel.observe(lambda _: self._draw_views(), "value")
        self.state.observe(lambda _: self.refresh(), "result")
        self.state.observe(self._on_runs, "runs")  # a run cancelled or failed: say so where its results were
        self.state.observe(lambda ch: self._show_detail(ch["new"]), "selected")
        self.state.observe(lambda _: self._on_bands(), "bands")  # the user's colour thresholds
        self.bands_box = ThresholdsBox(self.state)
        super().__init__([
            style_tag(), widgets.HBox([self.metric, self.feed, self.axis]), self.bands_box, self.message,
            self.zoom_bar,
            self.curve_box, self.more, heading("Selected layer"), self.detail_title, self.jobs, self.values_plot,
            widgets.HBox([self.scatter_plot, self.channel_plot], layout=widgets.Layout(flex_flow="row wrap")),
            heading("Reference / candidate / difference"), self.view_channel, self.view_note, self.views_plot,
            widgets.HBox([self.var_name, self.send_button]), self.send_note,
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
            self.message.value = message_html(no_result_text(self.state), "info")
            self._clear_views()
            return
        verdict = result.verdict()
        dips = len(verdict["internal_dips"])
        run = self.state.run_of(result)
        self.message.value = message_html(
            (f"{run.tag}: " if run is not None else "") + f"{'DIVERGED' if result.diverged else 'ok'}: "
            f"{verdict['reason']}"
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

        show_figure(self.overview, metric_histogram(result, bands=bands_in_use(self.state)))
        show_figure(self.culprit_chart, culprit_bars(result, bands=bands_in_use(self.state)))
        self._show_detail(self.state.selected)

    def _on_bands(self) -> None:
        """New colour thresholds: the curve, the distribution chart and the culprit chart are coloured again."""
        if self.state.result is not None:
            self.refresh()

    @property
    def curve_shown(self) -> bool:
        """Whether the error curve is shown (there is a current comparison)."""
        return bool(self.curve_box.children) and self.curve_box.layout.display != "none"

    def _on_runs(self, _change: Any = None) -> None:
        if self.state.result is None:
            self.message.value = message_html(no_result_text(self.state), "info")

    def _clear_views(self) -> None:
        """No current comparison: the curve, the overview charts, the selected layer's detail and its values go
        (none of them may show an older run's numbers as current)."""
        # hidden, its traces dropped, but kept in the page: a figure view removed and drawn again on the next run
        # made plotly.js fail to set its state ("Error setting state" in the browser console on every rerun)
        self.curve_box.layout.display = "none"
        if self.curve is not None:
            self.curve.data = ()
        for out in (self.overview, self.culprit_chart, self.values_plot, self.scatter_plot, self.channel_plot):
            clear(out)
        self.detail_title.value = ""
        self.zoom_note.value = ""
        self._set_values(None)

    def _draw_curve(self) -> None:
        import plotly.graph_objects as go

        from ..plots.compare import layer_error_curve

        result = self.state.result
        if result is None:
            return
        fig = layer_error_curve(result, self.metric.value, bands=bands_in_use(self.state))
        ring = {"size": 20, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": "#1a73e8"}}
        fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name=SELECTED_TRACE, hoverinfo="skip", marker=ring))
        fig.update_layout(height=420, clickmode="event")
        self.curve_box.layout.display = ""  # shown before it is updated: plotly.js draws into a visible plot
        if self.curve is None:
            self.curve = figure_widget(fig)
            self.curve_box.children = (self.curve,)
        else:
            with self.curve.batch_update():
                self.curve.data = ()
                self.curve.add_traces(list(fig.data))
                self.curve.layout = fig.layout
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
            self._set_values(None)
            return
        result = self.state.result
        self.detail_title.value = layer_html(result, tensor, self.metric.value or result.criterion.metric)
        feed, axis, model = int(self.feed.value), int(self.axis.value), self.state.model
        self._set_values(None)  # the arrays shown (and sent) are this layer's, for this feed, once computed

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
                    channel_error_heatmap(ref, cand, axis=axis if ref.ndim > 1 else 0, name=tensor.tensor),
                    (ref, cand))

        def done(figures):
            if self.state.selected != node or self.state.result is not result:
                return  # the user moved on while this ran
            for out, fig in zip((self.values_plot, self.scatter_plot, self.channel_plot), figures[:3]):
                show_figure(out, fig)
            self._set_values((node, tensor.tensor, *figures[3]))

        self.jobs.start("layer values", work, done, replace=True)

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)

    # --- side by side ----------------------------------------------------------------------------------------
    def _set_values(self, values: tuple | None) -> None:
        """Keep the selected layer's (node, tensor, reference, candidate) and draw them side by side."""
        from ..plots.compare import image_channels

        self._values = values
        self.send_button.disabled = values is None
        if values is None:
            clear(self.views_plot)
            self.view_note.value = ""
            self.view_channel.layout.display = "none"
            return
        _, name, ref, cand = values
        channels = image_channels(getattr(ref, "shape", ()))
        with self.view_channel.hold_trait_notifications():
            self.view_channel.max = max(0, (channels or 1) - 1)
            self.view_channel.value = min(self.view_channel.value, self.view_channel.max)
        self.view_channel.layout.display = "" if channels and channels > 1 else "none"
        self.view_note.value = message_html(
            f"{name} {list(ref.shape)}: image-like, shown as images" + (f" (pick one of {channels} channels)"
                                                                          if channels > 1 else "")
            if channels else f"{name} {list(ref.shape)}: values in order (not image-like)", "info")
        self._draw_views()

    def _draw_views(self) -> None:
        from ..plots.compare import tensor_side_by_side

        if self._values is None:
            return
        _, name, ref, cand = self._values
        try:
            show_figure(self.views_plot, tensor_side_by_side(ref, cand, name, channel=int(self.view_channel.value)))
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.view_note.value = error_html(e, "drawing the side-by-side view")

    # --- send to a notebook variable -------------------------------------------------------------------------
    def send_arrays(self, name: str | None = None, namespace: dict | None = None) -> str | None:
        """Put ``{'reference': array, 'candidate': array}`` of the layer shown into ``namespace`` (default: the
        notebook's, IPython's ``user_ns``) as ``name`` (default: the name typed); returns the name (None if not)."""
        name = (self.var_name.value if name is None else name).strip()
        if self._values is None:
            self.send_note.value = message_html("select a layer first (its values are computed on a click)", "warn")
            return None
        if not name.isidentifier() or keyword.iskeyword(name):
            self.send_note.value = message_html(f"{name!r} is not a Python variable name", "error")
            return None
        if namespace is None:
            try:
                from IPython import get_ipython
            except ImportError:  # pragma: no cover - IPython comes with ipywidgets
                get_ipython = None  # noqa: N806
            shell = get_ipython() if get_ipython is not None else None
            if shell is None:
                self.send_note.value = message_html("no notebook (IPython) namespace here to send to", "error")
                return None
            namespace = shell.user_ns
        node, tensor, ref, cand = self._values
        namespace[name] = {"reference": ref, "candidate": cand}
        self.send_note.value = message_html(
            f"{name} = {{'reference': array, 'candidate': array}} of {tensor} (layer {node}, feed "
            f"{int(self.feed.value)}, shape {list(ref.shape)}) is in your notebook's namespace (IPython user_ns)",
            "ok")
        return name

    # --- zoom ------------------------------------------------------------------------------------------------
    def zoom(self, where: str = "all") -> tuple | None:
        """Narrow the curve to the ``ZOOM_SPAN`` layers around the selected ("selected") or the first divergent
        ("first") layer, or show them all ("all"); the selection is kept. Returns the x range set (None: all)."""
        if self.curve is None:
            return None
        result = self.state.result
        self.zoom_note.value = ""
        if where == "all":
            self.curve.layout.xaxis.autorange = True
            return None
        tensor = self._tensor_of(self.state.selected) if where == "selected" else \
            (result.first_divergent if result is not None else None)
        if tensor is None:
            self.zoom_note.value = message_html("no selected layer to zoom to" if where == "selected" else
                                                "no first divergent layer (the run did not diverge)", "warn")
            return None
        self.zoom_note.value = ""
        x = tensor.topo_index
        span = (x - ZOOM_SPAN / 2, x + ZOOM_SPAN / 2)
        self.curve.layout.xaxis.range = span
        return span


def layer_html(result: Any, tensor: Any, metric: str) -> str:
    """The selected layer's error next to its precision floor (and how far beyond it), and its state."""
    from ..compare.floor import excess_db
    from ..compare.text import fmt

    m = html.escape(metric)
    # the index is in the compared reference graph: a reference variant (ort:int8, its Q/DQ nodes) numbers the
    # nodes otherwise than the loaded model the Graph tab draws
    ref = str(getattr(result, "reference", "") or "")
    where = f" in {html.escape(ref)}'s graph" if ":" in ref and not ref.endswith(":fp32") else ""
    text = (f"<b>{html.escape(tensor.node)}</b> ({html.escape(tensor.op_type)}, #{tensor.topo_index}{where}) &rarr; "
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
