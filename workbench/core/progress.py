"""Progress callbacks and cancellation, shared by every long-running job (compare, calibrate, repair)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import Cancelled  # noqa: F401 - re-exported: raised by Steps.check

#: ``progress(fraction in [0, 1], message)``
Progress = Callable[[float, str], None]


class Steps:
    """Reports progress and raises :class:`Cancelled` once ``cancel`` is set. ``span(lo, hi)`` maps a
    sub-job's own [0, 1] onto [lo, hi] of this one, so nested phases report one monotone bar."""

    def __init__(self, progress: Progress | None = None, cancel: threading.Event | None = None,
                 lo: float = 0.0, hi: float = 1.0):
        self.progress, self.cancel, self.lo, self.hi = progress, cancel, lo, hi

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled")

    def __call__(self, fraction: float, message: str) -> None:
        self.check()
        if self.progress is not None:
            f = max(0.0, min(1.0, fraction))
            self.progress(self.lo + (self.hi - self.lo) * f, message)

    def span(self, lo: float, hi: float) -> Steps:
        width = self.hi - self.lo
        return Steps(self.progress, self.cancel, self.lo + width * lo, self.lo + width * hi)
