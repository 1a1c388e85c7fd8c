"""A zero-size front-end helper put in each Workbench tab: it keeps the tab's plotly figures as wide as their box.

A figure drawn while its tab is hidden (a run finishing while another tab is shown, a window resized while it is
hidden) gets plotly's default 700 px width, and plotly does not resize a hidden plot: the figure stays 700 px wide
when the tab is revealed and is clipped in a narrow window. Clickable figures (``go.FigureWidget``) resize on a
window ``resize`` event only. So whenever the tab's width changes (0 -> its width when it is revealed, and on every
resize), the helper looks for a drawn figure whose width differs from its box's and, if one does, dispatches one
window ``resize`` event: FigureWidgets autosize on it, and JupyterLab resizes its plotly outputs."""

from __future__ import annotations

import anywidget

_ESM = """
function render({ el }) {
  el.style.height = "0px";
  el.style.margin = "0";
  let tab = null, watcher = null, queued = false;
  const misfit = () => [...tab.querySelectorAll('.js-plotly-plot')].some(gd => {
    const svg = gd.querySelector('svg.main-svg');
    if (!svg || gd.offsetParent === null || gd.clientWidth === 0) return false;  // hidden: fitted when shown
    return Math.abs(svg.getBoundingClientRect().width - gd.clientWidth) > 1;
  });
  const check = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; if (tab && misfit()) window.dispatchEvent(new Event('resize')); });
  };
  // the view is put in the page after render: watch the tab (this widget's parent box) once it is there
  const attach = (tries = 50) => {
    if (!el.parentElement) { if (tries > 0) requestAnimationFrame(() => attach(tries - 1)); return; }
    tab = el.parentElement;
    watcher = new ResizeObserver(check);
    watcher.observe(tab);
  };
  attach();
  return () => { if (watcher) watcher.disconnect(); };
}
export default { render };
"""


class PlotFit(anywidget.AnyWidget):
    """Put it in a tab's box (beside the panel): the plotly figures in that box follow its width."""

    _esm = _ESM
