"""Issue 13 in a real browser (JupyterLab + headless Chromium, one server for the module): what every tab of the
workbench shows, checked against stored expectations of *structure*, not pixels, in the light theme and again in
JupyterLab Dark; and the Compare panel's own-candidate picker (item 4) driven as a user would.

Structure expectations
----------------------
``tests/data/ui_structure/<tab>.json`` (one file per tab, e.g. ``compare.json``) holds, for the workbench on
``sample_models/fp16_clamp_constant.onnx`` after one Compare run (ort against the default ort:fp16):

- ``tabs``: the workbench's tab titles, in order, and ``current``: the tab shown;
- ``inner_tabs``: the titles of any tab bar inside the panel;
- ``headings``: the visible ``.wb-h`` headings' text, in order;
- ``buttons``: the visible buttons' labels (buttons with no text, icon-only, are left out), sorted: which
  buttons a tab offers is its vocabulary, their order is layout (it changes when a row wraps or a control moves
  into a side pane);
- ``plots``: how many plotly figures are visible; ``tables``: how many HTML tables are visible.

The same file is checked in both themes: switching to JupyterLab Dark must not add, drop or reorder anything.
Beyond the file, every visible heading and button must read (WCAG contrast >= 4.5 against what is behind it:
B.CONTRAST_JS) and every visible plot must be big (> 200 x 150 px, not collapsed), in both themes.

What is left out or normalised, because it legitimately varies: every run of digits (with decimals) reads ``N``
(run numbers, counts, timings, dB values in labels: "#1 /bn_big_var/..." is stored as "#N /bn_big_var/...");
the server's scratch folder and the repository's path read ``<root>`` and ``<repo>``; texts are whitespace-
collapsed. Pixels, colours, sizes (beyond "big"), message texts, table contents, plot contents and the positions
of things are not recorded: they change with fonts, the window and every tweak of a message, and the other
browser tests (test_browser_errors.py, test_browser_polish.py) check the plots' insides. Headings and button
labels are the UI's vocabulary: a change there is a change the user sees and should be a deliberate one.

Each tab is read once it has settled into its expectation (polled, generous timeout: the machine may be busy);
on a timeout the last reading is compared with the file and the difference reported.

Regenerate the expectations after a deliberate UI change with::

    WORKBENCH_UPDATE_UI_STRUCTURE=1 .venv/bin/python -m pytest -q tests/test_browser_structure.py -p no:cacheprovider

which writes the files (from the light theme, once each tab has been still for a few seconds with no plot or graph
pending) instead of comparing, still checks contrast and plot sizes in both themes and that the dark theme shows
the same structure; review the diff of ``tests/data/ui_structure/`` before committing.

Screenshots of every tab in both themes (``light-<tab>.png``, ``dark-<tab>.png``) and of the candidate picker go
to ``$WORKBENCH_ARTIFACTS/browser-structure`` (or a temporary folder)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import browser_support as B
import pytest
from conftest import REPO, SAMPLES

pytestmark = pytest.mark.browser

H = B.H
EXPECTED = Path(__file__).resolve().parent / "data" / "ui_structure"
UPDATE = bool(os.environ.get("WORKBENCH_UPDATE_UI_STRUCTURE"))
CULPRIT = "/bn_big_var/BatchNormalization"
#: how long a tab may take to settle into its expected structure (a busy 2-core CI machine)
SETTLE_MS = 60_000

#: the quickstart's first cell (as test_browser_errors.py's)
CELL = ('import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\nfrom pathlib import Path\n\n'
        'from workbench import Workbench\n\n'
        'SAMPLES = Path("../sample_models").resolve()\nwb = Workbench(SAMPLES / "fp16_clamp_constant.onnx")\nwb')

#: window.wbStructure(w, roots): the structure of the workbench output ``w`` (its shown tab), texts normalised
#: (digits -> N, each [path, name] of ``roots`` -> name); needs B.CONTRAST_JS loaded
STRUCTURE_JS = """(() => {
window.wbStructure = (w, roots) => {
  const shown = e => e.offsetParent !== null && e.getBoundingClientRect().width > 0;
  const norm = t => { t = t.trim().replace(/\\s+/g, ' ');
    for (const [path, name] of roots || []) t = t.split(path).join(name);
    return t.replace(/\\d+(?:[.,]\\d+)*/g, 'N'); };
  const text = e => norm(e.textContent);
  const bar = w.querySelector('.lm-TabBar');
  const outer = bar ? [...bar.querySelectorAll('.lm-TabBar-tab')] : [];
  const stack = w.querySelector('.widget-tab-contents, .jupyter-widget-TabPanel-tabContents');
  const box = stack ? [...stack.children].find(shown) || stack : w;  // the shown tab's panel
  const plots = [...box.querySelectorAll('.js-plotly-plot')].filter(shown);
  return {
    tabs: outer.map(text),
    current: outer.filter(t => t.classList.contains('lm-mod-current')).map(text),
    inner_tabs: [...box.querySelectorAll('.lm-TabBar-tab')].filter(shown).map(text),
    headings: [...box.querySelectorAll('.wb-h')].filter(shown).map(text),
    buttons: [...box.querySelectorAll('button')].filter(shown).filter(b => text(b)).map(text).sort(),
    plots: plots.length,
    tables: [...box.querySelectorAll('table')].filter(shown).length,
    // beyond the expectation file: checked in every theme, whatever the file says
    faint: [...box.querySelectorAll('.wb-h'), ...box.querySelectorAll('button')].filter(shown)
      .filter(e => text(e) && wbContrast(e) < 4.5).map(e => [text(e), Math.round(wbContrast(e) * 100) / 100]),
    small: plots.map(p => p.getBoundingClientRect()).filter(r => !(r.width > 200 && r.height > 150))
      .map(r => [Math.round(r.width), Math.round(r.height)]),
    // still drawing: a plotly output with no figure yet, a graph canvas not ready
    pending: [...box.querySelectorAll('.jp-RenderedPlotly')].filter(shown)
      .filter(e => !e.matches('.js-plotly-plot') && !e.querySelector('.js-plotly-plot')).length
      + [...box.querySelectorAll('.wb-graph')].filter(shown).filter(g => g.dataset.ready !== '1').length,
  };
};
})();
"""
#: the keys stored in the expectation files
KEYS = ("tabs", "current", "inner_tabs", "headings", "buttons", "plots", "tables")
#: true once the shown tab has the expected structure, reads, and has no small or pending plot
SETTLED_JS = """([w, roots, want]) => { const s = wbStructure(w, roots);
  return !s.pending && !s.small.length && !s.faint.length
    && Object.keys(want).every(k => JSON.stringify(s[k]) === JSON.stringify(want[k])); }"""


artifacts, lab_page = B.module_fixtures("browser-structure")


def _roots(lab) -> list[list[str]]:
    return [[str(lab.root.resolve()), "<root>"], [str(lab.root), "<root>"], [str(REPO), "<repo>"]]


def _workbench(page):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
        has=page.locator(".wb-title")).first


def _open_tab(wb, title: str) -> None:
    tab = wb.locator(".lm-TabBar").first.locator(".lm-TabBar-tab", has_text=re.compile(rf"^\s*{re.escape(title)}\s*$"))
    tab.click()
    wb.page.wait_for_function("t => t.classList.contains('lm-mod-current')", arg=tab.element_handle())


def _key(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def _read(wb, roots) -> dict:
    return wb.evaluate("(w, roots) => wbStructure(w, roots)", roots)


def _settle_unknown(wb, roots, timeout_s: float = SETTLE_MS / 1000, still_s: float = 3.0) -> dict:
    """Regeneration only: the structure once it has not changed for ``still_s`` with nothing pending."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        s = _read(wb, roots)
        now = {k: s[k] for k in KEYS}
        if now != last or s["pending"]:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return s
        wb.page.wait_for_timeout(250)
    return _read(wb, roots)


