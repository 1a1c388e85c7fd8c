"""Run an engine in a worker process, so a segfault, a hang or an out-of-memory kill cannot take the caller
(a notebook kernel, the CLI) down with it. A dead worker becomes an :class:`EngineCrashedError`; the next call
starts a fresh one and sessions prepared before are rebuilt there transparently.
"""

from __future__ import annotations

import logging
import pickle
import signal
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import onnx

from ..errors import EngineCrashedError, SpecError, WorkbenchError
from .base import Engine, Feeds, Session
from .serialize import ModelPayload, model_payload
from .worker import Worker, WorkerGone

log = logging.getLogger(__name__)

BUILDING = "building the engine"
RUNNING = "running the model"
CRASH_HINT = "rerun with --mode bisect or fewer marked tensors; the next call starts a new worker"


class IsolatedEngine(Engine):
    """Engine ``engine_name`` (a registry name, a spec or ``package.module:Class``) built from ``options`` (which
    must pickle) inside a "spawn" worker. Each call waits at most ``timeout_s``; ``memory_limit_bytes`` caps the
    worker's address space (RLIMIT_AS, POSIX only)."""

    def __init__(self, engine_name: str, options: dict | None = None, timeout_s: float = 600,
                 memory_limit_bytes: int | None = None):
        from . import engine_class, is_dotted_path

        self.engine_name = str(engine_name)
        self.options = dict(options or {})
        try:
            pickle.dumps(self.options)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SpecError(f"options for the isolated {engine_name} engine cannot be pickled ({e})",
                            "pass plain values (str, int, float, dict); objects stay in-process") from e
        self.timeout_s = timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        cls, defaults = engine_class(self.engine_name)
        self._cls, self._defaults = cls, {**defaults, **self.options}
        dotted = is_dotted_path(self.engine_name)
        self.name = cls.__name__ if dotted else self.engine_name.partition(":")[0]
        self._label = cls.__name__ if dotted else (cls.label.split(",")[0].split("(")[0].strip() or self.name)
        self.marks_all_cheaply = cls.marks_all_cheaply
        self.marking_changes_outputs = cls.marking_changes_outputs
        self._worker: Worker | None = None
        self._generation = 0
        self._lock = threading.RLock()
        self._described: dict = {}

    def availability(self) -> tuple[bool, str]:  # type: ignore[override]
        return self._cls.availability()

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        payload = model_payload(model)
        session = IsolatedSession(self, payload, list(dict.fromkeys(outputs)))
        session.bind()
        return session

    def describe(self) -> dict:
        with self._lock:
            if not self._described:
                self._described = self._call("describe", phase="describing itself")
            worker = self._worker
        return {**self._described, "isolated": True, "worker_pid": worker.process.pid if worker else None,
                "timeout_s": self.timeout_s, "memory_limit_bytes": self.memory_limit_bytes}

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __enter__(self) -> IsolatedEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, op: str, *args: Any, phase: str) -> Any:
        with self._lock:
            worker = self._ensure_worker()
            try:
                return worker.request((op, *args), self.timeout_s)
            except WorkerGone as gone:
                self._worker = None
                raise self._crash_error(gone, phase) from None
            except (KeyboardInterrupt, SystemExit):  # the request stopped the worker: nothing to close there
                self._worker = None
                raise

    def _ensure_worker(self) -> Worker:
        if self._worker is None or not self._worker.process.is_alive():
            if self._worker is not None:
                self._worker.stop()
            self._worker = Worker.start(self.engine_name, self.options, self.memory_limit_bytes)
            self._generation += 1
        return self._worker

    def _crash_error(self, gone: WorkerGone, phase: str) -> EngineCrashedError:
        who = f"the {self._label} worker"
        crash = partial(EngineCrashedError, engine=self._label)
        if gone.kind == "timeout":
            return crash(f"{who} did not finish {phase} within {self.timeout_s:g} s and was stopped",
                         "raise timeout_s, or rerun with --mode bisect or fewer marked tensors")
        if gone.kind == "memory":
            limit = f" (limit {self.memory_limit_bytes / 2**30:.2f} GiB)" if self.memory_limit_bytes else ""
            return crash(f"{who} ran out of memory{limit} while {phase}",
                         "raise memory_limit_bytes, use smaller inputs or mark fewer tensors")
        code = gone.exitcode
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            if sig == "SIGKILL":
                return crash(f"{who} was killed with SIGKILL while {phase} (most likely out of memory)",
                             "free memory or set memory_limit_bytes; " + CRASH_HINT)
            return crash(f"{who} crashed with {sig} while {phase}", CRASH_HINT)
        return crash(f"{who} exited unexpectedly (exit code {code}) while {phase}", CRASH_HINT)


class IsolatedSession(Session):
    """A session living in the worker; rebuilt there if the worker was replaced since it was prepared."""

    def __init__(self, engine: IsolatedEngine, payload: ModelPayload, outputs: list[str]):
        self._engine = engine
        self._payload = payload
        self.outputs = outputs
        self._sid: int | None = None
        self._generation = -1

    def bind(self) -> None:
        engine = self._engine
        with engine._lock:
            if self._sid is not None and self._generation == engine._generation and engine._worker is not None:
                return
            self._sid, engine._described = engine._call("prepare", self._payload.source, self.outputs,
                                                         phase=BUILDING)
            self._generation = engine._generation

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        engine = self._engine
        with engine._lock:
            self.bind()
            return engine._call("run", self._sid, dict(feeds), phase=RUNNING)

    def close(self) -> None:
        engine = self._engine
        with engine._lock:
            if self._sid is not None and self._generation == engine._generation and engine._worker is not None:
                try:
                    engine._call("close", self._sid, phase="closing a session")
                except WorkbenchError as e:
                    log.debug("closing an isolated session failed: %s", e)
            self._sid = None
        self._payload.close()
