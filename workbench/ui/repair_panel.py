"""Repair panel: pick two engines/precisions (or your own candidate file), inputs and a target; run repair() on a
thread with a progress bar and Cancel; show whether the target is met, the nodes repaired, each with its kind
(fp32-island, or a rewrite that keeps it in the candidate precision: restore-constant, fold-bn, rescale,
fold-scale; each one a button that selects it in the graph, where they are highlighted), the cost (evaluations, builds),
every output before and after, the share of weight bytes still in the candidate precision and the verification
on the candidate and an independent engine. The repaired model is written to a fresh folder under the output
folder (a temporary one unless you chose one: never the working directory) with a download link; "Make a bug
report" runs reduce() into another fresh folder and offers it as a zip.

Numbers come from the core (``workbench.repair``, ``workbench.reduce``) and the pure figure in
``workbench.plots.repair``; this module only lays them out."""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import ipywidgets as widgets
from traitlets import Any as AnyTrait
from traitlets import Bool, List, Unicode

from .._atomic import umask
from ..errors import InputError
from .downloads import download_html
from .downloads import server as download_server
from .engine_pair import EnginePair, PairedPanel
from .figures import clear, show_figure
from .inputs_box import InputsBox
from .jobs import JobControls
from .messages import error_html, fallback_repr, message_html
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import fmt, table_html

log = logging.getLogger(__name__)