def _settle(wb, roots, want: dict) -> dict:
    """The structure once the shown tab matches ``want`` (polled up to SETTLE_MS), else the last reading."""
    try:
        wb.page.wait_for_function(SETTLED_JS, arg=[wb.element_handle(), roots, want], timeout=SETTLE_MS,
                                  polling=250)
    except Exception:  # noqa: BLE001 - the comparison below says what differs
        pass
    return _read(wb, roots)


def _diff(want: dict, got: dict) -> str:
    return "; ".join(f"{k}: expected {want.get(k)!r}, shown {got.get(k)!r}" for k in KEYS if want.get(k) != got.get(k))


def _expected_tabs() -> list[str]:
    files = sorted(EXPECTED.glob("*.json"))
    assert files, f"no expectations in {EXPECTED}: run with WORKBENCH_UPDATE_UI_STRUCTURE=1 to write them"
    return json.loads(files[0].read_text(encoding="utf-8"))["tabs"]


def _visit_every_tab(page, wb, roots, artifacts, theme: str, tabs: list[str], light: dict) -> dict:
    """Open each tab, read its structure (against the file, or, when regenerating, once still), check contrast
    and plot sizes, screenshot it; returns {key: structure}."""
    seen = {}
    for title in tabs:
        key = _key(title)
        _open_tab(wb, title)
        if UPDATE and theme == "light":
            s = _settle_unknown(wb, roots)
        else:
            want = light[key] if UPDATE else json.loads((EXPECTED / f"{key}.json").read_text(encoding="utf-8"))
            s = _settle(wb, roots, {k: want[k] for k in KEYS})
            assert {k: s[k] for k in KEYS} == {k: want[k] for k in KEYS}, f"{theme} {title}: {_diff(want, s)}"
        H.screenshot(page, artifacts, f"{theme}-{key}")
        assert not s["pending"], f"{theme} {title}: {s['pending']} plot(s)/graph(s) never drawn"
        assert not s["faint"], f"{theme} {title}: headings/buttons that do not read (contrast < 4.5): {s['faint']}"
        assert not s["small"], f"{theme} {title}: collapsed or small plots (w, h): {s['small']}"
        seen[key] = s
    return seen


