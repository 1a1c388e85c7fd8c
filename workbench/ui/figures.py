"""Show plotly figures in Output widgets as plotly's JSON mimetype (JupyterLab renders it offline), so saved
notebooks stay small: no plotly.js copy per figure."""

from __future__ import annotations

import json
import threading
from typing import Any

from .kernel_thread import on_kernel

MIME = "application/vnd.plotly.v1+json"
#: figures waiting for their panel's first paint (see :func:`show_figure_after_paint`)
_WAITING: set[threading.Timer] = set()


def figure_bundle(fig: Any) -> dict:
    """The mimebundle of ``fig``: plotly's JSON, plus a plain-text title for viewers without plotly.

    Not ``responsive``: JupyterLab's plotly renderer resizes through ``Plots.resize``, which drops a height given
    without a width; a responsive figure then sizes its paper to 100% of an Output node with no height (0 px after
    a theme switch). Without it the figure still follows the panel's width on every resize."""
    doc = json.loads(fig.to_json(validate=False))  # plotly's encoder: numpy arrays become plain/typed arrays
    title = (doc.get("layout", {}).get("title") or {}).get("text") or "plotly figure"
    return {MIME: {"data": doc.get("data", []), "layout": doc.get("layout", {}),
                   "config": {"displaylogo": False, "responsive": False}},
            "text/plain": f"<{title}>"}


def figure_widget(fig: Any) -> Any:
    """A clickable ``go.FigureWidget`` of ``fig`` that follows its box's width.

    plotly's FigureWidget (an anywidget) never resizes on its own: drawn while its tab is hidden it keeps plotly's
    default 700 px width. ``responsive`` makes plotly resize it on each window ``resize`` event, which
    :class:`~workbench.ui.plot_fit.PlotFit` sends when its tab is revealed or resized (its height stays the
    layout's)."""
    import plotly.graph_objects as go

    widget = go.FigureWidget(fig)
    widget._config = {**(widget._config or {}), "responsive": True, "displaylogo": False}
    return widget


def show_figure(out: Any, fig: Any) -> None:
    """Replace what Output widget ``out`` shows with ``fig`` (works without a kernel, e.g. in tests)."""
    out.outputs = ({"output_type": "display_data", "data": figure_bundle(fig), "metadata": {}},)


def show_figure_after_paint(out: Any, fig: Any, beacon: Any, timeout_s: float = 2.0) -> None:
    """:func:`show_figure`, but while a cell executes, only once the browser has painted the widget holding
    ``beacon`` (a :class:`~workbench.ui.paint.PaintBeacon`), or after ``timeout_s`` without a browser (nbclient).
    JupyterLab loads plotly.js lazily (~1 s on first use, blocking the page); this lets the panel show first."""
    if not _in_cell(_shell()):
        show_figure(out, fig)
        return
    done = threading.Event()

    def fill(*_args: Any) -> None:
        if not done.is_set():
            done.set()
            show_figure(out, fig)

    def late() -> None:
        on_kernel(fill)  # the widget is set on the kernel's thread
        _WAITING.discard(timer)

    beacon.on_painted(fill)
    timer = threading.Timer(timeout_s, late)
    _WAITING.add(timer)
    timer.daemon = True
    timer.start()


def wait_figures(timeout: float = 10.0) -> bool:
    """Block until every figure waiting for a paint has been handed to the kernel's thread (recording)."""
    for timer in list(_WAITING):
        timer.join(timeout)
    return not _WAITING


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _in_cell(ip: Any) -> bool:
    """True while a kernel runs an execute request (not a widget message: a click on a tab, a button)."""
    kernel = getattr(ip, "kernel", None)
    if kernel is None:
        return False
    try:
        parent = kernel.get_parent("shell")
    except TypeError:
        parent = kernel.get_parent()
    except AttributeError:
        parent = getattr(kernel, "_parent_header", None)
    return (parent or {}).get("header", {}).get("msg_type") == "execute_request"


def clear(out: Any) -> None:
    out.outputs = ()
