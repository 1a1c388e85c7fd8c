"""The Graph tab's "side by side" mode: the reference model's graph (left) and the candidate's actual graph (right:
the user's own file, or the variant the tool built: the FP16 conversion with its Casts, the Q/DQ model), both
coloured by the current comparison (and the user's colour bands). Two instances of the graph widget (its layout,
collapsing and drawing of 5,000-node graphs), synchronised here: selecting a node on one side selects and reveals
its counterpart (:func:`workbench.plots.side_by_side.match_nodes`) on the other and shows both sides' numbers;
candidate-only nodes (Cast, Q/DQ) are drawn as such. It follows the current run: a new run, a Cancel or a failure
clears it (:mod:`workbench.ui.runs`)."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from ..core.metric_info import METRIC_INFO
from ..plots.graph import GraphView, auto_depth, items_at, rank_matches, reveal
from ..plots.side_by_side import INSERTED_OPS, match_nodes, pair_numbers, side_payloads
from ..plots.thresholds import BAND_STYLE
from .graph_widget import GraphWidget
from .messages import error_html, message_html
from .runs import candidate_text, no_result_text
from .state import WorkbenchState
from .thresholds_box import bands_in_use

log = logging.getLogger(__name__)

#: the overlays drawn side by side (each needs the comparison, but "precision": each side's own dtypes)
SIDE_OVERLAYS = {"error": "error vs your colour bands", "diverged": "diverged (full run)",
                 "introduced": "error introduced (culprits)", "precision": "precision (each side its own)"}
#: metrics listed in the numbers pane (the criterion's first)
SHOWN_METRICS = ("sqnr_db", "cosine", "max_abs", "mean_abs", "norm_mean_abs", "nonfinite_mismatch")


def candidate_graph(result: Any, model: Any = None):
    """(the candidate's graph (a GraphInfo) the comparison ``result`` ran, or None; a note: why it is missing, or
    how it was obtained when not from the run itself). A result opened from a bundle has no run behind it: its own
    candidate file is loaded from the path it recorded; a variant the tool built (FP16, INT8) is built again from
    ``model`` (the same model, by sha256, and the same options: the converters are deterministic)."""
    from ..model.graph import GraphInfo

    plan = getattr(result, "plan", None)
    proto = getattr(plan, "cand_inferred", None) if plan is not None else None
    if proto is None and plan is not None:
        proto = getattr(plan, "cand_model", None)
    if proto is not None:
        return GraphInfo.build(proto), ""
    options = getattr(result, "run_options", None) or {}
    if options.get("cand_model") is not None:
        from ..model.load import load_model

        return load_model(options["cand_model"]).graph, ""
    rebuilt = _rebuilt_variant(result, model, options)
    if rebuilt is not None:
        return rebuilt, "built again from the model (this comparison was opened, not run, in this session)"
    return None, ("the candidate's graph is not kept with this comparison (it was opened from a file, not run in "
                  "this session): run it in Compare to see both graphs side by side")


def _rebuilt_variant(result: Any, model: Any, options: dict):
    """The tool's FP16 / INT8 variant of ``model`` made again for an opened ``result`` (None when it cannot be)."""
    from ..model.graph import GraphInfo
    from ..variants import make_variant

    variant = str((getattr(result, "variant", None) or {}).get("variant") or "")
    if model is None or variant not in ("fp16", "int8") or (result.model or {}).get("sha256") != model.fingerprint:
        return None
    calib = options.get("calibration_feeds") or getattr(result, "used_feeds", None)
    if variant == "int8" and not calib:
        return None
    try:
        made = make_variant(model.proto, variant, calibration_feeds=calib,
                            keep_fp32=list(options.get("keep_fp32") or ()))
        from ..core.shapes import infer_shapes_lenient

        return GraphInfo.build(infer_shapes_lenient(made.model))
    except Exception as e:  # noqa: BLE001 - a convenience: the reason it is missing is shown instead
        log.info("the candidate variant could not be built again: %s", e)
        return None


def reference_graph(result: Any, model: Any):
    plan = getattr(result, "plan", None)
    graph = getattr(plan, "ref_graph", None) if plan is not None else None
    return graph if graph is not None else model.graph


