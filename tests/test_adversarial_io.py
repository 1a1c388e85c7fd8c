"""Hostile files, names and user code against every file-taking option of every subcommand.

- reads: each input option (found in the argparse parser itself, so a new option is covered) given a FIFO,
  /dev/zero, a folder, a symlink to /dev/zero, an oversize sparse file, binary junk, or a folder holding a FIFO
  or a link to /dev/zero: exit 2, one line on stderr naming the file, no hang, bounded memory;
- names: newlines, carriage returns, escape sequences and Unicode line separators in a model path, input,
  output, node, metric and sample names cannot forge output lines; they show escaped;
- stdout: user code that prints while ``--json -`` writes JSON to standard output cannot corrupt it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
TRT = REPO / "tests" / "data" / "trt"
ORT_TRT = REPO / "tests" / "data" / "ort_trt"
#: sparse size of the oversize file: over every read limit, costs no disk
OVERSIZE = 64 * 1024**3
#: growth of the resident memory a refused file may cause
RSS_SLACK = 256 * 1024**2
HANG_S = int(os.environ.get("ADVERSARIAL_HANG_S", "30"))


# --- the options, from the parser --------------------------------------------------------------------------------
#: metavars of options that take no file (engine specs, names, sizes, criteria...)
VALUE_METAVARS = {"SPEC", "TARGET", "NAME:[d,...]", "NAME:[lo,hi]", "NODE", "SIZE", "METRIC<VALUE", "NAME", "KIND",
                  "RULE", "MODULE:CLASS", "TEXT", "ENGINE", "N", "K", "S", "P", "INT"}
#: options without a metavar that take no file
VALUE_OPTIONS = {("diff", "--metric")}
_OUTPUT_HELP = re.compile(r"^(write|save|where to write|new \(or empty\) folder)", re.I)
_FILE_METAVAR = re.compile(r"FILE|DIR|PATH|\.onnx$|^[AB]$")


def classify(command: str, action: argparse.Action) -> str:
    """'file', 'code' (file.py:function), 'output' or 'value'; an option nobody classified fails the test."""
    if not action.option_strings:
        return "file"  # positionals: MODEL, BUNDLE, A, B
    help_text = action.help or ""
    metavar = action.metavar or ""
    if action.nargs == 0 or action.type is not None or action.choices:
        return "value"
    if _OUTPUT_HELP.match(help_text):
        return "output"
    if metavar.upper() == "MODULE:FUNCTION" or "module:function" in help_text.lower():
        return "code"
    if _FILE_METAVAR.search(metavar):
        return "file"
    if metavar in VALUE_METAVARS or (command, action.option_strings[-1]) in VALUE_OPTIONS:
        return "value"
    raise AssertionError(f"classify `workbench {command} {action.option_strings}` (metavar {metavar!r}) here")


def input_options() -> list[tuple[str, str, str]]:
    """(command, option or positional dest, 'file'|'code') for every input of every subcommand."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, sub in subs.choices.items():
        for action in sub._actions:
            if action.dest == "help":
                continue
            kind = classify(command, action)
            if kind in ("file", "code"):
                found.append((command, action.option_strings[-1] if action.option_strings else action.dest, kind))
    return found


INPUTS = input_options()
HOSTILE = ["fifo", "dev_zero", "folder", "link_to_dev_zero", "oversize", "binary", "folder_with_fifo",
           "folder_with_dev_zero_link"]
#: suffix of the hostile file, so that the reader meant for the option opens it
SUFFIX = {"model": ".onnx", "--cand-model": ".onnx", "--model": ".onnx", "--inputs": ".npz", "--calib": ".npz",
          "--data": ".npz", "--eval-data": ".npz", "--import-cache": ".cache", "bundle": ".zip"}
#: name of the hostile entry inside a folder given to an option that takes folders
ENTRY = {"--inputs": "a.npz", "--calib": "a.npz", "--data": "a.npz", "--eval-data": "a.npz",
         "--trt-subgraphs": "sub.onnx", "bundle": "manifest.json", "a": "manifest.json", "b": "manifest.json"}


def test_every_input_option_is_found():
    """The parser-driven list holds the options known to read files (a renamed or lost option shows here)."""
    names = {(c, o) for c, o, _ in INPUTS}
    for expected in [("inspect", "model"), ("inspect", "--layer-info"), ("inspect", "--layer-profile"),
                     ("inspect", "--layer-times"), ("inspect", "--ort-trace"), ("inspect", "--trt-subgraphs"),
                     ("inspect", "--inputs"), ("compare", "--calib"), ("compare", "--cand-model"),
                     ("compare", "--preprocess"), ("compare", "--metric"), ("calibrate", "--import-cache"),
                     ("calibrate", "--data"), ("calibrate", "--eval-data"), ("rerun", "bundle"), ("rerun", "--model"),
                     ("diff", "a"), ("diff", "b"), ("repair", "--metric"), ("reduce", "--inputs")]:
        assert expected in names
    assert len(INPUTS) >= 25