class RepairPanel(PairedPanel, widgets.VBox):
    """``RepairPanel(model)``; ``run()`` starts a repair (also what the Run button does), ``wait()`` joins it,
    ``make_bug_report()`` runs reduce() and zips its folder.

    ``kept`` lists the nodes of the current result repaired, kept in reference precision or rewritten (empty
    when there is no current result: before a run, while one runs, after Cancel or a failure); ``highlight`` is
    what a graph view should ring for them (the nodes and the name scopes holding them, so collapsed views show
    them too). ``compare=``
    (a :class:`~workbench.ui.ComparePanel` on the same state) shares its inputs and keeps the engine pickers in
    step with it; :meth:`link_graph` rings the kept nodes in a :class:`~workbench.ui.GraphPanel`."""

    kept = List(Unicode())
    highlight = List(Unicode())
    result = AnyTrait(None, allow_none=True)
    #: True when the results area holds no current result (cleared by a new run, a Cancel or a failure)
    stale = Bool(True)

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, reference: str = "ort",
                 candidate: str = "ort:fp16", compare: Any = None, **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.pair = EnginePair(reference, candidate)
        self.engines = self.pair.engines
        self.ref_engine, self.ref_variant = self.pair.ref_engine, self.pair.ref_variant
        self.cand_engine, self.cand_variant = self.pair.cand_engine, self.pair.cand_variant
        self._make_cand_file()
        self.engine_note = widgets.HTML()
        self.inputs = compare.inputs if compare is not None else InputsBox(state=self.state)
        self.target = widgets.Text(
            placeholder="empty: every output passes the candidate precision's criterion; or e.g. sqnr_db<40",
            description="target", layout=widgets.Layout(width="560px"))
        self.metric = widgets.Text(
            placeholder="optional task metric: module:function or path/to/file.py:function (target then '>=0.99')",
            description="metric", layout=widgets.Layout(width="560px"))
        self.max_builds = widgets.BoundedIntText(value=40, min=1, max=10_000, description="max builds",
                                                 layout=widgets.Layout(width="200px"))
        self.run_button = widgets.Button(description="Run", icon="play", button_style="primary",
                                         tooltip="find the smallest set of nodes to keep in reference precision")
        self.run_button.on_click(lambda _: self.run())
        self.jobs = JobControls(locks=[self.run_button])
        self.summary = widgets.HTML()
        self.kept_rows = widgets.VBox()
        self.outputs_table = widgets.HTML()
        self.chart = widgets.Output()
        self.details = widgets.HTML()
        self.download = widgets.HTML()
        self.reduce_button = widgets.Button(description="Make a bug report (reduce)", icon="bug",
                                            layout=widgets.Layout(width="auto"),
                                            tooltip="write the smallest reference/candidate pair that reproduces "
                                                    "the divergence alone, as a zip")
        self.reduce_button.on_click(lambda _: self.make_bug_report())
        self.reduce_jobs = JobControls()
        self.reduce_note = widgets.HTML()
        self.model_file: Path | None = None
        self.report_zip: Path | None = None
        self._problems: list[str] = []
        self._links: list[Any] = []
        self.pair.observe(self._on_engine)
        self.cand_file.observe(self._on_engine, "value")
        self.jobs.cancel_button.observe(self._on_job_state, "disabled")
        self.state.observe(self._on_model, "model")
        if compare is not None:
            self.link_compare(compare)
        pickers = widgets.VBox([widgets.HBox([self.ref_engine, self.ref_variant]),
                                widgets.HBox([self.cand_engine, self.cand_variant]), self.cand_file,
                                self.engine_note])
        super().__init__([
            style_tag(), download_server(), heading("Engines and precisions"), pickers,
            heading("Inputs" + (" (shared with Compare)" if compare is not None else "")), self.inputs,
            heading("Target"), self.target, self.metric, self.max_builds, widgets.HBox([self.run_button]),
            self.jobs, heading("Results"), self.summary, self.kept_rows, self.outputs_table, self.chart,
            self.details, self.download, heading("Bug report"), self.reduce_button, self.reduce_jobs,
            self.reduce_note,
        ])
        self.add_class("wb-root")
        self.observe(self._on_kept, "kept")
        self._on_engine()
        self._clear(message_html("no repair yet: choose the engines and a target, then press Run", "info"))

    # --- engines ---------------------------------------------------------------------------------------------
    def _on_engine(self, _change: Any = None) -> None:
        problems = self.pair_problems(self.state.model)
        self._problems = problems
        hint = ""
        if self._cand_text():
            hint = message_html(f"the candidate is your file on {self.cand_engine.value} (its precision is read from "
                                "the file; the precision picker is ignored)"
                                + (", the file chosen in Compare" if self._links else ""), "info")
        elif self.cand_engine.value == "ort" and self.cand_variant.value == "fp16":
            hint = message_html("ONNX Runtime's CPU provider computes most FP16 ops in FP32: the repair fixes what "
                                "it shows (converter clamps, FP16 storage overflow); 'ref' + fp16 emulates FP16 "
                                "arithmetic", "info")
        self.engine_note.value = "".join(message_html(p, "error") for p in problems) + hint
        self._sync_run()

    def _sync_run(self) -> None:
        self.run_button.disabled = bool(self._problems) or self.jobs.running

    def link_compare(self, compare: Any) -> None:
        """Keep the engine pickers and the candidate file in step with ``compare``'s (both ways; ``compare``'s
        current choice first): Repair repairs the candidate Compare compares, the user's own file included."""
        for name in ("ref_engine", "ref_variant", "cand_engine", "cand_variant", "cand_file"):
            self._links.append(widgets.link((getattr(compare, name), "value"), (getattr(self, name), "value")))

    def link_graph(self, graph: Any) -> None:
        """Ring the kept nodes in ``graph`` (a GraphPanel on the same state) whenever the result changes."""
        self._links.append(widgets.dlink((self, "highlight"), (graph.canvas, "highlight_label"),
                                         transform=lambda _: self.ring_label()))
        self._links.append(widgets.dlink((self, "highlight"), (graph.canvas, "highlight")))

    # --- running ---------------------------------------------------------------------------------------------
    def _options(self) -> dict:
        """The model, engines and feed options a run uses (raises WorkbenchError on bad input)."""
        if self._problems:
            raise InputError(self._problems[0], "pick engines that run here")
        model = self.state.require_model()
        source, module_kwargs = self.state.model_for(self.reference, self.candidate)  # a torch engine: the module
        cand_model = self.candidate_file()
        return {"model": model, "source": source, "module_kwargs": module_kwargs, "reference": self.reference,
                "candidate": self.candidate, "cand_model": cand_model,
                "feed_options": self.inputs.feed_options(), "target": self.target.value.strip() or None,
                "metric": self.metric.value.strip() or None}

    def run(self):
        """Start repair() on a thread with the chosen options; returns the thread (None if one is running or the
        options are bad: the reason is shown)."""
        from ..repair.api import repair

        if self.jobs.running:
            return self.jobs.start("repair", lambda _p, _c: None)  # says: wait for it, or cancel it
        try:
            o = self._options()
            parent = self.state.out_dir()
        except Exception as e:  # noqa: BLE001 - bad options are shown, not raised
            self.jobs.status.value = error_html(e, "the repair")
            return None
        max_builds = int(self.max_builds.value)
        stem = (self.state.model.name.rsplit(".", 1)[0] or "model") + ".repaired.onnx"
        named = f"{Path(o['cand_model']).name} on {o['candidate']}" if o["cand_model"] else o["candidate"]
        what = f"{named} against {o['reference']} on {html.unescape(self.inputs.describe())}"
        run = self.state.begin_run("repair", what)
        self._clear(message_html(f"{run.tag}: repairing {what}...", "info"))

        def work(progress, cancel):
            folder = Path(tempfile.mkdtemp(prefix="repair-", dir=parent))
            try:
                result = repair(o["source"], o["reference"], o["candidate"], cand_model=o["cand_model"],
                                target=o["target"], metric=o["metric"], out=folder / stem, max_builds=max_builds,
                                progress=progress, cancel=cancel, **o["module_kwargs"], **o["feed_options"])
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            if cancel.is_set():  # finished as Cancel was pressed: the result is dropped, so is its file
                shutil.rmtree(folder, ignore_errors=True)
            return result, checker_errors(o["model"].proto)  # the original's own: not the repair's doing

        def done(value):
            result, original = value
            self.state.end_run(run, "done", result)
            self.show_result(result, original_errors=original)

        def failed(e):
            self.state.end_run(run, "cancelled" if self.jobs.cancelled else "failed", error=str(e))
            self._clear("")  # the reason is in the status line above; a Cancel is said by _on_job_state

        self.run_button.disabled = True
        thread = self.jobs.start("repair", work, done, failed)
        self._sync_run()
        return thread

    def _on_job_state(self, change: dict) -> None:
        """The repair job started (Cancel enabled) or ended (Cancel disabled): Run follows; a cancelled job
        leaves the results area cleared and says so."""
        self._sync_run()
        if change["new"] and self.jobs.cancelled and self.stale:
            run = self.state.current_run("repair")
            self._clear(message_html(f"{run.tag + ' (repair)' if run is not None else 'repair'} cancelled: the "
                                     "results area was cleared (no current result)", "warn"))

    def cancel(self) -> None:
        self.jobs.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout) and self.reduce_jobs.wait(timeout)

    # --- results ---------------------------------------------------------------------------------------------
    def _clear(self, summary_html: str) -> None:
        """No current result: everything in the results area goes, ``summary_html`` says why."""
        self.result, self.model_file, self.stale = None, None, True
        self.kept = []
        self.summary.value = summary_html
        self.kept_rows.children = ()
        self.outputs_table.value = self.details.value = self.download.value = ""
        clear(self.chart)

    def _on_model(self, _change: Any = None) -> None:
        self._clear(message_html("a new model is loaded: run the repair on it", "info"))
        self.reduce_note.value = ""

    def ring_label(self) -> str:
        """What the rings of :attr:`highlight` mean, for the graph's legend."""
        if not self.highlight:
            return ""
        kind = getattr(self.result, "kind", "float")
        if kind != "float":
            return "Q/DQ removed around"
        repairs = getattr(self.result, "repairs", None) or []
        from ..repair.rewrites import KEPT_KINDS

        rewritten = any(r.get("kind") not in KEPT_KINDS for r in repairs)
        return "repaired (rewritten or kept in reference precision)" if rewritten else "kept in reference precision"

    def _on_kept(self, change: dict) -> None:
        self.highlight = highlight_ids(change["new"])

    def show_result(self, result: Any, original_errors: list[str] | None = None) -> None:
        """Show a :class:`~workbench.repair.result.RepairResult` (what a finished run calls); ``original_errors``:
        what onnx's checker says of the original model (so its errors are not shown as the repair's)."""
        from ..plots.repair import repair_outputs_figure

        doc = result.to_json()
        run = self.state.run_of(result)
        self.summary.value = (f'<div class="wb-run">{html.escape(run.tag)}</div>' if run is not None else "") + \
            summary_html(doc)
        from ..repair.rewrites import KEPT_KINDS

        label = "kept in reference precision" if doc.get("kind") == "float" else "Q/DQ removed around"
        repairs = doc.get("repairs") or [{"node": n, "kind": ""} for n in doc.get("kept") or []]
        if any(r["kind"] not in (*KEPT_KINDS, "") for r in repairs):
            label += " or rewritten in the candidate precision"
        from ..repair.qdq_placement import MODEL_NODE

        buttons, whole = [], []
        for r in repairs:  # each with its kind: fp32-island, restore-constant, fold-bn, rescale, ...
            node = r["node"]
            if node == MODEL_NODE:  # a rewrite of the whole model (qdq-placement): no node to select
                whole.append(widgets.HTML(f'<div class="wb-h">{html.escape(r["kind"])}: '
                                          f'{html.escape(r.get("detail", ""))}</div>'))
                continue
            kind = f" · {r['kind']}" if r["kind"] else ""
            tip = f"select {node} in the graph" + (f" ({r['kind']}: {r['detail']})" if r.get("detail") else "")
            button = widgets.Button(description=node + kind, icon="crosshairs", tooltip=tip,
                                    button_style="warning", layout=widgets.Layout(width="auto", max_width="520px"))
            button.on_click(lambda _b, n=node: self.select(n))
            buttons.append(button)
        best = "" if doc.get("met") else " (the best set found)"
        title = (f"{len(buttons)} node(s) {label}{best}" + ("" if doc.get("minimal") or not buttons else
                                                             ", not proven 1-minimal")
                 + ": click one to select it in the graph (all are ringed there)")
        if buttons:
            rows = [widgets.HTML(f'<div class="wb-h">{html.escape(title)}</div>'), *buttons]
        elif whole:  # the whole model rewritten, no node removed from it
            rows = []
        else:
            rows = [widgets.HTML(message_html(f"nothing {label}: the candidate meets the target as it is"
                                              if doc.get("met") else f"nothing {label}", "info"))]
        self.kept_rows.children = whole + rows
        self.outputs_table.value = outputs_html(doc)
        try:
            show_figure(self.chart, repair_outputs_figure(doc))
        except Exception as e:  # noqa: BLE001 - a figure that cannot be drawn is a message, the rest stays
            log.warning("repair figure not drawn: %s", e)
            clear(self.chart)
        self.details.value = details_html(doc, original_errors)
        path = Path(result.model_path) if result.model_path else None
        self.model_file = path
        self.download.value = download_html(path, "Download the repaired model") if path else ""
        self.result = result
        self.stale = False
        self.kept = list(dict.fromkeys(r["node"] for r in repairs if r["node"] != MODEL_NODE))  # ringed

    def select(self, node: str) -> None:
        """Select ``node`` in every panel and bring the graph forward."""
        self.state.selected = node
        self.state.request_show("graph")

    # --- bug report ------------------------------------------------------------------------------------------
    def make_bug_report(self):
        """Run reduce() on a thread (the first kept node, else the top harmful culprit) into a fresh folder and
        offer it as a zip; returns the thread (None if one is running or the options are bad)."""
        from ..reduce import reduce

        if self.reduce_jobs.running:
            return self.reduce_jobs.start("bug report", lambda _p, _c: None)
        try:
            o = self._options()
            parent = self.state.out_dir()
        except Exception as e:  # noqa: BLE001 - bad options are shown, not raised
            self.reduce_jobs.status.value = error_html(e, "the bug report")
            return None
        node = self.kept[0] if self.kept else None
        options = dict(o["feed_options"])
        if o["target"] and not o["metric"]:
            options["criterion"] = o["target"]
        self.reduce_note.value = message_html(
            f"reducing {node or 'the top harmful culprit'} ({o['candidate']} against {o['reference']})...", "info")
        self.report_zip = None

        def work(progress, cancel):
            progress(0.05, "comparing, then cutting out the smallest pair that reproduces")
            folder = Path(tempfile.mkdtemp(prefix="reduce-", dir=parent))
            try:
                result = reduce(o["model"], o["reference"], o["candidate"], cand_model=o["cand_model"], node=node,
                                out=folder / "bug-report", **options)
                if cancel.is_set():
                    raise InputError("cancelled")
                progress(0.9, "zipping the folder")
                return result, zip_folder(result.out, folder / "bug-report.zip")
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise

        def done(value):
            result, archive = value
            self.report_zip = archive
            said = (f"reproduces alone ({result.criterion.describe()})" if result.reproduced else
                    f"NOT reproduced within {result.max_nodes} node(s) (see README.md)")
            self.reduce_note.value = (
                message_html(f"{result.node} ({result.op_type}): {len(result.nodes)} reference node(s), {said}",
                             "ok" if result.reproduced else "warn")
                + download_html(archive, "Download the bug report")
                + f'<div class="wb-culprit">folder: <code>{html.escape(str(result.out))}</code></div>')

        return self.reduce_jobs.start("bug report", work, done, lambda _e: setattr(self.reduce_note, "value", ""))


