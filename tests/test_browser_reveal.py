"""Issue 22 defect 14 in a real browser (JupyterLab + headless Chromium): scrolled down to the Repair tab's kept
nodes, a click on one switches to the Graph tab and scrolls the page so the graph's canvas is in view; the graph's
legend says what its orange rings mark (defect 15)."""

from __future__ import annotations

import browser_support as B
import pytest

pytestmark = pytest.mark.browser

H = B.H
CULPRIT = "/bn_big_var/BatchNormalization"

CELLS = [
    # the Workbench after a repair (run in the kernel: the kept-node buttons are there when it is drawn)
    'import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\nfrom pathlib import Path\n\n'
    "from workbench import Workbench\n\n"
    'wb = Workbench(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\n'
    "wb.graph_panel\nwb.repair_panel.run()\nassert wb.repair_panel.wait(120) and wb.repair_panel.kept\n"
    'wb.show("repair")\nwb',
    # a Workbench after a comparison, on its Compare tab (culprit buttons drawn)
    'wc = Workbench(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\nwc.compare_panel.run()\n'
    'assert wc.compare_panel.wait(120) and wc.state.result.culprits\nwc.show("compare")\nwc',
    # room below it, so the page can be scrolled down to the kept nodes as a user reading the results does
    'from IPython.display import HTML\nHTML(\'<div style="height: 2500px">below</div>\')',
]

#: the canvas' box against the notebook's scrolled area and the window: [top, bottom, area top, area bottom]
BOX_JS = """c => { const r = c.getBoundingClientRect();
  const s = c.closest('.jp-WindowedPanel-outer, .jp-Notebook').getBoundingClientRect();
  return [r.top, r.bottom, Math.max(0, s.top), Math.min(window.innerHeight, s.bottom)]; }"""

artifacts, lab_page = B.module_fixtures("browser-reveal")


def test_a_kept_node_click_scrolls_the_graph_into_view(lab_page, artifacts):
    lab, page, errors = lab_page
    name = lab.write_notebook("reveal.ipynb", CELLS)
    H.open_notebook(page, lab, name)
    H.run_all(page)
    wb = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).first
    button = wb.locator("button", has_text=CULPRIT).first
    button.wait_for(state="visible", timeout=120_000)
    # scrolled down: the kept node at the top of the view, the Workbench's tab bar above it, out of view (where
    # the graph's canvas starts when its tab is shown)
    button.evaluate("b => b.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    tabs = wb.locator(".lm-TabBar").first.bounding_box()
    assert tabs is not None and tabs["y"] < -50, tabs
    H.screenshot(page, artifacts, "before-click")
    button.click()
    canvas = wb.locator(".wb-graph-canvas").first
    canvas.wait_for(state="visible", timeout=30_000)
    page.wait_for_function(f"c => {{ const b = ({BOX_JS})(c); return b[0] >= b[2] - 1 && b[1] <= b[3] + 1; }}",
                           arg=canvas.element_handle(), timeout=10_000)
    top, bottom, area_top, area_bottom = canvas.evaluate(BOX_JS)
    H.screenshot(page, artifacts, "after-click")
    assert area_top - 1 <= top < bottom <= area_bottom + 1, (top, bottom, area_top, area_bottom)
    # defect 15: the orange rings of the kept nodes have their legend entry, an orange ring swatch
    key = wb.locator(".wb-graph-key-ring").first
    # (the sample's clamped BatchNormalization is folded into its Conv: a rewrite, not an FP32 island)
    assert key.is_visible() and key.inner_text().startswith("repaired (rewritten or kept in reference precision) (")
    ring = key.locator(".wb-graph-swatch-ring").evaluate("e => [getComputedStyle(e).borderTopColor, "
                                                        "getComputedStyle(e).borderRadius]")
    assert ring == ["rgb(249, 168, 37)", "50%"], ring
    assert not errors, errors


def test_a_culprit_click_scrolls_the_errors_tab_into_view(lab_page, artifacts):
    """Scrolled down to Compare's culprits, a click on one brings Errors forward with its curve in view."""
    lab, page, errors = lab_page
    H.open_notebook(page, lab, lab.write_notebook("reveal-compare.ipynb", CELLS))
    H.run_all(page)
    wc = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).nth(1)
    button = wc.locator("button", has_text=f"#1 {CULPRIT}").first
    button.wait_for(state="visible", timeout=120_000)
    button.evaluate("b => b.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    tabs = wc.locator(".lm-TabBar").first.bounding_box()
    assert tabs is not None and tabs["y"] < -50, tabs
    button.click()
    curve = wc.locator(".js-plotly-plot").locator("visible=true").first
    curve.wait_for(state="visible", timeout=60_000)
    page.wait_for_function(f"c => {{ const b = ({BOX_JS})(c); return b[0] >= b[2] - 1 && b[0] < b[3] - 100; }}",
                           arg=curve.element_handle(), timeout=10_000)
    H.screenshot(page, artifacts, "errors-after-click")
    assert not errors, errors
