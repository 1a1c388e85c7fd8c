"""Notebook UI benchmark in a real browser, and the Playwright harness the browser tests share.

    python benchmarks/bench_ui.py [--nodes 100 1000 5000] [--artifacts DIR] [--json OUT]

Measures, in headless Chromium against a JupyterLab server started here (127.0.0.1, random port, token), from
the Shift+Enter key press to the first painted frame (timed in the page):
- ``workbench_render_s``: ``Workbench(sample model)`` (workbench already imported) until the widget shows;
  ``workbench_inventory_chart_s``: until its inventory chart is drawn too (JupyterLab loads plotly.js lazily);
- per synthetic graph size N (``graphs[N]``): ``python_layout_s`` (layout and colours in Python);
  ``graph_interactive_s``: ``GraphPanel(<N-node model>)``, every node uncollapsed, until its canvas is drawn and
  takes input; ``zoom_frame_ms``: one wheel zoom until the next frame; ``click_roundtrip_s``: a click on a node
  until the kernel has answered (the panel describes the node).
The harness (server, browser, notebook helpers) is imported by ``tests/test_browser_*.py``.

    python benchmarks/bench_ui.py --candidates DIR [--nodes 100 1000 5000]

re-measures the graph libraries the graph view was chosen against, on the same synthetic graphs: layout in
Python (ours, networkx generations, grandalf if installed), layout in the browser (dagre, elkjs), and drawing the
Python layout (cytoscape.js, sigma.js + graphology, plotly scattergl/scatter, our canvas). ``DIR`` is a
node_modules folder with those packages (``npm install @dagrejs/dagre elkjs cytoscape sigma graphology``);
they are measured, never shipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


# --- synthetic models ----------------------------------------------------------------------------------------
def synthetic_model(n_nodes: int, width: int = 16):
    """An ONNX model of about ``n_nodes`` elementwise nodes in transformer-like blocks: name scopes
    ``/layers.K/attn``, ``/layers.K/mlp/fcJ``, two branches and a residual per block. Runs on ORT."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    ops = ["Mul", "Add", "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Softsign"]
    nodes = []
    inits = [numpy_helper.from_array(np.full([1, width], 0.5, np.float32), "c")]

    def node(op: str, scope: str, inputs: list[str]) -> str:
        name = f"{scope}/{op}_{len(nodes)}"
        out = f"{name}_output_0"
        ins = inputs + (["c"] if op in ("Mul", "Add") and len(inputs) == 1 else [])
        nodes.append(helper.make_node(op, ins, [out], name=name))
        return out

    h, block = "x", 0
    while len(nodes) < n_nodes:
        scope = f"/layers.{block}"
        a = h
        for k in range(10):
            a = node(ops[k % len(ops)], f"{scope}/attn", [a])
        m = h
        for k in range(10):
            m = node(ops[(k + 3) % len(ops)], f"{scope}/mlp/fc{k // 5}", [m])
        h = node("Add", f"{scope}/residual", [node("Add", scope, [a, m]), h])
        block += 1
    graph = helper.make_graph(nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# --- JupyterLab server ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 (random port, token) serving a scratch copy of notebooks/ (the browser
    autosaves: the repository's notebooks are never touched); sample_models/ is linked beside it. All Jupyter
    state (config, runtime, workspaces, settings) lives in the scratch folder."""

    def __init__(self, root: Path | None = None, notebooks: list[str] | None = None) -> None:
        self.own_root = root is None  # a scratch folder of ours: removed when the server stops (__exit__)
        self.root = Path(root or tempfile.mkdtemp(prefix="workbench-lab-"))
        self.port, self.token = free_port(), "wb-" + os.urandom(8).hex()
        self.proc: subprocess.Popen | None = None
        (self.root / "notebooks").mkdir(parents=True, exist_ok=True)
        for name in notebooks or [p.name for p in (REPO / "notebooks").glob("*.ipynb")]:
            shutil.copy(REPO / "notebooks" / name, self.root / "notebooks" / name)
        link = self.root / "sample_models"
        if not link.exists():
            link.symlink_to(REPO / "sample_models", target_is_directory=True)
        self.log_path = self.root / "jupyterlab.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> JupyterLab:
        state = self.root / ".jupyter"
        settings = {  # offline: no news prompt; every cell in the DOM (no windowing) so tests can find outputs
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            "notebook-extension/tracker": {"windowingMode": "none"},
        }
        for key, values in settings.items():
            path = state / "settings" / "@jupyterlab" / f"{key}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_RUNTIME_DIR": str(state / "rt"),
               "IPYTHONDIR": str(state / "ipython"), "JUPYTER_PLATFORM_DIRS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}", "--ServerApp.ip=127.0.0.1",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               f"--LabApp.workspaces_dir={state / 'workspaces'}", f"--LabApp.user_settings_dir={state / 'settings'}",
               "--ServerApp.port_retries=0"]
        if hasattr(os, "getuid") and os.getuid() == 0:
            cmd.append("--allow-root")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=5):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"JupyterLab did not start in {timeout:.0f} s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its kernels: the group we started
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> JupyterLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/notebooks/{name}?token={self.token}&reset"

    def write_notebook(self, name: str, cells: list[str]) -> str:
        """A scratch notebook of code cells (for benchmarks); returns its name."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, self.root / "notebooks" / name)
        return name


# --- browser helpers -----------------------------------------------------------------------------------------
def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def open_notebook(page, lab: JupyterLab, name: str, timeout_ms: int = 90_000) -> None:
    """Open notebook ``name`` and wait until its kernel is idle."""
    page.goto(lab.notebook_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=timeout_ms)
    wait_idle(page, timeout_ms)


def wait_idle(page, timeout_ms: int = 300_000) -> None:
    """Wait until the notebook's kernel has started and reports idle (toolbar indicator and status bar)."""
    page.wait_for_function(
        """() => { const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) '
                 + '.jp-Notebook-ExecutionIndicator');
                   const bar = document.querySelector('#jp-main-statusbar');
                   return s && s.getAttribute('data-status') === 'idle'
                          && bar && /\\| Idle/.test(bar.textContent); }""",
        timeout=timeout_ms)


def menu(page, top: str, item: str, attempts: int = 3) -> None:
    """Click JupyterLab's menu ``top`` (e.g. "Run"), then its entry ``item`` (e.g. "Run All Cells")."""
    for attempt in range(attempts):
        page.keyboard.press("Escape")  # close any open menu first
        page.locator(".lm-MenuBar-itemLabel", has_text=top).first.click()
        entry = page.locator(".lm-Menu-itemLabel").get_by_text(item, exact=True).first
        try:
            entry.wait_for(state="visible", timeout=5_000)
            entry.click()
            return
        except Exception:  # noqa: BLE001 - the menu closed under us: try again
            if attempt == attempts - 1:
                raise


def run_all(page, timeout_ms: int = 300_000) -> None:
    """Clear the saved outputs, run every cell, then wait until every code cell shows a fresh execution count
    and the kernel is idle."""
    cleared = """() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
                         return ![...p.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].some(
                             e => /\\[\\d+\\]/.test(e.textContent)); }"""
    for attempt in range(3):
        menu(page, "Edit", "Clear Outputs of All Cells")
        try:
            page.wait_for_function(cleared, timeout=10_000)
            break
        except Exception:  # noqa: BLE001 - the click did not take: try again
            if attempt == 2:
                raise
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(
        """() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
                   const prompts = [...p.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
                   return prompts.length && prompts.every(e => /\\[\\d+\\]/.test(e.textContent)); }""",
        timeout=timeout_ms)
    wait_idle(page, timeout_ms)


def run_cell(page, index: int, wait: bool = False, timeout_ms: int = 300_000) -> None:
    """Select cell ``index`` (0-based among all cells) and run it (Shift+Enter); with ``wait``, until it has run."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-prompt").click()
    page.keyboard.press("Shift+Enter")
    if wait:
        cell.locator(".jp-InputArea-prompt", has_text=re.compile(r"\[\d+\]")).wait_for(timeout=timeout_ms)
        wait_idle(page, timeout_ms)


def time_cell(page, index: int, selectors: dict[str, str], timeout_ms: int = 120_000) -> dict[str, float]:
    """Run cell ``index``; for each ``{name: selector}``, the seconds from the key press until it shows in the cell's
    output and two animation frames have passed (painted). Measured in the page."""
    page.evaluate(
        """([index, selectors]) => {
             const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[index];
             window.__wbTiming = new Promise(resolve => {
               let t0 = null;
               const seen = {}, painted = {};
               const onKey = (e) => { if (e.key === 'Enter' && e.shiftKey && t0 === null) t0 = performance.now(); };
               document.addEventListener('keydown', onKey, true);
               const check = () => {
                 if (t0 === null) return;
                 for (const [name, sel] of Object.entries(selectors)) {
                   if (!(name in seen) && cell.querySelector(sel)) {
                     seen[name] = true;
                     requestAnimationFrame(() => requestAnimationFrame(() => {
                       painted[name] = (performance.now() - t0) / 1000;
                       if (Object.keys(painted).length === Object.keys(selectors).length) {
                         obs.disconnect();
                         document.removeEventListener('keydown', onKey, true);
                         resolve(painted);
                       }
                     }));
                   }
                 }
               };
               const obs = new MutationObserver(check);
               obs.observe(cell, {subtree: true, childList: true, attributes: true});
             }); }""", [index, selectors])
    run_cell(page, index)
    found = page.evaluate("""(ms) => Promise.race([window.__wbTiming, new Promise((_, reject) => setTimeout(
                                 () => reject(new Error('timed out waiting for the cell output')), ms))])""",
                          timeout_ms)
    return {k: round(v, 3) for k, v in found.items()}


def screenshot(page, folder: Path | None, name: str) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / f"{name}.png"), full_page=False)


# --- the benchmark -------------------------------------------------------------------------------------------
def bench(sizes: list[int], artifacts: Path | None) -> dict:
    import onnx
    from playwright.sync_api import sync_playwright

    from workbench import load_model
    from workbench.plots.graph import GraphView, graph_payload

    out: dict = {"graphs": {}}
    with JupyterLab(notebooks=[]) as lab:
        cells = ["import time\nfrom workbench import Workbench\nfrom workbench.ui import GraphPanel",
                 "Workbench('../sample_models/fp16_clamp_constant.onnx')"]
        for n in sizes:
            path = lab.root / f"synthetic_{n}.onnx"
            onnx.save(synthetic_model(n), path)
            view = GraphView.from_graph(load_model(path).graph)
            t0 = time.perf_counter()
            graph_payload(view)  # layout + colours, in Python
            out["graphs"][n] = {"python_layout_s": round(time.perf_counter() - t0, 3)}
            cells.append(f"GraphPanel({str(path)!r}, max_nodes={10 * n})  # every node, uncollapsed")
        name = lab.write_notebook("bench.ipynb", cells)
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            open_notebook(page, lab, name)
            run_cell(page, 0, wait=True)
            out.update(time_cell(page, 1, {"workbench_render_s": ".wb-title",
                                           "workbench_inventory_chart_s": ".js-plotly-plot .main-svg"}))
            wait_idle(page)
            screenshot(page, artifacts, "bench-workbench")
            for k, n in enumerate(sizes):
                out["graphs"][n].update(time_cell(page, 2 + k, {"graph_interactive_s": ".wb-graph[data-ready='1']"}))
                wait_idle(page)
                out["graphs"][n].update(_interact(page, 2 + k))
                screenshot(page, artifacts, f"bench-graph-{n}")
            browser.close()
    return out


def _interact(page, index: int) -> dict:
    """Zoom one step (time to the next frame), then click a node and time the kernel's answer."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)
    graph = cell.locator(".wb-graph")
    graph.scroll_into_view_if_needed()
    zoom_ms = graph.evaluate(
        """(g) => new Promise(r => { const c = g.querySelector('.wb-graph-canvas');
             const t = performance.now();
             c.dispatchEvent(new WheelEvent('wheel', {deltaY: -200, clientX: 300, clientY: 300, bubbles: true,
                                                      cancelable: true}));
             requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now() - t))); })""")
    graph.locator(".wb-graph-btn", has_text="Fit").click()
    for _ in range(3):  # zoom in until boxes are large enough to hit reliably
        graph.locator(".wb-graph-btn", has_text="+").click()
    target = graph.evaluate("""(g) => { const ids = g.wbVisibleIds(); const id = ids[Math.floor(ids.length / 2)];
                                        return {id, ...g.wbNodePosition(id)}; }""")
    t0 = time.perf_counter()
    page.mouse.click(target["x"], target["y"])
    cell.locator(".wb-culprit", has_text=target["id"]).wait_for(timeout=30_000)
    return {"zoom_frame_ms": round(zoom_ms, 1), "click_roundtrip_s": round(time.perf_counter() - t0, 3)}


# --- candidate graph libraries --------------------------------------------------------------------------------
_PAGE = """<html><body style="margin:0"><div id=c style="width:1000px;height:700px"></div>
<script>window.DATA = __DATA__; const PAL = ["#4e79a7","#f28e2b","#e15759","#76b7b2","#59a14f","#edc948"];
const opColor = (op) => PAL[[...op].reduce((h, ch) => (h * 31 + ch.charCodeAt(0)) | 0, 0) >>> 0 % PAL.length];
const frames2 = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));</script>
__LIBS__<script type="module">__BODY__</script></body></html>"""
_CANDIDATES = {
    "dagre layout (JS)": (["@dagrejs/dagre/dist/dagre.min.js"], """const t = performance.now();
const g = new dagre.graphlib.Graph(); g.setGraph({rankdir: 'TB'}); g.setDefaultEdgeLabel(() => ({}));
DATA.names.forEach((n, i) => g.setNode(String(i), {width: 100, height: 30}));
DATA.edges.forEach(([a, b]) => g.setEdge(String(a), String(b)));
dagre.layout(g); window.RESULT = {ready_s: (performance.now() - t) / 1000};"""),
    "elkjs layered layout (JS)": (["elkjs/lib/elk.bundled.js"], """const t = performance.now();
await new ELK().layout({id: 'root', layoutOptions: {'elk.algorithm': 'layered', 'elk.direction': 'DOWN'},
  children: DATA.names.map((n, i) => ({id: String(i), width: 100, height: 30})),
  edges: DATA.edges.map(([a, b], k) => ({id: 'e' + k, sources: [String(a)], targets: [String(b)]}))});
window.RESULT = {ready_s: (performance.now() - t) / 1000};"""),
    "cytoscape.js (canvas, Python layout)": (["cytoscape/dist/cytoscape.min.js"], """const t = performance.now();
const els = DATA.names.map((n, i) => ({data: {id: String(i), label: DATA.ops[i], color: opColor(DATA.ops[i])},
                                       position: {x: DATA.x[i] * 140, y: DATA.y[i] * 60}}));
DATA.edges.forEach(([a, b], k) => els.push({data: {id: 'e' + k, source: String(a), target: String(b)}}));
const cy = cytoscape({container: document.getElementById('c'), elements: els, layout: {name: 'preset'},
  textureOnViewport: true, hideEdgesOnViewport: true, style: [{selector: 'node', style: {'shape': 'round-rectangle',
  'width': 100, 'height': 30, 'background-color': 'data(color)', 'label': 'data(label)', 'min-zoomed-font-size': 8}},
  {selector: 'edge', style: {'width': 1, 'line-color': '#999'}}]});
await frames2(); const ready = performance.now() - t;
const t2 = performance.now(); cy.panBy({x: 50, y: 50}); await frames2();
window.RESULT = {ready_s: ready / 1000, frame_ms: performance.now() - t2};"""),
    "sigma.js + graphology (WebGL, Python layout)": (
        ["graphology/dist/graphology.umd.min.js", "sigma/dist/sigma.min.js"], """const t = performance.now();
const g = new graphology.Graph();
DATA.names.forEach((n, i) => g.addNode(String(i), {x: DATA.x[i] * 140, y: -DATA.y[i] * 60, size: 4,
                                                   label: DATA.ops[i], color: opColor(DATA.ops[i])}));
DATA.edges.forEach(([a, b]) => g.addEdge(String(a), String(b)));
const s = new Sigma(g, document.getElementById('c')); await frames2(); const ready = performance.now() - t;
const t2 = performance.now(); const st = s.getCamera().getState(); s.getCamera().setState({...st, x: st.x + 0.01});
await frames2(); window.RESULT = {ready_s: ready / 1000, frame_ms: performance.now() - t2};"""),
}


def _plotly_candidate(kind: str) -> tuple[list[str], str]:
    return (["plotly.min.js"], """const t = performance.now(); const ex = [], ey = [];
DATA.edges.forEach(([a, b]) => { ex.push(DATA.x[a], DATA.x[b], null); ey.push(-DATA.y[a], -DATA.y[b], null); });
await Plotly.newPlot('c', [{type: 'KIND', x: ex, y: ey, mode: 'lines', line: {color: '#999', width: 1}},
  {type: 'KIND', x: DATA.x, y: DATA.y.map(v => -v), mode: 'markers', text: DATA.names,
   marker: {symbol: 'square', size: 10, color: DATA.ops.map(opColor)}}], {showlegend: false});
await frames2(); const ready = performance.now() - t; const t2 = performance.now();
await Plotly.relayout('c', {'xaxis.range': [-5, 5]}); await frames2();
window.RESULT = {ready_s: ready / 1000, frame_ms: performance.now() - t2};""".replace("KIND", kind))


def bench_candidates(node_modules: Path, sizes: list[int]) -> dict:
    """Layout and drawing times of the candidate graph libraries (see the module docstring)."""
    import functools
    import http.server
    import threading

    from playwright.sync_api import sync_playwright

    from workbench import load_model
    from workbench.plots.graph import GraphView
    from workbench.plots.graph_layout import layered_layout

    root = Path(tempfile.mkdtemp(prefix="workbench-graphlibs-"))
    (root / "node_modules").symlink_to(node_modules.resolve(), target_is_directory=True)
    import plotly

    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", root / "node_modules")
    shutil.copy(Path(__file__).parents[1] / "workbench" / "ui" / "static" / "graph.js", root / "graph.mjs")
    candidates = dict(_CANDIDATES)
    candidates["plotly scattergl (WebGL, Python layout)"] = _plotly_candidate("scattergl")
    candidates["plotly scatter (SVG, Python layout)"] = _plotly_candidate("scatter")
    candidates["ours: canvas 2D (Python layout)"] = ([], """import w from './graph.mjs'; const t = performance.now();
const st = {data: {ids: DATA.names, labels: DATA.ops, x: DATA.x, y: DATA.y, color: DATA.ops.map(opColor),
            edges: DATA.edges.flat()}, selected: '', highlight: [], height: 700}; const h = {};
w.render({model: {get: k => st[k], set: (k, v) => { st[k] = v; }, save_changes() {}, send() {},
                  on: (e, f) => { (h[e] = h[e] || []).push(f); }}, el: document.getElementById('c')});
await frames2(); const ready = performance.now() - t; const t2 = performance.now();
document.querySelector('.wb-graph-btn').click(); await frames2();
window.RESULT = {ready_s: ready / 1000, frame_ms: performance.now() - t2};""")
    out: dict = {}
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = launch(p)
            for n in sizes:
                graph = load_model(synthetic_model(n)).graph
                view = GraphView.from_graph(graph)
                rows = out.setdefault(n, {})
                rows.update(_python_layouts(view))
                x, layer = layered_layout(len(view.names), view.edges)
                data = json.dumps({"names": view.names, "ops": view.ops, "x": x, "y": layer, "edges": view.edges})
                for name, (libs, body) in candidates.items():
                    tags = "".join(f'<script src="/node_modules/{lib}"></script>' for lib in libs)
                    page_file = root / f"page_{n}_{abs(hash(name))}.html"
                    page_file.write_text(_PAGE.replace("__DATA__", data).replace("__LIBS__", tags)
                                         .replace("__BODY__", body))
                    page = browser.new_page(viewport={"width": 1100, "height": 800})
                    page.goto(f"http://127.0.0.1:{server.server_address[1]}/{page_file.name}")
                    try:
                        page.wait_for_function("window.RESULT", timeout=120_000)
                        rows[name] = {k: round(v, 3) for k, v in page.evaluate("window.RESULT").items()}
                    except Exception as e:  # noqa: BLE001 - a candidate that times out is a result too
                        rows[name] = {"error": str(e).splitlines()[0][:80]}
                    page.close()
            browser.close()
    finally:
        server.shutdown()
    return out


def _python_layouts(view) -> dict:
    from workbench.plots.graph_layout import layered_layout

    out = {}
    t0 = time.perf_counter()
    layered_layout(len(view.names), view.edges)
    out["ours: layered layout (Python)"] = {"ready_s": round(time.perf_counter() - t0, 3)}
    import networkx as nx

    t0 = time.perf_counter()
    g = nx.DiGraph(view.edges)
    g.add_nodes_from(range(len(view.names)))
    for k, gen in enumerate(nx.topological_generations(g)):
        for v in gen:
            g.nodes[v]["layer"] = k
    nx.multipartite_layout(g, subset_key="layer", align="horizontal")
    out["networkx generations + multipartite (Python, no crossing reduction)"] = {
        "ready_s": round(time.perf_counter() - t0, 3)}
    try:
        from grandalf.graphs import Edge, Graph, Vertex
        from grandalf.layouts import SugiyamaLayout
    except ImportError:
        return out

    class _Box:
        w = h = 10

    t0 = time.perf_counter()
    vs = [Vertex(i) for i in range(len(view.names))]
    for v in vs:
        v.view = _Box()
    for component in Graph(vs, [Edge(vs[a], vs[b]) for a, b in view.edges]).C:
        layout = SugiyamaLayout(component)
        layout.init_all()
        layout.draw(2)
    out["grandalf Sugiyama (Python)"] = {"ready_s": round(time.perf_counter() - t0, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000], help="synthetic graph sizes")
    parser.add_argument("--artifacts", type=Path, default=None, help="folder for screenshots")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    parser.add_argument("--candidates", type=Path, default=None, metavar="NODE_MODULES",
                        help="measure the candidate graph libraries instead (see the module docstring)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops us: still stop the server
    result = bench_candidates(args.candidates, args.nodes) if args.candidates else bench(args.nodes, args.artifacts)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
