"""Background jobs for panels: the work runs on a thread (the kernel stays responsive), a progress bar follows
the core's ``progress(fraction, message)`` callback, Cancel sets the core's ``cancel`` Event, and any failure
becomes a message in the panel, never an exception in the kernel. Whatever touches widgets or shared state runs on
the kernel's thread (:mod:`workbench.ui.kernel_thread`). At interpreter exit every job is cancelled
and its thread joined (a thread still inside a native library at exit aborts the process)."""

from __future__ import annotations

import atexit
import html
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from .kernel_thread import drain, on_kernel, pending
from .messages import error_html, message_html

log = logging.getLogger(__name__)

#: at most this many progress updates per second reach the browser
MAX_UPDATES_PER_S = 10
#: at interpreter exit, how long to wait in all for running jobs to end
EXIT_JOIN_S = 30.0

_LIVE: weakref.WeakSet[JobControls] = weakref.WeakSet()
_exiting = threading.Event()


def stop_all_jobs(timeout: float = EXIT_JOIN_S) -> bool:
    """Cancel every panel's job, drop queued ones and join their threads within ``timeout`` seconds in all;
    True when every thread ended. Registered with atexit."""
    _exiting.set()
    controls = list(_LIVE)
    for jobs in controls:
        jobs.stop()
    deadline = time.monotonic() + timeout
    ended = all([jobs.wait(max(0.0, deadline - time.monotonic())) for jobs in controls])  # join every one
    if not ended:
        log.warning("a panel job was still running %.0f s after exit began", timeout)
    return ended


atexit.register(stop_all_jobs)


def settle(timeout: float = 120.0) -> bool:
    """Let every panel's job finish and show what it found, figures included, before this cell ends (recording
    a notebook: see :mod:`workbench.ui.kernel_thread`); True when nothing was left running."""
    from .figures import wait_figures

    deadline = time.monotonic() + timeout
    while True:
        for jobs in list(_LIVE):
            jobs.wait(max(0.0, deadline - time.monotonic()))
        wait_figures(max(0.0, deadline - time.monotonic()))
        drain()
        if not any(jobs.running for jobs in list(_LIVE)) and not pending():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


#: the class a JobControls carries while its job runs (the CSS shows :data:`GONE_NOTE` if the kernel goes then)
RUNNING_CLASS = "wb-job-running"
GONE_NOTE = ("This run stopped: the kernel that ran it is gone (restarted or shut down). Run the cell again to use "
             "the workbench; finished runs can be reopened from its saved runs.")


