"""Fault injection on the dataset surfaces (issue 12's standard on issue 14's code): odd entries in dataset folders,
bad samples named by index, preprocessing and metrics that misbehave, workers killed or interrupted, tampered
dataset bundles, malformed results given to diff, outputs aimed at the user's code, memory that stays flat."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from workbench.cli import main
from workbench.dataset import compare_dataset, open_dataset, parse_metric
from workbench.dataset.bundle import save_dataset_bundle
from workbench.dataset.executors import ExecutorSpec, _ordered, _WorkerDied, usable_cores
from workbench.errors import Cancelled, EngineCrashedError, InputError
from workbench.report.rerun import rerun_bundle
from workbench.report.safety import BundleError, seal_manifest


# --- tiny model and data --------------------------------------------------------------------------------------
def _model(path: Path, dims: str | int = 4) -> Path:
    """x (1, T, 8) -> MatMul (8, 6) -> Softmax; ``dims`` "T" makes T dynamic."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [8, 6], rng.normal(size=(8, 6)).astype(np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Softmax", ["h"], ["y"], name="sm", axis=-1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dims, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dims, 6])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _folder(folder: Path, n: int, seed: int = 0, length=lambda i: 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.savez(folder / f"s{i:03d}.npz", x=rng.normal(size=(1, length(i), 8)).astype(np.float32))
    return folder


def _feed(value: float = 0.0) -> dict:
    return {"x": np.full((1, 4, 8), value, np.float32)}


def _cli(args: list, capsys) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


# --- dataset folders --------------------------------------------------------------------------------------------
def test_hidden_files_are_not_samples(tmp_path):
    data = _folder(tmp_path / "d", 3)
    np.savez(data / ".hidden.npz", x=np.full((1, 4, 8), np.nan, np.float32))  # would fail the NaN check
    ds = open_dataset(data, input_names=["x"])
    assert [s.source for s in ds] == ["s000.npz", "s001.npz", "s002.npz"]
    only = tmp_path / "only"
    only.mkdir()
    np.savez(only / ".a.npz", x=np.zeros((1, 4, 8), np.float32))
    with pytest.raises(InputError, match="no .npz samples"):
        open_dataset(only)


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: p.mkdir(), "folder"),
    (lambda p: os.symlink(p.parent / "gone.npz", p), "leads nowhere"),
    (lambda p: os.symlink(p.name, p), "leads nowhere"),  # a link to itself: a loop
])
def test_entries_named_like_samples_that_are_not_files_are_refused(tmp_path, make, kind):
    data = _folder(tmp_path / "d", 3)
    make(data / "s001b.npz")
    with pytest.raises(InputError, match=rf"s001b\.npz is .*{kind}.*not a sample file"):
        open_dataset(data)
    with pytest.raises(InputError, match="s001b.npz"):  # the same through a preprocess: never opened, never hangs
        open_dataset(data, preprocess=lambda path: None)


