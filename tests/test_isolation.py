"""Isolated engines: workers that really segfault, abort, hang, exit or run out of memory; the parent survives."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.engines import get_engine
from workbench.engines.isolated import IsolatedEngine
from workbench.engines.worker import WorkerGone
from workbench.errors import EngineCrashedError, EngineRunError, EngineUnavailableError, SpecError

FIXTURE = "engine_fixtures:MisbehavingEngine"
X = {"x": np.ones((1, 4), np.float32)}
SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


@pytest.mark.parametrize("how, when, wording", [
    ("segfault", "run", "the MisbehavingEngine worker crashed with SIGSEGV while running the model"),
    ("abort", "prepare", "the MisbehavingEngine worker crashed with SIGABRT while building the engine"),
    ("exit", "run", "the MisbehavingEngine worker exited unexpectedly (exit code 3) while running the model"),
])
def test_dead_worker_becomes_one_line_crash_error(tiny, how, when, wording):
    with IsolatedEngine(FIXTURE, {"how": how, "when": when}, timeout_s=60) as engine:
        with pytest.raises(EngineCrashedError) as err:
            engine.prepare(tiny, ["y"]).run(X)
    text = str(err.value)
    assert text.startswith(wording) and "--mode bisect or fewer marked tensors" in text and "\n" not in text


def test_hung_worker_is_stopped_after_the_timeout(tiny):
    engine = IsolatedEngine(FIXTURE, {"how": "hang"}, timeout_s=1.5)
    session = engine.prepare(tiny, ["y"])
    pid = engine.describe()["worker_pid"]
    with pytest.raises(EngineCrashedError, match=r"did not finish running the model within 1.5 s and was stopped"):
        session.run(X)
    assert not _alive(pid)
    engine.close()


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux only")
def test_memory_limit_turns_runaway_allocation_into_a_clear_error(tiny):
    with IsolatedEngine(FIXTURE, {"how": "memory"}, timeout_s=60, memory_limit_bytes=2**30) as engine:
        with pytest.raises(EngineCrashedError, match=r"ran out of memory \(limit 1.00 GiB\) while running the model"):
            engine.prepare(tiny, ["y"]).run(X)


def test_engine_is_usable_again_after_a_crash(tiny):
    with IsolatedEngine(FIXTURE, {"how": "none"}, timeout_s=60) as engine:
        session = engine.prepare(tiny, ["y"])
        first = session.run(X)
        with pytest.raises(EngineCrashedError, match="SIGSEGV"):
            session.run({**X, "how": np.array("segfault")})
        again = session.run(X)  # a new worker; the session is rebuilt there
        np.testing.assert_array_equal(again["y"], X["x"] * 2)
        assert int(again["pid"]) != int(first["pid"]) and int(again["pid"]) != os.getpid()
        assert not _alive(int(first["pid"]))


def test_worker_errors_keep_their_type_and_message(tiny):
    with IsolatedEngine(FIXTURE, {"how": "raise"}, timeout_s=60) as engine:
        session = engine.prepare(tiny, ["y"])
        with pytest.raises(EngineRunError, match="ValueError: boom from the test engine") as err:
            session.run(X)
        assert not isinstance(err.value, EngineCrashedError)
    with IsolatedEngine("ort", timeout_s=60) as engine:
        with pytest.raises(EngineRunError, match="no_such_tensor"):
            engine.prepare(tiny, ["no_such_tensor"])


def test_isolated_ort_gives_the_same_numbers_as_in_process_ort():
    from workbench.model.load import load_model

    model = load_model(SAMPLES / "healthy_cnn.onnx").proto
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    names = [o for node in model.graph.node for o in node.output]
    with IsolatedEngine(FIXTURE, {"how": "segfault"}, timeout_s=60) as crashing:
        with pytest.raises(EngineCrashedError):
            crashing.prepare(model, names).run(feeds)
    with IsolatedEngine("ort", timeout_s=120) as engine:
        got = engine.prepare(model, names).run(feeds)
        info = engine.describe()
    want = get_engine("ort").prepare(model, names).run(feeds)
    assert got.keys() == want.keys() == set(names)
    for name in names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert info["isolated"] and info["providers"] == ["CPUExecutionProvider"] and info["worker_pid"] != os.getpid()


def test_unavailable_engine_error_crosses_the_process_boundary(tiny):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorrt is installed here")
    with IsolatedEngine("trt", {"engine_cache_dir": "/nonexistent/never-created"}, timeout_s=60) as engine:
        assert engine.marks_all_cheaply is False and engine.availability()[0] is False
        with pytest.raises(EngineUnavailableError, match="tensorrt is not installed"):
            engine.prepare(tiny, ["h", "y"])
    assert not Path("/nonexistent/never-created").exists()


def test_crash_messages_name_the_runtime():
    engine = IsolatedEngine("trt")
    gone = WorkerGone("died", -11)
    assert str(engine._crash_error(gone, "building the engine")).startswith(
        "the TensorRT worker crashed with SIGSEGV while building the engine -- rerun with --mode bisect or fewer "
        "marked tensors")
    assert "most likely out of memory" in str(engine._crash_error(WorkerGone("died", -9), "running the model"))


def test_options_must_pickle():
    with pytest.raises(SpecError, match="cannot be pickled"):
        IsolatedEngine("torch", {"module": lambda x: x})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as dead
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return True