class JobControls(widgets.VBox):
    """A progress bar, a status line and a Cancel button for one job at a time.

    ``start(name, work, on_done)`` runs ``work(progress, cancel)`` on a thread. Everything that touches widgets or
    shared state runs on the kernel's thread (:func:`~workbench.ui.kernel_thread.on_kernel`): the progress bar,
    the status line, ``on_done(value)`` when ``work`` returns and ``on_error(exc)`` when it fails or is cancelled
    (``cancelled`` tells which). A failure or a cancellation is shown in ``status``. ``locks``: buttons (e.g. Run)
    disabled while a job runs and enabled again when none is left."""

    def __init__(self, locks: Any = (), **kwargs: Any) -> None:
        self.locks = list(locks)
        self.bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout=widgets.Layout(width="260px"))
        self.label = widgets.HTML("")
        self.cancel_button = widgets.Button(description="Cancel", icon="stop", disabled=True,
                                            layout=widgets.Layout(width="90px"))
        self.status = widgets.HTML("")
        self.cancel_button.on_click(lambda _: self.cancel())
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._active = False
        self._next: tuple | None = None
        self._last = 0.0
        self.error: BaseException | None = None
        self.cancelled = False
        row = widgets.HBox([self.bar, self.cancel_button, self.label], layout=widgets.Layout(align_items="center"))
        row.layout.display = "none"
        row.add_class("wb-job-row")
        self._row = row
        # shown by the CSS only when the kernel went away while a job ran (a restart): the row's Cancel and bar
        # can do nothing then, and the view would stay "running" for ever
        self.gone = widgets.HTML(f'<div class="wb-gone-note">{GONE_NOTE}</div>')
        self.gone.add_class("wb-gone")
        super().__init__([row, self.gone, self.status], **kwargs)

    @property
    def running(self) -> bool:
        return self._active

    def start(self, name: str, work: Callable[[Callable[[float, str], None], threading.Event], Any],
              on_done: Callable[[Any], None] | None = None,
              on_error: Callable[[BaseException], None] | None = None, *,
              replace: bool = False) -> threading.Thread | None:
        """Run ``work`` on a thread. If a job is running: with ``replace`` cancel it and run this one next (the
        latest request wins, e.g. clicking layer after layer), otherwise say so and return None."""
        job = (name, work, on_done, on_error)
        if _exiting.is_set():
            log.info("%s not started: the interpreter is exiting", name)
            return None
        _LIVE.add(self)
        with self._lock:
            if self._active:
                if not replace:
                    self.status.value = message_html(f"{name}: wait for the running job to finish, or cancel it",
                                                     "warn")
                    return None
                self._next = job
                self._cancel.set()
                return self._thread
            self._next, self._active = job, True
            for button in self.locks:  # before start() returns: a second click cannot slip in
                button.disabled = True
            self._thread = threading.Thread(target=self._loop, name=f"workbench-{name}", daemon=True)
        self._thread.start()
        return self._thread

    def _loop(self) -> None:
        while True:
            with self._lock:
                job, self._next = self._next, None
                if job is None:
                    self._active = False
                    on_kernel(self._idle)
                    return
                self._cancel = threading.Event()
            self._run(*job)

    def _idle(self) -> None:
        """No job left (kernel thread): Cancel off, the locked buttons on again, the running class off (unless a new
        job took them)."""
        if self._active:
            return
        self.remove_class(RUNNING_CLASS)
        self.cancel_button.disabled = True
        for button in self.locks:
            button.disabled = False

    def _begin(self, name: str) -> None:
        self.error, self.cancelled = None, False
        self.bar.value, self.bar.bar_style = 0.0, ""
        self.label.value = html.escape(f"{name}: starting")
        self.status.value = ""
        self.cancel_button.disabled = False
        self._row.layout.display = "flex"
        self.add_class(RUNNING_CLASS)

    def _show_progress(self, fraction: float, text: str) -> None:
        if self._row.layout.display == "none":  # the job already ended: a late update is dropped
            return
        self.bar.value = max(self.bar.value, max(0.0, min(1.0, float(fraction))))
        self.label.value = html.escape(text)

    def _run(self, name: str, work, on_done, on_error) -> None:
        cancel = self._cancel
        on_kernel(self._begin, name)

        def progress(fraction: float, message: str) -> None:
            now = time.monotonic()
            if fraction < 1.0 and now - self._last < 1.0 / MAX_UPDATES_PER_S:
                return
            self._last = now
            on_kernel(self._show_progress, fraction, f"{name}: {message}")

        try:
            value = work(progress, cancel)
        except BaseException as e:  # noqa: BLE001 - a job's failure is shown in the panel, never raised
            on_kernel(self._failed, name, cancel, e, on_error)
            return
        on_kernel(self._finished, name, cancel, value, on_done, on_error)

    def _finished(self, name: str, cancel: threading.Event, value: Any, on_done, on_error) -> None:
        """``work`` returned (kernel thread): hand the value over unless Cancel was pressed meanwhile."""
        if cancel.is_set():
            self._failed(name, cancel, _CancelledLate(), on_error)
            return
        try:
            if on_done is not None:
                on_done(value)
        except Exception as e:  # noqa: BLE001 - showing the result failed: say so in the panel
            self._failed(name, cancel, e, on_error)
            return
        self.bar.value, self.bar.bar_style = 1.0, "success"
        self.label.value = html.escape(f"{name}: done")
        self._row.layout.display = "none"

    def _failed(self, name: str, cancel: threading.Event, e: BaseException, on_error) -> None:
        """``work`` (or showing its value) failed or was cancelled (kernel thread)."""
        if cancel.is_set():
            self.cancelled = True
            if self._next is None:  # replaced jobs end silently
                self.status.value = message_html(f"{name} cancelled", "warn")
        else:
            self.error = e
            self.status.value = error_html(e, name)
        if on_error is not None:
            try:
                on_error(e)
            except Exception:  # noqa: BLE001 - never let an error handler escape
                log.exception("error handler of %s failed", name)
        self.bar.bar_style = "danger"
        self._row.layout.display = "none"

    def cancel(self) -> None:
        """Ask the running job to stop (the core checks the Event between steps)."""
        if self.running:
            self._cancel.set()
            self.label.value = html.escape("cancelling...")

    def stop(self) -> None:
        """Cancel the running job and drop any queued one (shutdown)."""
        with self._lock:
            self._next = None
            self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job (and any queued after it) ends (tests, scripts); True if it ended. On the kernel's
        thread, the updates the job queued for it (its result shown, Run enabled) run before this returns."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
        if not _exiting.is_set():
            drain()
        return True


class _CancelledLate(Exception):
    """The job returned after Cancel was pressed: its result is dropped."""
