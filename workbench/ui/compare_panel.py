"""Compare panel: pick two engines/precisions, inputs, tolerance and strategy; run compare() on a thread with a
progress bar and Cancel; show where the runs part ways (first divergent tensor) and why (culprits)."""

from __future__ import annotations

import html
import logging
from typing import Any

import ipywidgets as widgets

from ..compare.metrics import HIGHER_IS_BETTER, METRICS
from .inputs_box import InputsBox
from .jobs import JobControls
from .messages import error_html, fallback_repr, message_html
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import fmt, table_html

log = logging.getLogger(__name__)

VARIANTS = ("fp32", "fp16", "int8")
#: a sensible tolerance to start from when the user picks a metric
DEFAULT_THRESHOLDS = {"sqnr_db": 30.0, "cosine": 0.999, "max_abs": 1e-3, "mean_abs": 1e-3, "max_rel": 1e-2,
                      "norm_max_abs": 1e-2, "norm_mean_abs": 0.1}
AUTO_METRIC = "default for the candidate precision"


class ComparePanel(widgets.VBox):
    """``ComparePanel(model)``; ``run()`` starts a comparison (also what the Run button does), ``wait()`` joins it."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, reference: str = "ort",
                 candidate: str = "ort:fp16", **load_kwargs: Any) -> None:
        from ..engines import available_engines

        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.engines = {e["name"]: e for e in available_engines()}
        ref_engine, _, ref_variant = reference.partition(":")
        cand_engine, _, cand_variant = candidate.partition(":")
        self.ref_engine = self._engine_picker("reference", ref_engine)
        self.ref_variant = widgets.Dropdown(options=VARIANTS, value=ref_variant or "fp32",
                                            layout=widgets.Layout(width="90px"))
        self.cand_engine = self._engine_picker("candidate", cand_engine)
        self.cand_variant = widgets.Dropdown(options=VARIANTS, value=cand_variant or "fp32",
                                             layout=widgets.Layout(width="90px"))
        self.engine_note = widgets.HTML()
        self.inputs = InputsBox()
        self.metric = widgets.Dropdown(options=[AUTO_METRIC] + [m for m in METRICS if m != "nonfinite_mismatch"],
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
        self.jobs = JobControls()
        self.summary = widgets.HTML()
        self.culprit_rows = widgets.VBox()
        self.tensors = widgets.HTML()
        self.save_path = widgets.Text(placeholder="result.json (relative paths go under the output folder)",
                                      layout=widgets.Layout(width="420px"))
        self.save_button = widgets.Button(description="Save result JSON", icon="save", disabled=True)
        self.save_button.on_click(lambda _: self.save())
        self.save_note = widgets.HTML()
        for w in (self.ref_engine, self.cand_engine, self.ref_variant, self.cand_variant):
            w.observe(self._on_engine, "value")
        self.metric.observe(self._on_metric, "value")
        self.state.observe(lambda ch: self.show_result(ch["new"]), "result")
        pickers = widgets.VBox([
            widgets.HBox([self.ref_engine, self.ref_variant]), widgets.HBox([self.cand_engine, self.cand_variant]),
            self.engine_note])
        super().__init__([
            style_tag(), heading("Engines and precisions"), pickers, heading("Inputs"), self.inputs,
            heading("Divergence criterion"), widgets.HBox([self.metric, self.threshold]), self.tolerance_note,
            self.mode, widgets.HBox([self.run_button]), self.jobs, heading("Results"), self.summary,
            self.culprit_rows, self.tensors, widgets.HBox([self.save_path, self.save_button]), self.save_note,
        ])
        self._on_engine()
        self._on_metric()
        if self.state.result is not None:
            self.show_result(self.state.result)

    def _engine_picker(self, label: str, value: str) -> widgets.Dropdown:
        options = [(name if e["available"] else f"{name} (not available here)", name)
                   for name, e in self.engines.items()]
        return widgets.Dropdown(options=options, value=value if value in self.engines else "ort", description=label,
                                layout=widgets.Layout(width="330px"))

    @property
    def reference(self) -> str:
        return _spec(self.ref_engine.value, self.ref_variant.value)

    @property
    def candidate(self) -> str:
        return _spec(self.cand_engine.value, self.cand_variant.value)

    def _on_engine(self, _change: Any = None) -> None:
        chosen = dict.fromkeys([self.ref_engine.value, self.cand_engine.value])
        problems = [f"{name}: {self.engines[name]['reason']}" for name in chosen if not self.engines[name]["available"]]
        if self.ref_engine.value == "ref" and self.ref_variant.value == "int8" or \
                self.cand_engine.value == "ref" and self.cand_variant.value == "int8":
            problems.append("ref: the reference evaluator has no INT8 variant (use ort:int8)")
        hints = []
        if self.cand_engine.value == "ort" and self.cand_variant.value == "fp16":
            hints.append("ONNX Runtime's CPU provider computes most FP16 ops in FP32: converter clamps show, FP16 "
                         "arithmetic overflow does not; 'ref' + fp16 emulates FP16 arithmetic on the CPU.")
        if "int8" in (self.ref_variant.value, self.cand_variant.value):
            hints.append("INT8 is a Q/DQ model calibrated on the comparison's own inputs unless you calibrate in the "
                         "Calibration panel and compare its QDQ export.")
        self.engine_note.value = "".join(message_html(p, "error") for p in problems) + \
            "".join(message_html(h, "info") for h in hints)
        self.run_button.disabled = bool(problems)
        if self.metric.value == AUTO_METRIC:
            self._on_metric()

    def _on_metric(self, _change: Any = None) -> None:
        from ..compare.criterion import Criterion

        if self.metric.value == AUTO_METRIC:
            crit = Criterion.default_for(self.cand_variant.value)
            self.threshold.disabled = True
            self.threshold.value = crit.threshold
            self.tolerance_note.value = message_html(f"diverged when {crit.describe()}", "info")
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
        """Start compare() on a thread with the chosen options; returns the thread (None if one is running)."""
        from ..compare.api import compare

        try:
            model = self.state.require_model()
            options = self.inputs.feed_options()
            criterion = self.criterion()
        except Exception as e:  # noqa: BLE001 - bad options are shown, not raised
            self.jobs.status.value = error_html(e, "the comparison")
            return None
        reference, candidate, mode = self.reference, self.candidate, self.mode.value
        self.summary.value = message_html(f"comparing {candidate} against {reference} on "
                                          f"{self.inputs.describe()}...", "info")

        def work(progress, cancel):
            return compare(model, reference, candidate, mode=mode, criterion=criterion, progress=progress,
                           cancel=cancel, **options)

        def done(result):
            self.state.selected = ""
            self.state.result = result

        def failed(_e):
            self.summary.value = ""

        return self.jobs.start("comparison", work, done, failed)

    def cancel(self) -> None:
        self.jobs.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)

    # --- results ---------------------------------------------------------------------------------------------
    def show_result(self, result: Any) -> None:
        """Summary, culprits (each a button that selects it everywhere) and the per-tensor table."""
        if result is None:
            self.summary.value, self.tensors.value = "", ""
            self.culprit_rows.children = ()
            self.save_button.disabled = True
            return
        self.save_button.disabled = False
        crit = result.criterion
        first = result.first_divergent
        bad = sum(t.diverged for t in result.tensors)
        lines = [f"<b>{html.escape(result.candidate)}</b> against <b>{html.escape(result.reference)}</b>, "
                 f"{len(result.tensors)} tensors compared ({html.escape(result.mode)}), criterion: "
                 f"{html.escape(crit.describe())}, {result.timing.get('total_s', 0):.2f} s"]
        if first is None:
            lines.append(message_html("no tensor diverged: the two runs agree within the tolerance", "ok"))
        else:
            value = fmt(first.metrics.get(crit.metric))
            lines.append(message_html(
                f"first divergent: {first.node} ({first.op_type}, #{first.topo_index}), {crit.metric} {value}; "
                f"{bad} of {len(result.tensors)} tensors diverged", "error"))
        for note in result.notes:
            lines.append(message_html(note, "info"))
        self.summary.value = "".join(lines)
        rows = []
        for k, c in enumerate(result.culprits, 1):
            button = widgets.Button(description=f"#{k} {c.node}", tooltip=f"show {c.node} in Errors and Graph",
                                    icon="search", button_style="danger" if c.introduces_divergence else "",
                                    layout=widgets.Layout(width="auto", max_width="520px"))
            button.on_click(lambda _b, node=c.node: self.show_culprit(node))
            introduced = fmt(c.introduced.get(crit.metric))
            received = fmt(c.received.get(crit.metric))
            text = (f"{html.escape(c.op_type)} · introduces {html.escape(crit.metric)} {introduced}, receives "
                    f"{received}<br>{html.escape(c.explanation)}")
            rows.append(widgets.VBox([button, widgets.HTML(f'<div class="wb-culprit">{text}</div>')]))
        title = "Culprits: nodes ranked by the error they introduce (run alone on the candidate with reference inputs)"
        self.culprit_rows.children = [widgets.HTML(f'<div class="wb-h">{html.escape(title)}</div>')] + rows \
            if rows else [widgets.HTML(message_html("no culprit ranking (isolation did not run)", "warn"))]
        shown = sorted(result.tensors, key=lambda t: (not t.diverged, t.topo_index))[:200]
        self.tensors.value = "<details><summary>Every compared tensor (diverged first)</summary>" + table_html(
            ["#", "tensor", "node", "op", crit.metric, "nonfinite", "diverged"],
            [(t.topo_index, t.tensor, t.node, t.op_type, t.metrics.get(crit.metric),
              t.metrics.get("nonfinite_mismatch"), t.diverged) for t in shown],
            classes=["first" if first is not None and t.tensor == first.tensor else "bad" if t.diverged else ""
                     for t in shown]) + "</details>"

    def show_culprit(self, node: str) -> None:
        """Select ``node`` in every panel and bring the Errors panel forward."""
        self.state.selected = node
        self.state.request_show("errors")

    def save(self) -> None:
        result = self.state.result
        if result is None:
            return
        try:
            path = self.state.resolve_output(self.save_path.value, "result.json")
            written = result.save_json(path)
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.save_note.value = error_html(e, "saving the result")
            return
        self.save_note.value = message_html(f"saved {written}", "ok")


def _spec(engine: str, variant: str) -> str:
    return engine if variant == "fp32" else f"{engine}:{variant}"
