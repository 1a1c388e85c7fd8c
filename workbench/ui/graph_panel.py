"""Graph panel: the model's DAG with colour overlays, search, k-hop focus and name-scope collapsing, linked to
the other panels through the shared selection. The engine overlays (execution provider, runtime precision,
latency) and the fused-group boxes come from the state's ``engine_graph``: the latest engine inspected in the
Engine tab. The view (pan and zoom) stays where the user put it when the overlay changes, a scope opens or a
result arrives; it is framed again only for a new model, a new detail level, a focus and "Whole graph".
"hide Identity/Constant" (on by default) leaves those nodes out, bridging the edges through an Identity; the
selected node is described in a side pane to the right of the graph like Netron does (op type, domain, attributes
with values, typed inputs and outputs): as tall as the graph, scrolling on its own, so it reads without scrolling
the page."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from ..plots.graph import (
    OVERLAYS,
    RESULT_OVERLAYS,
    GraphView,
    auto_depth,
    graph_payload,
    items_at,
    node_details,
    rank_matches,
    reveal,
)
from ..plots.graph_engine import ENGINE_OVERLAYS, NO_ENGINE, EngineView
from .graph_widget import GraphWidget
from .messages import error_html, fallback_repr, message_html
from .runs import no_result_text
from .side_by_side import SideBySide
from .state import WorkbenchState
from .style import style_tag
from .thresholds_box import ThresholdsBox, bands_in_use

log = logging.getLogger(__name__)

#: overlays drawn from the model alone; RESULT_OVERLAYS need a comparison, ENGINE_OVERLAYS an engine graph
STATIC_OVERLAYS = ("op_type", "precision")
#: matches ringed (and their scopes opened) in the graph
MAX_MATCHES = 50
#: matches listed under the search box
MAX_LISTED = 200
#: the inspector pane right of the graph: its width, and how much taller than the canvas it may grow (the graph's
#: toolbar above the canvas)
PANE_WIDTH = 340
TOOLBAR_HEIGHT = 32
#: the narrowest the graph gets beside the pane
MIN_GRAPH_WIDTH = 320
#: the inspector pane with no node selected
HINT = "Click a node to inspect it"
#: longer values are cut (with an ellipsis) in the inspector; the whole value is in the cell's tooltip
MAX_SHOWN = 300
#: the most of a value a tooltip holds
MAX_TITLE = 4000


class GraphPanel(widgets.VBox):
    """``GraphPanel(model)`` or ``GraphPanel(state=...)``. Large graphs start collapsed by name scope to at
    most ``max_nodes`` boxes; double-click a scope to open it, search a name (the box above the graph, or
    :meth:`find`) to reveal and centre it: matches are listed best first (the exact name first) and stepped
    through with Enter / Shift+Enter, the arrow keys or the buttons."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, max_nodes: int = 1500,
                 height: int = 560, **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.max_nodes = max_nodes
        self.view: GraphView | None = None
        self.expanded: set[str] = set()
        self.focus: str | None = None
        self.canvas = GraphWidget(height=height)
        self.overlay = widgets.Dropdown(options=[(v, k) for k, v in OVERLAYS.items()], value="op_type",
                                        description="colour", layout=widgets.Layout(width="280px"))
        self.depth = widgets.Dropdown(description="detail", layout=widgets.Layout(width="230px"))
        self.hops = widgets.BoundedIntText(value=2, min=1, max=20, description="hops",
                                           layout=widgets.Layout(width="130px"))
        self.focus_button = widgets.Button(description="Focus", icon="crosshairs",
                                          tooltip="show only the selected node's neighbourhood (hops)")
        self.reset_button = widgets.Button(description="Whole graph", icon="expand")
        self.hide_trivial = widgets.Checkbox(value=True, description="hide Identity/Constant", indent=False,
                                             tooltip="leave Identity and Constant nodes out (edges through an "
                                                     "Identity are bridged)",
                                             layout=widgets.Layout(width="170px"))
        self.fused = widgets.Checkbox(value=False, description="Fused groups", indent=False,
                                      tooltip="box the ONNX nodes each executed node of the engine graph fuses "
                                              "(inspect an engine in the Engine tab)",
                                      layout=widgets.Layout(width="130px"))
        self.message = widgets.HTML("")
        self.overlay_note = widgets.HTML("")
        self.info = widgets.HTML(hint_html())
        self.info.add_class("wb-graph-info")
        self.side = widgets.VBox([self.info], layout=widgets.Layout(
            width=f"{PANE_WIDTH}px", min_width=f"{PANE_WIDTH}px", flex=f"0 0 {PANE_WIDTH}px",
            max_height=f"{height + TOOLBAR_HEIGHT}px", overflow="auto"))
        self.side.add_class("wb-graph-side")
        # the graph takes the width the pane leaves (flex basis 0: never its last drawn width); in an output
        # narrower than MIN_GRAPH_WIDTH + the pane, the pane goes under the graph
        self.canvas.layout = widgets.Layout(flex="1 1 0px", width="auto", min_width=f"{MIN_GRAPH_WIDTH}px")
        self.body = widgets.HBox([self.canvas, self.side], layout=widgets.Layout(
            width="100%", align_items="flex-start", flex_flow="row wrap"))
        self.body.add_class("wb-graph-body")
        self.show_errors = widgets.Button(description="Show in Errors", icon="line-chart", disabled=True)
        self.matches: list[str] = []
        self._quiet_query = False
        self.overlay.observe(lambda _: self.refresh(), "value")
        self.depth.observe(self._on_depth, "value")
        self.hide_trivial.observe(self._on_hide, "value")
        self.fused.observe(lambda _: self.refresh(), "value")
        self.canvas.observe(self._on_query, "query")
        self.focus_button.on_click(lambda _: self.focus_on(self.state.selected))
        self.reset_button.on_click(lambda _: self.whole_graph())
        self.show_errors.on_click(lambda _: self.state.request_show("errors"))
        self.canvas.observe(self._on_canvas_select, "selected")
        self.canvas.observe(self._on_height, "height")
        self.canvas.on_msg(self._on_canvas_msg)
        self.state.observe(self._on_model, "model")
        self.state.observe(self._on_result, "result")
        self.state.observe(lambda _: self._on_result() if self.state.result is None else None, "runs")
        self.state.observe(self._on_selected, "selected")
        self.state.observe(self._on_engine, "engine_graph")
        self.state.observe(lambda _: self.refresh(), "bands")
        # one graph, or the reference and the candidate side by side (the current comparison's)
        self.mode = widgets.ToggleButtons(options=[("one graph", "single"), ("side by side", "side")],
                                          value="single", tooltip="the reference and the candidate's graphs, "
                                          "coloured by the comparison, selections linked",
                                          style={"button_width": "110px"})
        # built on the first switch to it (its two graph widgets are not in the page before)
        self._side: SideBySide | None = None
        self._side_args = {"height": height, "max_nodes": max_nodes}
        self.side_box = widgets.VBox([], layout=widgets.Layout(width="100%", display="none"))
        self.bands_box = ThresholdsBox(self.state)
        self.mode.observe(self._on_mode, "value")
        self.single_bar = widgets.HBox([self.overlay, self.depth, self.fused],
                                       layout=widgets.Layout(flex_flow="row wrap"))
        self.single_bar2 = widgets.HBox([self.focus_button, self.hops, self.reset_button, self.hide_trivial,
                                         self.show_errors])
        bar1 = widgets.HBox([self.mode, self.single_bar], layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__([style_tag(), bar1, self.bands_box, self.single_bar2, self.message, self.overlay_note,
                          self.body, self.side_box])
        self.add_class("wb-root")
        self._on_model()
        if self.state.engine_graph is not None:
            self._on_engine()
        if self.state.result is not None:
            self._on_result()
        if self.state.selected:
            self._on_selected({"new": self.state.selected})

    def _on_mode(self, change: dict) -> None:
        """One graph, or the reference and candidate graphs side by side."""
        side = change["new"] == "side"
        for w in (self.single_bar, self.single_bar2, self.overlay_note, self.body):  # the one graph's parts
            w.layout.display = "none" if side else ""
        self.side_box.layout.display = "" if side else "none"
        if side:
            self.side_by_side.show()
        elif self._side is not None:
            self._side.active = False  # hidden: not laid out again for each new run until shown

    @property
    def side_by_side(self) -> SideBySide:
        """The side-by-side view (made, and put in the panel, when first asked for)."""
        if self._side is None:
            self._side = SideBySide(self.state, **self._side_args)
            self.side_box.children = (self._side,)
        return self._side

    # --- state -> view ---------------------------------------------------------------------------------------
    def _on_model(self, _change: Any = None) -> None:
        model = self.state.model
        self.expanded, self.focus, self.matches = set(), None, []
        self.info.value = hint_html()
        self.canvas.matches, self.canvas.match_total = [], 0
        if model is None:
            self.view = None
            self.message.value = message_html("no model loaded", "warn")
            return
        hide = self.hide_trivial.value
        self.view = GraphView.from_graph(model.graph, constants=not hide, hide=("Identity",) if hide else ())
        start = auto_depth(self.view, self.max_nodes)
        options = [("every node", -1)] + [(f"scopes to depth {d}", d) for d in range(1, self.view.max_depth + 1)]
        if start is not None and start not in {v for _, v in options}:
            start = None  # never a value the dropdown lacks (TraitError)
        with self.hold_trait_notifications():
            self.depth.options = options
            self.depth.value = -1 if start is None else start
        if start is not None:
            self.message.value = message_html(
                f"{len(self.view.names)} nodes: collapsed by name scope to depth {start} "
                f"({len(items_at(self.view, start)[0])} boxes). Double-click a dashed box to open it.", "info")
        elif len(self.view.names) > self.max_nodes:
            self.message.value = message_html(
                f"{len(self.view.names)} nodes and no name scopes to collapse them by: every node is drawn "
                "(search a name, or Focus on a node's neighbourhood).", "info")
        else:
            self.message.value = ""
        self.refresh(fit=True)

    def _on_result(self, _change: Any = None) -> None:
        """A new current comparison (or none: a run started, was cancelled or failed): the colours and the side
        pane follow it, so neither keeps an older run's numbers."""
        if self.state.result is not None and self.overlay.value in STATIC_OVERLAYS:
            self.overlay.value = "introduced"  # refreshes
        else:
            self.refresh()
        selected = self.state.selected
        if selected and self.view is not None and selected in self.view.index and self.state.model is not None:
            self._describe(selected)
        else:
            self.info.value = hint_html()

    def _on_engine(self, _change: Any = None) -> None:
        """A new engine graph: its fused groups are boxed (Fused groups ticks itself) and the engine overlays
        redrawn."""
        if self.engine_graph() is not None and not self.fused.value:
            self.fused.value = True  # refreshes
        else:
            self.refresh()

    def engine_graph(self):
        """The state's engine graph when it is of the model shown, else None (see :meth:`engine_problem`)."""
        return None if self.engine_problem() else self.state.engine_graph

    def engine_problem(self) -> str:
        """Why the engine overlays cannot be drawn ("" when they can)."""
        graph, model = self.state.engine_graph, self.state.model
        if graph is None:
            return NO_ENGINE
        sha = (graph.model or {}).get("sha256")
        if model is not None and sha and sha != model.fingerprint:
            name = (graph.model or {}).get("name") or "another model"
            return f"the engine graph in the Engine tab is of {name}, not of this model: inspect this one there"
        return ""

    def _on_hide(self, _change: Any) -> None:
        """Identity/Constant nodes shown or left out: the same model again, the selection kept."""
        self._on_model()
        if self.state.selected:
            self._on_selected({"new": self.state.selected})

    def _on_selected(self, change: dict) -> None:
        name = change["new"]
        if name and self.view is not None and name in self.view.hidden:
            self.hide_trivial.value = False  # a hidden Identity/Constant picked elsewhere: show them (rebuilds)
        if not name:  # the selection was reset (a new run): no ring left on the canvas, so that a click on that
            self.canvas.selected = ""  # node selects it again (the front end sends only a changed value)
            return
        if self.view is None or name not in self.view.index:
            return
        if self.focus is not None and name not in {self.view.names[i]
                                                   for i in self.view.neighbourhood(self.focus, self.hops.value)}:
            self.focus = name
            self.refresh()
        elif self.focus is None and self._depth() is not None and name not in self.canvas.data.get("ids", []):
            self.expanded = reveal(self.view, name, self._depth(), self.expanded)
            self.refresh()
        self.canvas.selected = name
        self._describe(name)

    def _on_height(self, change: dict) -> None:
        self.side.layout.max_height = f"{int(change['new'] or 560) + TOOLBAR_HEIGHT}px"

    def _depth(self) -> int | None:
        return None if self.depth.value in (None, -1) else int(self.depth.value)

    def _on_depth(self, _change: Any) -> None:
        self.expanded = set()
        self.refresh(fit=True)

    def refresh(self, fit: bool = False, anchor: tuple[str, str] | None = None) -> None:
        """Recompute the view (layout, colours) and send it to the canvas. ``fit``: frame the whole graph; else
        the pan and zoom stay, ``anchor`` (an id of the old layout, one of the new) keeping its place."""
        if self.view is None:
            return
        overlay = self.overlay.value
        engine, problem = self.engine_graph(), self.engine_problem()
        notes = []
        result = self.state.result
        run = self.state.run_of(result)
        if overlay in RESULT_OVERLAYS and result is None:
            notes.append(f"'{OVERLAYS[overlay]}' needs a comparison: " + no_result_text(self.state, where="Compare"))
            overlay = "op_type"
        elif overlay in RESULT_OVERLAYS:
            notes.append(f"colours from comparison {run.tag if run is not None else ''}".rstrip())
        elif overlay == "precision" and result is not None:
            notes.append(f"precision: what the candidate of comparison {run.tag if run is not None else ''} "
                         f"({result.candidate}) computes each node in, not the loaded model's own types (those are "
                         "in the node pane)")
        elif overlay == "precision":
            notes.append("precision: the loaded model's own tensor types (after a comparison: its candidate's)")
        elif overlay in ENGINE_OVERLAYS and engine is None:
            notes.append(f"'{OVERLAYS[overlay]}': {problem}")
            overlay = "op_type"
        elif overlay in ENGINE_OVERLAYS:
            notes.append(f"colours from the engine graph of {engine.engine}" + (
                f" ({engine.runs} profiled runs)" if overlay == "latency" and engine.runs else ""))
        if self.fused.value and engine is None and self.overlay.value not in ENGINE_OVERLAYS:
            notes.append(f"fused groups: {problem}")
        self.overlay_note.value = "".join(message_html(n, "info") for n in notes)
        try:
            data = graph_payload(
                self.view, overlay=overlay, result=self.state.result, depth=self._depth(), expanded=self.expanded,
                focus=self.focus, hops=self.hops.value, title=self.state.model.name if self.focus is None else "",
                engine=engine, groups=self.fused.value, bands=bands_in_use(self.state))
            data["view"] = "fit" if fit else "keep"
            if anchor is not None:
                data["anchor"] = list(anchor)
            self.canvas.data = data
        except Exception as e:  # noqa: BLE001 - a view that cannot be drawn is reported, not raised
            self.message.value = error_html(e, "drawing the graph")

    # --- user actions ----------------------------------------------------------------------------------------
    def find(self, text: str) -> list[str]:
        """What typing ``text`` in the search box does: rank the nodes matching it (the exact name first, see
        :func:`~workbench.plots.graph.rank_matches`), list them under the box, ring the first MAX_MATCHES and
        select the best. Returns the matching names, best first."""
        self._quiet_query = True
        try:
            self.canvas.query = (text or "").strip()
        finally:
            self._quiet_query = False
        return self._search(text)

    def _on_query(self, change: dict) -> None:
        if not self._quiet_query:
            self._search(change["new"])

    def _search(self, text: str) -> list[str]:
        text = (text or "").strip()
        if self.view is None or not text:
            self.matches = []
            self.canvas.matches, self.canvas.match_total, self.canvas.highlight = [], 0, []
            return []
        ranked = rank_matches(self.view, text)
        matches = [self.view.names[i] for i in ranked]
        self.matches = matches
        with self.canvas.hold_sync():
            self.canvas.matches = [[self.view.names[i], self.view.ops[i]] for i in ranked[:MAX_LISTED]]
            self.canvas.match_total = len(matches)
        if not matches:
            self.message.value = message_html(f"no node name contains '{text}'", "warn")
            self.canvas.highlight = []
            return []
        self.message.value = message_html(
            f"{len(matches)} match(es), best first" + (f"; the first {MAX_MATCHES} ringed" if len(matches) >
                                                       MAX_MATCHES else "")
            + ": Enter or \u2193 for the next, Shift+Enter or \u2191 for the previous", "info")
        for name in matches[:MAX_MATCHES]:
            if self.focus is None and self._depth() is not None:
                self.expanded = reveal(self.view, name, self._depth(), self.expanded)
        if self.focus is not None:
            self.focus = matches[0]
        self.refresh()
        with self.canvas.hold_sync():
            self.canvas.highlight_label = "search match"
            self.canvas.highlight = matches[:MAX_MATCHES]
        self.select(matches[0])
        return matches

    def step_match(self, step: int = 1) -> str | None:
        """Select the next (``step`` 1) or previous (-1) match of the last search, as Enter / Shift+Enter do."""
        if not self.matches:
            return None
        current = self.state.selected
        k = self.matches.index(current) if current in self.matches else -1
        name = self.matches[(k + step) % len(self.matches)]
        self.select(name)
        return name

    def reveal(self) -> None:
        """Scroll the page so the graph is in view (the front end does it once the graph is shown)."""
        self.canvas.scroll_into_view += 1

    def select(self, name: str) -> None:
        """Select node ``name`` here and in every linked panel."""
        if self.state.selected == name:
            self._on_selected({"new": name})
        else:
            self.state.selected = name

    def focus_on(self, name: str | None) -> None:
        """Show only the nodes within ``hops`` of ``name`` (the selected node)."""
        if not name or self.view is None or name not in self.view.index:
            self.message.value = message_html("select a node first (click it, or search its name)", "warn")
            return
        self.focus = name
        self.refresh(fit=True)
        self.canvas.selected = name

    def whole_graph(self) -> None:
        self.focus, self.expanded = None, set()
        self.message.value = ""
        self.refresh(fit=True)
        if self.state.selected:
            self._on_selected({"new": self.state.selected})

    def _on_canvas_select(self, change: dict) -> None:
        picked = change["new"]
        if not picked:
            return
        if picked.startswith("scope:"):
            self.info.value = message_html(f"scope {picked[6:]}: double-click it to open it", "info")
            self.show_errors.disabled = True
            return
        if picked != self.state.selected:
            self.state.selected = picked

    def _on_canvas_msg(self, _widget: Any, content: dict, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "expand" and str(content.get("id", "")):
            self.expand(str(content["id"]))

    def expand(self, scope: str) -> None:
        """Open a collapsed scope (``scope:/a/b``) one level. The view stays put (the scope's first box takes
        its place) and the selected node stays selected (a click on the scope had moved the ring to it)."""
        before = set(self.canvas.data.get("ids", []))
        self.expanded.add(scope)
        after = items_at(self.view, self._depth(), self.expanded)[0] if self.view is not None and \
            self.focus is None else list(before)
        inside = scope[6:].rstrip("/") + "/"
        first = next((i for i in after if i not in before
                      and (i[6:] if i.startswith("scope:") else i).startswith(inside)), None)
        kept = self.state.selected if self.state.selected in after else ""
        with self.canvas.hold_sync():  # one message: the browser never draws the new graph with no node selected
            self.refresh(anchor=(scope, first) if first is not None else None)
            self.canvas.selected = kept
        if kept:
            self._describe(kept)
        else:
            self.info.value = hint_html()

    def _describe(self, name: str) -> None:
        model, result = self.state.model, self.state.result
        node = model.graph.node(name)
        lines = [f"{_text(name, 'b')} ({_plain(node.op_type)}, #{node.topo_index})"]
        compared = False
        if result is None and self.state.current_run("comparison") is not None:
            lines.append(f"<span class='wb-muted'>{html.escape(no_result_text(self.state, where='Compare'))}"
                         "</span>")
        if result is not None:
            run = self.state.run_of(result)
            if run is not None:
                lines.append(f"<span class='wb-muted'>from comparison {run.tag}</span>")
            for t in result.tensors:
                if t.node == name:
                    compared = True
                    value = t.metrics.get(result.criterion.metric)
                    shown = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
                    lines.append(f"{html.escape(result.criterion.metric)}: {shown}")
                    if t.diverged:
                        lines.append("<b class='wb-bad'>diverged</b>")
                    break
            for k, c in enumerate(result.culprits, 1):
                if c.node == name:
                    lines.append(f"culprit #{k}: {html.escape(c.explanation)}")
        engine = self.engine_graph()
        if engine is not None:
            lines += [_text(line) for line in EngineView.of(engine).describe(name)]  # names bounded too
        self.show_errors.disabled = not compared
        try:
            inspector = inspector_html(node_details(model.proto, model.graph, name))
        except Exception as e:  # noqa: BLE001 - the inspector is a convenience: say why it is missing
            inspector = error_html(e, "inspecting the node")
        self.info.value = "<div class='wb-culprit'>" + "<br>".join(lines) + "</div>" + inspector


def hint_html() -> str:
    """The inspector pane with nothing selected."""
    return f"<div class='wb-graph-hint'>{html.escape(HINT)}</div>"


def _text(value: Any, tag: str = "span", cls: str = "") -> str:
    """``value`` escaped in a ``tag``: cut to MAX_SHOWN characters (an ellipsis), the whole value (up to MAX_TITLE)
    in its tooltip, so that a long name or a big tensor never widens the pane; control characters escaped."""
    from ..textfmt import printable

    value = printable(value)  # control characters escaped: a newline or NUL in a name shows as \\n, \\x00
    shown = value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN - 1] + "\u2026"
    title = value if len(value) <= MAX_TITLE else value[:MAX_TITLE - 1] + "\u2026"
    attrs = (f" class='{cls}'" if cls else "") + f" title='{html.escape(title, quote=True)}'"
    return f"<{tag}{attrs}>{html.escape(shown)}</{tag}>"


def _plain(value: Any) -> str:
    """``value`` escaped as text, control characters escaped, cut to MAX_SHOWN characters (no tooltip: an op type,
    a domain, an attribute type or a tensor kind from a hostile model is bounded too)."""
    from ..textfmt import printable

    value = printable(value)
    return html.escape(value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN - 1] + "\u2026")


