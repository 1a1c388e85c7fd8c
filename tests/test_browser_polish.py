"""Issue 13 in a real browser (JupyterLab + headless Chromium, one server for the module, as in
test_browser_workbench.py): saved notebooks open clean, the graph view's search, tooltips, Fit, overlay and scope
changes behave, and the dark theme keeps every heading, button and plot readable (with the figure titles inside
their plots and the saved JSON downloadable). Screenshots go to $WORKBENCH_ARTIFACTS (or a temporary folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import browser_support as B
import pytest
from conftest import REPO

pytestmark = pytest.mark.browser

H = B.H
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
CULPRIT = "/bn_big_var/BatchNormalization"



@pytest.fixture(scope="module")
def artifacts() -> Path:
    return B.artifacts_folder("browser-polish")


@pytest.fixture(scope="module")
def lab_page(artifacts):
    B.require_browser()
    lab = H.JupyterLab(notebooks=NOTEBOOKS)
    # the server's own data folder: notebooks trusted here (see _trust) are trusted for this server only
    data = lab.root / ".jupyter" / "data"
    before = os.environ.get("JUPYTER_DATA_DIR")
    os.environ["JUPYTER_DATA_DIR"] = str(data)
    try:
        with B.lab_browser(lab, artifacts) as (page, errors):
            yield lab, page, errors
    finally:
        if before is None:
            os.environ.pop("JUPYTER_DATA_DIR", None)
        else:
            os.environ["JUPYTER_DATA_DIR"] = before


def _panel(page):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")


OPENED_JS = """() => {
  const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const icons = [...p.querySelectorAll('.jupyter-widgets-disconnected')].filter(e => {
    const b = getComputedStyle(e, '::before');
    return e.offsetParent !== null && b.content && b.content !== 'none' && b.display !== 'none'; });
  const broken = [...p.querySelectorAll('img')].filter(
    i => i.getAttribute('src') && i.complete && i.naturalWidth === 0);
  const tab = [...document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab')].find(
    t => t.classList.contains('lm-mod-current'));
  const notes = [...p.querySelectorAll('.wb-saved-note')].filter(n => n.offsetParent !== null);
  const pictures = [...p.querySelectorAll('.jp-RenderedPlotly img.plot-img')].filter(i => i.naturalWidth > 0);
  return {icons: icons.length, broken: broken.length, dirty: tab.classList.contains('jp-mod-dirty'),
          text: p.innerText, notes: notes.length, roots: p.querySelectorAll('.wb-root').length,
          pictures: pictures.length, figures: p.querySelectorAll('.jp-RenderedPlotly').length};
}"""


def _open_saved(page, lab, name: str) -> dict:
    page.goto(lab.notebook_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    H.wait_idle(page)  # the kernel has started: JupyterLab has compared its kernelspec with the notebook's
    page.wait_for_timeout(1500)  # the saved figures and widgets are drawn
    return page.evaluate(OPENED_JS)


def _trust(lab, name: str) -> None:
    """``jupyter trust`` the server's copy, as a user who ran and saved it would have it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "jupyter", "trust", str(lab.root / "notebooks" / name)], check=True,
                   env={**os.environ, "JUPYTER_PLATFORM_DIRS": "1"}, capture_output=True, timeout=60)


def test_saved_notebooks_open_clean(lab_page, artifacts):
    """Item 11: before running, as cloned (untrusted: widgets show their text) and as trusted (the saved widgets
    drawn): no broken-link icons or broken images, not marked modified, no path of the machine that made the
    notebook; figures show as their saved pictures; a saved workbench says how to bring it to life."""
    lab, page, errors = lab_page
    for name in NOTEBOOKS:
        found = _open_saved(page, lab, name)
        H.screenshot(page, artifacts, f"11-open-{name.removesuffix('.ipynb')}")
        assert found["icons"] == 0 and found["broken"] == 0, (name, found["icons"], found["broken"])
        assert not found["dirty"], f"{name} is marked modified on open"
        assert str(REPO) not in found["text"] and "/tmp/" not in found["text"], name
        assert found["pictures"] == found["figures"], f"{name}: a saved figure without its picture"
    _trust(lab, "quickstart.ipynb")
    found = _open_saved(page, lab, "quickstart.ipynb")
    H.screenshot(page, artifacts, "11-open-quickstart-trusted")
    assert found["roots"] >= 1, "the trusted notebook draws its saved widgets"
    assert found["icons"] == 0 and found["broken"] == 0 and not found["dirty"], found
    assert found["notes"] == 1, "one note says the saved workbench needs a run"
    assert str(REPO) not in found["text"] and "/tmp/" not in found["text"]
    assert not errors, errors


