"""Fault injection for bundles and outputs (issue 12, part A): tampered manifests and engine options, concurrent
commits, outputs that would overwrite inputs, zip bombs, FIFOs, and temporaries left by killed writers. Each case
gives one clear line and exit 2 (or an option dropped with a note), and nothing the user owns is lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from workbench import _atomic
from workbench.cli import main
from workbench.core.paths import Output, check_outputs
from workbench.errors import WorkbenchError
from workbench.report import load_bundle, rerun_bundle
from workbench.report.bundle import BundleWriter
from workbench.report.engine_options import bundle_engine_options
from workbench.report.safety import BundleError, seal_manifest

MODEL = SAMPLES / "fp16_clamp_constant.onnx"
EXE = [sys.executable, "-m", "workbench"]


def _cli(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*EXE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error:"), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A real comparison bundle (ort vs ort:fp16 on a small sample model), made once."""
    from workbench.compare.api import compare
    from workbench.report import save_bundle

    root = tmp_path_factory.mktemp("good")
    model = root / "m.onnx"
    shutil.copyfile(MODEL, model)
    return save_bundle(compare(model, "ort", "ort:fp16"), dest=root / "bundle")


def _copy(good: Path, dest: Path) -> Path:
    shutil.copytree(good, dest)
    return dest


def _edit_manifest(bundle: Path, edit, *, reseal: bool) -> None:
    m = json.loads((bundle / "manifest.json").read_text())
    edit(m)
    (bundle / "manifest.json").write_text(json.dumps(seal_manifest(m) if reseal else m))


# --- 1. engine options and the manifest's own integrity -------------------------------------------------------------

def _set_engine_options(options: dict, candidate: str | None = None):
    def edit(m: dict) -> None:
        m["compare"]["engine_options"] = options
        m["compare"]["options"]["engine_options"] = options
        if candidate:
            m["compare"]["candidate"] = candidate
    return edit


def test_edited_manifest_is_refused(good, tmp_path):
    """The manifest is covered by its own sha256: editing it (here: 3000 ORT threads) without re-sealing is refused
    before any engine starts."""
    b = _copy(good, tmp_path / "b")
    _edit_manifest(b, _set_engine_options({"ort": {"threads": 3000}}), reseal=False)
    proc = _cli("rerun", b)
    assert proc.returncode == 2, proc.stderr
    assert "changed since the bundle was written" in _one_error_line(proc.stderr)
    assert proc.stdout == ""


def test_engine_options_outside_the_allow_list_never_reach_an_engine(good, tmp_path):
    """A re-sealed tampered bundle: OpenVINO's CACHE_DIR (a folder of the attacker's choosing) and 3000 ORT threads
    are dropped with a note the rerun prints; the cache folder is never created."""
    pytest.importorskip("openvino")
    b = _copy(good, tmp_path / "b")
    cache = tmp_path / "attacker_cache"
    options = {"ort": {"threads": 3000, "graph_optimization": "basic"},
               "openvino": {"config": {"CACHE_DIR": str(cache), "NUM_STREAMS": 1}}}
    _edit_manifest(b, _set_engine_options(options, candidate="openvino"), reseal=True)
    out = tmp_path / "rerun.json"
    proc = _cli("rerun", b, "--json", out)
    assert proc.returncode in (0, 1), proc.stderr
    assert "note: engine option ort.threads=3000 dropped" in proc.stdout
    assert "openvino.config.CACHE_DIR" in proc.stdout
    assert not cache.exists(), "a bundle's engine option created a folder"
    notes = json.loads(out.read_text())["notes"]
    assert len(notes) == 2 and all("dropped" in n for n in notes)


