"""The worker process behind :class:`~workbench.engines.isolated.IsolatedEngine`: its parent-side handle and
the request loop it runs (build the engine, then answer prepare/run/close/describe)."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import multiprocessing
import os
import sys
import threading
import types
import weakref
from collections.abc import Iterator
from multiprocessing.connection import wait
from typing import Any

import onnx

from ..errors import EngineRunError, WorkbenchError
from .base import Session

log = logging.getLogger(__name__)


class WorkerGone(Exception):
    """The worker stopped answering: ``kind`` is "died" (see ``exitcode``), "timeout" or "memory"."""

    def __init__(self, kind: str, exitcode: int | None = None):
        super().__init__(kind)
        self.kind, self.exitcode = kind, exitcode


class Worker:
    """The worker process and the parent's end of its pipe."""

    def __init__(self, process, conn):
        self.process, self.conn = process, conn
        self._finalizer = weakref.finalize(self, _terminate, process, conn)

    @classmethod
    def start(cls, engine_name: str, options: dict, memory_limit: int | None) -> Worker:
        from ..core import lifeline, scratch

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        lifeline_args = (scratch.for_child(), lifeline.from_main_thread())
        process = ctx.Process(target=_worker_main, args=(child, engine_name, options, list(sys.path), memory_limit,
                                                         lifeline_args),
                              name=f"workbench-{engine_name}", daemon=True)
        with _START_LOCK, _plain_main():
            process.start()
        child.close()
        log.debug("started %s worker pid %s", engine_name, process.pid)
        return cls(process, parent)

    def request(self, message: tuple, timeout_s: float) -> Any:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._gone() from None
        try:
            ready = wait([self.conn, self.process.sentinel], timeout_s)
            if not ready:
                self.stop(graceful=False)
                raise WorkerGone("timeout")
            if self.conn not in ready and not self.conn.poll():
                raise self._gone()
            try:
                status, *payload = self.conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                raise self._gone() from None
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM mid-request: the worker may be busy for long
            self.stop(graceful=False)  # and its reply would come out of turn; stop it now, not after its work
            raise
        if status == "ok":
            return payload[0]
        if status == "memory":
            self.stop(graceful=False)
            raise WorkerGone("memory")
        module, qualname, message_text, hint = payload
        raise _rebuild_error(module, qualname, message_text, hint)

    def _gone(self) -> WorkerGone:
        self.process.join(5)
        if self.process.exitcode is None:
            self.stop(graceful=False)
        return WorkerGone("died", self.process.exitcode)

    def stop(self, graceful: bool = True) -> None:
        """Ask the worker to exit (killing it after 1 s), or kill it at once."""
        if not graceful and self.process.is_alive():
            self.process.kill()
        self._finalizer()


_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _plain_main() -> Iterator[None]:
    """Start the worker without re-running the caller's ``__main__`` (a script without a ``__name__`` guard, a
    notebook launcher): the worker only needs importable modules, so spawn sees an empty main module."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _terminate(process, conn) -> None:
    try:
        if process.is_alive():
            try:
                conn.send(("stop",))
            except OSError:
                pass
            process.join(1)
        if process.is_alive():
            process.kill()
            process.join(5)
    finally:
        conn.close()


def _rebuild_error(module: str, qualname: str, message: str, hint: str | None) -> WorkbenchError:
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        cls = EngineRunError
    if not (isinstance(cls, type) and issubclass(cls, WorkbenchError)):
        cls = EngineRunError
    return cls(message, hint)


def _worker_main(conn, engine_name: str, options: dict, sys_path: list[str], memory_limit: int | None,
                 lifeline_args: tuple = ()) -> None:
    """The worker loop: build the engine, then answer prepare/run/close/describe until told to stop. The worker
    ignores Ctrl-C (its parent stops it) and dies with its parent (:func:`workbench.core.lifeline.worker_init`)."""
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    from ..core.lifeline import worker_init

    worker_init(*lifeline_args)
    if memory_limit:
        _limit_memory(memory_limit)
    from . import get_engine

    engine = None
    sessions: dict[int, Session] = {}
    ids = itertools.count(1)
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if op == "stop":
            return
        try:
            engine = engine or get_engine(engine_name, **options)
            if op == "prepare":
                source, outputs = args
                model = onnx.load(source) if isinstance(source, str) else onnx.load_from_string(source)
                sid = next(ids)
                sessions[sid] = engine.prepare(model, outputs)
                reply = (sid, engine.describe())
            elif op == "run":
                reply = sessions[args[0]].run(args[1])
            elif op == "close":
                reply = sessions.pop(args[0]).close()
            else:
                reply = engine.describe()
            conn.send(("ok", reply))
        except MemoryError:
            sessions.clear()
            conn.send(("memory",))
            os._exit(3)
        except WorkbenchError as e:
            conn.send(("error", type(e).__module__, type(e).__qualname__, e.message, e.hint))
        except Exception as e:  # noqa: BLE001 - the worker boundary: anything else becomes one EngineRunError
            text = " ".join(str(e).split())[:400]
            conn.send(("error", "workbench.errors", "EngineRunError", f"{type(e).__name__}: {text}",
                       "see the worker's log output above"))


def _limit_memory(limit: int) -> None:
    try:
        import resource
    except ImportError:
        log.warning("memory_limit_bytes is not supported on this platform; running without a limit")
        return
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
