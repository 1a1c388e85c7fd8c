"""Compare panel: pick two engines/precisions, inputs, tolerance and strategy; run compare() on a thread with a
progress bar and Cancel; show the verdict (output-led: ok, or DIVERGED with the reason), the precision each side
was inferred to compute in, internal dips, where the runs part ways (first divergent tensor) and why (culprits,
harmful first, with what fixing each gains on the outputs). Warns when a node ran on another execution provider
than the one asked for, on evidence only (the Engine tab's engine graph, the engines' recorded descriptions: see
:mod:`workbench.ui.fallbacks`). Exports the result (JSON, the HTML report, a rerunnable bundle) with download
links, to a temporary folder unless a path is typed; keeps a run history and diffs any two runs
(:func:`workbench.report.diff.diff_results`)."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from ..compare.text import fmt as fmt_metric
from ..core.metric_info import HIGHER_IS_BETTER, JUDGED, METRIC_INFO
from .downloads import download_html
from .downloads import server as download_server
from .engine_pair import EnginePair, PairedPanel
from .fallbacks import fallback_notes
from .inputs_box import InputsBox
from .jobs import JobControls
from .messages import error_html, error_text, fallback_repr, message_html, options_refused
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import table_html

log = logging.getLogger(__name__)

#: a sensible tolerance to start from when the user picks a metric
DEFAULT_THRESHOLDS = {m: info.tolerance for m, info in METRIC_INFO.items()
                      if info.judged and info.tolerance is not None}
AUTO_METRIC = "default for the candidate precision"


class ComparePanel(PairedPanel, widgets.VBox):
    """``ComparePanel(model)``; ``run()`` starts a comparison (also what the Run button does), ``wait()`` joins it."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, reference: str = "ort",
                 candidate: str = "ort:fp16", **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.pair = EnginePair(reference, candidate)
        self.engines = self.pair.engines
        self.ref_engine, self.ref_variant = self.pair.ref_engine, self.pair.ref_variant
        self.cand_engine, self.cand_variant = self.pair.cand_engine, self.pair.cand_variant
        self.engine_note = widgets.HTML()
        # the user's own candidate file (their FP16/QDQ export): typed, or uploaded (kept in a temporary folder)
        self._make_cand_file()
        self.cand_upload = widgets.FileUpload(accept=".onnx", multiple=False, description="upload .onnx")
        self.cand_upload.observe(self._on_upload, "value")
        self.cand_file.observe(lambda _: self._on_engine(), "value")
        self.precision = widgets.HTML()
        self._model_precision: tuple[str, Any] | None = None  # (fingerprint, Precision) of the loaded model
        self._file_info: tuple[tuple, dict] | None = None  # ((path, size, mtime), what the candidate file is)
        self.inputs = InputsBox(state=self.state)
        self.metric = widgets.Dropdown(options=[AUTO_METRIC, *JUDGED],
                                       value=AUTO_METRIC, description="metric", layout=widgets.Layout(width="360px"))
        self.threshold = widgets.FloatText(value=30.0, description="tolerance", disabled=True,
                                           layout=widgets.Layout(width="200px"))
        self.tolerance_note = widgets.HTML()
        self.mode = widgets.ToggleButtons(options=["auto", "all", "bisect"], value="auto", description="strategy",
                                          tooltips=["all where marking tensors is cheap, bisect on TensorRT",
                                                    "mark every tensor (chunked under a memory budget)",
                                                    "binary search, one extra marked tensor per build"])
        self.run_button = widgets.Button(description="Run", icon="play", button_style="primary")
        self.run_button.on_click(lambda _: self.run())
        self.jobs = JobControls(locks=[self.run_button])
        self.summary = widgets.HTML()
        self.provider_note = widgets.HTML()
        self.stale_note = widgets.HTML()
        self.culprit_rows = widgets.VBox()
        self.tensors = widgets.HTML()
        self.save_path = widgets.Text(placeholder="result.json (relative paths go under the output folder)",
                                      layout=widgets.Layout(width="420px"))
        self.save_button = widgets.Button(description="Save result JSON", icon="save", disabled=True)
        self.save_button.on_click(lambda _: self.save())
        self.save_note = widgets.HTML()
        # exports: the HTML report and a rerunnable bundle (zip), each with a download link
        self.export_dir = widgets.Text(placeholder="folder for the report and bundle (default: a temporary folder)",
                                       layout=widgets.Layout(width="420px"))
        self.report_button = widgets.Button(description="HTML report", icon="file-code-o", disabled=True,
                                            tooltip="write the self-contained HTML report and offer it as a download")
        self.bundle_button = widgets.Button(description="Bundle", icon="archive", disabled=True,
                                            tooltip="write a rerunnable bundle (.zip: model, feeds, result)")
        self.report_button.on_click(lambda _: self.export_report())
        self.bundle_button.on_click(lambda _: self.export_bundle())
        self.export_note = widgets.HTML()
        self._offers: list[tuple[str, str]] = []
        # run history: every finished comparison; pick two to see what changed
        self.history_a = widgets.Dropdown(options=[], description="run A", layout=widgets.Layout(width="560px"))
        self.history_b = widgets.Dropdown(options=[], description="run B", layout=widgets.Layout(width="560px"))
        self.diff_button = widgets.Button(description="Compare runs", icon="exchange", disabled=True,
                                          tooltip="what changed from run A to run B")
        self.diff_button.on_click(lambda _: self.diff_runs())
        self.history_note = widgets.HTML()
        self.diff_out = widgets.HTML()
        self.pair.observe(self._on_engine)
        self.metric.observe(self._on_metric, "value")
        self.state.observe(lambda ch: self.show_result(ch["new"]), "result")
        self.state.observe(lambda _: self._on_engine(), "model")
        self.state.observe(lambda _: self.show_fallbacks(), "engine_graph")
        self.state.observe(lambda _: self.show_history(), "history")
        pickers = widgets.VBox([
            widgets.HBox([self.ref_engine, self.ref_variant]), widgets.HBox([self.cand_engine, self.cand_variant]),
            widgets.HBox([self.cand_file, self.cand_upload]), self.engine_note, self.precision])
        super().__init__([
            style_tag(), download_server(), heading("Engines and precisions"), pickers, heading("Inputs"), self.inputs,
            heading("Divergence criterion"), widgets.HBox([self.metric, self.threshold]), self.tolerance_note,
            self.mode, widgets.HBox([self.run_button]), self.jobs, heading("Results"), self.stale_note, self.summary,
            self.provider_note, self.culprit_rows, self.tensors, heading("Export"),
            widgets.HBox([self.save_path, self.save_button]), self.save_note,
            widgets.HBox([self.export_dir, self.report_button, self.bundle_button]), self.export_note,
            heading("Run history"), self.history_note, self.history_a, self.history_b,
            widgets.HBox([self.diff_button]), self.diff_out,
        ])
        self.add_class("wb-root")
        self._on_engine()
        self._on_metric()
        if self.state.result is not None:
            self.show_result(self.state.result)
        self.show_history()

    def _on_upload(self, change: dict) -> None:
        """An uploaded .onnx goes to a private temporary folder (never the working directory; removed with the panel
        or when Python exits) and fills the path.
        The browser's file name is only a label: cut to a safe base name (no folder part, no ``..``, no NUL or
        control characters, at most :data:`MAX_UPLOAD_NAME` characters), so no name can write elsewhere or fail."""
        import shutil
        import tempfile
        import weakref
        from pathlib import Path

        files = change["new"] or ()
        if not files:
            return
        item = files[0]
        name = _upload_name(item.get("name"))
        folder = Path(tempfile.mkdtemp(prefix="workbench-upload-"))
        # kept while the panel lives (a comparison may still read it), removed with the panel or at exit
        weakref.finalize(self, shutil.rmtree, str(folder), True)
        try:
            (folder / name).write_bytes(bytes(item["content"]))
        except (OSError, TypeError, ValueError) as e:  # a full disk, content that is not bytes: one line, no trace
            shutil.rmtree(folder, ignore_errors=True)
            self.precision.value = message_html(f"the uploaded file {name} could not be kept: "
                                                f"{_one_line(type(e).__name__ + ': ' + str(e))}", "error")
            return
        self.cand_file.value = str(folder / name)

    def candidate_file_info(self) -> dict | None:
        """What the candidate file typed or uploaded is, read from the file itself (cached while its path, size and
        modification time stay the same): None without one; else ``{"path", "name"}`` and either ``"sha256"``
        (its content fingerprint, as the comparison records it) and ``"precision"`` (inferred by the core from
        its weights/types, as the comparison does), or ``"error"`` (one line: why it cannot be read)."""
        from pathlib import Path

        from ..model.load import load_model
        from ..model.precision import Precision, infer_precision

        text = self.cand_file.value.strip()
        if not text:
            return None
        path = Path(text).expanduser()
        try:
            st = path.stat()
            key: tuple = (str(path.absolute()), st.st_size, st.st_mtime_ns)
        except (OSError, ValueError):  # ValueError: a NUL in the typed path
            key = (str(path.absolute()), None, None)
        if self._file_info is not None and self._file_info[0] == key:
            return self._file_info[1]
        info: dict = {"path": str(path), "name": _one_line(path.name, MAX_NAME_SHOWN)}
        try:
            loaded = load_model(path)
            inferred = infer_precision(loaded.proto)
            info["sha256"] = loaded.fingerprint
            info["precision"] = Precision(inferred.precision, f"read from your file {info['name']}: {inferred.source}")
        except (OSError, ValueError) as e:  # the path itself: too long, a NUL in it, a permission (not our bug)
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            info["error"] = _one_line(f"cannot open {_one_line(str(path), MAX_NAME_SHOWN)}: {why} -- type the path "
                                      "of your converted .onnx, or upload it")
        except Exception as e:  # noqa: BLE001 - shown as one line; the run says it again
            info["error"] = _one_line(error_text(e) if str(e) else type(e).__name__)
        self._file_info = (key, info)
        return info

    def _on_engine(self, _change: Any = None) -> None:
        info = self.candidate_file_info()
        problems = self.pair.problems(self.state.model, candidate_variant=info is None)
        hints = []
        # hints about the candidate pickers only while they decide what runs (a file overrides them)
        if info is None and self.cand_engine.value == "ort" and self.cand_variant.value == "fp16":
            hints.append("ONNX Runtime's CPU provider computes most FP16 ops in FP32: converter clamps show, FP16 "
                         "arithmetic overflow does not; 'ref' + fp16 emulates FP16 arithmetic on the CPU.")
        if info is not None:
            hints.append(f"the candidate runs your file on {self.cand_engine.value} (its precision is read from the "
                         f"file; the precision picker is ignored): tensors are matched by name")
        if "int8" in (self.ref_variant.value, self.cand_variant.value if info is None else None):
            hints.append("INT8 is a Q/DQ model calibrated on the comparison's own inputs unless you calibrate in the "
                         "Calibration panel and compare its QDQ export.")
        self.engine_note.value = "".join(message_html(p, "error") for p in problems) + \
            "".join(message_html(h, "info") for h in hints)
        self.run_button.disabled = bool(problems)
        self.precision.value = _precision_html(self.expected_precision(), "expected")
        if info is not None and "error" in info:
            self.precision.value += message_html(f"candidate file {info['name']} cannot be read: {info['error']}",
                                                 "warn")
        if self.metric.value == AUTO_METRIC:
            self._on_metric()
        self._mark_stale()
        self.show_fallbacks()

    def show_fallbacks(self) -> None:
        """Warn when a node of the current result's engines (or, before a run, of the engines picked) ran on
        another execution provider than the one asked for, on evidence only (:func:`fallback_notes`)."""
        result, model = self.state.result, self.state.model
        sides = {"reference": result.reference, "candidate": result.candidate} if result is not None else \
            {"reference": self.reference, "candidate": self.candidate}
        try:
            notes = fallback_notes(sides, engine_graph=self.state.engine_graph,
                                   engines=result.engines if result is not None else None,
                                   fingerprint=model.fingerprint if model is not None else None)
        except Exception as e:  # noqa: BLE001 - a hint must never break the results
            log.info("provider fallbacks not checked: %s", e)
            notes = []
        self.provider_note.value = "".join(message_html(text, level) for level, text in notes)

    def _chosen_file(self) -> tuple | None:
        """The candidate file the panel now names, as a result records it: (name, sha256), or (path, the reason it
        cannot be read); None without one."""
        info = self.candidate_file_info()
        if info is None:
            return None
        return (info["name"], info["sha256"]) if "sha256" in info else (info["path"], info["error"])

    def _mark_stale(self) -> None:
        """Say so when the result shown is of another engine pair, or another candidate file (by name and content:
        an upload is a new copy each time), than the pickers now show."""
        result = self.state.result
        if result is None:
            self.stale_note.value = ""
            return
        ran = _result_file(result)
        chosen = self._chosen_file()
        if (result.reference, result.candidate, ran) != (self.reference, self.candidate, chosen):
            now = f"{chosen[0]} on {self.candidate}" if chosen is not None else self.candidate
            what = "the engines and candidate file above" if (ran or chosen) else "the engines above"
            self.stale_note.value = message_html(
                f"the results below compare {_candidate_label(result)} against {result.reference}; {what} now "
                f"say {now} against {self.reference}: press Run to compare those", "warn")
        else:
            self.stale_note.value = ""

    def expected_precision(self) -> dict:
        """``{"reference"|"candidate": Precision}``: what each side will compute in, as the comparison infers it
        from the model it runs: the loaded file's own precision (read from it) for "fp32" (the model as loaded),
        the variant's for "fp16"/"int8". Empty for a side with no model loaded yet."""
        from ..model.precision import Precision

        out = {}
        info = self.candidate_file_info()
        for side, variant in (("reference", self.ref_variant.value), ("candidate", self.cand_variant.value)):
            if side == "candidate" and info is not None:  # the user's file runs: its own precision, if readable
                if "precision" in info:
                    out[side] = info["precision"]
            elif variant != "fp32":
                out[side] = Precision(variant, f"the {variant} variant the workbench makes of the model")
            else:
                loaded = self._loaded_precision()
                if loaded is not None:
                    out[side] = loaded
        return out

    def _loaded_precision(self):
        from ..model.precision import infer_precision

        model = self.state.model
        if model is None:
            return None
        if self._model_precision is None or self._model_precision[0] != model.fingerprint:
            try:
                self._model_precision = (model.fingerprint, infer_precision(model.proto))
            except Exception as e:  # noqa: BLE001 - a hint only: the comparison infers it again
                log.info("precision of the loaded model not inferred: %s", e)
                return None
        return self._model_precision[1]

    def auto_criterion(self):
        """The criterion "auto" stands for: the default of the lossier side's expected precision family (what
        compare() picks from the precisions it infers)."""
        from ..compare.criterion import Criterion
        from ..model.precision import lossier

        prec = self.expected_precision()
        if len(prec) == 2:
            return Criterion.default_for(lossier(prec["reference"], prec["candidate"]).family)
        if "candidate" in prec:
            return Criterion.default_for(prec["candidate"].family)
        if self.cand_file.value.strip():  # an unreadable file: no guess from the ignored precision picker
            return Criterion.default_for(prec["reference"].family if "reference" in prec else "fp32")
        return Criterion.default_for(self.cand_variant.value)

    def _on_metric(self, _change: Any = None) -> None:
        if self.metric.value == AUTO_METRIC:
            crit = self.auto_criterion()
            cand = self.expected_precision().get("candidate")
            self.threshold.disabled = True
            self.threshold.value = crit.threshold
            why = f" (the candidate computes in {cand.precision}: {cand.source})" if cand is not None else ""
            if cand is None and self.cand_file.value.strip():
                why = " (the candidate file cannot be read: its precision is not known yet)"
            self.tolerance_note.value = message_html(f"diverged when {crit.describe()}{why}; each run infers the "
                                                     "precision from the model it runs", "info")
        else:
            self.threshold.disabled = False
            self.threshold.value = DEFAULT_THRESHOLDS.get(self.metric.value, self.threshold.value)
            op = "<" if self.metric.value in HIGHER_IS_BETTER else ">"
            self.tolerance_note.value = message_html(f"diverged when {self.metric.value} {op} tolerance, or when "
                                                     "non-finite values disagree", "info")

    def criterion(self):
        from ..compare.criterion import Criterion

        if self.metric.value == AUTO_METRIC:
            return None
        return Criterion(self.metric.value, float(self.threshold.value))

    # --- running ---------------------------------------------------------------------------------------------
    def run(self):
        """Start compare() on a thread with the chosen options; returns the thread (None if one is running or the
        options are bad: the reason is shown).

        A run replaces the current result: the results area (here, and the result the other panels show) is
        cleared when it starts, and stays cleared with the reason after a Cancel or a failure, so no panel shows
        culprits of an earlier run (maybe of another engine pair) as if they were this one's."""
        from pathlib import Path

        from ..compare.api import compare

        if self.jobs.running:
            return self.jobs.start("comparison", lambda _p, _c: None)  # says: wait for it, or cancel it
        try:
            model = self.state.require_model()
            options = self.inputs.feed_options()
            criterion = self.criterion()
            cand_file = self.candidate_file()
        except Exception as e:  # noqa: BLE001 - bad options are shown, not raised
            options_refused(self.jobs.status, self.summary, e, "the comparison")
            return None
        reference, candidate, mode = self.reference, self.candidate, self.mode.value
        named = f"{Path(cand_file).name} on {candidate}" if cand_file else candidate  # the user's file by its name
        what = f"{named} against {reference} on {html.unescape(self.inputs.describe())}"
        run = self.state.begin_run("comparison", what)  # every panel drops the previous result (observers)
        self.show_result(None)
        self.summary.value = message_html(f"{run.tag}: comparing {what}...", "info")

        model, module_kwargs = self.state.model_for(reference, candidate)  # a torch engine runs the module

        def work(progress, cancel):
            return compare(model, reference, candidate, mode=mode, criterion=criterion, progress=progress,
                           cancel=cancel, cand_model=cand_file, **module_kwargs, **options)

        def done(result):
            self.state.selected = ""
            self.state.end_run(run, "done", result)

        def failed(e):
            cancelled = self.jobs.cancelled
            self.state.end_run(run, "cancelled" if cancelled else "failed", error=error_text(e))
            self.show_result(None)
            said = "cancelled" if cancelled else "failed (the reason is above)"
            self.summary.value = message_html(f"{run.tag}, the comparison of {what}, {said}: no current result",
                                              "warn")

        return self.jobs.start("comparison", work, done, failed)

    def cancel(self) -> None:
        self.jobs.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)

    # --- results ---------------------------------------------------------------------------------------------
    def show_result(self, result: Any) -> None:
        """Verdict, precisions, outputs, internal dips, culprits (each a button that selects it everywhere) and
        the per-tensor table."""
        self.save_note.value = ""
        self.export_note.value = ""
        self._offers = []  # (what, its note and link) of the current result's exports
        self._mark_stale()
        self.show_fallbacks()
        if result is None:
            self.summary.value, self.tensors.value = "", ""
            self.culprit_rows.children = ()
            self.save_button.disabled = self.report_button.disabled = self.bundle_button.disabled = True
            return
        self.save_button.disabled = self.report_button.disabled = self.bundle_button.disabled = False
        if self.metric.value == AUTO_METRIC:  # what "auto" became for this run's inferred precisions
            self.threshold.value = result.criterion.threshold
            self.tolerance_note.value = message_html(f"this run: diverged when {result.criterion.describe()} "
                                                     "(the default for the inferred precisions)", "info")
        run = self.state.run_of(result)
        self.summary.value = (f'<div class="wb-run">{html.escape(run.tag)}</div>' if run is not None else "") + \
            _user_file_html(result) + verdict_html(result)
        m = result.criterion.metric
        rows = []
        for k, c in enumerate(result.culprits, 1):
            harmful = c.introduces_divergence and not c.harmless
            button = widgets.Button(description=f"#{k} {c.node}", tooltip=f"show {c.node} in Errors and Graph",
                                    icon="search", button_style="danger" if harmful else "",
                                    layout=widgets.Layout(width="auto", max_width="520px"))
            button.on_click(lambda _b, node=c.node: self.show_culprit(node))
            rows.append(widgets.VBox([button, widgets.HTML(f'<div class="wb-culprit">{culprit_html(c, m)}</div>')]))
        title = ("Culprits: nodes ranked by the error they introduce beyond their precision floor (run alone on the "
                 "candidate with reference inputs); harmful first, harmless last")
        self.culprit_rows.children = [widgets.HTML(f'<div class="wb-h">{html.escape(title)}</div>')] + rows \
            if rows else [widgets.HTML(message_html("no culprit ranking (isolation did not run)", "warn"))]
        first = result.first_divergent
        outputs = set(result.outputs)
        shown = sorted(result.tensors, key=lambda t: (not t.diverged, not t.at_floor, t.topo_index))[:200]
        self.tensors.value = ("<details><summary>Every compared tensor (diverged first, then at their floor)"
                              "</summary>" + table_html(
                                  ["#", "tensor", "node", "op", m, "floor", "nonfinite", "state"],
                                  [(t.topo_index, t.tensor, t.node, t.op_type, fmt_metric(t.metrics.get(m), m),
                                    _floor_text(t.floor, m), t.metrics.get("nonfinite_mismatch"),
                                    _state_text(result, t) + (" · output" if t.tensor in outputs else ""))
                                   for t in shown],
                                  classes=["first" if first is not None and t.tensor == first.tensor else
                                           "bad" if t.diverged else "" for t in shown]) + "</details>")

    def take_options(self, result: Any) -> list[str]:
        """Set the engine pickers and the inputs to those ``result`` ran (a reopened run), so that Run compares the
        same again; the lines saying what could not be set (a candidate file, inputs that were not random)."""
        said = self.pair.set(result.reference, result.candidate)
        ran = _result_file(result)
        if ran is not None:
            said.append(f"the run compared your file {ran[0]}: give it again under 'cand. file' to run it again")
        elif self.cand_file.value:
            self.cand_file.value = ""
        if not self.inputs.take_feeds(result.feeds):
            said.append("its inputs were given, not random: choose them again under Inputs to run it again")
        self._mark_stale()
        return said

    def show_culprit(self, node: str) -> None:
        """Select ``node`` in every panel and bring the Errors panel forward."""
        self.state.selected = node
        self.state.request_show("errors")

    def save(self):
        """Write the current result's JSON (to the typed path, else the output folder) and offer it as a download
        link; returns the path written (None if nothing was)."""
        result = self.state.result
        if result is None:
            return None
        try:
            path = self.state.resolve_output(self.save_path.value, "result.json", what="the result JSON path")
            written = result.save_json(path)
            link = download_html(written, "Download the result JSON", show_path=False)
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.save_note.value = error_html(e, "saving the result")
            return None
        self.save_note.value = message_html(f"saved {written}", "ok") + link
        return written

    # --- exports ---------------------------------------------------------------------------------------------
    def _export_folder(self):
        """The typed folder (relative: under the output folder), else the output folder (a temporary one)."""
        return self.state.resolve_output(self.export_dir.value, ".").resolve()

    def export_report(self):
        """Write the HTML report of the current result (on a worker thread) and offer it as a download link;
        returns the job's thread (None if nothing started)."""
        from ..report.html import write_report
        from .thresholds_box import bands_in_use

        inspection, bands = self.state.inspection, bands_in_use(self.state)
        return self._export("the HTML report", "HTML report", lambda result, folder: write_report(
            result, folder / f"report-{_stamp(result)}.html", inspection, bands=bands))

    def export_bundle(self):
        """Write a rerunnable bundle (.zip) of the current result (on a worker thread) and offer it as a download
        link; returns the job's thread (None if nothing started)."""
        from ..report.bundle import save_bundle

        model = self.state.model

        def write(result, folder):
            opts = result.run_options or {}
            source = None if opts.get("model") is not None or result.model.get("path") else \
                getattr(model, "path", None)
            return save_bundle(result, source, dest=folder / f"bundle-{_stamp(result)}", zip=True, overwrite=True)

        return self._export("the bundle", "bundle", write)

    def _export(self, what: str, job: str, write):
        """Run ``write(result, folder)`` on a worker thread for the current result, then offer its file."""
        result = self.state.result
        if result is None:
            return None
        try:
            folder = self._export_folder()
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.export_note.value = error_html(e, what)
            return None
        self.export_note.value = "".join(o[1] for o in self._offers) + message_html(f"writing {what}...", "info")

        def work(progress, _cancel):
            progress(0.2, f"writing {what}")
            return write(result, folder)

        return self.jobs.start(job, work, lambda path: self._offer(path, what), lambda e: self._export_failed(e, what))

    def _offer(self, path, what: str) -> None:
        """Offer ``path`` for download next to the other exports of the current result (each kept: the report's
        link stays when the bundle is written)."""
        try:
            link = download_html(path, f"Download {what}", show_path=False)
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self._export_failed(e, what)
            return
        self._offers = [o for o in self._offers if o[0] != what] + [(what, message_html(f"wrote {what}: {path}",
                                                                                         "ok") + link)]
        self.export_note.value = "".join(o[1] for o in self._offers)

    def _export_failed(self, e: BaseException, what: str) -> None:
        self.export_note.value = "".join(o[1] for o in self._offers) + error_html(e, f"writing {what}")

    # --- run history -----------------------------------------------------------------------------------------
    def show_history(self) -> None:
        """The run pickers list every finished comparison (newest last); A and B default to the last two."""
        runs = list(self.state.history)
        options = [(self._history_label(r), k) for k, r in enumerate(runs)]
        self.history_a.options = options
        self.history_b.options = options
        if options:
            self.history_a.value = max(0, len(runs) - 2)
            self.history_b.value = len(runs) - 1
        self.diff_button.disabled = len(runs) < 2
        self.history_note.value = message_html(
            f"{len(runs)} finished comparison(s) this session" + ("; run another to compare two" if len(runs) < 2
                                                                   else "; pick two to see what changed"), "info")

    def _history_label(self, result: Any) -> str:
        """``#N: CANDIDATE on ENGINE vs REFERENCE, SHAPES, TIME: VERDICT`` (N: the run's id)."""
        import time

        from .runs import comparison_text

        run = self.state.run_of(result)
        head = f"#{run.id}: " if run is not None else ""
        when = time.strftime(", %H:%M:%S", time.localtime(run.started)) if run is not None else ""
        return f"{head}{comparison_text(result)}{when}: {'DIVERGED' if result.diverged else 'ok'}"

    def _tag(self, result: Any, fallback: int) -> str:
        run = self.state.run_of(result)
        return run.tag if run is not None else f"run #{fallback + 1}"

    def diff_runs(self):
        """What changed from run A to run B (:func:`workbench.report.diff.diff_results`), shown in the panel;
        returns the diff (None if it could not be made)."""
        from ..report.diff import diff_results

        runs = list(self.state.history)
        if len(runs) < 2:
            self.diff_out.value = message_html("run at least two comparisons first", "warn")
            return None
        # a picker between two option lists (the history just changed) reads None: the last two runs then
        a, b = self.history_a.value, self.history_b.value
        a = a if a is not None and a < len(runs) else len(runs) - 2
        b = b if b is not None and b < len(runs) else len(runs) - 1
        tag_a, tag_b = self._tag(runs[a], a), self._tag(runs[b], b)
        try:
            diff = diff_results(runs[a], runs[b], labels=(tag_a, tag_b))
            text = diff.render()
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.diff_out.value = error_html(e, "comparing the two runs")
            return None
        said = "the same conclusion" if diff.same_conclusion else "a different conclusion"
        self.diff_out.value = (message_html(f"{tag_a} against {tag_b}: {said}", "info")
                               + "".join(message_html(n, "warn") for n in setup_changes(runs[a], runs[b]))
                               + '<pre class="wb-diff" style="white-space: pre-wrap; overflow-x: auto; '
                               f'color: var(--jp-content-font-color1)">{html.escape(text)}</pre>')
        return diff


