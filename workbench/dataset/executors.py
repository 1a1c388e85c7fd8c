"""Where samples run: in this process (serial), in N local worker processes, or on Ray (local or a cluster).

:func:`run_samples` takes the samples as a stream of chunks, keeps at most two chunks per worker in flight (so
memory does not grow with the dataset), and yields :class:`~workbench.dataset.evaluate.SampleRecord` in sample
order whatever order the workers finish in: every executor gives the same output as serial. A worker that dies is
reported in ``notes`` and its chunk retried once; a second death of the same chunk stops the run with a clear
:class:`~workbench.errors.EngineCrashedError`. Cancel (``steps.cancel``) stops the workers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..core.progress import Steps
from ..errors import EngineCrashedError, InputError
from .evaluate import Job, SampleRecord, evaluate_chunk

log = logging.getLogger(__name__)

Chunk = list[tuple[int, dict]]
RAY_HINT = "install it: pip install 'onnx-drift-workbench[ray]' (or pip install ray)"


@dataclass(frozen=True)
class ExecutorSpec:
    """``kind``: serial | processes | ray; ``address``: a Ray cluster (``ray://HOST:PORT``) or None (local)."""

    kind: str = "serial"
    workers: int = 1
    address: str | None = None
    requested: int | None = None  # the workers asked for, when more than this machine's cores (then capped)

    @classmethod
    def parse(cls, executor: str | None, workers: int | None) -> ExecutorSpec:
        """The executor for ``executor`` and ``workers``. Workers on this machine (processes, a local Ray) are
        capped at its usable cores: each runs engines on a core of its own, and more would only add memory."""
        n = 1 if workers is None else workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"workers must be a whole number >= 1, not {workers!r}", "write e.g. --workers 2")
        if executor is not None and not isinstance(executor, str):
            raise InputError(f"executor must be text, not a {type(executor).__name__}",
                             "use serial, processes, ray or ray://HOST:PORT")
        text = (executor or "").strip()
        if text in ("", "serial", "processes", "local"):
            if text == "serial" and n > 1:
                raise InputError("--executor serial runs one worker", "drop --workers, or use --executor processes")
            return cls("processes" if n > 1 or text in ("processes", "local") else "serial", n)._capped()
        if text == "ray":
            return cls("ray", n)._capped()
        if text.startswith("ray://"):
            if len(text) <= len("ray://") or any(ch.isspace() for ch in text):
                raise InputError(f"cannot read Ray address {text!r}", "write --executor ray://HOST:PORT")
            return cls("ray", n, text)
        raise InputError(f"unknown executor {text!r}", "use serial, processes, ray or ray://HOST:PORT")

    def _capped(self) -> ExecutorSpec:
        from dataclasses import replace

        cores = usable_cores()
        if self.kind == "serial" or self.workers <= cores:
            return self
        log.warning("%d workers asked for, %d cores here: running %d", self.workers, cores, cores)
        return replace(self, workers=cores, requested=self.workers)

    @property
    def note(self) -> str | None:
        """What a capped spec says in a result's notes."""
        if self.requested is None:
            return None
        return (f"{self.requested} workers asked for, this machine has {self.workers} usable core(s): ran "
                f"{self.workers} (more workers than cores only add memory)")

    def describe(self) -> dict:
        out = {"kind": self.kind, "workers": self.workers, "address": self.address}
        if self.requested is not None:
            out["requested"] = self.requested
        return out


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform says it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass
class _Pending:
    chunk: Chunk
    handle: object
    attempts: int = 1
    done: list[SampleRecord] | None = field(default=None)


def run_samples(job: Job, chunks: Iterable[Chunk], spec: ExecutorSpec, steps: Steps, *,
                local: Callable[[Chunk], list[SampleRecord]] | None = None,
                notes: list[str] | None = None) -> Iterator[SampleRecord]:
    """Records of every sample in ``chunks``, in order. ``local``: the serial evaluator (this process's
    sessions)."""
    notes = notes if notes is not None else []
    if spec.kind == "serial":
        for chunk in chunks:
            steps.check()
            yield from (local or (lambda c: evaluate_chunk(job, c)))(chunk)
        return
    backend = _Processes(spec.workers) if spec.kind == "processes" else _Ray(spec)
    try:
        yield from _ordered(backend, backend.share(job), iter(chunks), spec.workers, steps, notes)
    finally:
        backend.close()


