"""Dataset panel (issue 14): drift over a dataset, sample by sample, judged by task metrics.

Pick the samples (a folder of .npz, a folder of images with a ``module:function`` preprocessing function, or a
Python object from the notebook: ``panel.set_dataset(loader)``), the task metrics, the executor and the engine
pair; compare_dataset() runs on a thread with a progress bar and Cancel. Then: the verdict, the task metrics'
aggregates, the worst samples, each layer's error across samples, each sample's task metric and where samples
first diverge. Clicking a sample (its point, or its button among the worst) reads its feed again from the dataset
(checked against the content hash the run recorded) and runs the single-sample comparison, which the Compare and
Errors panels then show. Every number shown comes from the :class:`~workbench.dataset.DatasetResult`.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ..compare.text import fmt as fmt_metric
from ..core.floats import decode_float
from ..dataset.metrics import BUILTIN
from ..errors import InputError
from .engine_pair import EnginePair, PairedPanel
from .figures import clear, figure_widget, show_figure
from .jobs import JobControls
from .messages import error_text, fallback_repr, message_html, options_refused
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import fmt, table_html

log = logging.getLogger(__name__)

FOLDER, OBJECT = "folder on the server", "Python object"
EXECUTORS = ("serial", "processes", "ray")
METRIC_LABELS = {"top1": "top1: argmax agrees", "topk": "topk: top-K sets overlap",
                 "ctc": "ctc: greedy CTC decode agrees", "mask_iou": "mask_iou: IoU of output > T"}


class DatasetPanel(PairedPanel, widgets.VBox):
    """``DatasetPanel(model)``; ``set_dataset(obj)`` takes samples from the notebook, ``run()`` starts the dataset
    comparison (the Run button), ``open_sample(index)`` opens one sample layer by layer (a click on it), ``wait()``
    joins both. ``result``: the latest :class:`~workbench.dataset.DatasetResult` (None while none is current)."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, reference: str = "ort",
                 candidate: str = "ort:fp16", dataset: Any = None, preprocess: Any = None,
                 **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.result = None
        self.opened: int | None = None  # the sample whose single comparison was last published
        self._object: Any = None
        self._preprocess_fn: Any = None
        self.pair = EnginePair(reference, candidate)
        self.engine_note = widgets.HTML()
        self._make_cand_file()  # the user's own candidate file (their FP16/QDQ export), as in Compare
        # samples
        self.source = widgets.ToggleButtons(options=[FOLDER, OBJECT], value=FOLDER, description="samples")
        self.folder = widgets.Text(placeholder="/path/to/a folder of .npz (one sample each), or of images",
                                   description="folder", layout=widgets.Layout(width="560px"))
        self.preprocess = widgets.Text(placeholder="module:function or path/to/prep.py:function (optional; an image "
                                       "folder needs one)", description="preprocess",
                                       layout=widgets.Layout(width="560px"))
        self.object_note = widgets.HTML()
        self.preprocess_note = widgets.HTML()
        # task metrics
        self.metrics = widgets.SelectMultiple(options=[(METRIC_LABELS.get(m, m), m) for m in BUILTIN], value=(),
                                              description="metrics", rows=len(BUILTIN),
                                              layout=widgets.Layout(width="360px"))
        self.topk = widgets.BoundedIntText(value=5, min=1, max=100_000, description="top-k K",
                                           layout=widgets.Layout(width="170px"))
        self.mask_threshold = widgets.FloatText(value=0.3, description="mask T", layout=widgets.Layout(width="170px"))
        self.custom = widgets.Text(placeholder="mypkg.metrics:cer  topk:3 ... (space-separated, optional)",
                                   description="more", layout=widgets.Layout(width="560px"))
        self.task_target = widgets.Text(placeholder="ctc>=1, mean top1>=0.95 ... (optional; empty: judge the outputs)",
                                        description="task target", layout=widgets.Layout(width="560px"),
                                        tooltip="judge the run by a task metric instead of the outputs' criterion")
        # criterion, worst count, executor
        self.criterion = widgets.Text(placeholder="sqnr_db<30 (empty: the default for the inferred precision)",
                                      description="criterion", layout=widgets.Layout(width="420px"))
        self.worst_count = widgets.BoundedIntText(value=5, min=1, max=1000, description="worst k",
                                                  layout=widgets.Layout(width="170px"))
        self.executor = widgets.ToggleButtons(options=EXECUTORS, value="serial", description="executor",
                                              tooltips=["one sample after another in this kernel",
                                                        "N local worker processes, each with its own sessions",
                                                        "Ray: a local Ray, or a cluster at ray://HOST:PORT"])
        self.workers = widgets.BoundedIntText(value=2, min=1, max=1024, description="workers",
                                              layout=widgets.Layout(width="170px"))
        self.ray_address = widgets.Text(placeholder="ray://HOST:PORT (empty: a local Ray)", description="cluster",
                                        layout=widgets.Layout(width="420px"))
        self.run_button = widgets.Button(description="Run", icon="play", button_style="primary")
        self.run_button.on_click(lambda _: self.run())
        self.jobs = JobControls(locks=[self.run_button])
        # results
        self.summary = widgets.HTML()
        self.task_table = widgets.HTML()
        self.worst_title = widgets.HTML()
        self.worst_grid = widgets.GridBox(layout=widgets.Layout(grid_gap="2px 14px", align_items="center"))
        self.worst_buttons: list[widgets.Button] = []
        self.sample_index = widgets.BoundedIntText(value=0, min=0, max=0, description="sample #",
                                                   layout=widgets.Layout(width="170px"))
        self.open_button = widgets.Button(description="Open sample", icon="search", disabled=True,
                                          tooltip="compare this sample layer by layer (shown in Compare and Errors)")
        self.open_button.on_click(lambda _: self.open_sample(int(self.sample_index.value)))
        self.sample_jobs = JobControls()
        self.sample_note = widgets.HTML()
        self.spread = widgets.Output()
        self.layer_table = widgets.HTML()
        self.scatter_metric = widgets.Dropdown(options=[], description="metric", layout=widgets.Layout(width="300px"))
        self.scatter = None  # a go.FigureWidget (clickable points), made for the first result
        self.scatter_box = widgets.VBox()
        self.bars = widgets.Output()
        self.bars_note = widgets.HTML()
        self._filling = False
        self.source.observe(self._on_source, "value")
        self.executor.observe(self._on_executor, "value")
        self.pair.observe(self._on_engine)
        self.cand_file.observe(self._on_engine, "value")
        self.scatter_metric.observe(lambda _: None if self._filling else self._draw_scatter(), "value")
        self.state.observe(self._on_model, "model")
        self._folder_box = widgets.VBox([self.folder])
        self._object_box = widgets.VBox([self.object_note])
        self.results_box = widgets.VBox([
            self.task_table, self.worst_title, self.worst_grid, widgets.HBox([self.sample_index, self.open_button]),
            self.sample_jobs, self.sample_note, heading("Each layer across samples"), self.spread, self.layer_table,
            heading("Each sample (click a point to open it)"), self.scatter_metric, self.scatter_box,
            heading("Where samples first diverge"), self.bars_note, self.bars])
        pickers = widgets.VBox([widgets.HBox([self.pair.ref_engine, self.pair.ref_variant]),
                                widgets.HBox([self.pair.cand_engine, self.pair.cand_variant]), self.cand_file,
                                self.engine_note])
        super().__init__([
            style_tag(), heading("Engines and precisions"), pickers,
            heading("Samples"), self.source, self._folder_box, self._object_box, self.preprocess,
            self.preprocess_note,
            heading("Task metrics"), widgets.HBox([self.metrics, widgets.VBox([self.topk, self.mask_threshold])]),
            self.custom, self.task_target, heading("Divergence criterion and execution"),
            widgets.HBox([self.criterion, self.worst_count]), widgets.HBox([self.executor, self.workers]),
            self.ray_address, widgets.HBox([self.run_button]), self.jobs,
            heading("Results"), self.summary, self.results_box,
        ])
        self.add_class("wb-root")
        self._on_source()
        self._on_executor()
        self._on_engine()
        self.show_result(None)
        self.summary.value = message_html("no dataset comparison yet: choose the samples and press Run", "info")
        if dataset is not None or preprocess is not None:
            self.set_dataset(dataset, preprocess)

    # --- choices ---------------------------------------------------------------------------------------------
    def _on_source(self, _change: Any = None) -> None:
        self._folder_box.layout.display = "" if self.source.value == FOLDER else "none"
        self._object_box.layout.display = "" if self.source.value == OBJECT else "none"
        if self.source.value == OBJECT and self._object is None:
            self.object_note.value = message_html("no Python dataset yet: call panel.set_dataset(samples) in a cell "
                                                  "(a list of feed dicts or arrays, a generator, a DataLoader)",
                                                  "info")

    def _on_executor(self, _change: Any = None) -> None:
        self.workers.layout.display = "none" if self.executor.value == "serial" else ""
        self.ray_address.layout.display = "" if self.executor.value == "ray" else "none"

    def _on_engine(self, _change: Any = None) -> None:
        problems = self.pair_problems(self.state.model)
        hint = message_html(f"the candidate runs your file on {self.pair.cand_engine.value} (its precision is read "
                            "from the file; the precision picker is ignored)", "info") if self._cand_text() else ""
        self.engine_note.value = "".join(message_html(p, "error") for p in problems) + hint
        self.run_button.disabled = bool(problems) or self.jobs.running

    def _on_model(self, _change: Any = None) -> None:
        """A new model: a result made on the previous one is no longer current."""
        self._on_engine()
        if self.result is not None:
            self.show_result(None)
            self.summary.value = message_html("the model changed: run the dataset again", "info")

    def set_dataset(self, dataset: Any, preprocess: Any = None) -> None:
        """Use ``dataset`` for the next run: a list of feed dicts (or arrays, or tuples of arrays in input order), a
        generator, a torch DataLoader, or a folder path (goes to the folder field). ``preprocess``: a function (one
        element or image path -> feed dict or array) or ``module:function`` text; None clears a function given
        before."""
        if isinstance(preprocess, str):
            self.preprocess.value, self._preprocess_fn = preprocess, None
        else:
            self._preprocess_fn = preprocess
        self.preprocess.disabled = self._preprocess_fn is not None
        self.preprocess_note.value = message_html(
            f"preprocess: {getattr(preprocess, '__qualname__', type(preprocess).__name__)} (given from the notebook)",
            "info") if self._preprocess_fn is not None else ""
        if isinstance(dataset, (str, os.PathLike)):
            self.folder.value, self.source.value = str(dataset), FOLDER
            return
        if dataset is None:
            return
        self._object = dataset
        self.object_note.value = message_html(_describe_object(dataset), "ok")
        if isinstance(dataset, Iterator):
            self.object_note.value += message_html("a generator is read once: its samples cannot be opened after the "
                                                   "run, nor run again (pass a list or a DataLoader for that)", "warn")
        self.source.value = OBJECT
        self._on_source()

    def metric_specs(self) -> list[str]:
        """The task metrics chosen, as compare_dataset() takes them (``top1``, ``topk:K``, ``module:function``): the
        built-ins in list order, then the typed ones. The first ranks the worst samples."""
        chosen = []
        for name in (m for m in BUILTIN if m in self.metrics.value):
            if name == "topk":
                chosen.append(f"topk:{int(self.topk.value)}")
            elif name == "mask_iou":
                chosen.append(f"mask_iou:{float(self.mask_threshold.value):g}")
            else:
                chosen.append(name)
        return chosen + self.custom.value.replace(",", " ").split()

    def executor_choice(self) -> tuple[str | None, int]:
        """compare_dataset()'s ``(executor, workers)`` for the executor chosen."""
        if self.executor.value == "serial":
            return None, 1
        if self.executor.value == "processes":
            return "processes", int(self.workers.value)
        return self.ray_address.value.strip() or "ray", int(self.workers.value)

    def run_options(self) -> dict:
        """compare_dataset()'s keywords for what the panel shows; raises InputError naming a bad field."""
        from ..compare.criterion import Criterion
        from ..dataset.executors import ExecutorSpec
        from ..dataset.metrics import parse_metric
        from ..dataset.task_target import TaskTarget

        problems = self.pair_problems(self.state.model)
        if problems:
            raise InputError(problems[0], "pick another engine or variant")
        cand_model = self.candidate_file()
        if self.source.value == FOLDER:
            text = self.folder.value.strip()
            if not text:
                raise InputError("no dataset folder given", "type the path of a folder of .npz files (or of images, "
                                 "with a preprocess function), or call panel.set_dataset(samples)")
            inputs: Any = str(Path(text).expanduser())
        else:
            if self._object is None:
                raise InputError("no Python dataset given", "call panel.set_dataset(samples) in a cell, or pick a "
                                 "folder")
            inputs = self._object
        preprocess = self._preprocess_fn or self.preprocess.value.strip() or None
        metrics = [parse_metric(m) for m in self.metric_specs()]  # a bad name or import is said before running
        target = self.task_target.value.strip() or None
        if target is not None:
            TaskTarget.parse(target)
            if not metrics:
                raise InputError("a task target needs a task metric", "pick a metric (e.g. ctc, top1), or clear the "
                                 "task target to judge the outputs")
        executor, workers = self.executor_choice()
        ExecutorSpec.parse(executor, workers)
        criterion = self.criterion.value.strip() or None
        if criterion is not None:
            Criterion.parse(criterion)
        return {"inputs": inputs, "preprocess": preprocess, "metrics": metrics, "executor": executor,
                "workers": workers, "worst": int(self.worst_count.value), "criterion": criterion,
                "cand_model": cand_model, "task_target": target}

    def describe(self) -> str:
        if self.source.value == FOLDER:
            return self.folder.value.strip()
        return _describe_object(self._object) if self._object is not None else "no dataset"

    # --- running ---------------------------------------------------------------------------------------------
    def run(self):
        """Start compare_dataset() on a thread; returns the thread (None if one is running or an option is bad:
        the reason is shown). The current result is cleared when a run starts and stays cleared, with the reason,
        after a Cancel or a failure: no table or plot shows an earlier run as if it were this one."""
        from ..dataset.api import compare_dataset

        if self.jobs.running:
            return self.jobs.start("dataset comparison", lambda _p, _c: None)  # says: wait for it, or cancel it
        try:
            model = self.state.require_model()
            options = self.run_options()
        except Exception as e:  # noqa: BLE001 - bad options are shown, not raised
            options_refused(self.jobs.status, self.summary, e, "the dataset comparison")
            return None
        reference, candidate = self.reference, self.candidate
        named = f"{Path(options['cand_model']).name} on {candidate}" if options.get("cand_model") else candidate
        what = f"{named} against {reference} on {self.describe()}"
        self.sample_jobs.cancel()  # a sample being opened belongs to the result this run replaces
        self.show_result(None)
        run = self.state.begin_run("dataset", what)
        self.summary.value = message_html(f"{run.tag}: comparing {what}...", "info")

        def work(progress, cancel):
            return compare_dataset(model, reference, candidate, progress=progress, cancel=cancel, **options)

        def done(result):
            self.state.end_run(run, "done", result)
            self.show_result(result)

        def failed(e):
            cancelled = self.jobs.cancelled
            self.state.end_run(run, "cancelled" if cancelled else "failed", error=error_text(e))
            self.show_result(None)
            said = "cancelled" if cancelled else "failed (the reason is above)"
            self.summary.value = message_html(f"{run.tag}, the dataset comparison of {what}, {said}: no current "
                                              "result", "warn")

        return self.jobs.start("dataset comparison", work, done, failed)

    def cancel(self) -> None:
        self.jobs.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the dataset run and any sample being opened end (tests, scripts); True if both ended."""
        return self.jobs.wait(timeout) and self.sample_jobs.wait(timeout)

    # --- one sample ------------------------------------------------------------------------------------------
    def open_sample(self, index: int):
        """Compare sample ``index`` layer by layer with the run's engines, criterion and options, its feed read again
        from the dataset (refused if its content changed), and publish the CompareResult to the shared state (the
        Compare and Errors panels show it; Errors is brought forward). Returns the thread (None when there is no
        such sample: said in the panel). The latest click wins."""
        from ..compare.api import compare
        from ..compare.options import CompareOptions
        from ..dataset.source import sample_at

        result = self.result
        if result is None:
            self.sample_note.value = message_html("no dataset result: run the dataset first", "warn")
            return None
        row = next((s for s in result.samples if s["index"] == index), None)
        if row is None:
            self.sample_note.value = message_html(f"no sample #{index} in this result", "warn")
            return None
        run = result.run_options or {}
        dataset, model, cand_model = run.get("dataset"), run.get("model"), run.get("cand_model")
        if dataset is None or model is None:  # a run reopened from disk keeps its numbers, not its data reader
            self.sample_note.value = message_html(
                f"sample #{index} cannot be opened from this run: it was reopened from disk and keeps its results, "
                "not the dataset reader -- run the dataset again to open its samples", "warn")
            return None
        defaults = CompareOptions()
        options = (run.get("options") or defaults).replace(culprits=defaults.culprits, impact=defaults.impact)
        reference, candidate = result.reference, result.candidate
        what = f"sample #{index} ({row['source']})"
        of = self.state.run_of(result)
        label = f"{what} of dataset {of.tag if of is not None else 'run'}"
        self.sample_note.value = message_html(f"opening {what}: comparing it layer by layer...", "info")

        def work(progress, cancel):
            progress(0.0, f"reading {what}")
            sample = sample_at(dataset, index)
            if sample.sha256 != row["sha256"]:
                raise InputError(f"{what} is not what the run read: its content changed since",
                                 "run the dataset again")
            single = compare(model, reference, candidate, options, feeds=[sample.feed], cand_model=cand_model,
                             progress=progress, cancel=cancel)
            single.notes.append(f"dataset sample #{index}: {row['source']} (sha256 {row['sha256'][:12]})")
            return single

        def done(single):
            if self.result is not result:  # a new run replaced the result this sample belongs to
                return
            self.opened = index
            self.state.selected = ""
            opened = self.state.begin_run("comparison", label)  # the current comparison until another one
            self.state.end_run(opened, "done", single)
            self.sample_note.value = opened_html(single, what)
            self.state.request_show("errors")

        def failed(_e):
            if self.result is result:
                said = "cancelled" if self.sample_jobs.cancelled else "failed (the reason is above)"
                self.sample_note.value = message_html(f"opening {what} {said}", "warn")

        return self.sample_jobs.start("sample comparison", work, done, failed, replace=True)

    def _on_point(self, trace: Any, points: Any, _selector: Any) -> None:
        if not points.point_inds:
            return
        self.open_sample(int(trace.customdata[points.point_inds[0]]))

    # --- results ---------------------------------------------------------------------------------------------
    def show_result(self, result: Any) -> None:
        """Verdict, task aggregates, the worst samples (a button each), each layer across samples, each sample's
        task metric and where samples first diverge; None clears them all."""
        from ..plots.dataset import first_divergence_bars, layer_spread

        self.result = result
        self.sample_note.value = ""
        if result is None:
            for w in (self.summary, self.task_table, self.worst_title, self.layer_table, self.bars_note):
                w.value = ""
            self.worst_grid.children, self.worst_buttons = (), []
            self.scatter_box.children = ()
            for out in (self.spread, self.bars):
                clear(out)
            self.open_button.disabled = True
            self.results_box.layout.display = "none"
            return
        self.results_box.layout.display = ""
        run = self.state.run_of(result)
        self.summary.value = (message_html(run.tag, "info") if run is not None else "") + verdict_html(result)
        self.task_table.value = task_html(result)
        self._show_worst(result)
        indices = [s["index"] for s in result.samples]
        self.sample_index.max = max(indices, default=0)
        self.open_button.disabled = not indices
        show_figure(self.spread, layer_spread(result))
        self.layer_table.value = layers_html(result)
        if any(r["first_divergent_samples"] for r in result.layers):
            self.bars_note.value = ""
            show_figure(self.bars, first_divergence_bars(result))
        else:
            self.bars_note.value = message_html("no sample has a layer over the criterion", "ok")
            clear(self.bars)
        self._filling = True
        try:
            names = list(result.task)
            self.scatter_metric.options = names
            self.scatter_metric.value = names[0] if names else None
            self.scatter_metric.layout.display = "" if len(names) > 1 else "none"
        finally:
            self._filling = False
        self._draw_scatter()

    def _show_worst(self, result: Any) -> None:
        worst = result.worst()
        m = result.criterion.metric
        names = list(result.samples[0]["task"]) if result.samples else []
        headers = ["sample", *names, *(f"{o} {m}" for o in result.outputs), "first divergence", "its worst layers"]
        cells: list[widgets.Widget] = [widgets.HTML(f"<b>{html.escape(h)}</b>") for h in headers]
        self.worst_buttons = []
        failing = result.failing_indices()
        for s in worst:
            button = widgets.Button(description=f"#{s['index']} {s['source']}", icon="search",
                                    tooltip="compare this sample layer by layer (shown in Compare and Errors)",
                                    button_style="danger" if s["index"] in failing else "",
                                    layout=widgets.Layout(width="auto", max_width="360px"))
            button.on_click(lambda _b, index=s["index"]: self.open_sample(index))
            self.worst_buttons.append(button)
            cells.append(button)
            cells += [widgets.HTML(html.escape(fmt(s["task"].get(n)))) for n in names]
            cells += [widgets.HTML(html.escape(fmt_metric(decode_float((s["outputs"].get(o) or {}).get(m)), m)))
                      for o in result.outputs]
            cells.append(widgets.HTML(_TIGHT + (_layer_text(s.get("first_divergent"), m) or "no layer diverged")
                                      + "</div>"))
            cells.append(widgets.HTML('<div class="wb-small" style="line-height: 1.35">' + "<br>".join(
                _layer_text(w, m) for w in s.get("worst_layers") or []) + "</div>"))
        order = f"by {names[0]}, worst first" if names else "by how far the worst output is past the criterion"
        self.worst_title.value = (f'<div class="wb-h">The {len(worst)} worst sample(s) ({html.escape(order)}): '
                                  "click one to compare it layer by layer</div>")
        self.worst_grid.layout.grid_template_columns = f"repeat({len(headers)}, auto)"
        self.worst_grid.children = cells

    def _draw_scatter(self) -> None:

        from ..plots.dataset import sample_metric

        result = self.result
        if result is None:
            return
        fig = sample_metric(result, self.scatter_metric.value or None)
        fig.update_layout(height=360, clickmode="event")
        if self.scatter is None:
            self.scatter = figure_widget(fig)
        else:
            with self.scatter.batch_update():
                self.scatter.data = ()
                self.scatter.add_traces(list(fig.data))
                self.scatter.layout = fig.layout
        for trace in self.scatter.data:
            if trace.customdata is not None:
                trace.on_click(self._on_point)
        self.scatter_box.children = (self.scatter,)


#: a grid cell of several lines (widget HTML otherwise spaces lines at the widget row height)
_TIGHT = '<div style="line-height: 1.35">'


def _describe_object(obj: Any) -> str:
    if isinstance(obj, Mapping):
        return "one feed dict"
    try:
        size = f" of {len(obj)} sample(s)"
    except TypeError:
        size = " (length unknown until read)"
    return f"a {type(obj).__name__}{size}"


def _layer_text(layer: dict | None, metric: str) -> str:
    """``tensor (op, #k) metric value`` for a first-divergent or worst-layer entry of a sample row (HTML)."""
    if not layer:
        return ""
    value = fmt_metric(decode_float(layer.get("value")), metric)
    return (f"{html.escape(str(layer['tensor']))} ({html.escape(str(layer['op_type']))}, #{layer['topo_index']}) "
            f"{html.escape(metric)} {html.escape(value)}")


def _dataset_text(result: Any) -> str:
    d = result.dataset or {}
    kind = d.get("kind", "?")
    where = d.get("folder") or d.get("type") or ""
    text = f"{kind} {where}".strip() if kind != "python" else f"a Python {where}"
    return text + (f", preprocess {d['preprocess']}" if d.get("preprocess") else "")


def verdict_html(result: Any) -> str:
    """The verdict line (ok / DIVERGED: how many samples' outputs fail / FAILED: the task target is missed), what
    ran where, and the run's notes."""
    v = result.verdict()
    ex = result.executor or {}
    workers = f", {ex.get('workers')} workers" if ex.get("kind", "serial") != "serial" else ""
    address = f" at {ex['address']}" if ex.get("address") else ""
    timing = result.timing or {}
    lines = [f"<b>{html.escape(result.candidate)}</b> against <b>{html.escape(result.reference)}</b> on "
             f"{v['samples']} sample(s) ({html.escape(_dataset_text(result))}), {html.escape(ex.get('kind', 'serial'))}"
             f"{html.escape(workers + address)}, criterion: {html.escape(result.criterion.describe())}, "
             f"{html.escape(fmt(timing.get('total_s')))} s ({html.escape(fmt(timing.get('samples_per_s')))} "
             "samples/s)",
             message_html(f"{v['headline']}: {v['reason']}", "error" if v["failed"] else
                          "warn" if v["diverged"] else "ok")]
    lines += [message_html(n, "info") for n in result.notes]
    return "".join(lines)


def task_html(result: Any) -> str:
    """Each task metric across samples: mean, min, max, worst and the worst sample."""
    if not result.task:
        return message_html("no task metric chosen: samples are ranked by their outputs' error", "info")
    return table_html(["task metric", "mean", "min", "max", "worst", "worst sample", "better"],
                      [(name, a["mean"], a["min"], a["max"], a["worst"], f"#{a['worst_index']}",
                        "lower" if a["lower_is_better"] else "higher") for name, a in result.task.items()])


def layers_html(result: Any) -> str:
    """Every compared layer's judged metric across samples (mean, p95, worst) and how many samples diverge there."""
    m = result.criterion.metric
    rows = result.layers
    return ("<details><summary>Every compared layer across samples</summary>" + table_html(
        ["#", "tensor", "op", f"mean {m}", f"p95 {m}", f"worst {m}", "diverged in", "first diverged in"],
        [(r["topo_index"], r["tensor"], r["op_type"], fmt_metric(r["mean"], m), fmt_metric(r["p95"], m),
          fmt_metric(r["worst"], m), r["diverged_samples"], r["first_divergent_samples"]) for r in rows],
        classes=["first" if r["first_divergent_samples"] else "bad" if r["diverged_samples"] else "" for r in rows],
        empty="no layer compared") + "</details>")


def opened_html(single: Any, what: str) -> str:
    """What the opened sample's comparison says, and where to look."""
    v = single.verdict()
    first = single.first_divergent
    said = ("DIVERGED: " if v["diverged"] else "ok: ") + v["reason"]
    if first is not None:
        said += f"; first divergent: {first.node} ({first.op_type})"
    return message_html(f"{what} opened: {said}. Its layer-wise view is in the Compare and Errors panels.",
                        "error" if v["diverged"] else "ok")
