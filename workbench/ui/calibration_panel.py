"""Calibration panel: INT8 calibration diagnostics. Each range rule is named after the toolchain whose threshold
it reproduces (TensorRT, ModelOpt, ONNX Runtime): the rules table scores them, and a note says when the ranking
rule is far worse than another. Tensors sorted by sensitivity; a tensor's |x| histogram (log counts) with every
rule's threshold, its clipped fraction and the evaluation data overlaid; representativeness; export of the
TensorRT cache and the QDQ model (with the rule they carry) to a path the user types (default: the output
folder)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from ..calibrate.methods import DEFAULT_METHOD, DEFAULT_PERCENTILES, METHODS, RULES
from ..calibrate.ort_rules import ENTROPY_BINS, QUANTIZED_BINS
from ..plots.calibration import calibration_histogram, sensitivity_bars
from .downloads import download_html
from .downloads import server as download_server
from .figures import clear, show_figure
from .inputs_box import parse_shapes, shapes_note_html, shapes_placeholder, shapes_template
from .jobs import JobControls
from .messages import error_html, error_text, fallback_repr, message_html
from .runs import no_result_text
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import table_html

log = logging.getLogger(__name__)


def rule_option(method: str) -> tuple[str, str]:
    """(label, value) of a method option: "entropy — TensorRT EntropyCalibration2 (…)", "entropy"."""
    rule = RULES.get(method)
    return (f"{method} — {rule.label}" if rule else method), method


class CalibrationPanel(widgets.VBox):
    """``CalibrationPanel(model)``; ``run()`` calibrates on a thread, ``wait()`` joins, ``export_cache()`` and
    ``export_qdq()`` write files. ``report=`` shows an existing :class:`~workbench.calibrate.CalibrationReport`."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, report: Any = None,
                 **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        if report is not None:
            self.state.calibration = report
        self.data_path = widgets.Text(placeholder="calibration feeds: .npz, folder of .npz, JSON (empty: random)",
                                      description="data", layout=widgets.Layout(width="520px"))
        self.data_count = widgets.BoundedIntText(value=16, min=1, max=100_000, description="random N",
                                                 layout=widgets.Layout(width="180px"))
        self.eval_path = widgets.Text(placeholder="evaluation feeds (empty: random, other seed)", description="eval",
                                      layout=widgets.Layout(width="520px"))
        self.eval_count = widgets.BoundedIntText(value=8, min=0, max=100_000, description="random N",
                                                 layout=widgets.Layout(width="180px"))
        self.shapes = widgets.Text(placeholder=shapes_placeholder(None), description="shapes",
                                   tooltip="input shapes of the random feeds (shared with Compare)",
                                   layout=widgets.Layout(width="520px"))
        self.shapes_note = widgets.HTML()
        self._shapes_link = traitlets.link((self.state, "input_shapes"), (self.shapes, "value"))
        self.methods = widgets.SelectMultiple(options=[rule_option(m) for m in METHODS], value=METHODS,
                                              rows=len(METHODS), description="rules",
                                              layout=widgets.Layout(width="640px"))
        self.rank_method = widgets.Dropdown(options=[rule_option(m) for m in METHODS], value=DEFAULT_METHOD,
                                            description="rank by", layout=widgets.Layout(width="640px"))
        defaults = ", ".join(f"{m} {p:g}" for m, p in DEFAULT_PERCENTILES.items())
        self.rule_percentile = widgets.Checkbox(value=True, description=f"each rule's default percentile ({defaults})",
                                                indent=False, layout=widgets.Layout(width="420px"))
        self.percentile = widgets.BoundedFloatText(value=DEFAULT_PERCENTILES["percentile"], min=0.01, max=100.0,
                                                   step=0.001, description="percentile", disabled=True,
                                                   layout=widgets.Layout(width="200px"))
        self.rule_percentile.observe(lambda change: setattr(self.percentile, "disabled", change["new"]), "value")
        self.ort_entropy_bins = widgets.BoundedIntText(value=ENTROPY_BINS, min=QUANTIZED_BINS, max=1 << 16,
                                                       description="ORT entropy bins",
                                                       style={"description_width": "initial"},
                                                       layout=widgets.Layout(width="200px"))
        self.seed = widgets.BoundedIntText(value=0, min=0, max=2**31 - 1, description="seed",
                                           layout=widgets.Layout(width="150px"))
        self.run_button = widgets.Button(description="Calibrate", icon="play", button_style="primary")
        self.run_button.on_click(lambda _: self.run())
        self.jobs = JobControls(locks=[self.run_button])
        self.summary = widgets.HTML()
        self.rules = widgets.HTML()
        self.tensor = widgets.Select(description="tensor", rows=10, layout=widgets.Layout(width="640px"))
        self.log_y = widgets.Checkbox(value=True, description="log counts")
        self.show_eval = widgets.Checkbox(value=True, description="evaluation overlay")
        self.histogram = widgets.Output()
        self.tensor_note = widgets.HTML()
        self.sensitivity = widgets.Output()
        self.represent = widgets.HTML()
        self.export_method = widgets.Dropdown(options=[rule_option(m) for m in METHODS], value=DEFAULT_METHOD,
                                              description="rule", layout=widgets.Layout(width="640px"))
        self.cache_path = widgets.Text(description="cache", layout=widgets.Layout(width="560px"))
        self.cache_button = widgets.Button(description="Write TensorRT cache", icon="save", disabled=True)
        self.qdq_path = widgets.Text(description="QDQ model", layout=widgets.Layout(width="560px"))
        self.qdq_button = widgets.Button(description="Save QDQ model", icon="save", disabled=True)
        self.export_note = widgets.HTML()
        self._offers: dict[str, str] = {}  # export kind -> its message and link, for the report shown
        self._offers_for = None
        self.export_jobs = JobControls(locks=[self.run_button])  # one job at a time: none mid-export
        self.cache_button.on_click(lambda _: self.export_cache())
        self.qdq_button.on_click(lambda _: self.export_qdq())
        self._quiet = False  # set while a new report fills the tensor list: it draws once, after
        for w in (self.tensor, self.log_y, self.show_eval):
            w.observe(lambda _: None if self._quiet else self._draw_tensor(), "value")
        self.state.observe(lambda _: self.refresh(), "calibration")
        self.state.observe(lambda _: self.refresh() if self.state.calibration is None else None, "runs")
        self.state.observe(lambda _: self._on_model(), "model")
        setup = widgets.VBox([
            widgets.HBox([self.data_path, self.data_count]), widgets.HBox([self.eval_path, self.eval_count]),
            self.shapes, self.shapes_note,
            self.methods, self.rank_method, widgets.HBox([self.rule_percentile, self.percentile]),
            widgets.HBox([self.ort_entropy_bins, self.seed]), self.run_button, self.jobs])
        super().__init__([
            style_tag(), download_server(), heading("Calibration data"), setup, heading("Results"), self.summary,
            heading("Rules: whose threshold each reproduces, and how well it keeps the tensors"), self.rules,
            heading("Tensors, most sensitive first (worst-case SQNR under the ranking rule)"), self.tensor,
            widgets.HBox([self.log_y, self.show_eval]), self.tensor_note, self.histogram,
            heading("Sensitivity by rule"), self.sensitivity,
            heading("Representativeness: calibration vs evaluation data"), self.represent,
            heading("Export"), self.export_method, widgets.HBox([self.cache_path, self.cache_button]),
            widgets.HBox([self.qdq_path, self.qdq_button]), self.export_jobs, self.export_note,
        ])
        self.add_class("wb-root")
        self.shapes.observe(
            lambda ch: setattr(self.shapes_note, "value", shapes_note_html(self.state.model, ch["new"])), "value")
        self._on_model()
        self.refresh()

    def _on_model(self) -> None:
        """Default export names for the model (relative: they go under the output folder, made when first
        written) and its input shapes described under the shapes field."""
        model = self.state.model
        self.shapes_note.value = shapes_note_html(model, self.shapes.value)
        self.shapes.placeholder = shapes_placeholder(model) + (" (random feeds only)" if shapes_template(model)
                                                                else "")
        if model is None:
            return
        stem = model.name.rsplit(".", 1)[0] or "model"
        self.cache_path.value = f"{stem}.calib.cache"
        self.qdq_path.value = f"{stem}.int8.qdq.onnx"
        for w in (self.cache_path, self.qdq_path):
            w.placeholder = "a path; relative paths go under the output folder"

    # --- running ---------------------------------------------------------------------------------------------
    def run(self):
        """Calibrate the state's model on a thread; returns the thread (None if one is running or the options are
        bad: the reason is shown). A run replaces the current calibration: it is cleared when the run starts and
        stays cleared, with the reason, after a Cancel or a failure."""
        from ..calibrate import calibrate

        if self.jobs.running or self.export_jobs.running:  # one job at a time in this panel
            busy = self.jobs if self.jobs.running else self.export_jobs
            return busy.start("calibration", lambda _p, _c: None)  # says: wait for it, or cancel it
        data = self.data_path.value.strip() or int(self.data_count.value)
        evaluation = self.eval_path.value.strip() or (int(self.eval_count.value) or None)
        try:
            model = self.state.require_model()
            random = isinstance(data, int) or isinstance(evaluation, int)
            shapes = parse_shapes(model, self.shapes.value) if random else None
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.jobs.status.value = error_html(e, "calibration")
            return None
        methods, rank = tuple(self.methods.value) or METHODS, self.rank_method.value
        percentile = None if self.rule_percentile.value else float(self.percentile.value)
        bins, seed = int(self.ort_entropy_bins.value), int(self.seed.value)
        what = f"{data} random feed(s)" if isinstance(data, int) else data
        run = self.state.begin_run("calibration", f"on {what}")  # the previous report goes everywhere
        self.summary.value = message_html(f"{run.tag}: calibrating on {what}...", "info")

        def work(progress, cancel):
            return calibrate(model, data, methods=methods, method=rank, percentile=percentile,
                             ort_entropy_bins=bins, eval_data=evaluation, seed=seed, input_shapes=shapes,
                             progress=progress, cancel=cancel)

        def done(report):
            self.state.end_run(run, "done", report)

        def failed(e):
            cancelled = self.jobs.cancelled
            self.state.end_run(run, "cancelled" if cancelled else "failed", error=error_text(e))
            said = "cancelled" if cancelled else "failed (the reason is above)"
            self.summary.value = message_html(f"{run.tag}, the calibration on {what}, {said}: no current "
                                              "calibration", "warn")

        return self.jobs.start("calibration", work, done, failed)

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout) and self.export_jobs.wait(timeout)

    # --- results ---------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Show the state's calibration report (a failure is a message in the panel)."""
        try:
            self._refresh()
        except Exception as e:  # noqa: BLE001 - shown in the panel, never raised into the calibration's thread
            self.summary.value = error_html(e, "showing the calibration")

    def _refresh(self) -> None:
        report = self.state.calibration
        if report is not self._offers_for:  # the exports of an earlier report go with it
            self._offers, self._offers_for = {}, report
            self.export_note.value = ""
        ready = report is not None
        self.cache_button.disabled = self.qdq_button.disabled = not ready
        if ready and (report.source_model is None or not report.sample_feeds):  # reopened: read from JSON
            self.qdq_button.disabled = True
            self.qdq_button.tooltip = "a reopened calibration keeps no feeds to quantize with: calibrate again"
            self._offer("qdq", message_html("a reopened calibration keeps its ranges, not its model and feeds: "
                                            "Calibrate again to save its QDQ model (the TensorRT cache can be "
                                            "written from the ranges)", "info"))
        else:
            self.qdq_button.tooltip = ""
        if not ready:
            run = self.state.current_run("calibration")
            self.summary.value = message_html(
                "no calibration yet: choose data and press Calibrate" if run is None else
                no_result_text(self.state, "calibration", "this panel"), "info")
            self.rules.value = self.tensor_note.value = self.represent.value = ""
            self.tensor.options = []
            clear(self.histogram)
            clear(self.sensitivity)
            return
        cfg = report.config
        run = self.state.run_of(report)
        # the notes (e.g. "the ranking rule is N dB worse than another") come first, as warnings
        self.summary.value = "".join(message_html(n, "warn") for n in report.notes) + message_html(
            (f"{run.tag}: " if run is not None else "")
            + f"{len(report.tensors)} tensors calibrated on {cfg.get('feeds')} feed(s)"
            + (f", evaluated on {cfg.get('eval_feeds')}" if cfg.get("eval_feeds") else "")
            + f"; rules {', '.join(report.methods)}; ranking under '{report.method}' ({report.rule(report.method)})",
            "ok")
        self.rules.value = rules_table(report)
        with self.hold_trait_notifications():
            self.export_method.options = [rule_option(m) for m in report.methods]
            self.export_method.value = report.method
        options = []
        for e in report.sensitivity:
            worst = f"{e.worst_sqnr_db:.1f} dB" if math.isfinite(e.worst_sqnr_db) else str(e.worst_sqnr_db)
            options.append((f"#{e.rank} {e.tensor}  ({worst}; best: {e.best_method})", e.tensor))
        ranked = {t for _, t in options}
        options += [(t, t) for t in report.tensors if t not in ranked]
        self._quiet = True
        try:
            self.tensor.options = options
            self.tensor.value = options[0][1] if options else None
        finally:
            self._quiet = False
        # always redraw: the same tensor selected again triggers no change, but its numbers are the new report's
        self._draw_tensor()
        show_figure(self.sensitivity, sensitivity_bars(report))
        rows = sorted(report.representativeness or [], key=lambda r: (not r.flagged, -r.js_distance))
        self.represent.value = represent_html(rows)

    def _draw_tensor(self) -> None:
        report, name = self.state.calibration, self.tensor.value
        if report is None or not name:
            self.tensor_note.value = ""
            clear(self.histogram)
            return
        try:
            fig = calibration_histogram(report, name, log_y=self.log_y.value, show_eval=self.show_eval.value)
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.tensor_note.value = error_html(e, "drawing the histogram")
            return
        errors = report.errors.get(name, {})
        self.tensor_note.value = table_html(
            ["rule", "toolchain", "(lowest, highest)", "amax", "clipped", "SQNR (dB)", "bulk SQNR (dB)",
             "worst (dB)"],
            [(m, _toolchain(m), report.bounds.get(m, {}).get(name, (-e.amax, e.amax)), e.amax,
              f"{e.clipped_fraction:.4%}", e.sqnr_db, e.bulk_sqnr_db, e.worst_sqnr_db) for m, e in errors.items()],
            classes=["first" if m == report.method else "" for m in errors])
        show_figure(self.histogram, fig)

    # --- export ----------------------------------------------------------------------------------------------
    def _inputs(self) -> dict[str, str]:
        """The typed data paths an export may not overwrite."""
        return {"the calibration data": self.data_path.value, "the evaluation data": self.eval_path.value}

    def export_cache(self):
        """Write the TensorRT calibration cache (the chosen rule's thresholds) to the typed path."""
        report = self.state.calibration
        if report is None:
            return None
        method = self.export_method.value
        try:
            path = self.state.resolve_output(self.cache_path.value, "model.calib.cache", what="the cache path",
                                             inputs=self._inputs())
            written = report.write_trt_cache(path, method)
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self._offer("cache", error_html(e, "writing the cache"))
            return None
        self._offer("cache", message_html(
            f"{self._tag(report)}TensorRT cache written with '{method}' ({report.rule(method)}) thresholds: "
            f"{written}", "ok") + download_html(written, "Download the TensorRT cache", show_path=False))
        return written

    def _tag(self, report) -> str:
        run = self.state.run_of(report)
        return f"{run.tag}: " if run is not None else ""

    def _offer(self, kind: str, text: str) -> None:
        """Show ``text`` for export ``kind`` ("cache", "qdq") beside the other export's (each keeps its link)."""
        self._offers[kind] = text
        self.export_note.value = "".join(self._offers[k] for k in ("cache", "qdq") if k in self._offers)

    def export_qdq(self):
        """Save the QDQ INT8 model (the chosen rule's ranges) to the typed path, on a thread."""
        report = self.state.calibration
        if report is None:
            return None
        method = self.export_method.value
        try:
            path = self.state.resolve_output(self.qdq_path.value, "model.int8.qdq.onnx", what="the QDQ model path",
                                             inputs=self._inputs())
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self._offer("qdq", error_html(e, "saving the QDQ model"))
            return None

        def work(progress, _cancel):
            progress(0.2, f"quantizing with the '{method}' ranges")
            return report.save_qdq(path, method)

        def done(written):
            if self.state.calibration is not report:  # a new calibration came meanwhile: this export is its past
                return
            self._offer("qdq", message_html(
                f"{self._tag(report)}QDQ model saved with '{method}' ({report.rule(method)}) ranges: {written}",
                "ok") + download_html(Path(written), "Download the QDQ model", show_path=False))

        return self.export_jobs.start("QDQ export", work, done)


