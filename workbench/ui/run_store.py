"""Runs that survive a kernel restart: every finished comparison, calibration, repair and dataset run of the
Workbench is saved as a bundle (:mod:`workbench.report.bundle` and its calibration / dataset / repair siblings)
into a per-user runs folder, and a later Workbench on the same model lists them and reopens one.

The folder is ``$WORKBENCH_RUNS_DIR``, else ``onnx-drift-workbench/runs`` in the user's cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache``; ``%LOCALAPPDATA%`` on Windows, ``~/Library/Caches`` on macOS), never the
working directory. Each run is a folder ``STAMP-KIND-ID/`` holding ``run.json`` (what it was: kind, label, the
model's sha256, when) and ``bundle/``; it is built under a temporary name and renamed into place, so a reader never
sees half a run. Only the newest ``$WORKBENCH_RUNS_KEEP`` (default 10) are kept; 0 turns saving off. A model over
``$WORKBENCH_RUNS_COPY_MB`` (default 200 MB) is not copied into each bundle: comparisons and calibrations keep its
path and sha256 (reopening needs no model), dataset and repair runs of it are not saved.

Saving runs on a worker thread (a bundle copies the model and the feeds); :func:`wait_saved` waits for it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .._user_cache import APP, user_cache_dir

log = logging.getLogger(__name__)

RUNS_ENV = "WORKBENCH_RUNS_DIR"
KEEP_ENV = "WORKBENCH_RUNS_KEEP"
KEEP = 10
COPY_ENV = "WORKBENCH_RUNS_COPY_MB"
COPY_MB = 200
SCHEMA = "workbench.saved_run/1"
INDEX = "run.json"
BUNDLE = "bundle"
#: the kinds of run saved (an engine inspection is not a result of its own)
SAVED_KINDS = ("comparison", "calibration", "repair", "dataset")

_PENDING: set[threading.Thread] = set()
_LOCK = threading.Lock()


def runs_dir() -> Path:
    """Where runs are saved: ``$WORKBENCH_RUNS_DIR`` or the user cache's ``onnx-drift-workbench/runs``."""
    env = os.environ.get(RUNS_ENV, "").strip()
    return Path(env).expanduser() if env else user_cache_dir() / APP / "runs"


def keep_count() -> int:
    """How many saved runs are kept (``$WORKBENCH_RUNS_KEEP``, default 10; 0: none are saved)."""
    try:
        return max(0, int(os.environ.get(KEEP_ENV, KEEP)))
    except ValueError:
        return KEEP


def copy_limit() -> int:
    """The largest model (bytes) copied into a saved run's bundle (``$WORKBENCH_RUNS_COPY_MB``, default 200)."""
    try:
        return int(float(os.environ.get(COPY_ENV, COPY_MB)) * 1e6)
    except ValueError:
        return COPY_MB * 1_000_000


def model_bytes(model: Any) -> int:
    """The size of ``model``'s files (its .onnx and external data), else of its proto."""
    path = getattr(model, "path", None)
    if path is not None and Path(path).is_file():
        files = [Path(path), *(getattr(model, "external_files", None) or [])]
        return sum(Path(f).stat().st_size for f in files if Path(f).is_file())
    proto = getattr(model, "proto", None)
    return proto.ByteSize() if proto is not None else 0


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A run saved in the runs folder: ``path`` (its folder), what ``run.json`` says of it."""

    path: Path
    kind: str
    label: str
    run_id: int
    model_sha256: str
    model_name: str
    created: str
    summary: str = ""

    @property
    def bundle(self) -> Path:
        return self.path / BUNDLE

    def describe(self) -> str:
        """``run #3 comparison, 2026-11-27 03:50 UTC: LABEL``."""
        when = self.created.replace("T", " ").replace("Z", " UTC")
        return (f"run #{self.run_id} {self.kind}, {when}" + (f": {self.label}" if self.label else "")
                + (f" ({self.summary})" if self.summary else ""))


def summary_of(kind: str, value: Any) -> str:
    """A few words on a result: its verdict."""
    try:
        if kind == "dataset":
            return value.verdict()["headline"]
        if kind == "comparison":
            return "DIVERGED" if value.diverged else "ok"
        if kind == "repair":
            return "target met" if value.met else "target not reached"
        if kind == "calibration":
            return f"{value.method}, {len(value.tensors)} tensors"
    except Exception:  # noqa: BLE001 - a summary is a courtesy
        return ""
    return ""


