"""Run lifecycle under signals (issue 21, items 1-2): real CLI processes on the bundled sample models and real
engines, interrupted while work is in progress (Ctrl-C to the process group, SIGTERM or SIGKILL to the CLI).

Each case checks: the exit code (130 Ctrl-C, 143 SIGTERM); no process of the run survives (every descendant
recorded before the signal, the multiprocessing resource tracker included, is gone within a bounded wait for the
kernel); the private TMPDIR of the run is empty (after SIGKILL: at most the run's one scratch folder, which the next
run removes); no staging temporary (``.NAME.wbtmp-*.tmp``) and no partial output beside the outputs.

Work is held at a known point by a slow user preprocessing function that blocks on a chosen (file, pass) and says so
with a marker file, or by an engine kept busy by a long Loop: no fixed sleeps decide where the signal lands.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from conftest import SAMPLES
from onnx import TensorProto, helper

from workbench import _atomic

CNN = SAMPLES / "healthy_cnn.onnx"
OUTLIER = SAMPLES / "int8_outlier.onnx"
CNN_SHAPE = "1,3,32,32"
REAP_S = 10  # bounded wait for the kernel to reap processes (not a timing assertion)

PREPROCESS = textwrap.dedent('''
    import os, time
    import numpy as np
    HERE = os.path.dirname(os.path.abspath(__file__))

    def prep(path):
        """Each file's array; blocks (and says so in HERE/blocked) on the read WB_TEST_BLOCK names: FILE:PASS."""
        name = os.path.basename(path)
        os.makedirs(os.path.join(HERE, "seen"), exist_ok=True)
        mark = os.path.join(HERE, "seen", name)
        with open(mark, "a") as fh:
            fh.write("x")
        if os.environ.get("WB_TEST_BLOCK") == f"{name}:{os.path.getsize(mark)}":
            open(os.path.join(HERE, "blocked"), "w").close()
            time.sleep(300)
        shape = [int(d) for d in os.environ["WB_TEST_SHAPE"].split(",")]
        return np.random.default_rng(int(name.split(".")[0])).normal(size=shape).astype(np.float32)
