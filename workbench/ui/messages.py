"""Messages shown in panels: errors as the WorkbenchError text (problem -- hint), never a traceback."""

from __future__ import annotations

import html
import logging

log = logging.getLogger(__name__)

_STYLES = {"info": "wb-msg wb-info", "ok": "wb-msg wb-ok", "warn": "wb-msg wb-warn", "error": "wb-msg wb-error"}


def message_html(text: str, kind: str = "info") -> str:
    return f'<div class="{_STYLES.get(kind, _STYLES["info"])}">{html.escape(text)}</div>'


def error_text(exc: BaseException) -> str:
    """One readable line: a WorkbenchError's message and hint; anything else named as an internal error."""
    from ..errors import Cancelled, WorkbenchError, os_error_text

    if isinstance(exc, WorkbenchError):
        return str(exc)
    if isinstance(exc, Cancelled):
        return f"cancelled ({exc.message})"
    said = os_error_text(exc)  # a path or disk the user gave: not an internal error
    if said is not None:
        return said
    if getattr(exc, "user_error", False):  # a checked argument (core.arguments): the message names it
        return str(exc)
    return f"internal error ({type(exc).__name__}: {exc}); the kernel log has the details"


def error_html(exc: BaseException, what: str = "") -> str:
    from ..errors import Cancelled, WorkbenchError, os_error_text

    if not isinstance(exc, (WorkbenchError, Cancelled)) and os_error_text(exc) is None \
            and not getattr(exc, "user_error", False):
        log.error("%s failed", what or "a task", exc_info=exc)
    prefix = f"{what} failed: " if what else ""
    return message_html(prefix + error_text(exc), "error")


def fallback_repr(panel) -> str:
    """Short text/plain for viewers that cannot draw widgets (ipywidgets cuts it at 110 characters)."""
    model = getattr(getattr(panel, "state", None), "model", None)
    name = model.name if model is not None else "no model"
    return f"{type(panel).__name__}({name}): run this cell to use it (widgets need a live kernel)"


def options_refused(status, summary, exc: BaseException, what: str) -> None:
    """Bad options, said in ``status`` before anything runs; a summary that says there is no current result
    (about the last attempt) is replaced by one about this one."""
    status.value = error_html(exc, what)
    if "no current result" in summary.value:
        summary.value = message_html("nothing ran: the options above could not be used (the reason is above); no "
                                     "current result", "warn")
