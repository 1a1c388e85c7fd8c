"""Signals and worker processes: SIGTERM handled like Ctrl-C, and workers that die with their parent.

:func:`sigterm_as_interrupt` turns SIGTERM into :class:`Terminated`, a ``KeyboardInterrupt``: whatever cleans up
after Ctrl-C (``with`` blocks, ``finally``, stopping workers) does so after SIGTERM too, and the CLI exits 143.

:func:`worker_init` runs first in every worker process (the isolated engine's, the dataset and repair pools'): it
ignores SIGINT (the parent decides and stops its workers), adopts the parent's scratch folder, and ties the worker's
life to the parent's, even when the parent is killed with SIGKILL: Linux's PR_SET_PDEATHSIG (when the worker was
started from the parent's main thread: the signal follows the thread that started it), and always a watcher thread
that exits when multiprocessing's parent sentinel (a pipe only the parent holds open) closes. With the workers gone,
multiprocessing's resource tracker sees its pipe close and exits as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C; the CLI exits 143."""


_terminated: list[bool] = []  # a SIGTERM arrived in this process


def exit_code(e: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (also when something unwinding after it raised a plain KeyboardInterrupt:
    stopping a local Ray sends one)."""
    return EXIT_TERMINATED if isinstance(e, Terminated) or _terminated else EXIT_INTERRUPTED


def _raise_terminated(signum, frame) -> None:
    _terminated.append(True)
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside (main thread only; elsewhere a no-op): SIGTERM raises :class:`Terminated`."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """Python's SIGTERM and SIGINT handlers put back after the block (main thread only): for third-party start-up
    code that installs its own (Ray's core worker installs a crash handler for SIGTERM that prints a stack and exits
    15, skipping the run's cleanup)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def ignore_interrupts() -> None:
    """From now on Ctrl-C and SIGTERM are ignored (the process is on its way out and cleaning up)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
            if sig is not None:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_IGN)


def from_main_thread() -> bool:
    """Whether a worker started now is started by the main thread (PR_SET_PDEATHSIG is safe for it)."""
    return threading.current_thread() is threading.main_thread()


def worker_init(scratch: str | None = None, pdeathsig: bool = False) -> None:
    """First thing in a worker process: see the module docstring."""
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from . import scratch as _scratch

    _scratch.adopt(scratch)
    bind_to_parent(pdeathsig)


def bind_to_parent(pdeathsig: bool = False) -> None:
    """This process exits (``os._exit``) as soon as the process that started it is gone."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None else os.getppid()
    if pdeathsig and sys.platform.startswith("linux"):
        _set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(1)
    sentinel = getattr(parent, "sentinel", None) if parent is not None else None
    target = (lambda: _wait_sentinel(sentinel)) if sentinel is not None else (lambda: _poll_parent(parent_pid))
    threading.Thread(target=target, name="workbench-parent-watch", daemon=True).start()


def _set_pdeathsig(sig: int) -> None:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.debug("prctl unavailable: %s", e)


def _wait_sentinel(sentinel) -> None:
    from multiprocessing.connection import wait

    while True:
        try:
            if wait([sentinel]):
                break
        except OSError:
            break
    os._exit(1)


def _poll_parent(parent_pid: int) -> None:
    import time

    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)