def setup_changes(a: Any, b: Any) -> list[str]:
    """What differs in how two comparisons were set up (engines, candidate file, inputs): the likely cause of
    the differences a diff shows."""
    from .runs import candidate_text, inputs_text

    out = []
    for what, get in (("reference", lambda r: str(r.reference)), ("candidate", candidate_text),
                      ("inputs", inputs_text)):
        before, after = get(a), get(b)
        if before != after:
            out.append(f"the {what} changed: {before} -> {after}")
    return out


def _stamp(result: Any) -> str:
    """A file-name stamp for an export of ``result``: its candidate and a time."""
    import re
    import time

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(result.candidate)) + time.strftime("-%H%M%S")


def _result_file(result: Any) -> tuple | None:
    """The user's candidate file a result ran, as (name, sha256); None when it ran the precision picker's."""
    variant = result.variant or {}
    if variant.get("variant") != "user model":
        return None
    return (variant.get("file"), variant.get("sha256"))


def _candidate_label(result: Any) -> str:
    """The candidate as the user knows it: their own file by name on its engine ("my_fp16.onnx on ort") when the
    result ran one (else "ort against ort" would read as the model against itself), else the spec ("ort:fp16")."""
    ran = _result_file(result)
    return f"{ran[0]} on {result.candidate}" if ran and ran[0] else str(result.candidate)