class WorkerPool:
    """Local processes or Ray kept across several batches of work (repair's search rounds): started once, each
    job shared once. ``fn(job, chunk) -> list`` runs in the workers (a module-level function); :meth:`map` yields
    its results in chunk order, with the same retry-once and Cancel as :func:`run_samples`. ``what`` names the
    items in notes and errors."""

    def __init__(self, spec: ExecutorSpec, fn: Callable = evaluate_chunk, what: str = "samples"):
        if spec.kind == "serial":
            raise ValueError("a WorkerPool needs processes or Ray")
        self.spec, self.what = spec, what
        self.backend = _Processes(spec.workers, fn) if spec.kind == "processes" else _Ray(spec, fn)
        self._shared: dict = {}

    def map(self, job, chunks: Iterable[Chunk], steps: Steps, notes: list[str] | None = None) -> Iterator:
        if job.key not in self._shared:
            self._shared[job.key] = self.backend.share(job)
        yield from _ordered(self.backend, self._shared[job.key], iter(chunks), self.spec.workers, steps,
                            notes if notes is not None else [], self.what)

    def close(self) -> None:
        self._shared.clear()
        self.backend.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ordered(backend, job_handle, chunks: Iterator[Chunk], workers: int, steps: Steps,
             notes: list[str], what: str = "samples") -> Iterator[SampleRecord]:
    queue: collections.deque[_Pending] = collections.deque()
    exhausted = False
    while True:
        while not exhausted and len(queue) < 2 * workers:
            chunk = next(chunks, None)
            if chunk is None:
                exhausted = True
                break
            queue.append(_Pending(chunk, _submit(backend, job_handle, chunk)))
        if not queue:
            return
        head = queue[0]
        while True:
            steps.check()
            try:
                if head.handle is None:
                    raise _WorkerDied("the worker pool broke before these started")
                result = backend.result(head.handle, timeout=0.2)
            except TimeoutError:
                continue
            except _WorkerDied as died:
                _retry(backend, job_handle, queue, died, notes, what)
                continue
            break
        queue.popleft()
        yield from result


def _retry(backend, job_handle, queue: collections.deque[_Pending], died: _WorkerDied, notes: list[str],
           what: str = "samples") -> None:
    """A worker died: every chunk it may have held runs again, once."""
    head = queue[0]
    first, last = head.chunk[0][0], head.chunk[-1][0]
    if head.attempts >= 2:
        raise EngineCrashedError(f"a worker died twice evaluating {what} {first}-{last} ({died})",
                                 f"run those {what} serially (no --workers/--executor) to see the error",
                                 engine="dataset worker")
    notes.append(f"a worker died evaluating {what} {first}-{last} ({died}); retried once")
    log.warning(notes[-1])
    backend.restart()
    for p in queue:
        if p.handle is None:  # never reached a worker: not an attempt
            p.handle = _submit(backend, job_handle, p.chunk)
        elif backend.lost(p.handle):
            p.handle = _submit(backend, job_handle, p.chunk)
            p.attempts += 1


class _WorkerDied(Exception):
    pass


def _submit(backend, job_handle, chunk: Chunk):
    """The chunk's handle, or None when the pool broke (a worker died) before it could take it: the chunk then
    goes to the restarted pool with the others that worker's death lost."""
    try:
        return backend.submit(job_handle, chunk)
    except _WorkerDied:
        return None