def represent_html(rows: list) -> str:
    """Representativeness rows: the evaluation data's share beyond the calibrated amax next to the calibration
    data's own (a tensor is flagged on the excess of one over the other, not on the first alone)."""
    note = ('<div class="wb-culprit wb-small">"beyond amax": the share of values past the calibrated amax, for the '
            "evaluation data and for the calibration data itself; a tensor is flagged when the evaluation data goes "
            "beyond it clearly more often than the calibration data does (the excess), or when the two "
            "distributions differ (JS distance)</div>")
    return table_html(
        ["tensor", "flagged", "calib amax", "eval amax", "eval beyond amax", "calib beyond amax", "excess",
         "JS distance", "reasons"],
        [(r.tensor, "yes" if r.flagged else "no", r.calib_amax, r.eval_amax, f"{r.beyond_fraction:.3%}",
          f"{r.calib_beyond_fraction:.3%}", f"{r.excess_beyond:+.3%}", r.js_distance,
          "; ".join(r.reasons)) for r in rows],
        classes=["bad" if r.flagged else "" for r in rows],
        empty="no evaluation data: give some to check that the calibration set is representative") + \
        (note if rows else "")


def _toolchain(method: str) -> str:
    return RULES[method].toolchain if method in RULES else ""


def rules_table(report: Any) -> str:
    """The report's rules (``report.summary``): whose threshold each reproduces, its setting, the median tensor's
    worst-case SQNR and on how many tensors it does best; the ranking rule's row marked."""
    from ..calibrate.methods import percentile_of

    cfg = report.config

    def setting(method: str) -> str:
        if method in DEFAULT_PERCENTILES:
            return f"percentile {percentile_of(method, cfg.get('percentile')):g}"
        if method == "ort-entropy" and cfg.get("ort_entropy_bins"):
            return f"{cfg['ort_entropy_bins']} bins"
        if method in RULES and RULES[method].reads == "trt" and cfg.get("num_bins"):
            return f"{cfg['num_bins']} bins"
        return ""

    rows = [(m, s.get("toolchain") or _toolchain(m), s.get("rule") or report.rule(m), setting(m),
             s.get("median_worst_sqnr_db"), s.get("tensors_best"), "ranks the tensors" if m == report.method else "")
            for m, s in report.summary.items()]
    return table_html(["rule", "toolchain", "whose threshold", "setting", "median worst SQNR (dB)",
                       "tensors where best", ""], rows,
                      classes=["first" if m == report.method else "" for m in report.summary],
                      empty="this report scores no rules (it was made before rules were named)")