#: the longest file name kept from an upload, and shown for the candidate file; the longest error line shown
MAX_UPLOAD_NAME = 120
MAX_NAME_SHOWN = 120
MAX_ERROR_SHOWN = 600


def _one_line(text: str, limit: int = MAX_ERROR_SHOWN) -> str:
    """``text`` on one line (control characters escaped, so a newline in a path cannot cut the message short or
    hide what it is about), at most ``limit`` characters."""
    from ..textfmt import printable

    text = printable(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _upload_name(raw: Any) -> str:
    """A safe file name for an upload: the base name of what the browser sent, control characters and NUL
    replaced, ``.``/``..``/empty refused, cut to :data:`MAX_UPLOAD_NAME` characters keeping the ``.onnx`` suffix."""
    import re
    from pathlib import PurePosixPath, PureWindowsPath

    name = PureWindowsPath(PurePosixPath(str(raw or "")).name).name  # "..\\x.onnx" from Windows too
    name = re.sub(r"[\x00-\x1f\x7f/\\]", "_", name).strip()
    if name in ("", ".", "..") or set(name) <= {"."}:
        name = "candidate.onnx"
    stem, dot, ext = name.rpartition(".")
    ext = f".{ext}" if dot and len(ext) <= 10 else ""
    stem = (stem if dot and ext else name).encode("utf-8", "replace").decode("utf-8")  # lone surrogates: '?'
    stem = stem[:MAX_UPLOAD_NAME - len(ext)]
    while len((stem + ext).encode("utf-8")) > 200:  # file systems count bytes (255): 120 emoji are 480
        stem = stem[:-1]
    return stem + ext


def _precision_html(precision: dict, what: str) -> str:
    """Each side's precision, with what it was read from as a tooltip and in small text."""
    parts = []
    for side in ("reference", "candidate"):
        p = precision.get(side)
        if p is None:
            continue
        name = p.precision if hasattr(p, "precision") else p.get("precision", "?")
        source = p.source if hasattr(p, "source") else p.get("precision_source", "")
        parts.append(f'{side} <b title="{html.escape(source, quote=True)}">{html.escape(str(name))}</b> '
                     f'<span class="wb-muted wb-small">({html.escape(source)})</span>')
    if not parts:
        return ""
    return f'<div class="wb-culprit">{html.escape(what)} precision: ' + "; ".join(parts) + "</div>"


def _floor_text(floor: dict | None, metric: str) -> str:
    if not floor:
        return "-"
    return f"{str(floor.get('format', '')).upper()} {fmt_metric(floor.get(metric), metric)}"


def _state_text(result: Any, t: Any) -> str:
    if t.diverged:
        return "DIVERGED" if result.diverged else "internal dip"
    if t.at_floor:
        return "at its floor"
    return "ok"


def verdict_html(result: Any) -> str:
    """The verdict line (ok / DIVERGED with the reason), both sides' inferred precisions, every graph output
    against its floor, internal dips, the first divergent tensor and the notes (see workbench.compare.text)."""
    crit = result.criterion
    m = crit.metric
    verdict = result.verdict()
    lines = [f"<b>{html.escape(_candidate_label(result))}</b> against <b>{html.escape(result.reference)}</b>, "
             f"{len(result.tensors)} tensors compared ({html.escape(result.mode)}), criterion: "
             f"{html.escape(crit.describe())}, {result.timing.get('total_s', 0):.2f} s",
             _precision_html(result.precision or {}, "inferred")]
    if result.diverged:
        lines.append(message_html(f"DIVERGED: {verdict['reason']}", "error"))
    else:
        lines.append(message_html(f"ok: {verdict['reason']}", "ok"))
    outs = result.output_results
    if outs:
        lines.append(table_html(
            ["output", m, "floor", "inf/NaN", "state"],
            [(t.tensor, fmt_metric(t.metrics.get(m), m), _floor_text(t.floor, m),
              t.metrics.get("nonfinite_mismatch") or 0,
              "DIVERGED" if t.diverged else ("ok, at its floor (the format cannot hold the values)" if t.at_floor
                                             else "ok")) for t in outs],
            classes=["bad" if t.diverged else "" for t in outs]))
    at_floor = [t for t in outs if t.at_floor]
    if at_floor:
        lines.append(message_html(
            f"{len(at_floor)} output(s) at their precision floor: {', '.join(t.tensor for t in at_floor)} (the "
            "candidate's format cannot hold those values; no node is at fault)", "info"))
    dips = result.internal_dips
    if dips:
        on_floor = sum(t.at_floor for t in dips)
        names = ", ".join(t.tensor for t in dips[:5]) + (", ..." if len(dips) > 5 else "")
        lines.append(message_html(
            f"{len(dips)} internal dip(s): internal tensors under the criterion while the outputs pass"
            + (f" ({on_floor} at their format's floor)" if on_floor else "") + f": {names}"
            + ("; they fail this run (fail_on_internal_dips)" if result.fail_on_internal_dips else
               "; not a divergence"), "error" if result.failed else "warn"))
    first = result.first_divergent
    if first is not None:
        bad = sum(t.diverged for t in result.tensors)
        lines.append(message_html(
            f"first divergent: {first.node} ({first.op_type}, #{first.topo_index}), {m} "
            f"{fmt_metric(first.metrics.get(m), m)}" + (f", {_floor_text(first.floor, m)} floor" if first.floor
                                                         else "")
            + f"; {bad} of {len(result.tensors)} tensors diverged", "error"))
    for note in result.notes:
        lines.append(message_html(note, "info"))
    return "".join(lines)


def culprit_html(c: Any, metric: str) -> str:
    """One culprit: harmful / harmless / below the criterion, the error it introduces (and beyond its floor),
    what fixing it gains on the outputs (when measured) and the explanation."""
    if c.harmless:
        label = '<b class="wb-muted">harmless</b>'
    elif c.introduces_divergence:
        label = '<b class="wb-bad">harmful</b>'
    else:
        label = "<b>below the criterion</b>"
    m = html.escape(metric)
    beyond = f" (the error beyond its floor: {metric} {fmt_metric(c.beyond_floor, metric)})" \
        if c.beyond_floor is not None else ""
    floor = f", its output's floor {html.escape(_floor_text(c.floor, metric))}" if c.floor else ""
    introduced, received = fmt_metric(c.introduced.get(metric), metric), fmt_metric(c.received.get(metric), metric)
    text = (f"{label} · {html.escape(c.op_type)} · introduces {m} {html.escape(introduced)}{html.escape(beyond)}, "
            f"receives {html.escape(received)}{floor}")
    impact = c.impact
    if impact:
        from ..compare.explain import impact_sentence

        per = ", ".join(f"{o} {_gain_db(g)}" for o, g in (impact.get("gain") or {}).items())
        said = (impact_sentence(impact) or "not measured") + (f" ({per})" if per else "")
        text += "<br>impact: " + html.escape(said)
    else:
        text += "<br>impact: not measured"
    if c.explanation:
        text += "<br>" + html.escape(c.explanation)
    return text


def _gain_db(gain: Any) -> str:
    """One output's gain: ``12.3 dB``, ``exact after the fix`` for an unbounded one."""
    import math

    if isinstance(gain, (int, float)) and math.isinf(gain):
        return "exact after the fix" if gain > 0 else "worse after the fix"
    return f"{fmt_metric(gain)} dB"


def _user_file_html(result: Any) -> str:
    """Names the user's own candidate file, when the result ran one (else nothing)."""
    variant = result.variant or {}
    if variant.get("variant") != "user model":
        return ""
    return message_html(f"candidate: your file {variant.get('file')} (sha256 {str(variant.get('sha256'))[:12]}) "
                        f"on {result.candidate}, against {result.reference}", "info")