class _Processes:
    """A pool of spawned local processes (fork is unsafe once engine threads run)."""

    def __init__(self, workers: int, fn: Callable = evaluate_chunk):
        self.workers, self.fn = workers, fn
        self.pool = self._pool()

    def _pool(self):
        """Workers that share this run's scratch folder and die with this process, even on SIGKILL
        (:func:`workbench.core.lifeline.worker_init`)."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from ..core import lifeline, scratch

        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=lifeline.worker_init,
                                   initargs=(scratch.for_child(), lifeline.from_main_thread()))

    def share(self, job: Job):
        return job

    def submit(self, job, chunk: Chunk):
        from concurrent.futures.process import BrokenProcessPool

        try:
            with _bare_main():
                return self.pool.submit(self.fn, job, chunk)
        except BrokenProcessPool as e:
            raise _WorkerDied(str(e) or "the process pool broke") from None

    def result(self, future, timeout: float):
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise TimeoutError from None
        except BrokenProcessPool as e:
            raise _WorkerDied(str(e) or "the process pool broke") from None

    def lost(self, future) -> bool:
        """After :meth:`restart`: a chunk whose future did not finish cleanly runs again in the new pool."""
        return future.cancelled() or not future.done() or future.exception() is not None

    def restart(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._pool()

    def close(self) -> None:
        for proc in list(getattr(self.pool, "_processes", {}).values()):
            if proc.is_alive():
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _bare_main():
    """Workers get models and arrays, never the caller's code: spawn them without re-running the caller's main
    script (a script without an ``if __name__ == "__main__"`` guard would otherwise start the run again in every
    worker). And with SIGINT blocked, which the workers inherit: Ctrl-C in a terminal reaches the whole process
    group, and only the caller should act on it (it stops the workers), not a worker half-way through starting
    (which would print its own traceback). A Ctrl-C meanwhile is delivered to the caller once unblocked."""
    import signal

    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    blocked = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocked else None
    try:
        yield
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if main is not None:
            sys.modules["__main__"] = main


class _Ray:
    """Ray tasks (one CPU each) on a local Ray it starts and stops, or on a running cluster (``ray://``)."""

    def __init__(self, spec: ExecutorSpec, fn: Callable = evaluate_chunk):
        try:
            import ray
        except ImportError:
            raise InputError("Ray is not installed", RAY_HINT) from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
            local = {} if spec.address else {"num_cpus": spec.workers, **_ray_temp()}
            self._sessions = _RaySessions(local.get("_temp_dir"))
            try:
                from ..core.lifeline import Terminated, handlers_kept

                with handlers_kept():
                    try:
                        if spec.address:
                            ray.init(address=spec.address, **kwargs)
                        else:
                            ray.init(**local, **kwargs)
                    except (SystemExit, KeyboardInterrupt) as e:  # Ray's SIGTERM handler while it starts: exit(15)
                        if isinstance(e, SystemExit) and e.code != signal.SIGTERM:
                            raise
                        with contextlib.suppress(Exception):  # the processes it started so far go with the run
                            ray.shutdown()
                        self._sessions.remove()
                        if isinstance(e, SystemExit):
                            raise Terminated() from None
                        raise
            except Exception as e:  # noqa: BLE001 - Ray raises many types; one line says what failed
                from ..variants.ort_session import first_line

                self._sessions.remove()
                hint = ("check the address and that the cluster runs the same Ray and Python versions" if spec.address
                        else "a local Ray could not start here (busy or short of memory?): try again, or use local "
                             "processes instead (--workers N without --executor ray)")
                raise InputError(f"cannot start Ray{' at ' + spec.address if spec.address else ''}: {first_line(e)}",
                                 hint) from None
            self.started = True
        self.remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        self.pending: set = set()

    def share(self, job: Job):
        from dataclasses import replace

        from .evaluate import ModelRef

        def shipped(ref: ModelRef) -> ModelRef:
            if ref.path is None:
                return ref
            from .._files import read_capped
            from ..model.load import MAX_MODEL_BYTES

            return ModelRef(blob=self.ray.put(read_capped(ref.path, MAX_MODEL_BYTES, "model file")))

        from ..core.lifeline import handlers_kept

        with handlers_kept():  # Ray's core worker may install its SIGTERM crash handler late (exit 15 or -6)
            return self.ray.put(replace(job, ref_model=shipped(job.ref_model), cand_model=shipped(job.cand_model)))

    def submit(self, job_ref, chunk: Chunk):
        from ..core.lifeline import handlers_kept

        with handlers_kept():
            ref = self.remote.remote(job_ref, chunk)
        self.pending.add(ref)
        return ref

    def result(self, ref, timeout: float):
        ray = self.ray
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            raise TimeoutError
        self.pending.discard(ref)
        try:
            return ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.LocalRayletDiedError) as e:
            raise _WorkerDied(type(e).__name__) from None
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None

    def lost(self, ref) -> bool:
        ready, _ = self.ray.wait([ref], timeout=0)
        if not ready:
            return False
        try:
            self.ray.get(ref)
        except (self.ray.exceptions.WorkerCrashedError, self.ray.exceptions.NodeDiedError,
                self.ray.exceptions.LocalRayletDiedError):
            return True
        except Exception:  # noqa: BLE001 - any other failure is reported when its turn comes
            return False
        return False

    def restart(self) -> None:
        pass

    def close(self) -> None:
        """Stop a Ray this started (its workers with it), else cancel what is still queued or running on the
        cluster (a cancelled or failed run). A local Ray is not force-cancelled first: a task whose reply arrives
        while it is being cancelled fails a check in Ray's core worker, which aborts the whole process (seen under
        load: "Tried to complete task that was not pending")."""
        if self.started:
            if self.pending:  # replies landing while Ray shuts down fail a check in its core worker (an abort,
                try:          # exit -6, skipping the run's cleanup): let the tasks in flight finish first, briefly
                    self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=SHUTDOWN_WAIT_S)
                except Exception:  # noqa: BLE001 - Ray already going down: shut it down anyway
                    pass
            self.pending.clear()
            self.ray.shutdown()
            self._sessions.remove()
            return
        for ref in self.pending:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished meanwhile, or the cluster is gone: nothing to stop
                pass
        self.pending.clear()