# --- formatting (no numerics: values come from the result document) -------------------------------------------

def highlight_ids(nodes: list[str]) -> list[str]:
    """The graph ids to ring for ``nodes``: each node and every name scope holding it (a collapsed view shows a
    scope box instead of the node)."""
    from ..plots.graph import scope_id, scope_of

    ids: dict[str, None] = {}
    for node in nodes:
        ids[node] = None
        scope = scope_of(node)
        for k in range(1, len(scope) + 1):
            ids[scope_id(scope[:k])] = None
    return list(ids)


def _metric_name(doc: dict) -> str | None:
    from ..plots.repair import output_metric

    return output_metric(doc)


def summary_html(doc: dict) -> str:
    """Met / not reached, the target, the cost."""
    target = (doc.get("target") or {}).get("text", "")
    head = f"<b>{html.escape(doc.get('candidate', ''))}</b> against <b>{html.escape(doc.get('reference', ''))}</b>"
    if doc.get("met"):
        line = message_html(f"target MET: {target}", "ok")
    else:
        line = message_html(f"target NOT reached: {target}; the best set found is reported (and written)", "error")
    detail = doc.get("builds_detail") or {}
    parts = ", ".join(f"{k} {v}" for k, v in detail.items())
    timing = (doc.get("timing") or {}).get("total_s")
    cost = (f"{len(doc.get('evaluations') or [])} evaluations, {doc.get('builds')} candidate builds"
            + (f" ({parts})" if parts else "") + (f", {timing:.1f} s" if isinstance(timing, (int, float)) else ""))
    return f'<div class="wb-culprit">repair of {head}</div>' + line + \
        f'<div class="wb-culprit">{html.escape(cost)}</div>'


