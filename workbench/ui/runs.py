"""The workbench's runs: every comparison, calibration, repair, dataset run and engine inspection gets an id
(#1, #2, ...), a kind and a status (running / done / cancelled / failed) with its result once done. Start,
Cancel, a failure and a new run are transitions of one :class:`RunLog` the panels share, so every view is derived
from the current run of its kind and can say which run its numbers come from."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

KINDS = ("comparison", "calibration", "repair", "dataset", "engine")
STATUSES = ("running", "done", "cancelled", "failed")


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: ``id`` (N, N+1, ... in this session, all kinds together, after the model's saved runs),
    ``kind``, ``status``, what ran (``label``), when it started (``started``, seconds since the epoch) and its
    ``result`` once done."""

    id: int
    kind: str
    label: str
    status: str = "running"
    result: Any = None
    error: str = ""
    started: float = dataclasses.field(default_factory=time.time)
    #: where a run reopened from a saved bundle came from (the saved run's name; see workbench.ui.run_store)
    source: str = ""

    @property
    def tag(self) -> str:
        """``run #N`` (``run #N, reopened from SOURCE`` for a run reopened from a saved bundle)."""
        return f"run #{self.id}" + (f", reopened from {self.source}" if self.source else "")

    def describe(self) -> str:
        """``run #3 (comparison, cancelled): LABEL``."""
        return f"{self.tag} ({self.kind}, {self.status})" + (f": {self.label}" if self.label else "")


class RunLog:
    """The runs of a session, oldest first (immutable :class:`Run` records; each transition replaces one)."""

    def __init__(self, runs: tuple[Run, ...] = (), first: int = 1) -> None:
        self.runs = tuple(runs)
        #: the first run's number: after the saved runs of the model (a kernel restart does not start again at
        #: #1, which gave two saved runs the same label)
        self.first = first

    def start(self, kind: str, label: str = "", result: Any = None, status: str = "running",
              source: str = "") -> tuple[RunLog, Run]:
        if kind not in KINDS:
            raise ValueError(f"no run kind {kind!r}; use one of {', '.join(KINDS)}")
        run = Run(id=self.first + len(self.runs), kind=kind, label=label, status=status, result=result,
                  source=source)
        return RunLog((*self.runs, run), self.first), run

    def end(self, run_id: int, status: str, result: Any = None, error: str = "") -> tuple[RunLog, Run]:
        if status not in STATUSES[1:]:
            raise ValueError(f"a run ends done, cancelled or failed, not {status!r}")
        old = self.get(run_id)
        if old is None:
            raise KeyError(f"no run #{run_id}")
        new = dataclasses.replace(old, status=status, result=result if status == "done" else None, error=error)
        return RunLog(tuple(new if r.id == run_id else r for r in self.runs), self.first), new

    def get(self, run_id: int) -> Run | None:
        return next((r for r in self.runs if r.id == run_id), None)

    def latest(self, kind: str) -> Run | None:
        """The newest run of ``kind`` whatever its status (the current one)."""
        return next((r for r in reversed(self.runs) if r.kind == kind), None)

    def of_result(self, result: Any) -> Run | None:
        """The run whose result is ``result`` (by identity)."""
        if result is None:
            return None
        return next((r for r in reversed(self.runs) if r.result is result), None)


def candidate_text(result: Any) -> str:
    """The candidate as the user knows it: their own file by name on its engine ("my_fp16.onnx on ort") when the
    result ran one, else the spec ("ort:fp16")."""
    variant = getattr(result, "variant", None) or {}
    if variant.get("variant") == "user model" and variant.get("file"):
        return f"{variant.get('file')} on {result.candidate}"
    return str(result.candidate)


def inputs_text(result: Any) -> str:
    """What a comparison was fed: ``shapes x:[1,3,64,64]`` (when set), the feed source and count."""
    feeds = getattr(result, "feeds", None) or {}
    shapes = feeds.get("shapes")
    parts = []
    if shapes:
        parts.append("shapes " + " ".join(f"{k}:[{','.join(str(d) for d in v)}]" if isinstance(v, (list, tuple))
                                          else f"{k}:{v}" for k, v in dict(shapes).items()))
    else:
        parts.append("the model's shapes")
    source, count = feeds.get("source"), feeds.get("count")
    if source:
        parts.append(f"{count} {source} feed(s)" if count is not None else f"{source} feeds")
    return ", ".join(parts)


def comparison_text(result: Any) -> str:
    """``CANDIDATE vs REFERENCE, INPUTS`` ("" for something that is no comparison result)."""
    if not hasattr(result, "candidate") or not hasattr(result, "reference"):
        return ""
    return f"{candidate_text(result)} vs {result.reference}, {inputs_text(result)}"


def no_result_text(state: Any, what: str = "comparison", where: str = "the Compare panel") -> str:
    """Why there is no current ``what``: none yet, one running, or the newest one cancelled or failed."""
    run = state.current_run(what)
    if run is None:
        return f"no {what} yet: run one in {where}"
    if run.status == "running":
        return f"{run.tag} ({what}) is running: its results show here when it is done"
    if run.status in ("cancelled", "failed"):
        return (f"{run.tag} ({what}) {run.status}: no current {what} (the previous run's results were cleared); "
                f"run one again in {where}")
    return f"no current {what}: run one in {where}"