class _Side:
    """One graph widget and its collapse state (depth, opened scopes) over a GraphView."""

    def __init__(self, name: str, height: int, max_nodes: int) -> None:
        self.name = name
        self.canvas = GraphWidget(height=height)
        self.canvas.layout = widgets.Layout(width="100%")
        self.canvas.add_class(f"wb-sbs-{name}")
        self.title = widgets.HTML("")
        self.box = widgets.VBox([self.title, self.canvas], layout=widgets.Layout(flex="1 1 0px", min_width="300px"))
        self.box.add_class(f"wb-sbs-side-{name}")
        self.max_nodes = max_nodes
        self.view: GraphView | None = None
        self.depth: int | None = None
        self.expanded: set[str] = set()

    def load(self, graph: Any) -> None:
        self.view = GraphView.from_graph(graph, hide=("Identity",))
        self.depth = auto_depth(self.view, self.max_nodes)
        self.expanded = set()

    def options(self) -> dict:
        return {"depth": self.depth, "expanded": set(self.expanded)}

    def needs_reveal(self, name: str) -> bool:
        return self.depth is not None and name not in self.canvas.data.get("ids", [])

    def reveal(self, name: str) -> None:
        self.expanded = reveal(self.view, name, self.depth, self.expanded)

    def clear(self) -> None:
        self.view = None
        with self.canvas.hold_sync():
            self.canvas.selected = ""
            self.canvas.data = {}
        self.title.value = ""