def test_every_tab_has_its_structure_in_light_and_dark(lab_page, artifacts):
    lab, page, errors = lab_page
    roots = _roots(lab)
    name = lab.write_notebook("structure.ipynb", [CELL])
    H.open_notebook(page, lab, name)
    H.run_cell(page, 0, wait=True)
    wb = _workbench(page)
    wb.wait_for()
    page.evaluate(B.CONTRAST_JS)
    page.evaluate(STRUCTURE_JS)

    # one comparison, so every panel has a result to show
    _open_tab(wb, "Compare")
    wb.locator("button", has_text="Run").first.click()
    wb.locator("button", has_text=f"#1 {CULPRIT}").wait_for(timeout=180_000)

    tabs = _read(wb, roots)["tabs"] if UPDATE else _expected_tabs()
    assert len(tabs) >= 8 and {"Model", "Compare", "Errors", "Graph", "Engine"} <= set(tabs), tabs
    light = _visit_every_tab(page, wb, roots, artifacts, "light", tabs, {})
    if UPDATE:
        EXPECTED.mkdir(parents=True, exist_ok=True)
        for old in EXPECTED.glob("*.json"):
            old.unlink()
        for key, s in light.items():
            text = json.dumps({k: s[k] for k in KEYS}, indent=1, ensure_ascii=False)
            (EXPECTED / f"{key}.json").write_text(text + "\n", encoding="utf-8")

    B.dark_theme(page)
    page.evaluate(B.CONTRAST_JS)
    page.evaluate(STRUCTURE_JS)
    _visit_every_tab(page, wb, roots, artifacts, "dark", tabs, light)
    assert not errors, errors