def test_engine_class_paths_in_a_bundle_are_not_imported_unless_allowed(good, tmp_path):
    """A re-sealed bundle whose candidate names a class path: the module is never imported by ``rerun`` unless the
    user allows that class by name."""
    b = _copy(good, tmp_path / "b")
    marker = tmp_path / "imported"
    (tmp_path / "evil_engine_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                 "from engine_fixtures import CountingReference as Engine\n")
    _edit_manifest(b, lambda m: m["compare"].update(candidate="evil_engine_mod:Engine:fp16"), reseal=True)
    env_path = os.pathsep.join([str(tmp_path), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    run = dict(capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": env_path})
    proc = subprocess.run([*EXE, "rerun", str(b)], **run)
    assert proc.returncode == 2 and "--allow-engine evil_engine_mod:Engine" in _one_error_line(proc.stderr)
    assert not marker.exists(), "rerun imported a module the bundle named"
    proc = subprocess.run([*EXE, "rerun", str(b), "--allow-engine", "evil_engine_mod:Engine"], **run)
    assert proc.returncode in (0, 1), proc.stderr
    assert marker.exists()


def test_allow_list_keeps_bounded_options_and_drops_paths_and_libraries():
    cap = (os.cpu_count() or 1) * 4
    clean, notes = bundle_engine_options({
        "ort": {"threads": cap, "graph_optimization": "extended", "memory_arena": True},
        "ort-trt": {"threads": cap + 1, "provider_options": {"trt_fp16_enable": True, "device_id": 0,
                                                             "trt_engine_cache_path": "/tmp/x",
                                                             "trt_extra_plugin_lib_paths": "/tmp/evil.so"}},
        "trt": {"timing_cache": "/tmp/t", "engine_cache_dir": "/tmp/e", "workspace": 1 << 30},
        "ref": {"precision": "native"},
        "openvino": {"device": "CPU; rm", "config": {"INFERENCE_NUM_THREADS": True}},
        "mypkg.mod:Engine": {"anything": 1},
    })
    assert clean == {"ort": {"threads": cap, "graph_optimization": "extended", "memory_arena": True},
                     "ort-trt": {"provider_options": {"trt_fp16_enable": True, "device_id": 0}},
                     "trt": {"workspace": 1 << 30}, "ref": {"precision": "native"}}
    dropped = " ".join(notes)
    for name in ("ort-trt.threads", "trt_engine_cache_path", "trt_extra_plugin_lib_paths", "trt.timing_cache",
                 "trt.engine_cache_dir", "openvino.device", "INFERENCE_NUM_THREADS", "mypkg.mod:Engine"):
        assert name in dropped, name
    assert len(notes) == 8 and all("\n" not in n for n in notes)
    assert bundle_engine_options(["not", "a", "dict"])[0] == {}


# --- 2. destinations: checked first, committed exclusively ----------------------------------------------------------

def test_existing_bundle_destination_is_refused_before_the_comparison(tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    out = tmp_path / "r.json"
    proc = _cli("compare", MODEL, "--json", out, "--bundle", dest)
    assert proc.returncode == 2
    assert "already exists" in _one_error_line(proc.stderr)
    assert proc.stdout == "" and not out.exists(), "the comparison ran before the destination was checked"
    assert (dest / "mine.txt").read_text() == "keep me"


def _writer(dest: Path, marker: str, **kw) -> BundleWriter:
    w = BundleWriter(dest, kind="test", **kw)
    w.add_json("marker.json", {"writer": marker})
    return w


def test_second_commit_to_one_destination_fails_and_deletes_nothing(tmp_path):
    """Both writers passed the "already exists" check; the second to commit gets a clear error, the first one's
    bundle stays, and no temporary is left."""
    dest = tmp_path / "b"
    first, second = _writer(dest, "first"), _writer(dest, "second")
    first.commit()
    with pytest.raises(BundleError, match="appeared while the bundle was being written"):
        second.commit()
    assert json.loads((dest / "marker.json").read_text()) == {"writer": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_file_appearing_at_a_zip_destination_is_kept(tmp_path):
    dest = tmp_path / "b.zip"
    w = _writer(dest, "late", zip=True)
    dest.write_bytes(b"someone else's file")
    with pytest.raises(BundleError, match="nothing there was replaced"):
        w.commit()
    assert dest.read_bytes() == b"someone else's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.zip"]


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "fallback"])
def test_place_new_never_replaces(tmp_path, monkeypatch, renameat2):
    if not renameat2:  # a system or file system without RENAME_NOREPLACE: hard link / exclusive mkdir claim
        monkeypatch.setattr(_atomic, "_rename_noreplace", lambda src, dest: False)
    (tmp_path / "src_dir").mkdir()
    (tmp_path / "src_dir" / "a").write_text("new")
    (tmp_path / "taken_dir").mkdir()
    (tmp_path / "taken_dir" / "a").write_text("old")
    (tmp_path / "src_file").write_text("new")
    (tmp_path / "taken_file").write_text("old")
    for src, taken in (("src_dir", "taken_dir/a"), ("src_file", "taken_file")):
        with pytest.raises(FileExistsError):
            _atomic.place_new(tmp_path / src, tmp_path / taken.split("/")[0])
        assert (tmp_path / taken).read_text() == "old" and (tmp_path / src).exists()
    _atomic.place_new(tmp_path / "src_dir", tmp_path / "free_dir")
    _atomic.place_new(tmp_path / "src_file", tmp_path / "free_file")
    assert (tmp_path / "free_dir" / "a").read_text() == "new" and (tmp_path / "free_file").read_text() == "new"
    assert not (tmp_path / "src_dir").exists() and not (tmp_path / "src_file").exists()


def test_two_concurrent_cli_bundles_into_one_folder(tmp_path):
    """Two `compare --bundle` runs racing for one destination: exactly one writes it, the other says so (exit 2)."""
    dest = tmp_path / "b"
    procs = [subprocess.Popen([*EXE, "compare", str(MODEL), "--bundle", str(dest)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    for p in procs:
        p.stderr.close()
    winners = [err for code, err in results if code in (0, 1) and "bundle written" in err]
    losers = [err for code, err in results if code == 2]
    assert len(winners) == 1 and len(losers) == 1, results
    assert "already exists" in _one_error_line(losers[0])
    with load_bundle(dest) as b:
        assert b.feeds()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


# --- 3. an output never overwrites an input or another output -------------------------------------------------------

def test_calibrate_qdq_onto_its_own_model_is_refused(tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copyfile(MODEL, model)
    before = model.read_bytes()
    proc = _cli("calibrate", model, "--data", "2", "--qdq", model)
    assert proc.returncode == 2
    assert "is the input MODEL" in _one_error_line(proc.stderr)
    assert model.read_bytes() == before


def _paths_case(tmp_path: Path, case: str) -> list[str]:
    model = tmp_path / "m.onnx"
    feeds = tmp_path / "feeds.npz"
    ext = tmp_path / "ext"
    shutil.copytree(SAMPLES / "external_data", ext)
    (tmp_path / "link.json").symlink_to(model)
    os.link(model, tmp_path / "hard.json")
    return {
        "json_onto_model": ["inspect", model, "--json", model],
        "report_onto_model": ["compare", model, "--report", model],
        "bundle_zip_onto_model": ["compare", model, "--bundle", model],
        "cache_onto_data": ["calibrate", model, "--data", feeds, "--cache", feeds],
        "symlink_to_model": ["inspect", model, "--json", tmp_path / "link.json"],
        "hard_link_to_model": ["inspect", model, "--json", tmp_path / "hard.json"],
        "external_data": ["inspect", ext / "mlp_external.onnx", "--json", ext / "weights.bin"],
        "json_onto_report": ["compare", model, "--json", tmp_path / "o.html", "--report", tmp_path / "o.html"],
        "json_inside_bundle": ["compare", model, "--json", tmp_path / "nb" / "r.json", "--bundle", tmp_path / "nb"],
        "json_onto_bundle_file": ["rerun", feeds, "--json", feeds],
        "json_names_a_folder": ["inspect", model, "--json", tmp_path],
        "parent_is_a_file": ["inspect", model, "--json", model / "r.json"],
        "reduce_out_holds_model": ["reduce", model, "--out", tmp_path],
        "repair_out_onto_cand_model": ["repair", model, "--cand-model", feeds, "--out", feeds],
    }[case]


PATH_CASES = ["json_onto_model", "report_onto_model", "bundle_zip_onto_model", "cache_onto_data", "symlink_to_model",
              "hard_link_to_model", "external_data", "json_onto_report", "json_inside_bundle",
              "json_onto_bundle_file", "json_names_a_folder", "parent_is_a_file", "reduce_out_holds_model",
              "repair_out_onto_cand_model"]


@pytest.mark.parametrize("case", PATH_CASES)
def test_outputs_onto_inputs_or_each_other_are_refused_before_work(case, tmp_path, capsys):
    shutil.copyfile(MODEL, tmp_path / "m.onnx")
    np.savez(tmp_path / "feeds.npz", image=np.zeros((1, 4, 16, 16), np.float32))
    args = _paths_case(tmp_path, case)
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main([str(a) for a in args]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert any(w in line for w in ("input", "both name", "lies inside", "folder", "already exists")), line
    assert captured.out == ""
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == snapshot, "a file changed"


def test_check_outputs_lets_ordinary_outputs_through(tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copyfile(MODEL, model)
    (tmp_path / "old.json").write_text("{}")  # replacing an earlier output is fine
    check_outputs([Output("--json", tmp_path / "old.json"), Output("--report", tmp_path / "new" / "r.html"),
                   Output("--bundle", tmp_path / "b", "new"), Output("--json2", "-"), Output("--x", None)],
                  models={"MODEL": model}, inputs={"--data": 8})


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_read_only_destination_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(WorkbenchError, match="not writable"):
        check_outputs([Output("--json", ro / "x.json")])


# --- 4. zips: checked, manifest first, before anything is extracted -------------------------------------------------

@pytest.fixture
def writes_under(monkeypatch, tmp_path):
    """The system temp folder redirected to a scratch folder, and every file opened for writing under it."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[str] = []
    _WRITES.append((str(scratch), seen))
    yield scratch, seen
    _WRITES.remove((str(scratch), seen))


_WRITES: list[tuple[str, list[str]]] = []


def _audit(event, args):
    if event == "open" and _WRITES and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = (args[1] or "r"), (args[2] or 0)
        if any(c in str(mode) for c in "wxa+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            path = os.fsdecode(args[0])
            for root, seen in _WRITES:
                if path.startswith(root):
                    seen.append(path)


sys.addaudithook(_audit)  # hooks cannot be removed: it records only while a test holds `writes_under`


def _bomb(good: Path, dest: Path, size: int = 64 * 1024**2) -> Path:
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(good / "manifest.json", "manifest.json")
        with zf.open("inputs/feed_000.npz", "w", force_zip64=True) as fh:
            chunk = bytes(1 << 20)
            for _ in range(size >> 20):
                fh.write(chunk)
    return dest


def test_zip_bomb_is_refused_before_extraction(good, tmp_path, writes_under):
    scratch, writes = writes_under
    bomb = _bomb(good, tmp_path / "bomb.zip")
    assert bomb.stat().st_size < 1024**2
    with pytest.raises(WorkbenchError, match="compression ratio") as info:
        rerun_bundle(bomb)
    assert "\n" not in str(info.value)
    assert writes == [], f"extracted before refusing: {writes}"
    assert list(scratch.iterdir()) == []


def test_zip_bomb_cli_exit_2(good, tmp_path):
    proc = _cli("rerun", _bomb(good, tmp_path / "bomb.zip"))
    assert proc.returncode == 2
    assert "zip bomb" in _one_error_line(proc.stderr)


def test_zip_manifest_is_read_before_anything_is_extracted(good, tmp_path, writes_under):
    """A zip that is not a bundle (foreign manifest) with an ordinary 4 MB entry: refused, nothing extracted."""
    scratch, writes = writes_under
    z = tmp_path / "foreign.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("manifest.json", json.dumps({"schema": "something/else"}))
        zf.writestr("payload.bin", np.random.default_rng(0).bytes(4 * 1024**2))
    with pytest.raises(WorkbenchError, match="expected 'workbench.bundle/1'"):
        rerun_bundle(z)
    assert writes == [], f"extracted before the manifest was read: {writes}"
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("names,needle", [
    (["inputs", "inputs/feed_000.npz"], "a file and also a folder"),
    (["inputs/feed_000.npz", "inputs/./feed_000.npz"], "appears twice"),
    (["/abs/feed.npz"], "absolute"),
    (["inputs/../../feed.npz"], "leaves the bundle"),
])
def test_zip_entry_names_are_checked(good, tmp_path, names, needle):
    z = tmp_path / "b.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.write(good / "manifest.json", "manifest.json")
        for name in names:
            zf.writestr(zipfile.ZipInfo(name), b"x")
    proc = _cli("rerun", z)
    assert proc.returncode == 2
    assert needle in _one_error_line(proc.stderr)


def test_zipped_bundle_extracts_only_listed_files(good, tmp_path):
    z = tmp_path / "b.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(good.rglob("*")):
            if p.is_file():
                zf.write(p, "top/" + p.relative_to(good).as_posix())  # zipped from the parent folder
        zf.writestr("top/unlisted.bin", b"not in the manifest")
    with load_bundle(z) as b:
        assert not (b.root / "unlisted.bin").exists()
        assert b.feeds() and (b.root / "manifest.json").is_file()
        extracted = b.root
    assert not extracted.exists()


# --- 5. only regular files are opened from bundles -----------------------------------------------------------------

def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where", ["referenced_model", "copied_model", "manifest", "bundle_itself"])
def test_fifo_in_a_bundle_is_refused_quickly(good, tmp_path, where):
    b = _copy(good, tmp_path / "b")
    target = b
    if where == "referenced_model":  # a reference-only bundle whose recorded model path is a FIFO
        fifo = _fifo(tmp_path / "model.onnx")

        def edit(m: dict) -> None:
            m["model"].update(copied=False, path=str(fifo))
        _edit_manifest(b, edit, reseal=True)
    elif where == "copied_model":
        _fifo(b / "model" / "m.onnx")
    elif where == "manifest":
        _fifo(b / "manifest.json")
    else:
        target = _fifo(tmp_path / "b.zip")
    proc = _cli("rerun", target, timeout=180)  # a hang guard (a FIFO read waits for ever), not a speed bound
    assert proc.returncode == 2, proc.stderr
    assert "FIFO" in _one_error_line(proc.stderr)


# --- 10. temporaries of killed writers are cleaned by the next commit ----------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _aged(path: Path, seconds: float) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_killed_writer_leftovers_are_cleaned_by_the_next_commit(tmp_path):
    """A writer SIGKILLed while building a bundle and a zip leaves its temporaries; the next commit in that folder
    removes those (once their pid is gone and they are old enough), and nothing else."""
    code = (f"import os, signal; from workbench.report.bundle import BundleWriter\n"
            f"w = BundleWriter({str(tmp_path / 'b')!r}, kind='test'); w.add_json('x.json', {{}})\n"
            f"z = BundleWriter({str(tmp_path / 'z')!r}, kind='test', zip=True)\n"
            f"os.kill(os.getpid(), signal.SIGKILL)\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == -9
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 2 and all(".wbtmp-" in p.name for p in leftovers)
    for p in leftovers:
        _aged(p, 3600)
    host, pid = _atomic.tag().split("-")[1], _dead_pid()
    fresh_dead = tmp_path / f".c.wbtmp-{host}-{pid}-abcdefgh.tmp"  # too young: maybe another pid namespace
    fresh_dead.mkdir()
    live = tmp_path / f".d.{_atomic.tag()}zzzzzzzz.tmp"  # this very process: alive
    live.write_bytes(b"")
    legacy = tmp_path / ".b.abcd1234.tmp"  # an older version's, for this destination
    legacy.mkdir()
    theirs = tmp_path / ".notes.tmp"  # not ours
    theirs.write_text("keep")
    for p in (live, legacy, theirs):
        _aged(p, 3 * 86400)
    _writer(tmp_path / "b", "next").commit()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["b", fresh_dead.name, live.name, theirs.name]), left


def test_atomic_write_cleans_stale_temporaries(tmp_path):
    stale = tmp_path / f".r.json.wbtmp-{_atomic.tag().split('-')[1]}-{_dead_pid()}-abcdefgh.tmp"
    stale.write_bytes(b"partial")  # a partial file of a writer that was killed
    _aged(stale, 3600)
    _atomic.atomic_write_text(tmp_path / "r.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