def _deep_and_named_models(root: Path) -> tuple[Path, Path]:
    """A 400-node chain (deep: Fit must show all of it) and a scoped model whose first nodes are named
    HardSigmoid.0 and Sigmoid.0 (searching "Sigmoid.0" must not pick HardSigmoid.0)."""
    import onnx
    from onnx import TensorProto, helper

    def chain(names_ops, path):
        nodes, h = [], "x"
        for k, (name, op) in enumerate(names_ops):
            nodes.append(helper.make_node(op, [h], [f"t{k}"], name=name))
            h = f"t{k}"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                                  [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 8])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    ops = ["Relu", "Neg", "Abs", "Tanh"]
    deep = chain([(f"n{k}", ops[k % 4]) for k in range(400)], root / "deep_chain.onnx")
    named = [("HardSigmoid.0", "HardSigmoid"), ("Sigmoid.0", "Sigmoid")]
    named += [(f"/block{b}/{ops[k % 4]}_{k}", ops[k % 4]) for b in range(12) for k in range(8)]
    return deep, chain(named, root / "scoped.onnx")


def test_graph_view_search_tooltips_fit_overlay_and_scopes(lab_page, artifacts):
    """Item 12: exact match first with a results list and next/previous by key; a tooltip goes when the view
    re-centres; Fit frames a deep graph whole; a new overlay keeps the pan/zoom; opening a scope keeps the
    selection and the view."""
    lab, page, errors = lab_page
    deep, scoped = _deep_and_named_models(lab.root)
    name = lab.write_notebook("graph_view.ipynb", [
        f"from workbench.ui import GraphPanel\nscoped = GraphPanel({str(scoped)!r}, max_nodes=40, height=420)\n"
        "scoped",
        f"deep = GraphPanel({str(deep)!r}, height=420)\ndeep",
    ])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    graphs = _panel(page).locator(".wb-graph[data-ready='1']")
    graphs.nth(1).wait_for()
    top, low = graphs.nth(0), graphs.nth(1)

    # Fit on a 400-layer chain shows every node (it used to show the top ten)
    low.scroll_into_view_if_needed()
    low.locator(".wb-graph-btn", has_text="Fit").click()
    shown = low.evaluate("g => [g.wbVisibleIds().length, g.wbView().s]")
    assert shown[0] == 400, f"Fit shows {shown[0]} of 400 nodes"

    # search: the exact name first, then step with the keys and the buttons
    top.scroll_into_view_if_needed()
    box = top.locator(".wb-graph-find")
    box.fill("Sigmoid.0")
    box.press("Enter")
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('selected: Sigmoid.0')",
                           arg=top.element_handle())
    items = top.locator(".wb-graph-results li")
    assert items.count() == 2 and items.nth(0).inner_text().startswith("Sigmoid.0")
    assert top.locator(".wb-graph-count").inner_text() == "1/2"
    box.press("Enter")  # next
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('HardSigmoid.0')",
                           arg=top.element_handle())
    box.press("Shift+Enter")  # previous
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('selected: Sigmoid.0')",
                           arg=top.element_handle())
    box.press("ArrowDown")
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('HardSigmoid.0')",
                           arg=top.element_handle())
    top.locator(".wb-graph-prev").click()
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('selected: Sigmoid.0')",
                           arg=top.element_handle())
    H.screenshot(page, artifacts, "12-search")

    # a new overlay keeps the pan and zoom
    top.locator(".wb-graph-btn", has_text="+").click()
    top.locator(".wb-graph-btn", has_text="+").click()
    before = top.evaluate("g => g.wbView()")
    legend = top.locator(".wb-graph-legend").inner_text()
    _panel(page).locator(".widget-dropdown", has_text="colour").first.locator("select").select_option(
        label="precision")
    page.wait_for_function("([g, old]) => g.querySelector('.wb-graph-legend').innerText !== old",
                           arg=[top.element_handle(), legend])
    after = top.evaluate("g => g.wbView()")
    assert all(abs(before[k] - after[k]) < 0.5 for k in ("s", "tx", "ty")), (before, after)

    # opening a scope keeps the selected node selected and the view where it was
    top.locator(".wb-graph-btn", has_text="Fit").click()
    target = top.evaluate("g => { const id = g.wbVisibleIds().find(i => i === 'scope:/block5');"
                          " return {id, ...g.wbNodePosition(id)}; }")
    assert target["id"], "the collapsed scope is drawn"
    scale = top.evaluate("g => g.wbView().s")
    page.mouse.dblclick(target["x"], target["y"])
    page.wait_for_function("(g) => g.wbVisibleIds().some(i => i.startsWith('/block5/'))", arg=top.element_handle())
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('selected: Sigmoid.0')",
                           arg=top.element_handle())  # drawn on the next animation frame
    assert abs(top.evaluate("g => g.wbView().s") - scale) < 1e-9, "the zoom stays"
    H.screenshot(page, artifacts, "12-expanded")

    # hover a node: its tooltip shows; the view re-centres on a far node (a search): the tooltip goes
    low.scroll_into_view_if_needed()
    for _ in range(4):
        low.locator(".wb-graph-btn", has_text="+").click()
    spot = low.evaluate("g => { const ids = g.wbVisibleIds(); const id = ids[Math.floor(ids.length / 2)];"
                        " return {id, ...g.wbNodePosition(id)}; }")
    page.mouse.move(spot["x"], spot["y"])
    tip = low.locator(".wb-graph-tip")
    page.wait_for_function("(t) => t.style.display === 'block'", arg=tip.element_handle())
    low.locator(".wb-graph-find").fill("n399")
    low.locator(".wb-graph-find").press("Enter")
    page.wait_for_function("(g) => g.querySelector('.wb-graph-status').textContent.endsWith('selected: n399')",
                           arg=low.element_handle())
    page.wait_for_timeout(400)  # the re-centring animation
    assert tip.evaluate("t => t.style.display") == "none", "the tooltip stayed after re-centring"
    assert not errors, errors


