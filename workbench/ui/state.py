"""What the panels share: the model, its inspection, the runs (:mod:`workbench.ui.runs`: every comparison,
calibration, repair, dataset run and engine inspection with its id and status), the current comparison,
calibration and engine graph, the selected node."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, HasTraits, Int, Unicode, observe

from ..errors import WorkbenchError
from ..inspection import inspect_model
from ..model.load import load_model
from .runs import Run, RunLog
from .runs import comparison_text as comparison_label

log = logging.getLogger(__name__)

#: how many finished comparisons the run history keeps
HISTORY_SIZE = 10


class WorkbenchState(HasTraits):
    """Observable state: panels watch it (``state.observe(fn, "result")``) instead of calling each other.

    ``selected`` is a node name (the graph, the error curve and the culprit list all set and follow it);
    ``engine_graph`` is the latest :class:`~workbench.engine_graphs.result.EngineGraph` inspected in the Engine tab
    (the graph view's provider, runtime precision, latency and fused-group overlays, Compare's fallback warning);
    ``show`` asks the enclosing :class:`~workbench.ui.Workbench` to bring a panel forward; ``input_shapes`` is the
    shapes field's text (``x:[1,3,?,?]``), prefilled from each model loaded and shared by Compare, Repair and
    Calibration. Panels set these on the kernel's thread only (see :mod:`workbench.ui.kernel_thread`)."""

    model = AnyTrait(None, allow_none=True)
    inspection = AnyTrait(None, allow_none=True)
    result = AnyTrait(None, allow_none=True)
    calibration = AnyTrait(None, allow_none=True)
    engine_graph = AnyTrait(None, allow_none=True)
    selected = Unicode("")
    show = Unicode("")
    output_dir = Unicode("")
    input_shapes = Unicode("")
    #: the finished comparisons of this session, oldest first (at most HISTORY_SIZE): pick two to diff them
    history = AnyTrait((), allow_none=False)
    #: every run of this session (a :class:`~workbench.ui.runs.RunLog`; replaced on each transition)
    runs = AnyTrait(None, allow_none=True)
    #: the user's colour thresholds (:class:`~workbench.plots.thresholds.Bands`), None: the current run's
    #: criterion's defaults (see :func:`workbench.ui.thresholds_box.bands_in_use`)
    bands = AnyTrait(None, allow_none=True)
    #: save each finished run into the runs folder (:mod:`workbench.ui.run_store`), to reopen after a restart
    autosave = Bool(True)
    #: the torch.nn.Module the model was exported from (None for an ONNX model) and its example inputs: the
    #: torch engines run the module itself (:meth:`model_for`)
    module: Any = None
    example_inputs: Any = None
    #: bumped (on the kernel's thread) each time a finished run has been saved there
    saved = Int(0)

    @classmethod
    def of(cls, source: Any = None, *, state: WorkbenchState | None = None, **load_kwargs: Any) -> WorkbenchState:
        """``state`` if given, else a new state on ``source`` (a path, ModelProto, LoadedModel, nn.Module)."""
        if state is not None:
            if source is not None and state.model is None:
                state.load(source, **load_kwargs)
            return state
        if isinstance(source, WorkbenchState):
            return source
        made = cls()
        if source is not None:
            made.load(source, **load_kwargs)
        return made

    def load(self, source: Any, **load_kwargs: Any) -> None:
        """Load a model (see :func:`workbench.load_model`); clears results made on the previous one."""
        from ..model.load import is_torch_module
        from .inputs_box import shapes_template

        model = load_model(source, **load_kwargs)
        # a torch.nn.Module is kept beside its export: the torch engines run the module itself
        self.module = source if is_torch_module(source) else None
        self.example_inputs = load_kwargs.get("example_inputs") if self.module is not None else None
        self.inspection = None
        self.result = None
        self.calibration = None
        self.engine_graph = None
        self.selected = ""
        self.input_shapes = shapes_template(model)
        self.model = model

    @observe("result")
    def _on_result(self, change: dict) -> None:
        result = change["new"]
        if result is not None and self.run_of(result) is None:  # set directly (a result opened, a dataset sample)
            self.runs, _ = self.log.start("comparison", comparison_label(result), result, status="done")
        self.remember(result)

    @observe("calibration", "engine_graph")
    def _on_value(self, change: dict) -> None:
        value, kind = change["new"], _KIND_OF[change["name"]]
        if value is not None and self.run_of(value) is None:
            self.runs, _ = self.log.start(kind, "", value, status="done")

    # --- runs ------------------------------------------------------------------------------------------------
    @property
    def log(self) -> RunLog:
        if self.runs is None:
            self.runs = RunLog(first=_next_run_id(self.model))
        return self.runs

    def begin_run(self, kind: str, label: str = "") -> Run:
        """A new run of ``kind`` starts: it becomes the current run of its kind, and the previous one's value
        (the comparison, calibration or engine graph) is dropped everywhere."""
        self.runs, run = self.log.start(kind, label)
        slot = _SLOT_OF.get(kind)
        if slot is not None:
            setattr(self, slot, None)
        return run

    def end_run(self, run: Run | int, status: str, result: Any = None, error: str = "") -> Run:
        """Run ``run`` ended ``status`` ("done" with its ``result``, "cancelled", "failed" with ``error``); a done
        run's result becomes the state's current one of its kind when the run is still the newest of its kind."""
        run_id = run if isinstance(run, int) else run.id
        self.runs, ended = self.log.end(run_id, status, result, error)
        slot = _SLOT_OF.get(ended.kind)
        if slot is not None and status == "done" and self.current_run(ended.kind) is ended:
            setattr(self, slot, result)
        if status == "done" and self.autosave:
            self._save(ended)
        return ended

    def _save(self, run: Run) -> None:
        """Save ``run`` into the runs folder on a worker thread; :attr:`saved` follows when it is there."""
        from .kernel_thread import on_kernel
        from .run_store import save_in_background

        def bump(_path: Any) -> None:
            on_kernel(lambda: setattr(self, "saved", self.saved + 1))

        save_in_background(run, self.model, then=bump)

    def current_run(self, kind: str) -> Run | None:
        """The newest run of ``kind`` (running, done, cancelled or failed), None before the first."""
        return self.log.latest(kind)

    def run_of(self, value: Any) -> Run | None:
        """The run whose result is ``value`` (a comparison, calibration, engine graph...), None if none."""
        return self.log.of_result(value) if self.runs is not None else None

    def remember(self, result: Any) -> None:
        """Add a finished comparison to :attr:`history` (the oldest dropped past HISTORY_SIZE)."""
        if result is None or any(r is result for r in self.history):
            return
        self.history = (*self.history, result)[-HISTORY_SIZE:]

    def request_show(self, panel: str) -> None:
        """Ask the enclosing Workbench to bring ``panel`` ("errors", "graph", ...) forward."""
        self.show = ""
        self.show = panel

    def require_model(self):
        if self.model is None:
            raise WorkbenchError("no model loaded", "pass a model: Workbench('model.onnx')")
        return self.model

    def inspect(self):
        """The model's inspection against the default targets, without runtime probes (cached)."""
        if self.inspection is None:
            self.inspection = inspect_model(self.require_model(), probe=False)
        return self.inspection

    def out_dir(self) -> Path:
        """Where exports go unless the user types a path: a fresh temporary folder, never the working directory."""
        if not self.output_dir:
            self.output_dir = tempfile.mkdtemp(prefix="workbench-")
            log.info("exports go to %s", self.output_dir)
        path = Path(self.output_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def model_for(self, *specs: Any) -> tuple[Any, dict[str, Any]]:
        """(model, extra keyword arguments) for a run of ``specs``: the torch.nn.Module this state was loaded from
        (with its ``example_inputs``) when a side runs a torch engine, else the loaded model."""
        from ..engines.spec import EngineSpec

        module = self.module
        if module is not None and any(EngineSpec.parse(str(s)).engine in ("torch", "torch-cuda") for s in specs):
            return module, {"example_inputs": self.example_inputs}
        return self.require_model(), {}

    def resolve_output(self, typed: str, default_name: str, *, what: str | None = None,
                       inputs: dict[str, Any] | None = None) -> Path:
        """An absolute output path: ``typed`` as given when absolute (``~`` expanded), else under :meth:`out_dir`.
        With ``what`` (how messages name it, e.g. "the cache path"), a file output is checked as the CLI checks
        its outputs: refused (one :class:`WorkbenchError`) when it is the loaded model or one of its weight files,
        a file of ``inputs`` ({label: path}, e.g. the calibration data), a folder, or not writable."""
        text = (typed or "").strip()
        path = Path(text).expanduser() if text else Path(default_name)
        path = path if path.is_absolute() else self.out_dir() / path
        if what is not None:
            from ..core.paths import Output, check_outputs

            model = getattr(self.model, "path", None)
            check_outputs([Output(what, str(path))], models={"the loaded model": model} if model else {},
                          inputs={k: v for k, v in (inputs or {}).items() if isinstance(v, (str, os.PathLike))
                                  and str(v).strip()})
        return path


#: the state trait holding the current value of a kind of run, and back
_SLOT_OF = {"comparison": "result", "calibration": "calibration", "engine": "engine_graph"}
_KIND_OF = {v: k for k, v in _SLOT_OF.items()}


def _next_run_id(model: Any) -> int:
    """1 + the highest number of the saved runs of ``model`` (1 without any): numbers go on across kernels."""
    from .run_store import saved_runs

    sha = getattr(model, "fingerprint", None)
    if not sha:
        return 1
    try:
        return 1 + max((r.run_id for r in saved_runs(sha)), default=0)
    except OSError:  # an unreadable runs folder: numbering from 1 is still right for this session
        return 1
