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
def lab_browser(lab, artifacts: Path):
    """``(page, errors)``: a 1400x1000 Chromium page (60 s default timeout, downloads accepted) with ``lab`` (an
    ``H.JupyterLab``) running; page errors collected in ``errors``; a screenshot on a setup failure; the server log
    saved."""
    from playwright.sync_api import sync_playwright

    with lab, sync_playwright() as p:
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