# --- saving -----------------------------------------------------------------------------------------------------
def write_bundle(kind: str, value: Any, dest: Path, copy_model: bool = True) -> Path:
    """Save ``value`` (a run's result of ``kind``) as the bundle ``dest`` with the API of its kind (``copy_model``
    False: a comparison or calibration bundle keeps the model's path and sha256 only)."""
    if kind == "comparison":
        from ..report.bundle import save_bundle

        return save_bundle(value, dest=dest, copy_model=copy_model)
    if kind == "calibration":
        from ..calibrate.bundle import save_calibration_bundle

        return save_calibration_bundle(value, dest, copy_model=copy_model)
    if not copy_model:
        raise ValueError(f"the model is over {copy_limit() / 1e6:g} MB (${COPY_ENV}): a {kind} run of it is not "
                         "saved (its bundle would copy it)")
    if kind == "dataset":
        from ..dataset.bundle import save_dataset_bundle

        return save_dataset_bundle(value, dest)
    if kind == "repair":  # the reference vs the repaired model, rerunnable; the repair itself goes in run.json
        return value.save_bundle(dest)
    raise ValueError(f"runs of kind {kind!r} are not saved")


def save_run(run: Any, model: Any, folder: Path | None = None) -> Path:
    """Save finished run ``run`` (a :class:`~workbench.ui.runs.Run`) of ``model`` (a LoadedModel) into the runs
    folder; returns the run's folder. The oldest runs past :func:`keep_count` are removed."""
    folder = Path(folder) if folder is not None else runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    # sortable by when the run started, to the microsecond (several runs a second keep their order)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(run.started)) + f"{int(run.started * 1e6) % 1_000_000:06d}Z"
    name = f"{stamp}-{run.kind}-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder))
    try:
        write_bundle(run.kind, run.result, tmp / BUNDLE, copy_model=model_bytes(model) <= copy_limit())
        doc = {"schema": SCHEMA, "kind": run.kind, "label": run.label, "run_id": run.id,
               "model": {"sha256": getattr(model, "fingerprint", ""), "name": getattr(model, "name", "")},
               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started)),
               "summary": summary_of(run.kind, run.result), "bundle": BUNDLE}
        if run.kind == "repair":
            doc["repair"] = run.result.to_json()
        (tmp / INDEX).write_text(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, folder / name)  # the whole run appears at once
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(folder)
    return folder / name


def save_in_background(run: Any, model: Any, then: Any = None) -> threading.Thread | None:
    """:func:`save_run` on a worker thread (a failure is logged: the run itself stays); ``then(path)`` follows
    a save. None when saving is off (:func:`keep_count` is 0) or ``run`` is no saved kind."""
    if keep_count() == 0 or run.kind not in SAVED_KINDS or run.result is None or model is None:
        return None

    folder = runs_dir()  # where it is now: the setting may change before the thread runs

    def work() -> None:
        try:
            path = save_run(run, model, folder)
            log.info("%s saved to %s", run.tag, path)
            if then is not None:
                then(path)
        except Exception as e:  # noqa: BLE001 - a run that cannot be saved still shows
            log.warning("%s (%s) not saved for reopening after a restart: %s", run.tag, run.kind, e)
        finally:
            with _LOCK:
                _PENDING.discard(threading.current_thread())

    thread = threading.Thread(target=work, name=f"save-run-{run.id}", daemon=True)
    with _LOCK:
        _PENDING.add(thread)
    thread.start()
    return thread


def wait_saved(timeout: float = 60.0) -> bool:
    """Block until every run being saved is saved (or ``timeout`` passed); True when none is left."""
    deadline = time.monotonic() + timeout
    while True:
        with _LOCK:
            pending = list(_PENDING)
        if not pending:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        pending[0].join(left)


# --- listing and reopening --------------------------------------------------------------------------------------
def _read(path: Path) -> SavedRun | None:
    try:
        doc = json.loads((path / INDEX).read_text(encoding="utf-8"))
        if doc.get("schema") != SCHEMA or doc.get("kind") not in SAVED_KINDS:
            return None
        model = doc.get("model") or {}
        return SavedRun(path=path, kind=doc["kind"], label=str(doc.get("label") or ""),
                        run_id=int(doc.get("run_id") or 0), model_sha256=str(model.get("sha256") or ""),
                        model_name=str(model.get("name") or ""), created=str(doc.get("created") or ""),
                        summary=str(doc.get("summary") or ""))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def saved_runs(model_sha256: str | None = None, folder: Path | None = None) -> list[SavedRun]:
    """The saved runs (of the model with ``model_sha256`` when given), newest first; unreadable ones skipped."""
    folder = Path(folder) if folder is not None else runs_dir()
    if not folder.is_dir():
        return []
    runs = [r for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            for r in [_read(p)] if r is not None]
    if model_sha256 is not None:
        runs = [r for r in runs if r.model_sha256 == model_sha256]
    return sorted(runs, key=lambda r: r.path.name, reverse=True)


