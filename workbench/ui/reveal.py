"""A zero-size front-end anchor at the top of a Workbench tab: each increment of ``count`` scrolls the page so the
tab's top is in view (``block: "nearest"``: a page already showing it does not move). A panel with its own way
to show itself (the graph: ``GraphPanel.reveal``) uses that instead."""

from __future__ import annotations

import anywidget
from traitlets import Int

_ESM = """
function render({ model, el }) {
  el.style.height = "0px";
  el.style.margin = "0";
  // the tab may be made visible in this same update: wait until the anchor is laid out, then scroll to it
  const scroll = (tries = 20) => {
    if (el.offsetParent === null) {
      if (tries > 0) requestAnimationFrame(() => scroll(tries - 1));
      return;
    }
    el.scrollIntoView({ block: "nearest" });
  };
  model.on("change:count", () => requestAnimationFrame(() => scroll()));
  if (model.get("count") > 0) requestAnimationFrame(() => scroll());  // asked before this view existed
}
export default { render };
"""


class RevealAnchor(anywidget.AnyWidget):
    """Put it first in a tab; ``reveal()`` scrolls the page to it."""

    _esm = _ESM
    count = Int(0).tag(sync=True)

    def reveal(self) -> None:
        self.count += 1
