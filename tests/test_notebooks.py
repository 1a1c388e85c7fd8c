"""Every notebook runs top to bottom in a fresh kernel; the README's main-job command serves JupyterLab."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import nbformat
import pytest
from conftest import REPO
from nbclient import NotebookClient

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_clean(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    saved = nbformat.read(path, as_version=4)
    assert all(c.get("outputs") for c in saved.cells if c.cell_type == "code"), "notebooks are saved with outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_saved_with_widget_state_and_stay_small(path):
    """Viewers draw the saved widgets without a kernel; plotly's 5 MB bundle is never saved per figure widget."""
    nb = nbformat.read(path, as_version=4)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    assert state, "saved with widget state (scripts/make_notebooks.py uses store_widget_state=True)"
    assert path.stat().st_size < 1_500_000
    assert all(len(m.get("state", {}).get("_esm", "")) < 200_000 for m in state.values())


def test_the_quickstart_opens_on_the_workbench():
    nb = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "Workbench(" in first.source
    views = [o for o in first.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "the first cell shows the workbench widget"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_start_script_serves_the_quickstart(tmp_path):
    """`bash scripts/start.sh` (the README's main job) starts JupyterLab with the quickstart notebook."""
    port, token = _free_port(), "workbench-test"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        ["bash", "scripts/start.sh", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline, body = time.time() + 240, None
        while time.time() < deadline and proc.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/notebooks/quickstart.ipynb?content=0&token={token}"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    body = json.loads(resp.read())
                break
            except OSError:
                time.sleep(1)
        assert body is not None, proc.stdout.read().decode(errors="replace")[-2000:] if proc.poll() else "timeout"
        assert body["name"] == "quickstart.ipynb" and body["type"] == "notebook"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
