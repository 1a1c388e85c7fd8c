"""Runs that survive a kernel restart (issue 22), in a real browser (JupyterLab + headless Chromium): run a
comparison in the Workbench, restart the kernel (nothing of the run is left in memory), show the Workbench again,
pick the saved run and press Reopen: every tab shows it as ``run #N, reopened from BUNDLE`` (numbered after the
saved runs) and its numbers are the original run's (read in the kernel, and in the Compare, Errors and Graph tabs).
A run going on when the kernel restarts says it stopped. The runs go to ``$WORKBENCH_RUNS_DIR``: a folder of this
test's own, which the notebook's first cell sets in each kernel."""

from __future__ import annotations

import re

import browser_support as B
import pytest

pytestmark = pytest.mark.browser

H = B.H
CULPRIT = "/bn_big_var/BatchNormalization"
CELLS = [
    'import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\nfrom pathlib import Path\n\n'
    'from workbench import Workbench\n\n'
    'wb = Workbench(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\nwb',
    # every compared tensor's numbers of the current comparison, and its run's id and label
    'r, run = wb.state.result, wb.state.current_run("comparison")\n'
    'print("numbers:", [(t.node, "%.6g" % t.metrics["sqnr_db"], "%.6g" % t.metrics["max_abs"]) for t in r.tensors],'
    ' "diverged:", r.diverged, "run:", run.id, "label:", run.label)',
    # a long comparison, running when the kernel restarts
    'p = wb.compare_panel\np.ref_engine.value, p.cand_engine.value, p.cand_variant.value = "ref", "ref", "fp16"\n'
    'p.inputs.count.value = 4000\nprint("long run started:", p.run() is not None)',
]
PANES = "'.lm-StackedPanel-child, .p-StackedPanel-child, .widget-tab-contents > *'"
SHOWN_JS = """w => { const box = [...w.querySelectorAll(PANES)]
  .find(e => e.offsetParent !== null && e.getBoundingClientRect().width > 0);
  return box ? box.innerText : ''; }""".replace("PANES", PANES)

artifacts, lab_page = B.module_fixtures("browser-saved-runs")


def _workbench(page):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).first


def _numbers(page) -> tuple[str, str]:
    """(the numbers, the run's id and label) printed by the kernel for the current comparison."""
    H.run_cell(page, 1, wait=True)
    out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(1).locator(".jp-OutputArea-output")
    out.filter(has_text="numbers:").last.wait_for(timeout=60_000)
    text = out.last.inner_text()
    m = re.search(r"numbers: (.*) diverged: (\w+) run: (\d+) label: (.*)", text, re.S)
    assert m, text
    return f"{m.group(1)} {m.group(2)}", f"{m.group(3)} {m.group(4).strip()}"