def prune(folder: Path | None = None, keep: int | None = None) -> None:
    """Remove all but the newest ``keep`` saved runs (and temporaries of saves that died over an hour ago)."""
    folder = Path(folder) if folder is not None else runs_dir()
    keep = keep_count() if keep is None else keep
    entries = sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.name, reverse=True)
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in folder.glob(".*.tmp"):
        try:
            if time.time() - tmp.stat().st_mtime > 3600:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


def open_saved(saved: SavedRun) -> Any:
    """The result ``saved`` holds, read back from its bundle (sealed and checked): a CompareResult, a
    CalibrationReport, a DatasetResult or a RepairResult."""
    from ..report.bundle import RESULTS, load_bundle
    from ..report.safety import confined, read_json

    with load_bundle(saved.bundle) as bundle:
        if saved.kind == "comparison":
            return bundle.result
        doc = read_json(confined(bundle.root, bundle.manifest.get("results", RESULTS), "manifest 'results'"),
                        f"{saved.path.name}: results.json")
    if saved.kind == "calibration":
        from ..calibrate.report import CalibrationReport

        return CalibrationReport.from_json(doc)
    if saved.kind == "dataset":
        return dataset_from_json(doc)
    return repair_from_json(json.loads((saved.path / INDEX).read_text(encoding="utf-8"))["repair"])


def dataset_from_json(doc: dict) -> Any:
    """A :class:`~workbench.dataset.result.DatasetResult` from its JSON (without what reruns it)."""
    from ..compare.criterion import Criterion
    from ..core.floats import decode_float, decode_metrics
    from ..dataset.result import DatasetResult
    from ..dataset.task_target import TaskTarget

    worst = {s["index"]: s.get("worst_layers", []) for s in doc.get("worst") or []}
    # the samples' badness (how far past the criterion) is not written: the worst samples' order stands for it
    rank = {s["index"]: len(worst) - i for i, s in enumerate(doc.get("worst") or [])}
    samples = [{**s, "badness": float(rank.get(s["index"], 0)),
                "outputs": {k: decode_metrics(v) for k, v in (s.get("outputs") or {}).items()},
                "task": {k: decode_float(v) for k, v in (s.get("task") or {}).items()},
                "worst_layers": worst.get(s["index"], [])} for s in doc["samples"]]
    task = {k: {kk: decode_float(vv) for kk, vv in v.items()} for k, v in (doc.get("task") or {}).items()}
    layers = [{k: decode_float(v) for k, v in row.items()} for row in doc.get("layers") or []]
    metrics = list(doc.get("metrics") or [])
    lower = {m for m, a in task.items() if isinstance(a, dict) and a.get("lower_is_better")}
    return DatasetResult(
        reference=doc["reference"], candidate=doc["candidate"], criterion=Criterion.from_json(doc["criterion"]),
        samples=samples, task=task, layers=layers, outputs=list(doc.get("outputs") or []),
        worst_count=len(doc.get("worst") or []) or 5,
        lower_is_better=lower, dataset=doc.get("dataset") or {},
        executor=doc.get("executor") or {}, model=doc.get("model") or {}, engines=doc.get("engines") or {},
        variant=doc.get("variant") or {}, precision=doc.get("precision") or {}, metrics=metrics,
        timing=doc.get("timing") or {}, notes=list(doc.get("notes") or []),
        task_target=TaskTarget.from_json(doc["task_target"]) if doc.get("task_target") else None)


def repair_from_json(doc: dict) -> Any:
    """A :class:`~workbench.repair.result.RepairResult` from its JSON (without the repaired ModelProto)."""
    from ..repair.result import RepairResult

    names = {f.name for f in dataclasses.fields(RepairResult)} - {"model", "plan", "model_path"}
    return RepairResult(model_path=doc.get("model"), **{k: v for k, v in doc.items() if k in names})