# --- issue 13 item 4: your own candidate file ------------------------------------------------------------------
def _fp16_copy(dest: Path) -> Path:
    """The sample model converted to FP16 by onnxconverter-common (what a user's own export would be): its
    out-of-range BatchNormalization constants clamped, so it diverges where the FP32 model against itself does
    not."""
    import warnings

    import onnx

    float16 = pytest.importorskip("onnxconverter_common.float16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the float32 number ... will be truncated": the point of the model
        model = float16.convert_float_to_float16(onnx.load(SAMPLES / "fp16_clamp_constant.onnx"), keep_io_types=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, dest)
    return dest


def _summary_text(wb, file_name: str) -> str:
    """The Compare panel's result once it names ``file_name`` (the user's candidate), as text."""
    # "tensors compared": the verdict, not the "expected precision" line (which names the file too)
    summary = wb.locator(".widget-html", has_text=f"your file {file_name}").filter(has_text="tensors compared").first
    summary.wait_for(timeout=180_000)
    return summary.inner_text()


def test_compare_runs_your_own_candidate_typed_or_uploaded(lab_page, artifacts):
    """A user's steps: type the path of their own FP16 export in "cand. file", Run: the result names the file and
    compares it (FP16, clamped: DIVERGED at the clamped BatchNormalization), not the model against itself (the
    sample model typed the same way: ok). Then upload another copy with the upload control (its button, then the
    browser's file chooser), Run: the result names the uploaded file. Before each Run, the "expected precision"
    line names the file and reads its precision from it (fp32 for the sample, fp16 for the exports, whatever the
    precision picker says), and once a result is shown, changing the file warns that the result is out of date
    (until Run)."""
    lab, page, errors = lab_page
    typed = _fp16_copy(lab.root / "candidates" / "typed_fp16.onnx")
    uploaded = _fp16_copy(lab.root / "uploads" / "uploaded_fp16.onnx")
    name = lab.write_notebook("candidate.ipynb", [CELL])
    H.open_notebook(page, lab, name)
    H.run_cell(page, 0, wait=True)
    wb = _workbench(page)
    wb.wait_for()
    _open_tab(wb, "Compare")
    path_box = wb.locator(".widget-text", has_text="cand. file").locator("input")
    note = wb.locator(".widget-html", has_text="runs your file")
    run = wb.locator("button", has_text="Run").first
    expected = wb.locator(".widget-html", has_text="expected precision:")
    stale = wb.locator(".widget-html", has_text="the results below compare")

    def check_before_run(path: Path, precision: str, ran: str | None) -> None:
        """The expected-precision line names the file and its own precision; with the result of another file
        (``ran``) shown, the out-of-date warning says so."""
        line = expected.filter(has_text=f"your file {path.name}").first
        line.wait_for(timeout=60_000)
        said = line.inner_text()
        assert re.search(rf"candidate {precision} \(read from your file {re.escape(path.name)}\b", said), said
        assert "variant the workbench makes" not in said.split("candidate", 1)[-1], said
        if ran is not None:
            warn = stale.filter(has_text=f"now say {path.name} on ort against ort").first
            warn.wait_for(timeout=60_000)
            assert f"compare {ran} on ort against ort" in warn.inner_text(), warn.inner_text()

    def run_with(path: Path, precision: str, ran: str | None = None) -> str:
        path_box.fill(str(path))
        path_box.press("Tab")
        # the kernel has a path (the panel says the file is what runs); the new one before the click: widget
        # messages reach the kernel in order, and the result is awaited by the file's name
        note.first.wait_for(timeout=60_000)
        check_before_run(path, precision, ran)
        page.wait_for_function("b => !b.disabled", arg=run.element_handle(), timeout=60_000)
        run.click()
        text = _summary_text(wb, path.name)
        stale.first.wait_for(state="hidden", timeout=60_000)  # the result shown is the file's: not out of date
        return text

    # control: the sample model itself typed as the candidate is the model against itself: nothing diverges
    # (the precision picker still says fp16: the file is fp32, and "expected precision" says so)
    same = run_with((SAMPLES / "fp16_clamp_constant.onnx").resolve(), "fp32")
    assert "ok: every output passes" in same and "DIVERGED" not in same, same
    assert re.search(r"candidate fp32\b", same), same

    # (a) typed: the FP16 export runs, and the result says so
    text = run_with(typed, "fp16", ran="fp16_clamp_constant.onnx")
    H.screenshot(page, artifacts, "candidate-typed")
    assert "your file typed_fp16.onnx" in text, text
    assert "DIVERGED" in text and f"first divergent: {CULPRIT}" in text, text
    assert re.search(r"candidate fp16\b", text), f"the candidate's precision is read from the file: {text}"
    headline = next(line for line in text.splitlines() if "tensors compared" in line)
    assert headline.startswith("typed_fp16.onnx on ort against ort,"), \
        f"the verdict's headline does not name the file (it read as the model against itself): {headline}"
    history = wb.locator(".widget-dropdown", has_text="run B").locator("select")
    page.wait_for_function("s => s.selectedIndex >= 0 && s.options[s.selectedIndex].text.replace(/\\s/g, ' ')"
                           ".startsWith('#2: typed_fp16.onnx on ort vs ort')", arg=history.element_handle(),
                           timeout=60_000)  # the run history names the file too

    # (b) uploaded: the upload control, then Run
    # ipywidgets' FileUpload is a button whose <input type=file> is never in the page: its click opens the chooser
    with page.expect_file_chooser(timeout=60_000) as chooser:
        wb.locator("button.widget-upload", has_text="upload .onnx").click()
    chooser.value.set_files(str(uploaded))
    page.wait_for_function("(i) => i.value.endsWith('/uploaded_fp16.onnx') && i.value.includes('workbench-upload-')",
                           arg=path_box.element_handle(), timeout=60_000)
    note.first.wait_for(timeout=60_000)
    check_before_run(uploaded, "fp16", ran="typed_fp16.onnx")
    run.click()
    text = _summary_text(wb, "uploaded_fp16.onnx")
    stale.first.wait_for(state="hidden", timeout=60_000)
    H.screenshot(page, artifacts, "candidate-uploaded")
    assert next(line for line in text.splitlines() if "tensors compared" in line).startswith(
        "uploaded_fp16.onnx on ort against ort,"), text
    assert "DIVERGED" in text and f"first divergent: {CULPRIT}" in text, text
    assert not errors, errors
