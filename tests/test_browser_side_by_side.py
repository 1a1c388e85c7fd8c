"""Issue 22, beyond the defects, in a real browser (JupyterLab + headless Chromium): the Graph tab's "side by side"
mode on the bundled sample's FP16 comparison shows the reference and the FP16 candidate (with its inserted Casts);
a click on a candidate node selects its reference counterpart with the pair's numbers, a click on a Cast says it
has none; new colour thresholds typed in the Graph tab recolour both graphs and their legend states them; bad
input gets one line. Screenshots go to $WORKBENCH_ARTIFACTS (or a temporary folder)."""

from __future__ import annotations

import browser_support as B
import pytest

pytestmark = pytest.mark.browser

H = B.H
CULPRIT = "/bn_big_var/BatchNormalization"
GOOD, BAD = "#43a047", "#e53935"
ANYWIDGET_SLOW_INIT = "[anywidget] Failed to initialize model."

CELLS = [
    'import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\nfrom pathlib import Path\n\n'
    "from workbench import Workbench\n\n"
    'wb = Workbench(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\nwb.compare_panel.run()\n'
    'assert wb.compare_panel.wait(120) and wb.state.result is not None\nwb.show("graph")\nwb',
    f'print("value:", "%.4g" % next(t for t in wb.state.result.tensors if t.node == "{CULPRIT}")'
    '.metrics["sqnr_db"])',
]

artifacts, lab_page = B.module_fixtures("browser-side-by-side")


def test_side_by_side_links_the_two_graphs_and_follows_the_colour_thresholds(lab_page, artifacts):
    lab, page, errors = lab_page
    H.open_notebook(page, lab, lab.write_notebook("side.ipynb", CELLS))
    H.run_all(page)
    wb = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).first
    wb.locator(".widget-toggle-button", has_text="side by side").first.click()
    left = wb.locator(".wb-sbs-reference .wb-graph[data-ready='1']").first
    right = wb.locator(".wb-sbs-candidate .wb-graph[data-ready='1']").first
    right.wait_for(state="visible", timeout=60_000)
    page.wait_for_function("g => g.wbNodePosition && g.wbNodePosition('graph_input_cast0') !== null",
                           arg=right.element_handle(), timeout=30_000)
    right.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    H.screenshot(page, artifacts, "side-by-side")
    # the candidate shows the FP16 conversion's Casts, drawn as candidate-only, the reference has none
    assert right.evaluate("g => g.wbNodeColor('graph_input_cast0')") == "#8d6e63"
    assert left.evaluate("g => g.wbNodeColor('graph_input_cast0')") is None
    assert "only in the candidate" in right.locator(".wb-graph-legend").inner_text()

    # a click on the candidate's culprit selects its reference counterpart, with the pair's numbers
    pos = right.evaluate(f"g => g.wbNodePosition({CULPRIT!r})")
    page.mouse.click(pos["x"], pos["y"])
    page.wait_for_function(f"g => g.wbSelectedId() === {CULPRIT!r}", arg=left.element_handle(), timeout=30_000)
    assert right.evaluate("g => g.wbSelectedId()") == CULPRIT
    value = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output",
                         has_text="value:").first.inner_text().split("value:")[1].strip()
    numbers = wb.locator(".wb-sbs-numbers").first
    numbers.locator(f"text={value}").first.wait_for(timeout=30_000)
    text = numbers.inner_text()
    assert "float16" in text and "float32" in text and "culprit #1" in text and "bad" in text, text
    H.screenshot(page, artifacts, "counterpart-selected")

    # a Cast the conversion inserted: nothing on the reference side, and the pane says why
    pos = right.evaluate("g => g.wbNodePosition('graph_input_cast0')")
    page.mouse.click(pos["x"], pos["y"])
    numbers.locator("text=inserted by the conversion").first.wait_for(timeout=30_000)
    page.wait_for_function("g => g.wbSelectedId() === ''", arg=left.element_handle(), timeout=30_000)

    # and the other way: a click on a reference node selects the candidate's
    pos = left.evaluate("g => g.wbNodePosition('/relu/Relu')")
    page.mouse.click(pos["x"], pos["y"])
    page.wait_for_function("g => g.wbSelectedId() === '/relu/Relu'", arg=right.element_handle(), timeout=30_000)
    numbers.get_by_text("/relu/Relu_output_0").first.wait_for(timeout=30_000)

    # colour thresholds: /conv/Conv is good by the run's defaults (40 / 30 dB), bad by 300 / 250 dB, on both sides
    for g in (left, right):
        assert g.evaluate("g => g.wbNodeColor('/conv/Conv')") == GOOD
    box = wb.locator(".wb-bands").first
    fields = box.locator("input[type='text']")
    fields.nth(0).fill("300")
    fields.nth(1).fill("250")
    box.locator("button", has_text="Apply").click()
    for g in (left, right):
        page.wait_for_function(f"g => g.wbNodeColor('/conv/Conv') === {BAD!r}", arg=g.element_handle(),
                               timeout=30_000)
    assert "good: sqnr_db \u2265 300 dB" in right.locator(".wb-graph-legend").inner_text()
    assert "300 dB" in box.inner_text() and "yours" in box.inner_text()
    H.screenshot(page, artifacts, "thresholds-applied")
    fields.nth(0).fill("abc")
    box.locator("button", has_text="Apply").click()
    box.locator("text=is not a number").first.wait_for(timeout=30_000)
    assert "Traceback" not in box.inner_text()
    assert right.evaluate("g => g.wbNodeColor('/conv/Conv')") == BAD  # unchanged
    light = left.evaluate("g => g.wbColors().bg")
    B.dark_theme(page)  # both graphs follow JupyterLab's theme
    for g in (left, right):
        page.wait_for_function("([g, light]) => g.wbColors().bg !== light", arg=[g.element_handle(), light],
                               timeout=30_000)
    right.scroll_into_view_if_needed()
    H.screenshot(page, artifacts, "side-by-side-dark")
    # anywidget rejects a model's "ready" promise when it takes over 2 s to initialise (AbortSignal.timeout(2000)
    # in its runtime), which a loaded CI machine can hit while the two graph widgets start; both were drawn and
    # answered every step above, so that message alone is not a failure here. Any other page error is.
    assert not [e for e in errors if e != ANYWIDGET_SLOW_INIT], errors