class SideBySide(widgets.VBox):
    """``SideBySide(state)``: both graphs of the state's current comparison; :meth:`select` (``side``
    "reference" or "candidate") is a click on a node of that side."""

    def __init__(self, state: WorkbenchState, *, height: int = 520, max_nodes: int = 1500) -> None:
        self.state = state
        self.left = _Side("reference", height, max_nodes)
        self.right = _Side("candidate", height, max_nodes)
        self.overlay = widgets.Dropdown(options=[(v, k) for k, v in SIDE_OVERLAYS.items()], value="error",
                                        description="colour", layout=widgets.Layout(width="300px"))
        self.message = widgets.HTML("")
        self.numbers = widgets.HTML("")
        self.numbers.add_class("wb-sbs-numbers")
        self.match = None
        self._for = None  # the result the two graphs are of (by identity)
        self._syncing = False
        self.picked: tuple[str, str] | None = None  # (side, node) selected
        self.overlay.observe(lambda _: self.refresh(), "value")
        for side in (self.left, self.right):
            side.canvas.observe(lambda ch, s=side: self._on_click(s, ch["new"]), "selected")
            side.canvas.on_msg(lambda _w, content, _b, s=side: self._on_msg(s, content))
            side.canvas.observe(lambda ch, s=side: self._on_query(s, ch["new"]), "query")
        state.observe(lambda _: self.update(), "result")
        state.observe(lambda _: self.update() if state.result is None else None, "runs")
        state.observe(lambda _: self.update(), "model")
        state.observe(lambda _: self.refresh(), "bands")
        state.observe(self._on_selected, "selected")
        body = widgets.HBox([self.left.box, self.right.box], layout=widgets.Layout(width="100%",
                                                                                   flex_flow="row wrap"))
        super().__init__([widgets.HBox([self.overlay]), self.message, body, self.numbers])
        self.add_class("wb-sbs")
        self.active = False

    # --- the current run -------------------------------------------------------------------------------------
    def update(self) -> None:
        """Follow the state's current comparison: both graphs of it, or cleared (with the reason) when there is
        none (a run started, was cancelled or failed)."""
        result, model = self.state.result, self.state.model
        if result is self._for and result is not None and self.match is not None:
            return
        self._for, self.match, self.picked = None, None, None
        self.numbers.value = ""
        if result is None or model is None:
            self.left.clear()
            self.right.clear()
            self.message.value = message_html(no_result_text(self.state, where="Compare") if model is not None
                                              else "no model loaded", "info")
            return
        if not self.active:  # built when shown (two layouts of a big graph are not free)
            self.left.clear()
            self.right.clear()
            self.message.value = ""
            return
        try:
            cand, why = candidate_graph(result, model)
            if cand is None:
                self.left.clear()
                self.right.clear()
                self.message.value = message_html(why, "warn")
                return
            ref = reference_graph(result, model)
            self.match = match_nodes(ref, cand, result)
            self.graphs = (ref, cand)
            self.left.load(ref)
            self.right.load(cand)
            self._for = result
        except Exception as e:  # noqa: BLE001 - a view that cannot be built is reported, not raised
            self.message.value = error_html(e, "laying out both graphs")
            return
        run = self.state.run_of(result)
        tag = f"{run.tag}: " if run is not None else ""
        self.message.value = message_html(f"{tag}{self.match.summary()}" + (f"; the candidate's graph {why}" if why
                                                                             else "")
                                          + ". Click a node on either side: its counterpart is selected on the other "
                                          "and both sides' numbers show below.", "info")
        self.left.title.value = (f"<b>reference</b> {html.escape(str(result.reference))} "
                                 f"<span class='wb-muted'>{html.escape(model.name)}</span>")
        self.right.title.value = f"<b>candidate</b> {html.escape(candidate_text(result))} " + \
            f"<span class='wb-muted'>{html.escape(_variant_text(result))}</span>"
        self.refresh(fit=True)
        if self.state.selected:
            self._on_selected({"new": self.state.selected})

    def show(self) -> None:
        """The mode was switched on: build the view for the current run."""
        self.active = True
        self.update()

    def refresh(self, fit: bool = False, anchor: dict | None = None) -> None:
        """Colour and lay out both sides again (the view kept unless ``fit``)."""
        if self.match is None or self.left.view is None or self.right.view is None:
            return
        try:
            left, right = side_payloads(self.left.view, self.right.view, self.match, self.state.result,
                                        overlay=self.overlay.value, bands=bands_in_use(self.state),
                                        ref_options=self.left.options(), cand_options=self.right.options())
        except Exception as e:  # noqa: BLE001 - reported, not raised
            self.message.value = error_html(e, "colouring both graphs")
            return
        for side, data in ((self.left, left), (self.right, right)):
            data["view"] = "fit" if fit else "keep"
            if anchor and side.name in anchor:
                data["anchor"] = list(anchor[side.name])
            side.canvas.data = data
        if self.picked is not None:
            self._show_numbers(*self.picked)

    # --- selection -------------------------------------------------------------------------------------------
    def _on_selected(self, change: dict) -> None:
        name = change["new"]
        if self.match is None or not name or self.left.view is None or name not in self.left.view.index:
            return
        self.select(name, "reference")

    def _on_click(self, side: _Side, picked: str) -> None:
        if self._syncing or not picked or picked.startswith("scope:") or self.match is None:
            return
        self.select(picked, side.name, from_click=True)

    def select(self, name: str, side: str = "reference", from_click: bool = False) -> None:
        """Select ``name`` on ``side`` and its counterpart on the other, revealing both; a reference node (or a
        candidate node with a counterpart) becomes the workbench's selection (the other panels follow)."""
        if self.match is None:
            return
        ref = name if side == "reference" else self.match.cand_to_ref.get(name)
        cand = name if side == "candidate" else self.match.ref_to_cand.get(name)
        if ref and self.state.selected != ref:
            self.picked = (side, name)
            self.state.selected = ref  # comes back through _on_selected with side "reference"
            if side == "reference":
                return
        self.picked = (side, name)
        grow = [s for s, n in ((self.left, ref), (self.right, cand)) if n and n in s.view.index and s.needs_reveal(n)]
        for s, n in ((self.left, ref), (self.right, cand)):
            if s in grow:
                s.reveal(n)
        if grow:
            self.refresh()
        self._syncing = True
        try:
            self.left.canvas.selected = ref or ""
            self.right.canvas.selected = cand or ""
        finally:
            self._syncing = False
        self._show_numbers(side, name)

    def _show_numbers(self, side: str, name: str) -> None:
        ref, cand = self.graphs
        numbers = pair_numbers(self.state.result, self.match, ref, cand, name, side)
        self.numbers.value = numbers_html(numbers, self.state.result, bands_in_use(self.state))

    # --- per-side actions: open a scope, search ---------------------------------------------------------------
    def _on_msg(self, side: _Side, content: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "expand" and side.view is not None:
            scope = str(content.get("id", ""))
            before = set(side.canvas.data.get("ids", []))
            side.expanded.add(scope)
            after = items_at(side.view, side.depth, side.expanded)[0]
            inside = scope[6:].rstrip("/") + "/"
            first = next((i for i in after if i not in before
                          and (i[6:] if i.startswith("scope:") else i).startswith(inside)), None)
            self.refresh(anchor={side.name: (scope, first)} if first else None)

    def _on_query(self, side: _Side, text: str) -> None:
        text = (text or "").strip()
        if side.view is None or not text:
            side.canvas.matches, side.canvas.match_total = [], 0
            return
        ranked = rank_matches(side.view, text)
        with side.canvas.hold_sync():
            side.canvas.matches = [[side.view.names[i], side.view.ops[i]] for i in ranked[:200]]
            side.canvas.match_total = len(ranked)
        if ranked:
            self.select(side.view.names[ranked[0]], side.name)


def _variant_text(result: Any) -> str:
    info = getattr(result, "variant", None) or {}
    if info.get("variant") == "user model":
        return "your own file, as it is"
    if info.get("variant"):
        return f"{str(info['variant']).upper()} variant built by {info.get('converter') or 'the workbench'}"
    return ""


def _value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, (int, float)):
        return f"{v:.4g}"
    return html.escape(str(v))


