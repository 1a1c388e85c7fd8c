"""Issue 22 in a real browser (JupyterLab + headless Chromium): run a comparison, cancel the next one, rerun on other
input shapes, and check that every tab's numbers belong to the current run: Compare's summary, the Errors curve and
message, the Graph side pane (its value is the current result's, read back from the kernel), the Engine tab's error
column. The cancelled run leaves no view showing the first run's numbers as current. Then the same for the
tabs whose runs are their own: Calibration and Repair each run, are cancelled (no numbers left, "cancelled" said),
and run again on other input shapes (shared with Compare): each shows the new run's numbers (read in the kernel)
and none of the old run's. (Model shows no run; Dataset runs read files, not input shapes: tests/test_ui_runs.py.)"""

from __future__ import annotations

import re

import browser_support as B
import pytest

pytestmark = pytest.mark.browser

H = B.H
CULPRIT = "/bn_big_var/BatchNormalization"

CELLS = [
    # the sample with a dynamic height and width, so a rerun can change the input shapes; compare() held until
    # Cancel while `hold` is set (a comparison long enough to cancel, without depending on timing)
    'import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\n'
    "import tempfile, threading\nfrom pathlib import Path\n\nimport onnx\n"
    "import workbench.compare.api as api\nfrom workbench import Workbench\n\n"
    'model = onnx.load(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\n'
    "dims = model.graph.input[0].type.tensor_type.shape.dim\n"
    'dims[2].dim_param, dims[3].dim_param = "H", "W"\ndel model.graph.value_info[:]\n'
    'path = Path(tempfile.mkdtemp()) / "clamp_dynamic.onnx"\nonnx.save(model, path)\n'
    "import workbench.calibrate as calibrate_api\nimport workbench.repair.api as repair_api\n"
    "hold = threading.Event()\n\n"
    "def held(real):\n    def run(*args, **kwargs):\n        if hold.is_set():\n"
    "            kwargs['cancel'].wait(120)\n        return real(*args, **kwargs)\n    return run\n\n"
    "api.compare = held(api.compare)\ncalibrate_api.calibrate = held(calibrate_api.calibrate)\n"
    "repair_api.repair = held(repair_api.repair)\nwb = Workbench(path)\n"
    "wb.calibration_panel.data_count.value, wb.calibration_panel.eval_count.value = 2, 2\n"
    "wb.repair_panel.max_builds.value = 4\nwb",
    "hold.set()",
    "hold.clear()",
    f'print("value:", "%.4g" % next(t for t in wb.state.result.tensors if t.node == "{CULPRIT}")'
    '.metrics["sqnr_db"], "run:", wb.state.current_run("comparison").id)',
    # the current calibration's calibrated amax of each tensor (as its representativeness table prints them)
    'print("value:", ",".join("%.4g" % r.calib_amax for r in wb.state.calibration.representativeness), '
    '"run:", wb.state.current_run("calibration").id)',
    # the current repair's worst output after the repair (as its outputs table prints it)
    'print("value:", "%.4g" % min(o["sqnr_db"] for o in wb.repair_panel.result.after["outputs"].values()), '
    '"run:", wb.state.current_run("repair").id)',
]

#: the text of the tab shown, and the number of plots drawn in it (the tab's pane: a child of the Tab's stacked panel)
PANES = "'.lm-StackedPanel-child, .p-StackedPanel-child, .widget-tab-contents > *'"
SHOWN_JS = """w => { const box = [...w.querySelectorAll(PANES)]
  .find(e => e.offsetParent !== null && e.getBoundingClientRect().width > 0);
  return box ? box.innerText : ''; }""".replace("PANES", PANES)
PLOTS_JS = """w => { const box = [...w.querySelectorAll(PANES)]
  .find(e => e.offsetParent !== null && e.getBoundingClientRect().width > 0);
  return box ? [...box.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent !== null).length
             : -1; }""".replace("PANES", PANES)

artifacts, lab_page = B.module_fixtures("browser-stale")