def outputs_html(doc: dict) -> str:
    """Per output: the metric before (the candidate as converted) and after (the repaired model), and the
    task metric's worst-feed value for a metric target."""
    from ..plots.repair import repair_rows

    rows = repair_rows(doc)
    metric = _metric_name(doc) or "metric"
    table = table_html(
        ["output", f"{metric} before", f"{metric} after", "before", "after"],
        [(r["output"], r["before"], r["after"], "fails" if r["before_failed"] else "passes",
          "fails" if r["after_failed"] else "passes") for r in rows],
        classes=["bad" if r["after_failed"] else "" for r in rows], empty="no output metrics recorded")
    target = doc.get("target") or {}
    if target.get("kind") == "metric":
        before, after = (doc.get("before") or {}).get("value"), (doc.get("after") or {}).get("value")
        agg = "mean over the feeds" if target.get("aggregate") == "mean" else "worst feed"
        table += f'<div class="wb-culprit">{html.escape(str(target.get("metric")))} ({agg}): ' \
                 f'{html.escape(fmt(before))} -&gt; {html.escape(fmt(after))}</div>'
    return '<div class="wb-h">Outputs before and after</div>' + table


def checker_errors(proto: Any) -> list[str] | None:
    """onnx's checker errors on ``proto`` (None when it could not be checked)."""
    from ..model.validate import validate

    try:
        _, problems = validate(proto)
    except Exception as e:  # noqa: BLE001 - a hint only
        log.info("the original model was not checked: %s", e)
        return None
    return [p.message for p in problems if p.severity == "error"]


