"""Long native calls (building an engine session) that Ctrl-C can still interrupt.

Python runs signal handlers only between bytecodes of the main thread, so a session build that spends minutes in
C++ (a 100k-node model) ignores Ctrl-C. :func:`interruptibly` runs such a call on a daemon thread while the main
thread waits in short joins: Ctrl-C raises KeyboardInterrupt at once. The abandoned build keeps running in native
code; :func:`native_work_running` tells the CLI to exit without running C++ destructors under it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_PREFIX = "workbench-native-"
#: how long an interrupt waits for a cancelled native call to return
CANCEL_WAIT_S = 1.0


def interruptibly(fn: Callable[[], T], what: str = "build", cancel: Callable[[], None] | None = None) -> T:
    """``fn()``; from the main thread, on a helper thread so that Ctrl-C (or SIGTERM) interrupts the wait. ``cancel``:
    asks the native call to stop (e.g. ONNX Runtime's ``RunOptions.terminate``), called on the interrupt; the
    interrupt then waits up to :data:`CANCEL_WAIT_S` for the call to return."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread as is
            box["error"] = e

    t = threading.Thread(target=run, name=_PREFIX + what, daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except BaseException:
        if cancel is not None:
            cancel()
            t.join(CANCEL_WAIT_S)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def native_work_running() -> bool:
    """A build abandoned by Ctrl-C is still inside native code."""
    return any(t.name.startswith(_PREFIX) and t.is_alive() for t in threading.enumerate())
