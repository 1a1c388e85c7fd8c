"""Widget and shared-state updates run on the kernel's thread.

Panel jobs run on worker threads; a worker must not set widget traits or :class:`~workbench.ui.WorkbenchState`
itself (observers would run on the worker, racing the kernel thread's own handlers). :func:`on_kernel` queues a
call for the kernel's thread instead: through the kernel's io loop (``get_ipython().kernel.io_loop``), which runs
it as soon as the kernel is between messages (at once after a button click; after the cell, when a cell is
running). Outside a kernel (scripts, tests) there is no such loop and the call runs directly. Calls run in the
order they were queued. A cell that waits for a job (``panel.wait()``) runs the queued calls itself
(:func:`drain`), so ``panel.run(); panel.wait()`` in one cell sees the result.

``WORKBENCH_UI_RECORD=1`` in the kernel's environment holds the queued calls until a cell runs them
(:func:`drain`, :func:`workbench.ui.jobs.settle`): for recording a notebook with nbclient
(scripts/make_notebooks.py), which saves only the widget updates sent while some cell runs; an update the io loop
sent between cells would be lost."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_queue: deque[tuple[Callable[..., Any], tuple, dict]] = deque()
_queue_lock = threading.Lock()
_drain_lock = threading.RLock()


def kernel_thread() -> threading.Thread:
    """The thread the kernel runs cells and widget messages on (ipykernel: the main thread)."""
    return threading.main_thread()


def on_kernel_thread() -> bool:
    return threading.current_thread() is kernel_thread()


def _io_loop() -> Any:
    """The kernel's io loop, or None outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    return getattr(kernel, "io_loop", None)


def on_kernel(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` on the kernel's thread: now when already there or outside a kernel, else
    queued (in order) for the kernel's io loop. A failing call is logged, never raised into the worker."""
    loop = _io_loop()
    if loop is None or on_kernel_thread():
        _call(fn, args, kwargs)
        return
    with _queue_lock:
        _queue.append((fn, args, kwargs))
    if os.environ.get("WORKBENCH_UI_RECORD") == "1":
        return  # a cell drains it (recording a notebook)
    try:
        loop.add_callback(drain)
    except Exception:  # noqa: BLE001 - the loop is closed (kernel shutting down): drop the update
        log.debug("kernel io loop closed; an update was dropped")


def drain() -> int:
    """Run the queued calls (on the kernel's thread only); returns how many ran."""
    if not on_kernel_thread():
        return 0
    ran = 0
    with _drain_lock:  # one drain at a time, calls in queue order (a call may drain again: RLock)
        while True:
            with _queue_lock:
                if not _queue:
                    return ran
                fn, args, kwargs = _queue.popleft()
            _call(fn, args, kwargs)
            ran += 1


def pending() -> int:
    """How many calls wait for the kernel's thread (tests)."""
    with _queue_lock:
        return len(_queue)


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an update that fails is logged; the job and the kernel go on
        log.exception("a panel update failed")
