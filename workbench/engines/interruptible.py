"""Long native calls (building an engine session) that Ctrl-C can still interrupt.

Python runs signal handlers only between bytecodes of the main thread, so a session build that spends minutes in
C++ (a 100k-node model) ignores Ctrl-C. :func:`interruptibly` runs such a call on a helper thread while the main
thread waits in short joins: Ctrl-C raises KeyboardInterrupt at once. The abandoned build keeps running in native
code; :func:`native_work_running` tells the CLI to exit without running C++ destructors under it.

The calls go to ONE long-lived helper thread rather than a new thread each: glibc gives threads their own malloc
arenas, and engine outputs allocated in a fresh thread's arena could not reuse what the previous calls freed in
another (a layer-wise compare of a 12-layer BERT peaked 0.1-0.5 GB higher, varying from run to run). A fresh
thread is used only while the helper is still busy with a call abandoned by an interrupt. Before a build the
memory freed since is handed back to the system (glibc's ``malloc_trim``), so what the main thread freed (the
variant, the previous session's values) does not stay resident beside what the helper allocates next.
"""

from __future__ import annotations

import ctypes
import functools
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_PREFIX = "workbench-native-"
#: how long an interrupt waits for a cancelled native call to return
CANCEL_WAIT_S = 1.0


class _Call:
    """One native call and its outcome; ``done`` is set when it returned or raised."""

    def __init__(self, fn: Callable[[], T]):
        self.fn, self.done, self.box = fn, threading.Event(), {}

    def __call__(self) -> None:
        try:
            self.box["value"] = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread as is
            self.box["error"] = e
        finally:
            self.fn = None  # the call's closure (feeds, model) is not kept alive by the helper
            self.done.set()


class _Helper:
    """The long-lived helper thread; ``current`` is the call it runs (None when idle)."""

    def __init__(self):
        self.jobs: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.current: _Call | None = None
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def submit(self, call: _Call) -> bool:
        """Hand ``call`` to the helper; False when it is busy (an abandoned call still runs)."""
        with self.lock:
            if self.current is not None and not self.current.done.is_set():
                return False
            self.current = call
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name=_PREFIX + "helper", daemon=True)
                self.thread.start()
        self.jobs.put(call)
        return True

    def _loop(self) -> None:
        while True:
            self.jobs.get()()

    def busy(self) -> bool:
        call = self.current
        return call is not None and not call.done.is_set()


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own symbols: libc's where it is glibc
    except (OSError, AttributeError, TypeError):
        return None


def release_freed_memory() -> None:
    """Give the pages of freed heap memory back to the system (every malloc arena; a no-op without glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_HELPER = _Helper()
_STRAYS: list[_Call] = []  # calls run on fresh threads while the helper was busy


def interruptibly(fn: Callable[[], T], what: str = "build", cancel: Callable[[], None] | None = None) -> T:
    """``fn()``; from the main thread, on a helper thread so that Ctrl-C (or SIGTERM) interrupts the wait. ``cancel``:
    asks the native call to stop (e.g. ONNX Runtime's ``RunOptions.terminate``), called on the interrupt; the
    interrupt then waits up to :data:`CANCEL_WAIT_S` for the call to return."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    if cancel is None:  # a build: a new phase of allocations starts
        release_freed_memory()
    call = _Call(fn)
    if not _HELPER.submit(call):
        _STRAYS[:] = [c for c in _STRAYS if not c.done.is_set()] + [call]
        threading.Thread(target=call, name=_PREFIX + what, daemon=True).start()
    try:
        while not call.done.wait(0.1):
            pass
    except BaseException:
        if cancel is not None:
            cancel()
            call.done.wait(CANCEL_WAIT_S)
        raise
    if "error" in call.box:
        raise call.box.pop("error")
    return call.box.pop("value")


def native_work_running() -> bool:
    """A build abandoned by Ctrl-C is still inside native code."""
    return _HELPER.busy() or any(not c.done.is_set() for c in _STRAYS)