def test_empty_and_huge_sample_files_are_refused_by_name_without_reading_them(tmp_path):
    data = _folder(tmp_path / "d", 3)
    (data / "s001.npz").write_bytes(b"")
    with pytest.raises(InputError, match=r"s001\.npz is not a readable \.npz"):
        list(open_dataset(data))
    with open(data / "s001.npz", "wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: 3 GiB that are never read
    read_before = _bytes_read()
    with pytest.raises(InputError, match=r"s001\.npz is 3\.0 GiB, over the 2\.0 GiB limit"):
        list(open_dataset(data))
    with pytest.raises(InputError, match="over the"):
        list(open_dataset(data, preprocess=lambda path: _feed()["x"], input_names=["x"]))
    assert _bytes_read() - read_before < 256 << 20  # reading it would be 3 GiB (twice)


def _bytes_read() -> int:
    """Bytes this process has read through read() calls so far (Linux's /proc/self/io rchar, page cache included)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def test_a_plain_sub_folder_is_skipped_and_a_symlinked_sample_is_read(tmp_path):
    data = _folder(tmp_path / "d", 2)
    (data / "notes").mkdir()
    other = _folder(tmp_path / "elsewhere", 1, seed=5)
    os.symlink(other / "s000.npz", data / "s009.npz")
    assert [s.source for s in open_dataset(data)] == ["s000.npz", "s001.npz", "s009.npz"]


@pytest.mark.parametrize("bad, fragment", [
    ({"y": np.zeros((1, 4, 8), np.float32)}, "unknown input"),
    ({"x": np.zeros((1, 4, 8), np.int64)}, "int64"),
    ({"x": np.zeros((1, 5, 8), np.float32)}, "shape"),
    ({"x": np.where(np.arange(32).reshape(1, 4, 8) == 3, np.nan, 0).astype(np.float32)}, "NaN"),
])
def test_a_bad_sample_37_of_40_is_named(tmp_path, bad, fragment):
    model = _model(tmp_path / "m.onnx")
    data = _folder(tmp_path / "d", 40)
    np.savez(data / "s037.npz", **bad)
    with pytest.raises(InputError, match=rf"^sample 37 \(s037\.npz\): .*{fragment}"):
        compare_dataset(model, "ort", "ort:fp16", data)
    feeds = [_feed() for _ in range(40)]
    feeds[37] = bad
    with pytest.raises(InputError, match=rf"^sample 37 \(list\[37\]\): .*{fragment}"):
        compare_dataset(model, "ort", "ort:fp16", feeds)


# --- preprocessing and metrics: user code ------------------------------------------------------------------------
def _gen(path):
    yield np.zeros((1, 4, 8), np.float32)


@pytest.mark.parametrize("fn, fragment", [
    (lambda path: None, "gave None, not an array"),
    (lambda path: "text", "gave a str"),
    (_gen, "gave a generator"),
    (lambda path: np.array([object()], dtype=object), "not numeric"),
    (lambda path: {"x": "abc"}, "not numeric"),
    (lambda path: 1 / 0, "preprocess failed on 00001.png: ZeroDivisionError"),
])
def test_preprocess_returning_garbage_names_the_file(tmp_path, fn, fragment):
    images = tmp_path / "imgs"
    images.mkdir()
    for i in range(3):
        (images / f"{i:05d}.png").write_bytes(b"not read by the workbench")
    calls = []

    def prep(path):
        calls.append(path)
        return _feed()["x"] if len(calls) == 1 else fn(path)

    ds = open_dataset(images, preprocess=prep, input_names=["x"])
    with pytest.raises(InputError, match=fragment) as err:
        list(ds)
    assert "00001.png" in str(err.value)
    with pytest.raises(InputError, match="must be a function"):
        open_dataset(images, preprocess=5)


def test_user_code_calling_sys_exit_is_one_error_line(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx")
    data = _folder(tmp_path / "d", 2)
    code = tmp_path / "user.py"
    code.write_text("import sys\nimport numpy as np\ndef prep(path):\n    sys.exit(5)\n"
                    "def metric(ref, cand):\n    sys.exit(7)\n")
    rc, err = _cli(["compare", model, "--inputs", data, "--metric", f"{code}:metric"], capsys)
    assert rc == 2 and "sys.exit(7)" in err and len(err.strip().splitlines()) == 1
    rc, err = _cli(["compare", model, "--inputs", tmp_path / "d", "--preprocess", f"{code}:prep"], capsys)
    assert rc == 2 and "preprocess failed on s000.npz" in err and "sys.exit(5)" in err
    (tmp_path / "exits_at_import.py").write_text("raise SystemExit(4)\n")
    rc, err = _cli(["compare", model, "--inputs", data, "--preprocess", f"{tmp_path / 'exits_at_import.py'}:f"],
                   capsys)
    assert rc == 2 and "cannot import preprocess" in err


def _cancelled_while_stuck(work, release: threading.Event, cancel: threading.Event, after_s: float) -> None:
    """Run ``work`` on a thread, set ``cancel`` after ``after_s``: it must end with Cancelled while the preprocess is
    still stuck (it waits up to 600 s for ``release``; the 120 s join is a hang guard, not a speed bound), then
    ``release`` lets the stuck preprocess return, so the reader thread ends with the test."""
    got = {}

    def run():
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            got["error"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(after_s)
    cancel.set()
    t.join(120)
    release.set()
    assert not t.is_alive() and isinstance(got.get("error"), Cancelled)


def test_preprocess_that_never_returns_can_be_cancelled(tmp_path):
    model = _model(tmp_path / "m.onnx")
    data = _folder(tmp_path / "d", 3)
    release = threading.Event()
    cancel = threading.Event()

    def stuck(path):
        release.wait(600)  # "sleeps forever" (released at the end so the reader thread ends with the test)
        return _feed()["x"]

    _cancelled_while_stuck(lambda: compare_dataset(model, "ort", "ort:fp16", data, preprocess=stuck, cancel=cancel),
                           release, cancel, 0.3)


def test_a_calibration_pass_over_a_stuck_preprocess_can_be_cancelled(tmp_path):
    from workbench.calibrate.feeds import as_feeds
    from workbench.model.load import load_model

    data = _folder(tmp_path / "d", 3)
    release, cancel = threading.Event(), threading.Event()
    stream = as_feeds(load_model(_model(tmp_path / "m.onnx")), data,
                      preprocess=lambda path: release.wait(600) and _feed()["x"], cancel=cancel)
    _cancelled_while_stuck(lambda: list(stream), release, cancel, 0.2)


@pytest.mark.parametrize("value, fragment", [
    (10**400, "not a number"), ("0.5", "not a number"), (np.array([1.0, 2.0]), "not a number"),
])
def test_metric_values_that_are_not_numbers_are_refused(value, fragment):
    from workbench.dataset.metrics import TaskMetric

    with pytest.raises(InputError, match=fragment):
        TaskMetric("m", lambda r, c: {"v": value})({"y": np.zeros(2)}, {"y": np.zeros(2)})


@pytest.mark.parametrize("spec", ["mask_iou:nan", "mask_iou:inf", "ctc:-1"])
def test_builtin_metric_parameters_that_would_judge_nothing_are_refused(spec):
    with pytest.raises(InputError, match="metric"):
        parse_metric(spec)


def test_metric_nan_ranks_worst_and_each_metric_names_its_own_worst_sample(tmp_path):
    model = _model(tmp_path / "m.onnx")
    feeds = [_feed(i / 10) for i in range(6)]
    count = [0]

    def alternating(ref, cand):  # "a" on odd calls, "b" on even ones; NaN once
        count[0] += 1
        if count[0] == 4:
            return {"b": float("nan")}
        return {"a": float(count[0])} if count[0] % 2 else {"b": float(count[0])}

    r = compare_dataset(model, "ort", "ort:fp16", feeds, metrics=[alternating], worst=2)
    assert [s["task"] for s in r.samples][:4] == [{"a": 1.0}, {"b": 2.0}, {"a": 3.0}, {"b": pytest.approx(np.nan,
                                                                                                    nan_ok=True)}]
    assert r.task["a"]["worst_index"] == 0 and r.task["a"]["worst"] == 1.0
    assert r.task["b"]["worst_index"] == 3 and r.task["b"]["nan_samples"] == 1 and r.task["b"]["mean"] == 4.0
    json.dumps(r.to_json(), allow_nan=False)


def test_two_metrics_reporting_the_same_name_are_refused(tmp_path):
    model = _model(tmp_path / "m.onnx")

    def top5(ref, cand):
        return {"top5": 0.0}

    with pytest.raises(InputError, match="metrics 'topk:5' and 'top5' both report 'top5'"):
        compare_dataset(model, "ort", "ort:fp16", [_feed()], metrics=["topk:5", top5])
    assert compare_dataset(model, "ort", "ort:fp16", [_feed()], metrics=["top1", "top1"]).metrics == ["top1"]


def test_a_metric_cannot_change_the_outputs_the_next_one_reads(tmp_path):
    model = _model(tmp_path / "m.onnx")

    def zeroes(ref, cand):
        next(iter(ref.values()))[...] = 0
        return {"z": 1.0}

    with pytest.raises(InputError, match="metric 'zeroes' failed.*read-only"):
        compare_dataset(model, "ort", "ort:fp16", [_feed()], metrics=[zeroes, "top1"])


# --- executors ------------------------------------------------------------------------------------------------------
def test_workers_are_capped_at_the_cores_and_bad_executors_refused():
    spec = ExecutorSpec.parse(None, 1000)
    assert spec.kind == "processes" and spec.workers == usable_cores() and spec.requested == 1000
    assert "1000 workers asked for" in spec.note and spec.describe()["requested"] == 1000
    assert ExecutorSpec.parse("ray://host:1", 1000).workers == 1000  # a cluster has its own cores
    with pytest.raises(InputError, match="must be text"):
        ExecutorSpec.parse(5, 1)


class _Backend:
    """A pool whose submit fails once it broke, like ProcessPoolExecutor's: chunk ``first`` index -> deaths."""

    def __init__(self, deaths: dict[int, int]):
        self.deaths, self.broken, self.restarts = dict(deaths), False, 0

    def submit(self, job, chunk):
        if self.broken:
            raise _WorkerDied("the pool broke")
        if self.deaths.get(chunk[0][0], 0):
            self.deaths[chunk[0][0]] -= 1
            self.broken = True
            return ("died", chunk)
        return ("ok", chunk)

    def result(self, handle, timeout):
        if handle[0] == "died":
            raise _WorkerDied("killed")
        return [i for i, _ in handle[1]]

    def lost(self, handle):
        return handle[0] == "died"

    def restart(self):
        self.broken, self.restarts = False, self.restarts + 1


def test_chunks_submitted_to_a_broken_pool_run_again_in_order():
    from workbench.core.progress import Steps

    chunks = [[(i, None), (i + 1, None)] for i in range(0, 20, 2)]
    notes: list[str] = []
    backend = _Backend({4: 1})
    got = list(_ordered(backend, None, iter(chunks), 1, Steps(), notes))
    assert got == list(range(20)) and backend.restarts == 1 and len(notes) == 1
    with pytest.raises(EngineCrashedError, match="died twice evaluating samples 4-5"):
        list(_ordered(_Backend({4: 2}), None, iter(chunks), 1, Steps(), []))


def _spawned_workers() -> list:
    return [p for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def test_a_worker_killed_mid_run_is_retried_and_the_result_is_the_serial_one(tmp_path):
    model = _model(tmp_path / "m.onnx")
    data = _folder(tmp_path / "d", 160)
    serial = compare_dataset(model, "ort", "ort:fp16", data, layers=False).to_json()["samples"]
    killed = []

    def progress(fraction, message):
        if not killed and message.startswith("24/"):  # chunks done, more still to submit
            victim = _spawned_workers()[0]
            victim.send_signal(signal.SIGKILL)
            killed.append(victim.pid)

    r = compare_dataset(model, "ort", "ort:fp16", data, layers=False, workers=2, progress=progress)
    assert killed and any("worker died" in n and "retried once" in n for n in r.notes), r.notes
    assert r.to_json()["samples"] == serial


def test_ctrl_c_during_a_workers_run_exits_130_and_leaves_no_process(tmp_path):
    model = _model(tmp_path / "m.onnx")
    files = tmp_path / "files"
    files.mkdir()
    for i in range(400):
        (files / f"{i:04d}.txt").write_text(str(i))
    (tmp_path / "slow.py").write_text("import time\nimport numpy as np\ndef prep(path):\n    time.sleep(0.02)\n"
                                      "    return np.full((1, 4, 8), float(open(path).read()), np.float32)\n")
    out = tmp_path / "o.json"
    p = subprocess.Popen([sys.executable, "-m", "workbench", "compare", str(model), "--inputs", str(files),
                          "--preprocess", f"{tmp_path / 'slow.py'}:prep", "--workers", "2", "--json", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored, as in a shell
    proc = psutil.Process(p.pid)
    deadline = time.time() + 60
    while time.time() < deadline and len([c for c in proc.children() if "spawn_main" in " ".join(c.cmdline())]) < 2:
        time.sleep(0.05)
    kids = proc.children(recursive=True)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert alive == [] and not out.exists()


def test_samples_of_different_shapes_and_a_single_sample_give_the_serial_result_on_workers(tmp_path):
    model = _model(tmp_path / "dyn.onnx", "T")
    data = _folder(tmp_path / "d", 9, length=lambda i: 1 + i % 4)
    (tmp_path / "one").mkdir()
    shutil.copy(data / "s000.npz", tmp_path / "one")
    for folder in (data, tmp_path / "one"):
        serial = compare_dataset(model, "ort", "ort:fp16", folder, metrics=["top1"]).to_json()
        two = compare_dataset(model, "ort", "ort:fp16", folder, metrics=["top1"], workers=2).to_json()
        assert two["samples"] == serial["samples"] and two["layers"] == serial["layers"]


# --- memory ---------------------------------------------------------------------------------------------------------
def test_memory_does_not_grow_with_the_samples(tmp_path):
    import tracemalloc

    model = _model(tmp_path / "dyn.onnx", "T")

    def peak(n: int) -> int:
        def gen():
            rng = np.random.default_rng(0)
            for _ in range(n):
                yield {"x": rng.normal(size=(1, 2048, 8)).astype(np.float32)}  # 64 KiB each

        tracemalloc.start()
        try:
            compare_dataset(model, "ort", "ort:fp16", gen(), layers=False)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(20), peak(200)
    assert large - small < 3 * 2**20, (small, large)  # 180 more samples held would be 11 MiB


@pytest.mark.slow
def test_rss_is_flat_from_200_to_2000_tiny_samples(tmp_path):
    model = _model(tmp_path / "m.onnx")
    code = ("import sys, numpy as np, psutil\nfrom workbench.dataset import compare_dataset\n"
            "n = int(sys.argv[1])\nrng = np.random.default_rng(0)\n"
            "gen = ({'x': rng.normal(size=(1, 4, 8)).astype(np.float32)} for _ in range(n))\n"
            f"compare_dataset({str(model)!r}, 'ort', 'ort:fp16', gen, metrics=['top1'])\n"
            "print(psutil.Process().memory_info().rss)\n")
    rss = [int(subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True, text=True,
                              check=True).stdout.split()[-1]) for n in (200, 2000)]
    assert rss[1] < 1.2 * rss[0], rss


def test_int8_calibration_samples_are_held_within_the_memory_budget(tmp_path):
    model = _model(tmp_path / "m.onnx")
    feeds = [_feed(i) for i in range(40)]  # 128 bytes each
    with pytest.raises(InputError, match=r"INT8 calibration on the first 40 samples .* memory budget"):
        compare_dataset(model, "ort", "ort:int8", feeds, calibration_count=40, memory_budget="1K")
    read = []

    def gen():
        for i in range(3):
            read.append(i)
            yield _feed(i)

    r = compare_dataset(model, "ort", "ort:fp16", gen(), calibration_count=10**9)  # fp16 calibrates on nothing
    assert len(r.samples) == 3


# --- bundles --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsb")
    model = _model(root / "m.onnx")
    data = _folder(root / "d", 6)
    r = compare_dataset(model, "ort", "ort:fp16", data, metrics=["top1"])
    save_dataset_bundle(r, root / "b")
    save_dataset_bundle(compare_dataset(model, "ort", "ort:fp16", data, metrics=["top1"]), root / "bd",
                        include_data=True)
    return root


def _tampered(made: Path, tmp_path: Path, edit, *, reseal: bool = True, src: str = "b") -> Path:
    dest = tmp_path / "t"
    shutil.copytree(made / src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    edit(manifest, dest)
    (dest / "manifest.json").write_text(json.dumps(seal_manifest(manifest) if reseal else manifest))
    return dest


def test_a_bundle_never_imports_the_preprocess_or_metric_it_names(made, tmp_path):
    evil = tmp_path / "evil.py"
    marker = tmp_path / "PWNED"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\ndef f(*a):\n    return None\n")
    b = _tampered(made, tmp_path, lambda m, d: m["dataset"].update(kind="files", preprocess=f"{evil}:f"))
    with pytest.raises(BundleError, match="never runs by itself"):
        rerun_bundle(b)
    shutil.rmtree(b)
    for metric in ("os:system", f"{evil}:f"):
        b = _tampered(made, tmp_path, lambda m, d, x=metric: m["dataset_compare"].__setitem__("metrics", [x]))
        with pytest.raises(BundleError, match="user code, which a bundle never runs"):
            rerun_bundle(b)
        assert rerun_bundle(b, metrics=["top1"]).reproduced  # the user's own choice runs
        shutil.rmtree(b)
    assert not marker.exists()


@pytest.mark.parametrize("edit, reseal, fragment", [
    (lambda m, d: m["dataset"]["samples"][3].__setitem__("sha256", "0" * 64), False, "changed since"),
    (lambda m, d: m.pop("manifest_sha256"), False, "carries no seal"),
    (lambda m, d: m["dataset_compare"].__setitem__("calibration_count", "abc"), True, "calibration_count"),
    (lambda m, d: m["dataset_compare"].__setitem__("worst", -1), True, "worst"),
    (lambda m, d: m["dataset_compare"].__setitem__("layers", "no"), True, "layers"),
    (lambda m, d: m["dataset"].__setitem__("samples", [5]), True, "sample entry 0"),
    (lambda m, d: m["dataset"].__setitem__("samples", [{"source": "x", "sha256": "0"}]), True, "index"),
    (lambda m, d: (d / "results.json").unlink(), True, "results.json"),
    (lambda m, d: m["dataset"].update(included=True, files=["../../etc/passwd"]), True, "leaves the bundle"),
    (lambda m, d: m["dataset"].update(included=True, files="inputs"), True, "not a list of paths"),
])
def test_tampered_dataset_bundles_are_refused_in_one_line(made, tmp_path, edit, reseal, fragment):
    b = _tampered(made, tmp_path, edit, reseal=reseal)
    with pytest.raises(BundleError, match=fragment) as err:
        rerun_bundle(b)
    assert "\n" not in str(err.value)


def test_a_bundle_folder_pointing_elsewhere_is_read_and_said(made, tmp_path):
    other = _folder(tmp_path / "other", 6, seed=9)
    b = _tampered(made, tmp_path, lambda m, d: m["dataset"].__setitem__("folder", str(other)))
    r = rerun_bundle(b)
    assert not r.reproduced and len(r.data_changed) == 6
    assert any(str(other) in n for n in r.notes)


def test_included_data_reruns_under_the_original_sources(made):
    r = rerun_bundle(made / "bd")
    assert r.reproduced and [s["source"] for s in r.result.samples] == [f"s{i:03d}.npz" for i in range(6)]
    assert r.result.dataset["kind"] == "bundle"


def test_bundle_data_of_a_generator_or_of_changed_data_is_refused_before_writing(tmp_path):
    model = _model(tmp_path / "m.onnx")
    r = compare_dataset(model, "ort", "ort:fp16", (_feed(i) for i in range(3)))
    with pytest.raises(BundleError, match="generator"):
        save_dataset_bundle(r, tmp_path / "b", include_data=True)
    assert not (tmp_path / "b").exists()
    data = _folder(tmp_path / "d", 3)
    r = compare_dataset(model, "ort", "ort:fp16", data)
    np.savez(data / "s001.npz", x=np.ones((1, 4, 8), np.float32))
    with pytest.raises(BundleError, match=r"sample 1 \(s001.npz\) is not the data the comparison read"):
        save_dataset_bundle(r, tmp_path / "b2", include_data=True)
    assert not (tmp_path / "b2").exists()


# --- CLI: outputs, diff ---------------------------------------------------------------------------------------------
def test_outputs_never_overwrite_the_users_preprocess_or_metric(made, tmp_path, capsys):
    model = made / "m.onnx"
    code = tmp_path / "user.py"
    text = "import numpy as np\ndef prep(path):\n    return np.zeros((1, 4, 8), np.float32)\n" \
           "def metric(r, c):\n    return {'m': 1.0}\n"
    code.write_text(text)
    for args in (["compare", model, "--inputs", made / "d", "--metric", f"{code}:metric", "--json", code],
                 ["compare", model, "--inputs", made / "d", "--preprocess", f"{code}:prep", "--report", code],
                 ["rerun", made / "b", "--metric", f"{code}:metric", "--json", code],
                 ["rerun", made / "b", "--inputs", made / "d", "--json", made / "d" / "s000.npz"],
                 ["compare", model, "--inputs", made / "d", "--per-sample", "--report", model]):
        rc, err = _cli(args, capsys)
        assert rc == 2 and ("refusing to overwrite" in err or "would overwrite" in err), err
    assert code.read_text() == text
    rc, err = _cli(["compare", model, "--inputs", made / "d", "--per-sample", "--report", made / "d"], capsys)
    assert rc == 2 and "is a folder" in err
    rc = main(["compare", str(model), "--inputs", str(made / "d"), "--per-sample", "--json", "-"])
    assert rc == 0 and len(json.loads(capsys.readouterr().out)["samples"]) == 6  # stdout holds the JSON alone


def test_diff_of_malformed_or_mismatched_dataset_results_is_one_line(made, tmp_path, capsys):
    good = tmp_path / "good.json"
    rc, _ = _cli(["compare", made / "m.onnx", "--inputs", made / "d", "--per-sample", "--json", good], capsys)
    doc = json.loads(good.read_text())
    cases = {"samples_int": dict(doc, samples=[5]), "samples_text": dict(doc, samples="abc"),
             "task_list": dict(doc, task=[1]), "index_list": dict(doc, samples=[dict(doc["samples"][0], index=[1])]),
             "outputs_int": dict(doc, samples=[dict(doc["samples"][0], outputs={"y": 5})])}
    for name, bad in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(bad))
        rc, err = _cli(["diff", good, tmp_path / f"{name}.json"], capsys)
        assert rc == 2 and "not a well-formed dataset result" in err, (name, err)
    rc, err = _cli(["diff", good, good, "--metric", "bogus"], capsys)
    assert rc == 2 and "drop --metric" in err
    (tmp_path / "x.py").write_text("print(1)\n")
    rc, err = _cli(["diff", good, tmp_path / "x.py"], capsys)
    assert rc == 2 and "x.py is not a dataset comparison" in err
    rc, out = main(["diff", str(good), str(made / "b"), "--json", "-"]), capsys.readouterr().out
    assert rc == 0 and json.loads(out)["kind"] == "dataset"


@pytest.mark.parametrize("job", ["calibrate", "repair"])
def test_cancel_ends_calibrate_and_repair_while_a_preprocess_blocks(tmp_path, job):
    """A preprocessing function stuck on one sample: Cancel still ends calibrate and repair within seconds."""
    from workbench.calibrate.api import calibrate
    from workbench.repair import repair

    model = _model(tmp_path / "m.onnx")
    files = tmp_path / "files"
    files.mkdir()
    for i in range(3):
        (files / f"{i}.txt").write_text(str(i))
    woke = tmp_path / "woke"  # written once the stuck sample's preprocessing ends (after 600 s)
    (tmp_path / "stuck.py").write_text("import time\nimport numpy as np\ndef prep(path):\n"
                                       "    if path.endswith('1.txt'):\n        time.sleep(600)\n"
                                       f"        open({str(woke)!r}, 'w').close()\n"
                                       "    return np.zeros((1, 4, 8), np.float32)\n")
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    with pytest.raises(Cancelled):
        if job == "calibrate":
            calibrate(model, files, preprocess=f"{tmp_path / 'stuck.py'}:prep", cancel=cancel)
        else:
            repair(model, "ort", "ref:fp16", feeds=files, preprocess=f"{tmp_path / 'stuck.py'}:prep", cancel=cancel,
                   out=tmp_path / "fixed.onnx")
    assert not woke.exists()  # Cancel ended the job while the stuck sample was still being prepared