#: the canvas pixel (RGB) under a client point
PIXEL_JS = """(g, [x, y]) => { const c = g.querySelector('canvas'); const r = c.getBoundingClientRect();
  const k = c.width / r.width; const d = c.getContext('2d').getImageData(Math.round((x - r.left) * k),
  Math.round((y - r.top) * k), 1, 1).data; return [d[0], d[1], d[2]]; }"""


#: the share of a node's box (inset from its outline) painted within 24 of colour "#rrggbb" (the label is thin)
FILL_JS = """(g, [id, hex]) => { const c = g.querySelector('canvas'); const r = c.getBoundingClientRect();
  const k = c.width / r.width, s = g.wbView().s, at = g.wbNodePosition(id);
  const w = Math.floor((120 * s - 6) * k), h = Math.floor((30 * s - 6) * k);
  const d = c.getContext('2d').getImageData(Math.round((at.x - r.left) * k - w / 2),
                                            Math.round((at.y - r.top) * k - h / 2), w, h).data;
  const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
  let hits = 0;
  for (let i = 0; i < d.length; i += 4) hits += want.every((v, j) => Math.abs(d[i + j] - v) <= 24);
  return hits / (w * h); }"""


def _near(rgb, hex_color: str, tol: int = 24) -> bool:
    want = [int(hex_color[k:k + 2], 16) for k in (1, 3, 5)]
    return all(abs(a - b) <= tol for a, b in zip(rgb, want))


def test_engine_overlays_and_fused_group_boxes_render(lab_page, artifacts):
    """Issue 15 item 3: the provider overlay paints each node in its provider's colour with a categorical legend,
    and the engine's fused groups are boxes around their ONNX nodes, with a tooltip naming the fused kernel."""
    from workbench.plots.graph_engine import GROUP_COLOR, PROVIDER_COLORS

    lab, page, errors = lab_page
    name = lab.write_notebook("engine_overlays.ipynb", [
        "from pathlib import Path\n\nfrom workbench import engine_graph\nfrom workbench.ui import GraphPanel\n\n"
        'panel = GraphPanel(Path("../sample_models/fp16_clamp_constant.onnx").resolve(), height=380)\n'
        'panel.state.engine_graph = engine_graph(panel.state.model, "ort", runs=2)\n'
        'panel.overlay.value = "provider"\npanel',
    ])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    g = _panel(page).locator(".wb-graph[data-ready='1']").first
    g.wait_for()
    g.scroll_into_view_if_needed()
    page.wait_for_function("(g) => g.wbGroupBoxes().length === 1", arg=g.element_handle())
    legend = g.locator(".wb-graph-legend").inner_text()
    assert "CPUExecutionProvider" in legend and "fused group (1)" in legend, legend
    box = g.evaluate("g => g.wbGroupBoxes()[0]")
    assert sorted(box["items"]) == sorted(["/conv/Conv", "/bn_big_var/BatchNormalization", "/relu/Relu"]), box
    H.screenshot(page, artifacts, "15-engine-overlays")

    # the box's outline is drawn in the group colour; the nodes inside it in the provider's colour
    mid = (box["y0"] + box["y1"]) / 2
    assert _near(g.evaluate(PIXEL_JS, [box["x0"], mid]), GROUP_COLOR, 40)
    for node in box["items"]:
        share = g.evaluate(FILL_JS, [node, PROVIDER_COLORS[0]])
        assert share > 0.6, f"{node}: {share:.0%} of its box in the provider's colour"

    # hovering the box off its nodes shows the fused kernel
    page.mouse.move(box["x0"] + 3, mid)
    tip = g.locator(".wb-graph-tip")
    page.wait_for_function("(t) => t.style.display === 'block'", arg=tip.element_handle())
    assert "fused by ort" in tip.inner_text() and "com.microsoft.nchwc.Conv" in tip.inner_text()
    assert not errors, errors