''')


class Run:
    """The CLI in a session of its own (so a Ctrl-C can go to its process group, as a terminal sends it), with a
    private TMPDIR; stderr is collected on a thread."""

    def __init__(self, root: Path, *args: str, env: dict | None = None, tmpdir: Path | None = None):
        self.root = root
        self.tmpdir = tmpdir or root / "tmpdir"
        self.tmpdir.mkdir(exist_ok=True)
        full_env = {**os.environ, "TMPDIR": str(self.tmpdir), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench", "-v", *args], cwd=root, env=full_env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def err(self) -> str:
        return "".join(self.lines)

    def wait_for(self, ready, what: str, timeout: float = 120, may_end: bool = False) -> bool:
        """Wait until ``ready()``: True. A run that ends first fails the test, or with ``may_end`` returns False
        (a short run on a busy machine can end between two looks)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                self._reader.join(5)
                if may_end:
                    return False
                pytest.fail(f"the run ended (rc {self.proc.returncode}) before {what}:\n{self.err[-3000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no {what} within {timeout} s:\n{self.err[-3000:]}")
            time.sleep(0.02)
        return True

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def workers(self) -> list[psutil.Process]:
        return [p for p in self.descendants() if _cmdline(p).find("spawn_main") >= 0]

    def send(self, sig: int) -> float:
        """SIGINT goes to the process group (Ctrl-C in a terminal), the others to the CLI process."""
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)
        return time.monotonic()

    def finish(self, timeout: float = 60) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return rc


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _still_running(procs: list[psutil.Process], timeout: float = REAP_S) -> list[str]:
    """Those of ``procs`` still alive after ``timeout`` (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{p.pid} {_cmdline(p)[:120]}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _litter(*folders: Path) -> list[str]:
    """Staging temporaries and partial outputs: anything ending in .tmp or carrying the .wbtmp tag."""
    return [str(p) for folder in folders if folder.exists() for p in folder.iterdir()
            if p.name.endswith(".tmp") or ".wbtmp-" in p.name]


def _check_clean(run: Run, rc: int, expected: int, procs: list[psutil.Process], out: Path) -> None:
    assert rc == expected, f"exit {rc}, expected {expected}:\n{run.err[-3000:]}"
    assert "Traceback" not in run.err, run.err[-3000:]
    assert _still_running(procs) == [], "processes of the run survived it"
    assert sorted(p.name for p in run.tmpdir.iterdir()) == [], "temporaries left in TMPDIR"
    assert _litter(out) == [], "temporaries left beside the outputs"


@pytest.fixture
def data(tmp_path) -> Path:
    """30 'image' files and the blocking preprocessing function beside them."""
    (tmp_path / "slow.py").write_text(PREPROCESS)
    files = tmp_path / "files"
    files.mkdir()
    for i in range(30):
        (files / f"{i:02d}.txt").write_text(str(i))
    (tmp_path / "out").mkdir()
    return tmp_path


def _blocked(root: Path):
    return lambda: (root / "blocked").exists()


def _dataset_compare(root: Path, block: str, *extra: str) -> Run:
    return Run(root, "compare", str(CNN), "--ref", "ort", "--cand", "ort:fp16", "--inputs", "files",
               "--preprocess", "slow.py:prep", *extra, env={"WB_TEST_BLOCK": block, "WB_TEST_SHAPE": CNN_SHAPE})


# --- 1. dataset workers: SIGTERM, Ctrl-C, SIGKILL -------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_workers_and_their_scratch_end_with_an_interrupted_run(data, sig):
    run = _dataset_compare(data, "20.txt:1", "--workers", "2", "--json", "out/r.json")
    run.wait_for(lambda: _blocked(data)() and len(run.workers()) >= 2, "two workers busy with the dataset")
    procs = run.descendants()
    assert any("resource_tracker" in _cmdline(p) for p in procs), [_cmdline(p) for p in procs]
    assert [p.name for p in run.tmpdir.iterdir()] != [], "the run keeps its scratch in TMPDIR"
    run.send(sig)
    _check_clean(run, run.finish(), 143 if sig == signal.SIGTERM else 130, procs, data / "out")
    assert not (data / "out" / "r.json").exists()
    assert run.err.strip().splitlines()[-1] == ("workbench: terminated" if sig == signal.SIGTERM
                                                else "workbench: interrupted")


def test_sigkill_leaves_no_worker_and_one_scratch_folder_the_next_run_removes(data):
    run = _dataset_compare(data, "20.txt:1", "--workers", "2")
    run.wait_for(lambda: _blocked(data)() and len(run.workers()) >= 2, "two workers busy with the dataset")
    procs = run.descendants()
    run.send(signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    assert _still_running(procs) == [], "workers (or the resource tracker) outlived a SIGKILLed parent"
    left = sorted(p.name for p in run.tmpdir.iterdir())
    assert len(left) == 1 and left[0].startswith(f"workbench-run-{_atomic._HOST}-{run.proc.pid}-"), left
    nxt = subprocess.run([sys.executable, "-m", "workbench", "inspect", str(CNN)], env={
        **os.environ, "TMPDIR": str(run.tmpdir)}, capture_output=True, text=True, timeout=120)
    assert nxt.returncode == 0, nxt.stderr
    assert list(run.tmpdir.iterdir()) == []


def test_a_local_ray_starts_under_a_deep_tmpdir_and_ends_with_a_sigterm(data):
    """Ray follows TMPDIR into the run's scratch folder; there its socket paths passed Linux's 107 bytes under a
    deep TMPDIR (or a 6-digit pid under /tmp) and Ray refused to start. Its session now goes where they fit."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'onnx-drift-workbench[ray]')")
    deep = data / ("t" * max(1, 60 - len(str(data))))  # 60+ characters before the run's own folder
    deep.mkdir()
    run = Run(data, "compare", str(CNN), "--ref", "ort", "--cand", "ort:fp16", "--inputs", "files", "--preprocess",
              "slow.py:prep", "--workers", "2", "--executor", "ray", tmpdir=deep,
              env={"WB_TEST_BLOCK": "20.txt:1", "WB_TEST_SHAPE": CNN_SHAPE})
    run.wait_for(lambda: _blocked(data)() and any("raylet" in _cmdline(p) for p in run.descendants()),
                 "a Ray task busy with the dataset", timeout=240)
    procs = run.descendants()
    run.send(signal.SIGTERM)
    _check_clean(run, run.finish(), 143, procs, data / "out")
    left = sorted(glob.glob(f"/tmp/ray/session_*_{run.proc.pid}"))
    assert left == [], f"Ray's session folder outside the run's scratch was left: {left}"


def test_ray_session_folders_outside_the_scratch_are_removed_with_the_folder_made_for_them(tmp_path):
    """Where Ray's session had to go outside the run's scratch folder (the user's TMPDIR/ray): the session this
    process started, its session_latest link, and the ray folder itself when this run made it and it is empty, go
    when Ray stops; another process's session and a ray folder that was there before stay."""
    from workbench.dataset.executors import _RaySessions

    root = tmp_path / "ray"
    sessions = _RaySessions(str(root))
    ours = root / f"session_2026-01-01_00-00-00_000000_{os.getpid()}"
    (ours / "logs").mkdir(parents=True)
    (root / "session_latest").symlink_to(ours)
    sessions.remove()
    assert not root.exists()
    root.mkdir()
    theirs = root / "session_2026-01-01_00-00-00_000000_1"
    theirs.mkdir()
    sessions = _RaySessions(str(root))
    ours.mkdir()
    sessions.remove()
    assert sorted(p.name for p in root.iterdir()) == [theirs.name]


def test_sigterm_while_a_repair_starts_ray_exits_143_and_clean(tmp_path):
    """Ray installs SIGTERM handlers of its own while it starts (sys.exit(15)) and in its core worker (a crash
    handler: exit -6): a SIGTERM as soon as Ray's processes exist still ends the run as SIGTERM ends it elsewhere."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'onnx-drift-workbench[ray]')")
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    rng = np.random.default_rng(0)
    for i in range(16):
        np.savez(feeds / f"{i:02d}.npz", x=rng.standard_normal((1, 64)).astype(np.float32))
    (tmp_path / "m.py").write_text("import numpy as np\n\ndef agree(ref, cand):\n    (r,), (c,) = ref.values(), "
                                   "cand.values()\n    return bool(np.argmax(r) == np.argmax(c))\n")
    (tmp_path / "out").mkdir()
    run = Run(tmp_path, "repair", str(OUTLIER), "--cand", "ort:int8", "--inputs", "feeds",
              "--metric", "m.py:agree", "--target", ">=1", "--executor", "ray", "--out", "out/fixed.onnx")
    run.wait_for(lambda: any("gcs_server" in _cmdline(p) for p in run.descendants()), "Ray's first process",
                 timeout=240)  # the earliest: ray.init() is still starting the others
    procs = run.descendants()
    run.send(signal.SIGTERM)
    _check_clean(run, run.finish(), 143, procs, tmp_path / "out")
    # every Ray process of the run (they name its session folder, in the run's TMPDIR), those started after too
    started = [p for p in psutil.process_iter() if str(run.tmpdir) in _cmdline(p)]
    assert _still_running(started) == [], "Ray processes of the run survived it"
    assert not (tmp_path / "out" / "fixed.onnx").exists()


# --- 2. bundles: the staging folder or zip beside the destination --------------------------------------------------

@pytest.mark.parametrize("dest", ["b", "b.zip"])
def test_sigterm_while_a_bundle_is_written_leaves_no_staging_beside_it(data, dest):
    run = _dataset_compare(data, "20.txt:2", "--bundle", f"out/{dest}", "--bundle-data")  # pass 2: the bundle's
    run.wait_for(lambda: _blocked(data)() and _litter(data / "out"), "a bundle being written")
    procs = run.descendants()
    run.send(signal.SIGTERM)
    _check_clean(run, run.finish(), 143, procs, data / "out")
    assert list((data / "out").iterdir()) == []


def test_ctrl_c_during_a_compare_with_a_zip_bundle_leaves_no_weight_copies(tmp_path):
    run = Run(tmp_path, "compare", str(OUTLIER), "--ref", "ort", "--cand", "ort:int8", "--feeds", "3",
              "--bundle", "b.zip")
    run.wait_for(lambda: run.said("written once to"), "the model's weights written to the scratch folder")
    procs = run.descendants()
    run.send(signal.SIGINT)
    rc = run.finish()
    if rc == 0:  # the run finished before the signal took effect: then it must have left nothing either
        assert (tmp_path / "b.zip").is_file()
        rc = 130
    _check_clean(run, rc, 130, procs, tmp_path)


# --- 3. calibrate --cache --qdq ------------------------------------------------------------------------------------

def test_sigterm_during_calibrate_with_cache_and_qdq_leaves_nothing(data):
    run = Run(data, "calibrate", str(OUTLIER), "--data", "files", "--preprocess", "slow.py:prep", "--cache",
              "out/c.cache", "--qdq", "out/q.onnx", env={"WB_TEST_BLOCK": "00.txt:4", "WB_TEST_SHAPE": "1,64"})
    run.wait_for(_blocked(data), "calibration past its histograms")
    procs = run.descendants()
    run.send(signal.SIGTERM)
    _check_clean(run, run.finish(), 143, procs, data / "out")
    assert not (data / "out" / "q.onnx").exists()


# --- 4. isolated engines: a busy worker ------------------------------------------------------------------------------

def _busy_model(path: Path, iterations: int = 200_000_000) -> Path:
    """A Loop of ``iterations`` Adds: keeps ONNX Runtime busy in one Run for minutes."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    g = helper.make_graph(
        [helper.make_node("Loop", ["n", "cond", "x"], ["y"], name="busy", body=body)], "busy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("n", TensorProto.INT64, [], [iterations]),
         helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _busy_run(tmp_path: Path, isolate: str = "yes") -> Run:
    """A compare whose reference run is busy in the Loop: in the isolated worker, or (``isolate="no"``) in the CLI
    process itself."""
    model = _busy_model(tmp_path / "busy.onnx")
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 4), np.float32))
    run = Run(tmp_path, "compare", str(model), "--ref", "ort", "--cand", "ort", "--inputs", "x.npz", "--isolate",
              isolate, "--no-culprits", "--json", "r.json")

    def busy() -> bool:  # the engine burns CPU inside the Loop
        if not run.said("reference engine"):
            return False
        engine = run.workers()[:1] if isolate == "yes" else [psutil.Process(run.proc.pid)]
        return bool(engine) and engine[0].cpu_times().user > 2.0
    run.wait_for(busy, "the engine busy running the model")
    return run


@pytest.mark.parametrize("isolate, sig", [("yes", signal.SIGINT), ("yes", signal.SIGTERM), ("no", signal.SIGINT)])
def test_an_interrupt_stops_a_busy_engine_at_once(tmp_path, isolate, sig):
    """Whatever the engine is doing (here: one long Run): the isolated worker is stopped instead of waited for (its
    timeout is 600 s), an in-process Run is terminated."""
    run = _busy_run(tmp_path, isolate)
    procs = run.descendants()
    sent = run.send(sig)
    rc = run.finish(timeout=120)
    took = time.monotonic() - sent
    _check_clean(run, rc, 130 if sig == signal.SIGINT else 143, procs, tmp_path)
    assert took < 20, f"the run took {took:.1f} s to end after the signal"
    assert not (tmp_path / "r.json").exists()


def test_a_sigkilled_parent_takes_its_busy_isolated_worker_along(tmp_path):
    run = _busy_run(tmp_path)
    procs = run.descendants()
    run.send(signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    assert _still_running(procs) == [], "the isolated worker outlived its SIGKILLed parent"


# --- 5. reduce, rerun of a zip -------------------------------------------------------------------------------------

def test_sigterm_during_reduce_leaves_no_staging_folder(tmp_path):
    run = Run(tmp_path, "reduce", str(SAMPLES / "cnn_fp16_overflow.onnx"), "--ref", "ref", "--cand", "ref:fp16",
              "--out", "red")
    run.wait_for(lambda: run.said("reproduces"), "the reduced pair being written")
    procs = run.descendants()
    run.send(signal.SIGTERM)
    rc = run.finish()
    if rc == 0:  # written before the signal took effect
        assert (tmp_path / "red" / "README.md").is_file()
        rc = 143
    else:
        assert not (tmp_path / "red").exists()
    _check_clean(run, rc, 143, procs, tmp_path)


def test_sigterm_during_a_rerun_of_a_zip_removes_its_extraction(data):
    made = _dataset_compare(data, "", "--bundle", "b.zip", "--bundle-data")
    assert made.finish(timeout=180) == 0, made.err[-3000:]
    run = Run(data, "rerun", "b.zip", tmpdir=data / "tmpdir")
    extracted = lambda: list(run.tmpdir.glob("workbench-bundle*")) + list(run.tmpdir.glob("*/workbench-bundle*"))  # noqa: E731
    if run.wait_for(lambda: extracted() and run.said("written once to"), "the zip extracted and rerunning",
                    may_end=True):
        procs = run.descendants()
        run.send(signal.SIGTERM)
    else:  # the rerun ended before it was seen rerunning (a busy machine): its extraction must be gone all the same
        procs = []
    rc = run.finish()
    if rc in (0, 1):  # the rerun ended before the signal took effect
        rc = 143
    _check_clean(run, rc, 143, procs, data)


# --- 6. stale scratch folders ----------------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_run_removes_scratch_folders_of_dead_runs_and_keeps_live_ones(tmp_path):
    tmpdir = tmp_path / "tmpdir"
    dead = tmpdir / f"workbench-run-{_atomic._HOST}-{_dead_pid()}-abcd1234"
    live = tmpdir / f"workbench-run-{_atomic._HOST}-{os.getpid()}-abcd1234"  # this test process: alive
    other_host = tmpdir / f"workbench-run-{'0' * 6 if _atomic._HOST != '0' * 6 else '1' * 6}-{_dead_pid()}-abcd1234"
    not_ours = tmpdir / "workbench-runner-cache"
    for folder in (dead, live, other_host, not_ours):
        (folder / "weights").mkdir(parents=True)
        (folder / "weights" / "weights.bin").write_bytes(b"\0" * 1024)
    proc = subprocess.run([sys.executable, "-m", "workbench", "inspect", str(CNN)], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmpdir)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmpdir.iterdir()) == sorted([live.name, other_host.name, not_ours.name])