def _at_floor_outputs(doc: dict, v: dict, metric: str | None) -> list[str]:
    """The outputs of a verification that miss the target's threshold yet pass, because they are at their
    precision floor (the format cannot do better)."""
    from ..compare.criterion import Criterion

    text = (doc.get("target") or {}).get("criterion")
    if not text or not metric:
        return []
    try:
        crit = Criterion.parse(text)
    except Exception:  # noqa: BLE001 - an old or odd document
        return []
    out = []
    for name, m in (v.get("outputs") or {}).items():
        value = m.get(metric)
        if isinstance(value, (int, float)) and not m.get("diverged") and crit.fails({metric: value}):
            out.append(f"{name} {metric} {fmt(value)}")
    return out


def details_html(doc: dict, original_errors: list[str] | None = None) -> str:
    """The share of weight bytes still in the candidate precision, the verification lines (an output met only at
    its precision floor said so), onnx's checker (errors the original model already had said so) and the
    notes."""
    lines = []
    weights = doc.get("weights") or {}
    family = str(weights.get("family") or "candidate").upper()
    before, after = (weights.get("before") or {}), (weights.get("after") or {})
    if after.get("share") is not None:
        was = f"{100 * before['share']:.2f}% before, " if before.get("share") is not None else ""
        lines.append(f"{family} share of the weight bytes: {was}<b>{100 * after['share']:.2f}%</b> after "
                     f"({fmt(after.get('candidate_bytes'))} of {fmt(after.get('total_bytes'))} bytes)")
    metric = _metric_name(doc)
    for role, v in (doc.get("verification") or {}).items():
        if v.get("skipped"):
            lines.append(f"verified on {html.escape(role)}: skipped ({html.escape(str(v['skipped']))})")
            continue
        if v.get("error"):
            lines.append(f"verified on {html.escape(role)} ({html.escape(str(v.get('engine')))}): "
                         f"<b class='wb-bad'>could not run</b> ({html.escape(str(v['error']))})")
            continue
        state = "met" if v.get("met") else "<b class='wb-bad'>NOT met</b>"
        floor = _at_floor_outputs(doc, v, metric) if v.get("met") else []
        if floor:
            target = (doc.get("target") or {}).get("criterion")
            state = (f"met at the precision floor: {html.escape(', '.join(floor))} misses the target "
                     f"{html.escape(str(target))}, but only by what the candidate's format cannot hold (the "
                     "reference itself held in that format does no better)")
        outs = ", ".join(f"{o} {metric} {fmt(m.get(metric))}" for o, m in (v.get("outputs") or {}).items()
                         if metric)
        lines.append(f"verified on {html.escape(role)} ({html.escape(str(v.get('engine')))}): {state}"
                     + (f" ({html.escape(outs)})" if outs else ""))
    checker = doc.get("checker") or {}
    if checker:
        errors = list(checker.get("errors") or [])
        had = [e for e in errors if original_errors is not None and e in original_errors]
        new = [e for e in errors if e not in had]
        if checker.get("ok") or not errors:
            lines.append("onnx checker: ok (the repaired model)")
        if had:
            lines.append("onnx checker: the original model already fails it the same way (not caused by the "
                         "repair): " + html.escape("; ".join(had)))
        if new:
            lines.append("onnx checker on the repaired model: <b class='wb-bad'>" + html.escape("; ".join(new))
                         + "</b>" + ("" if original_errors is not None else
                                     " (the original model was not checked)"))
    out = '<div class="wb-culprit">' + "<br>".join(lines) + "</div>"
    return out + "".join(message_html(n, "info") for n in doc.get("notes") or [])


def zip_folder(folder: Path, dest: Path) -> Path:
    """Zip ``folder``'s files (under the folder's name) into ``dest``, atomically: written under a temporary
    name beside it, then renamed."""
    folder, dest = Path(folder), Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for p in sorted(folder.rglob("*")):
                if p.is_file():
                    zf.write(p, (Path(folder.name) / p.relative_to(folder)).as_posix())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
