"""The README's path in a real browser: JupyterLab (started here on 127.0.0.1, random port, token) and headless
Chromium driven by Playwright. Open the quickstart, run it, press Run in the Compare panel, wait for the planted
culprit, open its error plots, click a layer in the error curve, see its detail plots, follow it in the graph,
calibrate and see a histogram. Screenshots go to $WORKBENCH_ARTIFACTS (or a temporary folder, printed)."""

from __future__ import annotations

import re

import browser_support as B
import pytest

pytestmark = pytest.mark.browser

CULPRIT = "/bn_big_var/BatchNormalization"


H = B.H


artifacts, browser_page = B.module_fixtures("browser", ("quickstart.ipynb",))


def _visible(locator):
    return locator.locator("visible=true")


def test_quickstart_finds_the_culprit_in_the_browser(browser_page, artifacts):
    lab, page, errors = browser_page
    H.open_notebook(page, lab, "quickstart.ipynb")
    H.run_all(page)
    page.wait_for_selector(".wb-title")
    wb = page.locator(".jp-OutputArea-output").filter(has=page.locator(".wb-title")).first
    page.evaluate("document.querySelector('.jp-WindowedPanel-outer').scrollTop = 0")
    H.screenshot(page, artifacts, "01-workbench")

    def tab(name: str) -> None:
        wb.locator(".lm-TabBar-tab", has_text=name).click()

    tab("Compare")
    # the Dataset tab (filled by a later cell) has a Run button too, hidden: click the visible one, and give the
    # Compare panel time to build on a loaded machine
    _visible(wb.locator("button", has_text="Run")).first.click(timeout=180_000)
    culprit = wb.locator("button", has_text=f"#1 {CULPRIT}")
    culprit.wait_for()
    assert "first divergent: /bn_big_var/BatchNormalization" in wb.inner_text()
    culprit.scroll_into_view_if_needed()
    H.screenshot(page, artifacts, "02-culprit")

    culprit.click()  # selects it everywhere and opens Errors
    curve = _visible(wb.locator(".js-plotly-plot")).first
    curve.wait_for()
    curve.scroll_into_view_if_needed()
    # (a title may wrap after the tensor's name: its lines are separate text runs)
    wb.get_by_text(re.compile(r"/bn_big_var/BatchNormalization_output_0:\s*value distributions")).first.wait_for()
    H.screenshot(page, artifacts, "03-errors")

    # click another layer in the error curve: its detail plots replace the culprit's
    points = curve.locator(".scatterlayer .trace").first.locator(".points path")
    assert points.count() == 7
    points.nth(3).click(force=True)
    wb.get_by_text(re.compile(r"/head/pool/GlobalAveragePool_output_0:\s*value distributions")).first.wait_for()
    assert wb.get_by_text("candidate vs reference").count() and wb.get_by_text("mean |error| per channel").count()
    H.screenshot(page, artifacts, "04-layer-detail")

    tab("Graph")  # the graph follows the selection
    page.wait_for_function("""() => [...document.querySelectorAll('.wb-graph-status')].some(
                                 s => s.textContent.includes('selected: /head/pool/GlobalAveragePool'))""")
    H.screenshot(page, artifacts, "05-graph")

    tab("Calibration")
    wb.locator("button", has_text="Calibrate").click()
    histogram = wb.get_by_text("|x| over the calibration data").first
    histogram.wait_for(timeout=120_000)
    histogram.scroll_into_view_if_needed()
    H.screenshot(page, artifacts, "06-calibration")
    assert not errors, errors


def test_graph_widget_stays_interactive_on_5000_nodes(browser_page, artifacts):
    import onnx

    lab, page, errors = browser_page
    path = lab.root / "synthetic_5000.onnx"
    onnx.save(H.synthetic_model(5000), path)
    name = lab.write_notebook("graph5000.ipynb", [
        f"from workbench.ui import GraphPanel\ngp = GraphPanel({str(path)!r})\ngp",
        "gp.find('layers.40/mlp/fc1')[:1]",
    ])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    page.wait_for_selector(".wb-graph[data-ready='1']")
    page.wait_for_function("() => document.querySelector('.wb-graph-status').textContent"
                           ".includes('selected: /layers.40/mlp/fc1/')")  # drawn on an animation frame
    box = page.locator(".wb-graph-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, 600)  # zoom out
    page.locator(".wb-graph-btn", has_text="Fit").click()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 25)  # a box near the top
    page.wait_for_function(r"""() => [...document.querySelectorAll('.wb-culprit, .wb-msg')].some(
                                 e => /double-click|inputs:|\(\w+, #\d+\)/.test(e.textContent))""")  # scope or node
    H.screenshot(page, artifacts, "07-graph-5000")
    assert not errors, errors


