"""One scratch folder per run: every temporary of a process lives under ``$TMPDIR/workbench-run-HOST-PID-RAND/``.

:func:`run_scratch` creates that folder on first use (and holds a lock on it for the life of the process);
:func:`scratch_dir` and :func:`temporary_dir` make private folders inside it. :func:`cleanup` removes it, at exit
(atexit) and on the CLI's Ctrl-C/SIGTERM exit, before ``os._exit``. A SIGKILL leaves only that folder: the next run
removes it once its owner is gone (:func:`sweep_stale`: this host, a dead pid, its lock free).

Temporaries that must sit beside an output (staged for an atomic rename, named by :func:`workbench._atomic.temp_prefix`)
are registered with :func:`track` while they exist, so that an interrupted run removes them too.
Worker processes :func:`adopt` their parent's folder, so one run keeps one folder however many processes it has.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from .._atomic import _HOST, _alive
from .._atomic import remove_path as _remove

log = logging.getLogger(__name__)

RUN_PREFIX = "workbench-run-"
LOCK_FILE = ".lock"
_RUN_NAME = re.compile(rf"{RUN_PREFIX}(?P<host>[0-9a-f]{{6}})-(?P<pid>\d+)-[a-z0-9_]+$")

_lock = threading.RLock()
_run: Path | None = None
_owner: int | None = None  # the pid that created the folder (None: adopted from a parent)
_owned: list[tuple[Path, int | None]] = []  # the folders this process made, with their lock's fd
_tracked: set[str] = set()
_exit_hook: list = []  # cleanup registered with atexit (once)


def run_scratch() -> Path:
    """This run's scratch folder in the temp folder (created on first use; again if someone removed it, or in a
    new temp folder when ``tempfile.tempdir`` was changed since)."""
    global _run, _owner
    with _lock:
        base = tempfile.gettempdir()
        if _run is not None and (_owner is None or _owner == os.getpid()) and _run.is_dir() \
                and (_owner is None or base in (str(_run), str(_run.parent))):
            return _run
        if _owner is not None and _owner != os.getpid():  # a forked child: the parent's folders are not ours
            _owned.clear()
        sweep_stale(base)
        folder = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{_HOST}-{os.getpid()}-", dir=base))
        _owned.append((folder, _hold_lock(folder)))
        _run, _owner = folder, os.getpid()
        if not _exit_hook:
            atexit.register(cleanup)
            _exit_hook.append(cleanup)
        log.debug("scratch folder of this run: %s", folder)
        return folder


def scratch_dir(prefix: str = "workbench-") -> Path:
    """A new private folder inside this run's scratch folder (the caller removes it when done; the run's
    cleanup removes it in any case)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=run_scratch()))


def temporary_dir(prefix: str = "workbench-") -> tempfile.TemporaryDirectory:
    """:class:`tempfile.TemporaryDirectory` inside this run's scratch folder (a context manager, ``.cleanup()``)."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=run_scratch())


def for_child() -> str:
    """The folder a worker process should :func:`adopt` (created now if need be)."""
    return str(run_scratch())


def adopt(folder: str | None) -> None:
    """In a worker process: use the parent's run folder (never removed by this process) for every temporary,
    third-party ones included (``tempfile.tempdir``)."""
    global _run, _owner
    if not folder or not os.path.isdir(folder):
        return
    with _lock:
        _run, _owner = Path(folder), None
    tempfile.tempdir = folder
    os.environ["TMPDIR"] = folder


@contextlib.contextmanager
def as_tempdir() -> Iterator[Path]:
    """While inside: ``tempfile`` (and child processes, through ``TMPDIR``) put their temporaries in the run
    folder, so that third-party ones (ONNX Runtime's quantization, multiprocessing) go with it too."""
    folder = run_scratch()
    saved, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(folder), str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


def track(path: str | os.PathLike) -> None:
    """Remember a temporary beside an output (a staging file or folder): :func:`cleanup` removes it if it is
    still there."""
    with _lock:
        _tracked.add(os.fspath(path))


def untrack(path: str | os.PathLike) -> None:
    """The temporary was renamed into place or removed: forget it."""
    with _lock:
        _tracked.discard(os.fspath(path))


def cleanup() -> None:
    """Remove the tracked temporaries beside outputs and the run folders this process made."""
    global _run, _owner
    with _lock:
        for path in sorted(_tracked):
            _remove(path)
        _tracked.clear()
        if _owner is None or _owner != os.getpid():  # adopted, or a forked child's copy of the parent's state
            return
        folders = [folder for folder, _ in _owned]
        for folder, fd in _owned:
            if tempfile.tempdir == str(folder):
                tempfile.tempdir = None
            shutil.rmtree(folder, ignore_errors=True)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        _owned.clear()
        _run = _owner = None
        if folders:
            log.debug("removed the scratch folder(s) %s", ", ".join(map(str, folders)))


def sweep_stale(base: str | os.PathLike | None = None) -> list[Path]:
    """Remove run folders in ``base`` (default: the temp folder) left by killed runs of this host: their pid is
    dead and nobody holds their lock. Returns what was removed."""
    base = tempfile.gettempdir() if base is None else base
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(RUN_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        match = _RUN_NAME.match(entry.name)
        if not match or match["host"] != _HOST or int(match["pid"]) == os.getpid() or _alive(int(match["pid"])):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or _locked(Path(entry.path)):
                continue
            shutil.rmtree(entry.path)
        except OSError as e:
            log.debug("stale run folder %s not removed: %s", entry.path, e)
            continue
        log.info("removed %s: the run that made it is gone", entry.path)
        removed.append(Path(entry.path))
    return removed


def _hold_lock(folder: Path) -> int | None:
    """Lock ``folder/.lock`` for the life of this process (the kernel drops it when the process dies)."""
    try:
        import fcntl
    except ImportError:  # Windows: the pid check alone decides
        return None
    try:
        fd = os.open(folder / LOCK_FILE, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        log.debug("no lock on %s: %s", folder, e)
        return None
    return fd


def _locked(folder: Path) -> bool:
    """Someone holds ``folder``'s lock (a live run whose pid we cannot see, another pid namespace)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # no lock file: a run killed before it made one, or not ours to judge beyond the pid
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False