def test_every_tab_shows_the_current_run_after_cancel_and_rerun(lab_page, artifacts):
    lab, page, errors = lab_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    name = lab.write_notebook("stale.ipynb", CELLS)
    H.open_notebook(page, lab, name)
    H.run_cell(page, 0, wait=True)
    wb = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).first

    def tab(title: str) -> None:
        wb.locator(".lm-TabBar-tab", has_text=title).click()

    def shown() -> str:
        """The text of the tab shown."""
        return wb.evaluate(SHOWN_JS)

    def shapes(text: str) -> None:
        page.wait_for_function("w => [...w.querySelectorAll('input')].some(e => e.offsetParent !== null "
                               "&& e.value.startsWith('image:'))", arg=wb.element_handle(), timeout=120_000)
        field = wb.locator("input").locator("visible=true")
        values = field.evaluate_all("els => els.map(e => e.value)")
        k = next(i for i, v in enumerate(values) if v.startswith("image:"))
        field.nth(k).fill(text)
        field.nth(k).press("Tab")

    def value_now(cell: int = 3) -> tuple[str, int]:
        """The current result's value of the culprit and the current comparison's id, read in the kernel (``cell``
        4: the calibration's amax values, 5: the repair's worst output after it)."""
        H.run_cell(page, cell, wait=True)
        out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(cell).locator(
            ".jp-OutputArea-output").last.inner_text()
        m = re.search(r"value: (\S+) run: (\d+)", out)
        assert m, out
        return m.group(1), int(m.group(2))

    run = wb.locator("button", has_text="Run").locator("visible=true")
    culprit = wb.locator("button", has_text=f"#1 {CULPRIT}")
    # run #1 on 16x16
    tab("Compare")
    shapes("image:[1,4,16,16]")
    run.first.click()
    culprit.wait_for(timeout=180_000)
    first, first_id = value_now()
    assert first_id == 1 and "run #1" in shown()
    culprit.click()  # selects it everywhere, opens Errors
    wb.get_by_text(re.compile(r"run #1: DIVERGED")).first.wait_for(timeout=60_000)
    tab("Graph")
    wb.get_by_text("from comparison run #1").first.wait_for(timeout=60_000)
    assert first in shown()
    tab("Engine")
    wb.locator("button", has_text="Inspect").locator("visible=true").first.click()
    wb.get_by_text("from comparison run #1").locator("visible=true").first.wait_for(timeout=120_000)
    H.screenshot(page, artifacts, "01-run1")

    # run #3 (the engine inspection was #2), cancelled: no tab shows run #1's numbers as current
    H.run_cell(page, 1, wait=True)
    tab("Compare")
    run.first.click()
    cancel = wb.locator("button", has_text="Cancel").locator("visible=true").first
    page.wait_for_function("b => !b.disabled", arg=cancel.element_handle(), timeout=60_000)
    cancel.click()
    wb.get_by_text(re.compile(r"run #3, the comparison of .* cancelled")).first.wait_for(timeout=60_000)
    H.run_cell(page, 2, wait=True)
    for title in ("Compare", "Errors", "Graph", "Engine"):
        tab(title)
        text = shown()
        assert "run #1" not in text, f"{title} still shows run #1 after the cancel: {text[:2000]}"
        if title in ("Errors", "Graph"):
            assert "run #3 (comparison) cancelled" in text, f"{title}: {text[:2000]}"
    tab("Errors")
    assert wb.evaluate(PLOTS_JS) == 0, "the Errors tab still draws plots of the cancelled run's predecessor"
    tab("Engine")
    assert "no current comparison" in shown()
    H.screenshot(page, artifacts, "02-cancelled")

    # run #4 on 24x24: every tab shows run #4 and its own numbers
    tab("Compare")
    shapes("image:[1,4,24,24]")
    run.first.click()
    culprit.wait_for(timeout=180_000)
    third, third_id = value_now()
    assert third_id == 4 and third != first
    text = shown()
    assert "run #4" in text and "run #1" not in text
    culprit.click()
    wb.get_by_text(re.compile(r"run #4: DIVERGED")).first.wait_for(timeout=60_000)
    assert "run #1" not in shown()
    tab("Graph")
    wb.get_by_text("from comparison run #4").first.wait_for(timeout=60_000)
    text = shown()
    assert third in text and first not in text and "run #1" not in text
    tab("Engine")
    wb.get_by_text("from comparison run #4").locator("visible=true").first.wait_for(timeout=60_000)
    tab("Compare")
    history = "\n".join(wb.locator("select").locator("visible=true").evaluate_all(
        "els => els.map(e => e.innerText)")).replace("\xa0", " ")  # option labels keep their spaces as NBSP
    assert "#1: ort:fp16 vs ort, shapes image:[1,4,16,16]" in history
    assert "#4: ort:fp16 vs ort, shapes image:[1,4,24,24]" in history
    H.screenshot(page, artifacts, "03-run3")

    # the tabs with runs of their own: run, cancel (no numbers left), run again on other shapes (new numbers only)
    next_id = 5
    for title, button, cell, done in (("Calibration", "Calibrate", 4, "tensors calibrated"),
                                      ("Repair", "Run", 5, "target")):
        tab(title)
        start = wb.locator("button", has_text=re.compile(rf"^\s*{button}\s*$")).locator("visible=true").first
        start.click()
        try:
            wb.get_by_text(re.compile(rf"run #{next_id}(?!\d)[\s\S]*{done}")).first.wait_for(timeout=180_000)
        except Exception:  # noqa: BLE001 - a screenshot and what the tab shows, then the failure
            H.screenshot(page, artifacts, f"failure-{title.lower()}")
            raise AssertionError(f"{title}: run #{next_id} never showed: {shown()[:3000]}") from None
        old, old_id = value_now(cell)
        assert old_id == next_id and all(v in shown() for v in old.split(",")), (old, shown()[:2000])
        H.run_cell(page, 1, wait=True)
        start.click()
        cancel = wb.locator("button", has_text="Cancel").locator("visible=true").first
        page.wait_for_function("b => !b.disabled", arg=cancel.element_handle(), timeout=60_000)
        cancel.click()
        wb.get_by_text(re.compile(rf"run #{next_id + 1}(?!\d)[\s\S]*cancelled")).first.wait_for(timeout=60_000)
        H.run_cell(page, 2, wait=True)
        text = shown()
        assert f"run #{next_id}" not in text, f"{title} still shows run #{next_id} after the cancel: {text[:2000]}"
        assert not set(old.split(",")) & set(re.findall(r"-?\d+\.\d+", text)), (old, text[:2000])
        assert wb.evaluate(PLOTS_JS) == 0, f"{title} still draws the cancelled run's predecessor's plots"
        H.screenshot(page, artifacts, f"04-{title.lower()}-cancelled")
        tab("Compare")
        shapes(f"image:[1,4,{20 if title == 'Calibration' else 12},{20 if title == 'Calibration' else 12}]")
        tab(title)
        start.click()
        wb.get_by_text(re.compile(rf"run #{next_id + 2}(?!\d)[\s\S]*{done}")).first.wait_for(timeout=180_000)
        new, new_id = value_now(cell)
        text = shown()
        assert new_id == next_id + 2 and new != old
        assert all(v in text for v in new.split(",")), (new, text[:2000])
        gone = set(old.split(",")) - set(new.split(","))
        assert gone and not gone & set(re.findall(r"-?\d+\.\d+", text)), (old, new, text[:2000])
        assert f"run #{next_id}" not in text and f"run #{next_id + 1}" not in text
        H.screenshot(page, artifacts, f"05-{title.lower()}-rerun")
        next_id += 3
    assert not errors, errors
    # defect 18: no widget fails to take its new state on a rerun
    assert not [m for m in console if "Error setting state" in m], console