def numbers_html(n: dict, result: Any, bands: Any) -> str:
    """Both sides of the selected pair: node, op, tensor and type per side; the comparison's metrics of the pair
    (the criterion's first, its band named and coloured)."""
    e = html.escape
    if n["only"] == "candidate":
        c = n["candidate"] or {}
        why = ("inserted by the conversion" if c.get("op") in INSERTED_OPS else "only in the candidate")
        return (f"<div class='wb-sbs-pair' data-only='candidate'><b>{e(c.get('node', ''))}</b> ({e(c.get('op', ''))})"
                f": {why}; no reference node computes it, so it has no numbers of its own (its effect shows in "
                f"the nodes after it). Output {e(c.get('tensor', ''))} {e(c.get('type', ''))}</div>")
    rows = []
    for key in ("node", "op", "tensor", "type"):
        cells = "".join(f"<td class='wb-sbs-{side}'>{e(str((n[side] or {}).get(key, '-')))}</td>"
                        for side in ("reference", "candidate"))
        rows.append(f"<tr><th>{key}</th>{cells}</tr>")
    if n["only"] == "reference":
        rows.append("<tr><td colspan=3 class='wb-muted'>no candidate counterpart</td></tr>")
    metric = result.criterion.metric if result is not None else None
    shown = [metric] + [m for m in SHOWN_METRICS if m != metric] if metric else []
    for m in shown:
        if m not in n["metrics"]:
            continue
        v = n["metrics"][m]
        label = METRIC_INFO[m].label if m in METRIC_INFO else m
        band = bands.classify(v) if bands is not None and bands.metric == m else None
        badge = (f" <span class='wb-sbs-band' data-band='{BAND_STYLE[band][1]}' style='color:{BAND_STYLE[band][0]}'>"
                 f"\u25a0 {BAND_STYLE[band][1]}</span>") if band is not None else ""
        rows.append(f"<tr data-metric='{e(m)}'><th>{e(m)}</th><td colspan=2><span class='wb-sbs-value'>{_value(v)}"
                    f"</span> <span class='wb-muted'>{e(label)}</span>{badge}</td></tr>")
    floor = n.get("floor") or {}
    if metric and floor.get(metric) is not None:
        rows.append(f"<tr><th>floor</th><td colspan=2>{_value(floor[metric])} <span class='wb-muted'>{e(metric)} of "
                    f"the reference merely held in {e(str(floor.get('format', '')).upper())}</span></td></tr>")
    if n["diverged"] is not None:
        state = "diverged" if n["diverged"] else "at its floor" if n["at_floor"] else "within the criterion"
        rows.append(f"<tr><th>verdict</th><td colspan=2>{state}"
                    + (f"; culprit #{n['culprit']}" if n["culprit"] else "") + "</td></tr>")
    elif n["only"] != "reference":
        rows.append("<tr><td colspan=3 class='wb-muted'>not compared in this run</td></tr>")
    return ("<table class='wb-inspector wb-sbs-pair'><tr><th></th><th>reference</th><th>candidate</th></tr>"
            + "".join(rows) + "</table>")