def inspector_html(d: dict) -> str:
    """The node inspector (like Netron's): op type and domain, attributes with values, inputs and outputs with
    dtype and shape (an initializer's first values), as a table. Long names and values wrap (or are cut, the
    whole value in the tooltip); colours come from the theme (static/workbench.css, ``.wb-inspector``)."""
    e = _plain
    rows = [f"<tr><th>type</th><td><b>{e(d['op_type'])}</b> <span class='wb-muted'>{e(d['domain'])}</span>"
            "</td></tr>"]
    rows.append(f"<tr><th colspan=2>attributes ({len(d['attributes'])})</th></tr>")
    rows += [f"<tr><td>{_text(a['name'])}</td><td>{_text(a['value'], 'code')} "
             f"<span class='wb-muted'>{e(a['type'])}</span></td></tr>" for a in d["attributes"]]
    for part in ("inputs", "outputs"):
        rows.append(f"<tr><th colspan=2>{part} ({len(d[part])})</th></tr>")
        for t in d[part]:
            value = f"<br>{_text(t['value'], 'code')}" if t.get("value") else ""
            kind = f" <span class='wb-muted'>{e(t['kind'])}</span>" if t["kind"] not in ("", "intermediate") else ""
            rows.append(f"<tr><td>{_text(t['name'])}</td><td>{_text(t['type'] or '?')}{kind}{value}</td></tr>")
    return ("<table class='wb-inspector'><colgroup><col class='wb-inspector-key'><col></colgroup>"
            + "".join(rows) + "</table>")