# --- fixtures ------------------------------------------------------------------------------------------------------
def tiny(names: dict | None = None) -> onnx.ModelProto:
    """x[1,4] -> MatMul(W) -> Relu -> y[1,4], with optional renamed tensors/nodes."""
    n = {"x": "x", "y": "y", "h": "h", "mm": "/fc/MatMul", "relu": "/act/Relu", **(names or {})}
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16 - 0.3, "W")
    nodes = [helper.make_node("MatMul", [n["x"], "W"], [n["h"]], name=n["mm"]),
             helper.make_node("Relu", [n["h"]], [n["y"]], name=n["relu"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name=n.get("producer", "tests"), producer_version=n.get("version", ""))
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    """Valid files for every option: the tiny model, feeds, a results JSON, a dataset bundle, TensorRT and
    ORT+TensorRT records, a preprocess/metric module."""
    root = tmp_path_factory.mktemp("good")
    onnx.save(tiny(), root / "tiny.onnx")
    feeds = root / "feeds"
    feeds.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.savez(feeds / f"s{i}.npz", x=rng.standard_normal((1, 4)).astype(np.float32))
    code = root / "user.py"
    code.write_text("def prep(path):\n    import numpy as np\n    return {'x': np.load(path)['x']}\n\n"
                    "def metric(ref, cand):\n    return {'m': 1.0}\n\ndef score(ref, cand):\n    return 1.0\n")
    results = root / "results.json"
    assert main(["compare", str(root / "tiny.onnx"), "--cand", "ort", "--json", str(results)]) == 0
    bundle = root / "bundle"
    assert main(["compare", str(root / "tiny.onnx"), "--cand", "ort", "--cand-model", str(root / "tiny.onnx"),
                 "--inputs", str(feeds), "--per-sample", "--bundle", str(bundle)]) == 0
    dumps = root / "dumps"
    dumps.mkdir()
    return {"model": root / "tiny.onnx", "feeds": feeds, "code": code, "results": results, "bundle": bundle,
            "dumps": dumps, "root": root}


def make_hostile(kind: str, where: Path, suffix: str, entry: str) -> tuple[Path, Path]:
    """(path to pass, path the error must name) for a hostile ``kind``."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"hostile{suffix}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        return Path("/dev/zero"), Path("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "oversize":
        with open(path, "wb") as fh:
            fh.truncate(OVERSIZE)
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00\x80" + bytes(range(256)) * 16)
    elif kind in ("folder_with_fifo", "folder_with_dev_zero_link"):
        path.mkdir()
        inner = path / entry
        if kind == "folder_with_fifo":
            os.mkfifo(inner)
        else:
            inner.symlink_to("/dev/zero")
        return path, path
    return path, path


def argv_for(command: str, option: str, kind: str, value: str, good: dict, out: Path) -> list[str]:
    """A valid command line of ``command`` with ``value`` given to ``option`` (and what the option needs)."""
    model, feeds = str(good["model"]), str(good["feeds"])
    base = {"inspect": ["inspect", model], "compare": ["compare", model, "--cand", "ort"],
            "calibrate": ["calibrate", model, "--data", "2", "--methods", "max", "--method", "max"],
            "rerun": ["rerun", str(good["bundle"])], "diff": ["diff", str(good["results"]), str(good["results"])],
            "reduce": ["reduce", model, "--out", str(out / "reduced")],
            "repair": ["repair", model, "--out", str(out / "fixed.onnx")]}[command]
    positions = {"model": 1, "bundle": 1, "a": 1, "b": 2}
    if option in positions:
        argv = list(base)
        argv[positions[option]] = value
        return argv
    if kind == "code":
        value = f"{value}:{'prep' if option == '--preprocess' else 'score' if command == 'repair' else 'metric'}"
    needs = {("inspect", "--inputs"): ["--engine", "ort", "--runs", "0"],
             ("inspect", "--layer-profile"): ["--layer-info", str(TRT / "layers_trt10.json")],
             ("inspect", "--layer-times"): ["--layer-info", str(TRT / "layers_trt10.json")],
             ("inspect", "--ort-trace"): ["--engine", "ort-trt", "--trt-subgraphs", str(good["dumps"])],
             ("inspect", "--trt-subgraphs"): ["--engine", "ort-trt", "--ort-trace", str(ORT_TRT / "profile.json")],
             ("compare", "--calib"): ["--cand", "ort:int8"],
             ("compare", "--preprocess"): ["--inputs", feeds],
             ("compare", "--metric"): ["--inputs", feeds],
             ("calibrate", "--preprocess"): ["--data", feeds],
             ("reduce", "--cand-model"): ["--cand", "ort"],
             ("repair", "--cand-model"): ["--cand", "ort"],
             ("repair", "--calib"): ["--cand", "ort:int8"],
             ("repair", "--preprocess"): ["--inputs", feeds]}.get((command, option), [])
    return [*base, *needs, option, value]


# --- running a command in-process, watched -------------------------------------------------------------------------
class Hung(BaseException):
    """Raised by the alarm in a command that did not finish."""


def run_watched(argv: list[str], fifos: list[Path], capsys) -> tuple[object, str, str, int]:
    """(exit code or 'hung', stdout, stderr, peak RSS growth in bytes) of ``main(argv)``. An alarm ends a hang in
    Python; a reader blocked in native code on a FIFO is released by opening the FIFO for writing."""
    me = psutil.Process()
    start = me.memory_info().rss
    peak = [start]
    done = threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], me.memory_info().rss)

    def release():
        if done.wait(HANG_S + 5):
            return
        for f in fifos:
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    def alarm(*_):
        raise Hung

    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=release, daemon=True)]
    for t in threads:
        t.start()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        code = main(argv)
    except Hung:
        code = "hung"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        done.set()
    peak[0] = max(peak[0], me.memory_info().rss)
    out, err = capsys.readouterr()
    return code, out, err, peak[0] - start


def shown(path: Path) -> str:
    return str(path).encode("unicode_escape").decode() if not str(path).isprintable() else str(path)


@pytest.mark.timeout(HANG_S * 3)
@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize(("command", "option", "takes"), INPUTS, ids=[f"{c}:{o}" for c, o, _ in INPUTS])
def test_hostile_file_is_refused_in_one_line(command, option, takes, kind, good, tmp_path, capsys):
    suffix = ".py" if takes == "code" else SUFFIX.get(option, ".json")
    path, named = make_hostile(kind, tmp_path / "in", suffix, ENTRY.get(option, f"entry{suffix}"))
    argv = argv_for(command, option, takes, str(path), good, tmp_path)
    fifos = [p for p in (path, path / ENTRY.get(option, f"entry{suffix}")) if p.is_fifo()]
    code, out, err, grew = run_watched(argv, fifos, capsys)
    assert code != "hung", f"{argv} hung"
    assert grew < RSS_SLACK, f"{argv}: resident memory grew by {grew / 2**20:.0f} MiB"
    if kind == "folder" and option in ENTRY:  # an empty folder is a valid (empty) input there: it only must end
        assert code in (0, 1, 2) and "Traceback" not in err and len(err.splitlines()) <= 1, (code, err)
        return
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("workbench: error: ") and "Traceback" not in err, err
    assert named.name in lines[0] or shown(named) in lines[0], (named, err)


@pytest.mark.parametrize(("command", "option"), [("inspect", "model"), ("inspect", "--layer-info"),
                                                 ("calibrate", "--import-cache"), ("diff", "a")])
def test_fifo_never_blocks_the_console_command(command, option, good, tmp_path):
    """The real command, in its own process: a FIFO nobody writes to is refused at once (a blocking open or read
    would hang until the timeout)."""
    fifo = tmp_path / f"pipe{SUFFIX.get(option, '.json')}"
    os.mkfifo(fifo)
    argv = argv_for(command, option, "file", str(fifo), good, tmp_path)
    try:
        proc = subprocess.run([sys.executable, "-m", "workbench", *argv], capture_output=True, text=True,
                              timeout=HANG_S * 2, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the reader so the child can end
        pytest.fail(f"workbench {' '.join(argv)} hung on a FIFO")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "FIFO" in proc.stderr, proc.stderr


# --- 4. names cannot forge output lines ----------------------------------------------------------------------------
#: each hostile name carries a line breaker or a terminal control, then text that would start a forged line
FORGE = {"x": "x\nFORGED verdict: ok", "y": "y\rFORGED verdict: ok", "h": "h\x1b[2JFORGED",
         "mm": "mm\u2028FORGED verdict: ok", "relu": "relu\x85FORGED\x0bFORGED\u2029FORGED",
         "producer": "tests\nFORGED verdict: ok", "version": "1\rFORGED"}
_RAW = set("\r\x1b\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e")


def assert_not_forged(text: str, *, must_show: bool = True) -> None:
    """No line of ``text`` (split at every Unicode line boundary) starts with forged text, no raw control
    character is left, and the names did show (escaped)."""
    for line in text.splitlines():
        assert not line.lstrip().startswith("FORGED"), f"forged line {line!r} in:\n{text}"
    assert not _RAW & set(text), f"raw control characters {_RAW & set(text)} in:\n{text!r}"
    if must_show:
        assert "FORGED" in text


@pytest.fixture(scope="module")
def forged(tmp_path_factory) -> dict:
    """A model whose path, inputs, outputs, nodes and tensors carry hostile names; a sample folder whose file
    names do; a metric whose names do; a results JSON of each."""
    root = tmp_path_factory.mktemp("forged")
    model = root / "m\nFORGED verdict: ok.onnx"
    onnx.save(tiny(FORGE), model)
    samples = root / "samples"
    samples.mkdir()
    rng = np.random.default_rng(1)
    for name in ("a\nFORGED verdict: ok.npz", "b\x1b[2JFORGED.npz"):
        np.savez(samples / name, **{FORGE["x"]: rng.standard_normal((1, 4)).astype(np.float32)})
    code = root / "metric.py"
    code.write_text("def metric(ref, cand):\n    return {'m\\nFORGED verdict: ok': 1.0, 'n\\u2028FORGED': 0.5}\n")
    return {"model": model, "samples": samples, "code": code, "root": root}


def _run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out + err


def test_inspect_text_cannot_be_forged(forged, capsys):
    code, text = _run(capsys, "inspect", forged["model"], "--no-probe")
    assert code == 0
    assert_not_forged(text)
    assert "x\\nFORGED" in text


def test_engine_graph_text_cannot_be_forged(forged, capsys):
    code, text = _run(capsys, "inspect", forged["model"], "--engine", "ort", "--runs", "1")
    assert code == 0
    assert_not_forged(text)


def test_compare_text_and_diff_cannot_be_forged(forged, capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    code, text = _run(capsys, "compare", forged["model"], "--cand", "ort:fp16", "--criterion", "sqnr_db<300",
                      "--json", a, "--impact", "1")
    assert code in (0, 1)
    code, text = _run(capsys, "compare", forged["model"], "--cand", "ort:fp16", "--criterion", "sqnr_db<300",
                      "--impact", "1")
    assert_not_forged(text)
    _run(capsys, "compare", forged["model"], "--cand", "ort", "--json", b)
    code, text = _run(capsys, "diff", a, b)
    assert code == 0
    assert_not_forged(text)


def test_dataset_text_and_diff_cannot_be_forged(forged, capsys, tmp_path):
    """Sample names (file names) and metric names, shown by compare and by a diff of two results JSON."""
    docs = []
    for cand in ("ort:fp16", "ort"):
        out = tmp_path / f"{cand.replace(':', '_')}.json"
        code, text = _run(capsys, "compare", forged["model"], "--cand", cand, "--inputs", forged["samples"],
                          "--metric", f"{forged['code']}:metric", "--worst", "5", "--json", out)
        assert code in (0, 1), text
        docs.append(out)
        code, text = _run(capsys, "compare", forged["model"], "--cand", cand, "--inputs", forged["samples"],
                          "--metric", f"{forged['code']}:metric", "--worst", "5")
        assert_not_forged(text)
        assert "m\\nFORGED" in text
    code, text = _run(capsys, "diff", *docs)
    assert code == 0
    assert_not_forged(text, must_show=False)


def test_calibrate_text_cannot_be_forged(forged, capsys):
    code, text = _run(capsys, "calibrate", forged["model"], "--data", "2", "--methods", "max", "entropy",
                      "--method", "max", "--top", "5")
    assert code == 0
    assert_not_forged(text)


def test_reduce_and_repair_text_cannot_be_forged(forged, capsys, tmp_path):
    code, text = _run(capsys, "reduce", forged["model"], "--cand", "ort:fp16", "--node", FORGE["mm"],
                      "--criterion", "sqnr_db<300", "--out", tmp_path / "reduced")
    assert code in (0, 1), text
    assert_not_forged(text)
    code, text = _run(capsys, "repair", forged["model"], "--cand", "ort:fp16", "--target", "sqnr_db<300",
                      "--out", tmp_path / "fixed.onnx", "--max-builds", "3")
    assert code in (0, 1), text
    assert_not_forged(text)


def test_error_lines_cannot_be_forged(forged, capsys, tmp_path):
    code, text = _run(capsys, "compare", forged["model"], "--cand", "ort", "--keep-fp32", "nope\nFORGED")
    assert_not_forged(text, must_show=False)
    code, text = _run(capsys, "inspect", tmp_path / "missing\nFORGED verdict: ok.onnx")
    assert code == 2
    assert_not_forged(text)


# --- 8. user code that prints cannot corrupt --json - ---------------------------------------------------------------
NOISY = """import os, sys
import numpy as np

def prep(path):
    print("preprocess says hello")
    os.write(1, b"native write to fd 1\\n")
    return {"x": np.load(path)["x"]}

def metric(ref, cand):
    print("metric says hello")
    sys.stdout.write("{not json\\n")
    return {"agree": 1.0}
"""


@pytest.fixture(scope="module")
def noisy(good) -> Path:
    path = good["root"] / "noisy.py"
    path.write_text(NOISY)
    return path


def test_printing_user_code_keeps_stdout_json_in_process(good, noisy, capsys):
    code = main(["compare", str(good["model"]), "--cand", "ort", "--inputs", str(good["feeds"]), "--preprocess",
                 f"{noisy}:prep", "--metric", f"{noisy}:metric", "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["schema"] == "workbench.compare/1"
    assert "metric says hello" in err and "preprocess says hello" in err


@pytest.mark.parametrize("workers", [None, "2"])
def test_printing_user_code_keeps_stdout_json_in_a_process(good, noisy, workers):
    """The real file descriptors: a native write to fd 1, and worker processes (``--workers 2``)."""
    argv = [sys.executable, "-m", "workbench", "compare", str(good["model"]), "--cand", "ort", "--inputs",
            str(good["feeds"]), "--preprocess", f"{noisy}:prep", "--metric", f"{noisy}:metric", "--json", "-"]
    if workers:
        argv += ["--workers", workers]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "workbench.compare/1" and len(doc["samples"]) == 2
    assert "preprocess says hello" in proc.stderr and "native write to fd 1" in proc.stderr


def test_a_cap_names_file_size_and_limit_and_can_be_raised(good, capsys, monkeypatch):
    """The over-cap line names the file, its size, the cap and the variable that raises it; raising it works."""
    results = str(good["results"])
    monkeypatch.setenv("WORKBENCH_MAX_JSON_BYTES", "1K")
    assert main(["diff", results, results]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "results.json" in err and "over the 1.0 KiB limit" in err
    assert "WORKBENCH_MAX_JSON_BYTES" in err and re.search(r"is \d+\.\d KiB", err), err
    monkeypatch.setenv("WORKBENCH_MAX_JSON_BYTES", "64M")
    assert main(["diff", results, results]) == 0
    monkeypatch.setenv("WORKBENCH_MAX_JSON_BYTES", "lots")
    assert main(["diff", results, results]) == 2
    assert "WORKBENCH_MAX_JSON_BYTES='lots'" in capsys.readouterr().err


def test_rerun_and_recorded_engine_text_cannot_be_forged(forged, capsys, tmp_path):
    """Names read back from a bundle, and layer names from TensorRT's recorded layer information."""
    bundle = tmp_path / "b\nFORGED verdict: ok"
    code, _ = _run(capsys, "compare", forged["model"], "--cand", "ort", "--bundle", bundle)
    assert code == 0
    code, text = _run(capsys, "rerun", bundle)
    assert code == 0, text
    assert_not_forged(text)
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps({"Layers": [
        {"Name": "L0\nFORGED verdict: ok", "LayerType": "MatMul\nFORGED", "TacticName": "t\u2028FORGED",
         "Inputs": [{"Name": FORGE["x"]}], "Outputs": [{"Name": FORGE["h"], "Format/Datatype": "Row major FP32"}]},
        {"Name": FORGE["relu"], "LayerType": "Activation", "Inputs": [{"Name": FORGE["h"]}],
         "Outputs": [{"Name": FORGE["y"], "Format/Datatype": "Row major FP32"}]}]}))
    code, text = _run(capsys, "inspect", forged["model"], "--layer-info", layers)
    assert code == 0, text
    assert_not_forged(text)


def test_safe_name_is_one_escaped_line_cut_to_a_limit():
    from workbench.textfmt import safe_name

    shown = safe_name("a\nb\rc\x1b[2Jd\u2028e\x85f\tg")
    assert shown == "a\\nb\\rc\\x1b[2Jd\\u2028e\\x85f\\tg" and len(shown.splitlines()) == 1
    assert safe_name("x" * 50, 10) == "x" * 9 + "\u2026" and safe_name(None) == ""
