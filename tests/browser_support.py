"""What every browser test module shares: its screenshot folder, the browser check, and a Chromium page on a
JupyterLab server (benchmarks/bench_ui.py holds the JupyterLab and Chromium helpers themselves)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, load_file

H = load_file(REPO / "benchmarks" / "bench_ui.py")
#: a notebook cell showing the Workbench on the FP16 sample (plotly offline), as a user starts
SAMPLE_WORKBENCH_CELL = ('import plotly.io as pio\n\npio.renderers.default = "plotly_mimetype"\n'
                         'from pathlib import Path\n\nfrom workbench import Workbench\n\n'
                         'wb = Workbench(Path("../sample_models/fp16_clamp_constant.onnx").resolve())\nwb')


def artifacts_folder(name: str) -> Path:
    """``$WORKBENCH_ARTIFACTS/NAME`` (else a fresh temporary folder's), created, for screenshots and server logs."""
    folder = Path(os.environ.get("WORKBENCH_ARTIFACTS") or tempfile.mkdtemp(prefix="workbench-artifacts-")) / name
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {folder}")
    return folder


def require_browser() -> None:
    """Skip without Playwright or Chromium; fail instead in CI (``WORKBENCH_REQUIRE_BROWSER``)."""
    pytest.importorskip("playwright")
    if not Path(H.CHROMIUM).exists():
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER"):
            pytest.fail(f"{H.CHROMIUM} not found")
        pytest.skip(f"{H.CHROMIUM} not found: apt-get install chromium (CI installs it)")


@contextlib.contextmanager
def shared_lab():
    """The JupyterLab of one test worker, shared by its browser modules (the ``jupyter_lab`` fixture of conftest.py):
    starting one is the slow part of a browser module. Each module writes its own notebooks into it, and
    :func:`lab_browser` gives each module its page on the light theme and shuts its kernels down after it."""
    require_browser()
    with H.JupyterLab() as lab:
        yield lab


def _lab_api(lab, method: str, path: str, body: dict | None = None):
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{lab.url}{path}?token={lab.token}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read()
    return json.loads(text) if text else None


def _fresh_module(lab) -> None:
    """A shared server as a module expects a new one: the light theme (a module may leave the dark one set)."""
    _lab_api(lab, "PUT", "/lab/api/settings/@jupyterlab/apputils-extension:themes",
             {"raw": '{"theme": "JupyterLab Light"}'})


def _stop_kernels(lab) -> None:
    for kernel in _lab_api(lab, "GET", "/api/kernels") or []:
        with contextlib.suppress(OSError):
            _lab_api(lab, "DELETE", f"/api/kernels/{kernel['id']}")


@contextlib.contextmanager
def lab_browser(lab, artifacts: Path, shared: bool = False):
    """``(page, errors)``: a 1400x1000 Chromium page (60 s default timeout, downloads accepted) with ``lab`` (an
    ``H.JupyterLab``) running (``shared``: already running, from :func:`shared_lab`: set to the light theme first,
    its kernels shut down after); page errors collected in ``errors``; a screenshot on a setup failure; the server
    log saved."""
    from playwright.sync_api import sync_playwright

    if shared:
        _fresh_module(lab)
    with contextlib.nullcontext(lab) if shared else lab, sync_playwright() as p:
        browser = H.launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page, errors
        except Exception:
            H.screenshot(page, artifacts, "failure")
            raise
        finally:
            (artifacts / "jupyterlab.log").write_bytes(lab.log_path.read_bytes())
            browser.close()
            if shared:
                with contextlib.suppress(OSError):
                    _stop_kernels(lab)


def module_fixtures(name: str, notebooks: tuple[str, ...] = ()):
    """The module-scoped fixtures most browser modules need: ``artifacts`` (the screenshot folder NAME) and
    ``lab_page`` ((lab, page, errors): the worker's shared JupyterLab, ``notebooks`` copied into it, and a Chromium
    page on it). Use as ``artifacts, lab_page = B.module_fixtures("browser-errors")``."""
    @pytest.fixture(scope="module")
    def artifacts() -> Path:
        return artifacts_folder(name)

    @pytest.fixture(scope="module")
    def lab_page(artifacts, jupyter_lab):
        import shutil

        for name in notebooks:  # a fresh copy: the browser autosaves what a module ran
            shutil.copy(REPO / "notebooks" / name, jupyter_lab.root / "notebooks" / name)
        with lab_browser(jupyter_lab, artifacts, shared=True) as (page, errors):
            yield jupyter_lab, page, errors

    return artifacts, lab_page


#: (contrast ratio of an element's text against what is behind it, WCAG style); used on headings, buttons, plots
CONTRAST_JS = """
(() => {
  const parse = (c) => { const m = /rgba?\\(([^)]+)\\)/.exec(c || ''); if (!m) return null;
    const p = m[1].split(',').map(s => parseFloat(s));
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const over = (top, under) => ({r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a),
                                 b: top.b * top.a + under.b * (1 - top.a), a: 1});
  const background = (el) => {  // what shows behind el: its ancestors' backgrounds, composed
    const layers = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; }
    }
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (const c of layers.reverse()) bg = over(c, bg);
    return bg;
  };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  window.wbContrast = (el, colorProp = 'color') => {
    const fg = parse(getComputedStyle(el)[colorProp]);
    const bg = background(el instanceof SVGElement ? el.closest('.js-plotly-plot') || el : el);
    return ratio(over(fg, bg), bg);
  };
  window.wbLuminance = (c) => lum(parse(c));
  window.wbBackground = (el) => background(el);
})();
"""


def dark_theme(page) -> None:
    """Switch JupyterLab to its Dark theme from the Settings menu (as a user does) and wait until it applies."""
    page.keyboard.press("Escape")
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").first.click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Theme", exact=True).first.hover()
    page.locator(".lm-Menu-itemLabel").get_by_text("JupyterLab Dark", exact=True).first.click()
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    page.wait_for_timeout(500)