def test_a_run_is_reopened_after_a_kernel_restart_with_its_numbers(lab_page, artifacts):
    lab, page, errors = lab_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    # a runs folder of this test's own (set by the first cell, again after the restart): other browser tests of the
    # session save runs of the same sample model into the session's folder, which would list them here too
    runs = artifacts / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    cells = [f"import os\nos.environ['WORKBENCH_RUNS_DIR'] = {str(runs)!r}\n" + CELLS[0], *CELLS[1:]]
    name = lab.write_notebook("saved_runs.ipynb", cells)
    H.open_notebook(page, lab, name)
    H.run_cell(page, 0, wait=True)
    wb = _workbench(page)
    wb.wait_for()

    def tab(title: str) -> None:
        wb.locator(".lm-TabBar-tab", has_text=re.compile(rf"^\s*{title}\s*$")).click()

    tab("Compare")
    wb.locator("button", has_text="Run").locator("visible=true").first.click()
    wb.locator("button", has_text=f"#1 {CULPRIT}").wait_for(timeout=180_000)
    original, first = _numbers(page)
    assert first.startswith("1 ")
    sqnr = re.search(rf"'{re.escape(CULPRIT)}', '([^']+)'", original).group(1)
    # saved on a worker thread: the live Workbench's picker lists it once it is in the runs folder
    wb.locator(".wb-saved-runs select option", has_text="run #1 comparison").wait_for(state="attached",
                                                                                     timeout=120_000)
    compare_text = wb.evaluate(SHOWN_JS)
    H.screenshot(page, artifacts, "01-run")

    # a long run starts, and the kernel restarts while it runs (as a user does: Kernel > Restart Kernel...): its
    # Workbench, results and runs are gone; the view of the run says it stopped instead of staying "running"
    H.run_cell(page, 2, wait=True)
    wb.locator(".wb-job-running").first.wait_for(state="attached", timeout=60_000)
    [kernel] = B._lab_api(lab, "GET", "/api/kernels")
    H.menu(page, "Kernel", "Restart Kernel…")
    page.locator(".jp-Dialog-button", has_text="Restart").click()
    out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(1).locator(".jp-OutputArea")
    for _attempt in range(30):  # the restarted kernel knows no `wb`
        H.wait_idle(page)
        H.run_cell(page, 1, wait=True)
        if "NameError" in out.inner_text():
            break
        page.wait_for_timeout(1000)
    assert "NameError" in out.inner_text(), out.inner_text()
    stopped = wb.locator(".wb-job-running .wb-gone-note", has_text="This run stopped: the kernel that ran it is gone")
    stopped = stopped.first
    stopped.wait_for(state="visible", timeout=60_000)
    assert not wb.locator(".wb-job-running .wb-job-row").first.is_visible()  # no Cancel that can do nothing
    H.screenshot(page, artifacts, "01b-restarted-while-running")
    [again] = B._lab_api(lab, "GET", "/api/kernels")
    assert again["id"] == kernel["id"]
    H.menu(page, "Edit", "Clear Outputs of All Cells")
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .wb-title").wait_for(state="detached")
    H.run_cell(page, 0, wait=True)
    wb = _workbench(page)
    wb.locator(".wb-saved-runs", has_text="saved runs of this model").wait_for(timeout=120_000)
    option = wb.locator(".wb-saved-runs select option", has_text="run #1 comparison")
    assert option.count() == 1 and "DIVERGED" in option.inner_text()
    H.screenshot(page, artifacts, "02-restarted")
    wb.locator(".wb-saved-runs button", has_text="Reopen").click()
    # numbered after the saved run #1 (a restart does not start again at #1)
    note = wb.locator(".wb-saved-runs", has_text=re.compile(r"run #2, reopened from \S+-comparison-"))
    note.wait_for(timeout=120_000)

    reopened, now = _numbers(page)
    assert reopened == original  # every tensor's numbers and the verdict
    assert now.startswith("2 ") and now.split(" ", 1)[1] == first.split(" ", 1)[1]  # the same run's label
    tab("Compare")
    wb.locator("button", has_text=f"#1 {CULPRIT}").wait_for(timeout=60_000)
    text = wb.evaluate(SHOWN_JS)
    assert re.search(r"run #2, reopened from \S+-comparison-", text), text[:2000]
    # the Compare tab reads as it did for the original run (its culprit card, verdict and numbers)
    cards = [line for line in compare_text.splitlines() if "dB" in line]
    assert cards and all(line in text for line in cards), (cards, text[:3000])
    tab("Errors")
    wb.get_by_text(re.compile(r"run #2, reopened from \S+-comparison-\w+: DIVERGED")).first.wait_for(timeout=60_000)
    tab("Compare")
    wb.locator("button", has_text=f"#1 {CULPRIT}").click()  # selects it everywhere
    tab("Graph")
    wb.get_by_text(re.compile(r"from comparison run #2, reopened from \S+-comparison-")).first.wait_for(timeout=60_000)
    assert f"{float(sqnr):.4g}" in wb.evaluate(SHOWN_JS)  # as the side pane prints it
    H.screenshot(page, artifacts, "03-reopened")
    assert not errors, errors