#: seconds a local Ray's shutdown waits for the tasks still in flight (a Cancel or Ctrl-C/SIGTERM mid-run)
SHUTDOWN_WAIT_S = 5.0

#: Linux's limit on a Unix socket's path (108 bytes with the NUL) and what Ray appends to its temp folder for its
#: longest socket: /session_YYYY-MM-DD_HH-MM-SS_ffffff_PID/sockets/plasma_store
_SOCKET_PATH_MAX = 107
_RAY_SOCKET_TAIL = len("/session_2026-01-01_00-00-00_000000_") + len("/sockets/plasma_store")


class _RaySessions:
    """The session folders a local Ray this process starts leaves in ``root`` (its ``_temp_dir``; None: inside the
    run's scratch folder, removed with it, or the user's RAY_TMPDIR, left alone): noted before Ray starts, removed
    after it stops. Ray names a session after the process that starts it (``session_<date>_<pid>``)."""

    def __init__(self, root: str | None):
        from ..core.scratch import run_scratch

        inside = root is not None and Path(root).resolve().is_relative_to(run_scratch().resolve())
        self.root = Path(root) if root is not None and not inside else None
        self.before = set(self._ours()) if self.root is not None else set()
        self.made_root = self.root is not None and not self.root.exists()  # removed too when left empty

    def _ours(self) -> list[Path]:
        return list(self.root.glob(f"session_*_{os.getpid()}")) if self.root is not None and self.root.is_dir() else []

    def remove(self) -> None:
        if self.root is None:
            return
        new = [p for p in self._ours() if p not in self.before]
        latest = self.root / "session_latest"
        with contextlib.suppress(OSError):
            if latest.is_symlink() and Path(os.readlink(latest)).name in {p.name for p in new}:
                latest.unlink()
        for p in new:
            shutil.rmtree(p, ignore_errors=True)
        if new:
            log.info("removed Ray's session folder(s) %s", ", ".join(str(p) for p in new))
        if self.made_root:
            with contextlib.suppress(OSError):  # only when empty: another run's Ray may be using it
                self.root.rmdir()


def _ray_temp() -> dict:
    """Where a local Ray this starts keeps its session (sockets, logs): inside this run's scratch folder, removed
    with it (a SIGKILLed run's too, by the next run), when its socket paths fit Linux's 107 bytes; else Ray's own
    choice ($RAY_TMPDIR, else the temp folder the user set, else /tmp; there the session folder this run's Ray made
is removed when it stops, :class:`_RaySessions`). Without this Ray would follow TMPDIR into
    the run folder and fail to start where the path is too long (a 6-digit pid under /tmp is enough)."""
    if os.environ.get("RAY_TMPDIR"):
        return {}  # the user's choice
    from ..core.scratch import run_scratch

    tail = _RAY_SOCKET_TAIL + len(str(os.getpid()))  # the session is named after the process that starts Ray
    inside = str(run_scratch() / "ray")
    if len(inside) + tail <= _SOCKET_PATH_MAX:
        return {"_temp_dir": inside}
    outer = str(run_scratch().parent)  # the temp folder the user set
    for base in (outer, "/tmp"):
        if len(os.path.join(base, "ray")) + tail <= _SOCKET_PATH_MAX and os.path.isdir(base):
            log.info("Ray's session folder goes to %s (the run's scratch folder %s is too deep for its sockets)",
                     os.path.join(base, "ray"), inside)
            return {"_temp_dir": os.path.join(base, "ray")}
    raise InputError(f"the temp folder {outer} is too deep for Ray's sockets (Linux allows {_SOCKET_PATH_MAX} bytes "
                     "for a socket path)", "set RAY_TMPDIR (or TMPDIR) to a short folder, e.g. /tmp")


def worker_threads(workers: int) -> int:
    """Engine threads per worker so that the workers together use the machine's cores once."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))