def test_repair_tab_keeps_the_culprit_and_offers_downloads(browser_page, artifacts):
    import onnx

    lab, page, errors = browser_page
    name = lab.write_notebook("repair.ipynb", [B.SAMPLE_WORKBENCH_CELL])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    page.wait_for_selector(".wb-title")
    wb = page.locator(".jp-OutputArea-output").filter(has=page.locator(".wb-title")).first
    wb.locator(".lm-TabBar-tab", has_text="Repair").click()
    _visible(wb.locator("button", has_text="Run")).first.click()
    kept = _visible(wb.locator("button", has_text=CULPRIT))
    kept.wait_for(timeout=120_000)
    wb.get_by_text("verified on independent (ref").first.wait_for()  # the result's last lines have arrived
    text = wb.inner_text()
    assert "target MET" in text and "node(s) kept in reference precision" in text
    assert "verified on independent (ref" in text and "FP16 share of the weight bytes" in text
    link = _visible(wb.locator("a.wb-download"))
    assert link.count() == 1 and link.get_attribute("data-name") == "fp16_clamp_constant.repaired.onnx"
    with page.expect_download() as info:  # the browser really downloads it: the kernel sends it when asked
        link.click()
    assert info.value.suggested_filename == "fp16_clamp_constant.repaired.onnx"
    assert onnx.load(info.value.path()).graph.node
    wb.locator("button", has_text="Make a bug report").click()
    report = _visible(wb.locator("a.wb-download", has_text="bug report"))
    report.wait_for(timeout=120_000)
    assert report.get_attribute("data-name") == "bug-report.zip"
    report.scroll_into_view_if_needed()
    H.screenshot(page, artifacts, "08-repair-downloads")
    _visible(wb.locator(".js-plotly-plot")).first.wait_for()
    kept.evaluate("e => e.scrollIntoView({block: 'center'})")
    H.screenshot(page, artifacts, "09-repair")
    kept.click()  # selects it in the graph and brings the graph forward
    page.wait_for_function("""(name) => [...document.querySelectorAll('.wb-graph-status')].some(
                                 s => s.textContent.includes('selected: ' + name))""", arg=CULPRIT)
    _visible(wb.locator(".wb-graph-canvas")).first.evaluate("e => e.scrollIntoView({block: 'center'})")
    H.screenshot(page, artifacts, "10-repair-graph")
    assert not errors, errors


def test_a_file_of_several_chunks_downloads_whole_from_the_kernel(browser_page):
    from pathlib import Path

    from workbench.ui.downloads import CHUNK_BYTES

    lab, page, errors = browser_page
    expected = bytes(range(256)) * (2 * CHUNK_BYTES // 256 + 5)  # two whole chunks and a part: three messages
    name = lab.write_notebook("download.ipynb", [
        "import tempfile\nfrom pathlib import Path\nimport ipywidgets as w\n"
        "from workbench.ui.downloads import download_html, server\n"
        "p = Path(tempfile.mkdtemp()) / 'weights.bin'\n"
        f"p.write_bytes(bytes(range(256)) * {len(expected) // 256})\n"
        "w.VBox([server(), w.HTML(download_html(p, 'Download the weights'))])",
    ])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    link = _visible(page.locator("a.wb-download", has_text="Download the weights"))
    link.wait_for(timeout=120_000)
    assert "base64" not in (link.get_attribute("href") or "")  # the page holds a token, not the bytes
    with page.expect_download(timeout=120_000) as info:
        link.click()
    assert info.value.suggested_filename == "weights.bin"
    assert Path(info.value.path()).read_bytes() == expected
    assert not errors, errors