def test_dark_theme_keeps_headings_buttons_and_plots_readable(lab_page, artifacts):
    """Item 10 (with 13 and 15): in JupyterLab Dark every heading and table reads, Fit/+/- are not blank white
    boxes, the graph canvas and the plots follow the theme; the plot titles fit inside their figures; the saved
    result JSON is downloadable."""
    lab, page, errors = lab_page
    name = lab.write_notebook("dark.ipynb", [B.SAMPLE_WORKBENCH_CELL])
    H.open_notebook(page, lab, name)
    H.run_all(page)
    wb = _panel(page).locator(".jp-OutputArea-output").filter(has=page.locator(".wb-title")).first
    wb.locator(".lm-TabBar-tab", has_text="Graph").click()
    canvas = wb.locator(".wb-graph[data-ready='1']").first
    canvas.wait_for()
    light_bg = canvas.evaluate("g => g.wbColors().bg")
    B.dark_theme(page)
    page.evaluate(B.CONTRAST_JS)
    # the graph: canvas colours re-read from the theme, buttons themed
    assert canvas.evaluate("g => g.wbColors().bg") != light_bg
    corner = canvas.evaluate("""g => { const c = g.querySelector('canvas');
        const d = c.getContext('2d').getImageData(2, 2, 1, 1).data; return (d[0] + d[1] + d[2]) / 3; }""")
    assert corner < 80, f"the graph canvas stays light in the dark theme ({corner})"
    for label in ("Fit", "+"):
        button = canvas.locator(".wb-graph-btn", has_text=label).first
        assert button.evaluate("b => wbLuminance(getComputedStyle(b).backgroundColor)") < 0.3, label
        assert button.evaluate("b => wbContrast(b)") >= 4.5, label
    H.screenshot(page, artifacts, "10-dark-graph")

    wb.locator(".lm-TabBar-tab", has_text="Compare").click()
    wb.locator("button", has_text="Run").first.click()
    wb.locator("button", has_text=f"#1 {CULPRIT}").wait_for(timeout=120_000)
    low = wb.evaluate("""w => [...w.querySelectorAll(
            '.wb-h, .wb-title, .wb-table th, .wb-table td, .wb-msg, .wb-culprit, .wb-kv th')]
        .filter(e => e.offsetParent !== null && e.textContent.trim())
        .map(e => [e.className, e.textContent.slice(0, 40), wbContrast(e)]).filter(x => x[2] < 4.5)""")
    assert not low, f"text too faint in the dark theme: {low[:5]}"

    # results JSON: saved, and the browser downloads it
    wb.locator("button", has_text="Save result JSON").click()
    link = wb.locator("a.wb-download", has_text="result JSON")
    link.wait_for()
    with page.expect_download() as info:
        link.click()
    assert json.loads(Path(info.value.path()).read_text())["schema"] == "workbench.compare/1"

    # the plots: transparent on the dark page, axis text readable, titles inside their figures
    wb.locator("button", has_text=f"#1 {CULPRIT}").click()  # opens Errors
    plot = wb.locator(".js-plotly-plot").locator("visible=true").first
    plot.wait_for()
    wb.get_by_text("value distributions").first.wait_for()
    page.wait_for_timeout(300)
    checks = wb.evaluate("""w => [...w.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent !== null)
      .map(p => { const svg = p.querySelector('.main-svg'); const box = svg.getBoundingClientRect();
        const texts = [...p.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text')];
        const title = p.querySelector('.g-gtitle text, .gtitle');
        const t = title ? title.getBoundingClientRect() : null;
        return {bg: getComputedStyle(svg).backgroundColor,
                faint: texts.filter(e => wbContrast(e, 'fill') < 4.5).length, texts: texts.length,
                title: title ? title.textContent : null,
                inside: t ? (t.left >= box.left - 1 && t.right <= box.right + 1) : true}; })""")
    assert len(checks) >= 3, checks
    for c in checks:
        assert c["bg"] in ("rgba(0, 0, 0, 0)", "transparent"), c
        assert c["texts"] and c["faint"] == 0, c
        assert c["inside"], f"title cut off: {c['title']}"
    H.screenshot(page, artifacts, "10-dark-errors")
    assert not errors, errors
