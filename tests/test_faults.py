"""Fault injection (issue 12): hostile files (FIFOs, devices, oversized), hostile values (out-of-range options,
ranges a dtype cannot hold, inputs too large for memory), hostile names (control characters, HTML), invalid
graphs, crashing engines and shutdown races. Each gives the right exit code and one clear line; nothing hangs,
allocates without bound or aborts.

Exit codes: 0 ok, 1 diverged, 2 the user's problem (one line), 3 our bug or an engine crash, 130 cancelled.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import onnx
import pytest
from conftest import SAMPLES, tiny_model
from onnx import TensorProto, helper

from workbench.cli import build_parser, main
from workbench.errors import (
    Cancelled,
    EngineCrashedError,
    EngineRunError,
    InputError,
    ModelStructureError,
    WorkbenchError,
)

WB = Path(sys.executable).with_name("workbench")
CNN = SAMPLES / "healthy_cnn.onnx"
HOSTILE = '<a href="https://example.com/x">click</a>'


#: a hang guard, not a speed bound: a loaded CI machine starts the CLI slowly, a hang never ends
HANG_S = 180


def run(*args, timeout: float = HANG_S, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(WB), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kwargs)


def one_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single stderr line of a run that must exit ``code``."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def graph_model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    return model


def relu_model(shape: list[int], out: str = "y", node: str = "relu") -> onnx.ModelProto:
    return graph_model([helper.make_node("Relu", ["x"], [out], name=node)],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                       [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)])


# --- 5. only regular files are read, and never more than a cap ------------------------------------------------
@pytest.mark.parametrize("command", [["inspect", "{f}"], ["compare", "{f}"], ["diff", "{f}", "{f}"]])
def test_a_fifo_as_the_model_is_refused_instead_of_waited_on(tmp_path, command):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    line = one_line(run(*[c.format(f=fifo) for c in command]))
    assert "FIFO" in line and "not a regular file" in line


@pytest.mark.parametrize("command", [["inspect", "/dev/zero"], ["compare", "/dev/zero"],
                                     ["diff", "/dev/zero", "/dev/zero"]])
def test_a_device_as_the_model_is_refused_instead_of_read_without_end(command):
    line = one_line(run(*command))
    assert "character device" in line


@pytest.mark.parametrize("name", ["feeds.npz", "feeds.json"])
def test_a_fifo_as_the_inputs_is_refused(tmp_path, name):
    model = save(tiny_model(), tmp_path / "m.onnx")
    fifo = tmp_path / name
    os.mkfifo(fifo)
    line = one_line(run("compare", model, "--ref", "ort", "--cand", "ort", "--inputs", fifo))
    assert "feed file" in line and "FIFO" in line


def test_a_model_file_over_2_gib_is_refused_without_reading_it(tmp_path):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as fh:
        fh.truncate(2**31 + 16)  # sparse: no disk used, but reading it would take 2 GiB of memory
    line = one_line(run("inspect", big, "--no-probe"))
    assert "over the 2.0 GiB limit" in line and "external data" in line


def test_read_capped_refuses_a_file_over_its_cap(tmp_path):
    from workbench._files import read_capped

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 11)
    with pytest.raises(InputError, match="over the 10 B limit"):
        read_capped(path, 10, "feed file", InputError)
    assert read_capped(path, 11, "feed file", InputError) == b"x" * 11


# --- 6. exit codes that tell the truth -------------------------------------------------------------------------
def _giant(d: Path) -> list:
    return ["compare", save(relu_model([2**40, 2**40]), d / "giant.onnx"), "--ref", "ort", "--cand", "ort"]


def _nested(d: Path) -> list:
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return ["compare", CNN, "--ref", "ort", "--cand", "ort", "--inputs", d / "deep.json"]


def _file_as_parent(d: Path) -> list:
    (d / "file").write_text("x")
    return ["inspect", CNN, "--no-probe", "--json", d / "file" / "out.json"]


BAD_INPUTS = {
    "--json names a folder": lambda d: ["inspect", CNN, "--no-probe", "--json", d],
    "--json parent is a file": _file_as_parent,
    "--feeds 0": lambda d: ["compare", CNN, "--feeds", "0"],
    "--feeds -3": lambda d: ["compare", CNN, "--feeds", "-3"],
    "huge static dims": _giant,
    "--val-range beyond float32": lambda d: ["compare", CNN, "--ref", "ort", "--cand", "ort",
                                             "--val-range", "image:[-1e308,1e308]"],
    "deeply nested inputs JSON": _nested,
    "--num-bins 2**28": lambda d: ["calibrate", CNN, "--data", "1", "--num-bins", str(2**28)],
    "/dev/zero as the model": lambda d: ["inspect", "/dev/zero"],
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_never_3(tmp_path, case):
    one_line(run(*BAD_INPUTS[case](tmp_path)))


def test_a_file_too_large_for_the_disk_is_the_users_problem(tmp_path):
    def limit_file_size():  # a real write failure (EFBIG), as on a full or quota-limited disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    line = one_line(run("inspect", CNN, "--no-probe", "--json", tmp_path / "out.json", preexec_fn=limit_file_size))
    assert "File too large" in line


def test_an_engine_crash_exits_3_and_names_the_engine(tmp_path):
    (tmp_path / "crashing_engine.py").write_text(textwrap.dedent("""
        import ctypes
        from workbench.engines.base import Engine, Session

        class Crashing(Engine):
            name = "crashing"

            def prepare(self, model, outputs):
                return _Session()

            def describe(self):
                return {"engine": self.name}

        class _Session(Session):
            def run(self, feeds):
                ctypes.string_at(0)  # a real segfault in the worker
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = run("compare", CNN, "--ref", "ort", "--cand", "crashing_engine:Crashing", "--isolate", "yes",
               "--no-culprits", env=env, timeout=HANG_S)
    line = one_line(proc, code=3)
    assert line.startswith("workbench: engine crash (Crashing):") and "SIGSEGV" in line


def test_crashes_and_cancellations_are_not_bad_input():
    crash = EngineCrashedError("the X worker crashed", engine="X")
    assert crash.exit_code == 3 and crash.engine == "X" and isinstance(crash, EngineRunError)  # fall-backs still work
    assert InputError("bad").exit_code == 2
    assert not issubclass(Cancelled, WorkbenchError) and Cancelled().exit_code == 130


def test_a_cancelled_comparison_raises_cancelled_not_a_workbench_error():
    from workbench.compare.api import compare

    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled) as err:
        compare(CNN, "ort", "ort", cancel=cancel)
    assert not isinstance(err.value, WorkbenchError)  # `except WorkbenchError` fall-backs cannot swallow it


# --- 7. garbage values are refused, not answered ---------------------------------------------------------------
@pytest.mark.parametrize("criterion, says", [("sqnr_db<nan", "non-finite"), ("sqnr_db>30", "sqnr_db<30"),
                                             ("sqnr_db<30,atol=-1", "atol")])
def test_a_criterion_that_would_silence_or_flip_the_gate_is_refused(criterion, says):
    line = one_line(run("compare", SAMPLES / "fp16_clamp_constant.onnx", "--criterion", criterion))
    assert says in line


def test_a_value_range_the_input_dtype_cannot_hold_is_refused():
    line = one_line(run("compare", CNN, "--ref", "ort", "--cand", "ort", "--val-range", "image:[1e39,1e40]"))
    assert "not finite in float32" in line


def test_an_unknown_diff_metric_is_refused_with_the_valid_ones(tmp_path):
    from workbench.compare.api import compare

    path = compare(tiny_model(), "ort", "ort").save_json(tmp_path / "a.json")
    line = one_line(run("diff", path, path, "--metric", "bogus"))
    assert "unknown metric 'bogus'" in line and "sqnr_db" in line and "max_abs" in line


def test_every_numeric_option_has_a_range_checking_type():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.type not in (int, float), f"workbench {name} {action.option_strings}: no range checked"


OUT_OF_RANGE = [
    ("compare", "--timeout", "-1"), ("compare", "--timeout", "nan"), ("compare", "--impact", "-1"),
    ("compare", "--seed", "-1"), ("compare", "--feeds", "0"), ("compare", "--memory-budget", "0"),
    ("calibrate", "--top-k", "-5"), ("calibrate", "--num-bins", "3"), ("calibrate", "--num-bins", str(2**28)),
    ("calibrate", "--percentile", "0"), ("calibrate", "--percentile", "101"), ("calibrate", "--top", "-1"),
    ("calibrate", "--cache-version", "-1"), ("calibrate", "--ort-entropy-bins", "1"),
    ("diff", "--top", "-3"), ("reduce", "--max-nodes", "0"), ("repair", "--max-builds", "0"),
]
REQUIRED = {"compare": ["m.onnx"], "calibrate": ["m.onnx", "--data", "1"], "diff": ["a.json", "b.json"],
            "reduce": ["m.onnx", "--out", "r"], "repair": ["m.onnx", "--out", "f.onnx"]}


@pytest.mark.parametrize("command, option, value", OUT_OF_RANGE)
def test_an_out_of_range_option_is_refused_naming_the_range(command, option, value, capsys):
    assert main([command, *REQUIRED[command], f"{option}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err and ("range" in err or "power of two" in err or "size" in err)


# --- 4. inputs are sized against the memory budget before anything is allocated -------------------------------
def _peak_rss_mib(args: list) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS in MiB) of a CLI run, measured in a fresh parent."""
    script = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
              "sys.stderr.write(p.stderr); print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", script, str(WB), *map(str, args)], capture_output=True, text=True,
                          timeout=HANG_S)
    code, rss_kib = proc.stdout.split()
    return int(code), proc.stderr, int(rss_kib) / 1024


def test_feeds_over_the_memory_budget_are_refused_with_the_numbers(tmp_path):
    model = save(relu_model([1, 8000, 8000]), tmp_path / "big.onnx")  # 244 MiB per feed
    code, err, peak = _peak_rss_mib(["compare", model, "--ref", "ort", "--cand", "ort", "--memory-budget", "64M"])
    assert code == 2 and "244.1 MiB" in err and "64.0 MiB" in err, err
    assert peak < 200, f"{peak:.0f} MiB used: the feed was allocated before the check"


def test_a_run_that_cannot_fit_the_default_budget_is_refused_before_allocating(tmp_path):
    model = save(relu_model([1, 30000, 30000]), tmp_path / "huge.onnx")  # 3.4 GiB per tensor
    code, err, peak = _peak_rss_mib(["compare", model, "--ref", "ort", "--cand", "ort"])
    assert code == 2 and "3.4 GiB" in err and ("memory budget" in err or "physical memory" in err), err
    assert peak < 500, f"{peak:.0f} MiB used"


def test_random_feeds_refuse_before_allocating():
    from workbench.inputs import random_feeds

    with pytest.raises(InputError, match=r"would take 1\.0 GiB, over the memory budget of 1\.0 MiB"):
        random_feeds(relu_model([1, 2**14, 2**14]), max_bytes=2**20)
    with pytest.raises(InputError, match="half the physical memory"):  # no budget given: still bounded
        random_feeds(relu_model([2**40, 2**40]))


# --- 8. interpreter exit never aborts --------------------------------------------------------------------------
def test_two_workbenches_in_one_script_exit_cleanly(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(f"""
        from workbench.ui.workbench import Workbench
        a = Workbench({str(CNN)!r})
        b = Workbench({str(CNN)!r})  # each Model panel starts an ONNX Runtime probe on a thread
        """))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]  # it aborted in ~7 of 8 runs
    for p in procs:
        _, err = p.communicate(timeout=HANG_S)
        assert p.returncode == 0 and "terminate called" not in err, (p.returncode, err)


# --- 9. names cannot forge terminal lines or live links ------------------------------------------------------
def test_control_characters_in_a_path_are_escaped_on_stderr(tmp_path):
    line = one_line(run("inspect", tmp_path / "nope\r\nworkbench: all good\x1b[2K.onnx"))
    assert "nope\\r\\nworkbench: all good\\x1b[2K.onnx" in line


def test_control_characters_in_model_names_are_escaped_on_stdout(tmp_path):
    model = save(relu_model([1, 4], out="y\r\nFAKE LINE"), tmp_path / "m.onnx")
    proc = run("inspect", model, "--no-probe")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stdout and "y\\r\\nFAKE LINE" in proc.stdout
    assert not any(line.startswith("FAKE") for line in proc.stdout.splitlines())


def _strings(obj, skip=("customdata",)):
    """Every string plotly would render from a figure's JSON (customdata is data for clicks, not shown)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in skip:
                yield from _strings(v, skip)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v, skip)


def test_html_in_node_names_is_text_in_every_plot():
    from workbench.compare.api import compare
    from workbench.model.load import load_model
    from workbench.plots.compare import culprit_bars, layer_error_curve
    from workbench.plots.graph import GraphView, graph_figure

    model = tiny_model()
    for node in model.graph.node:
        node.name = HOSTILE
    result = compare(model, "ref", "ref:fp16", criterion="sqnr_db<200")
    assert result.culprits and result.tensors
    figures = [layer_error_curve(result), culprit_bars(result),
               graph_figure(GraphView.from_graph(load_model(model).graph), result=result, overlay="diverged")]
    for fig in figures:
        shown = list(_strings(fig.to_plotly_json()))
        assert not [s for s in shown if "<a " in s], fig.layout.title.text
        assert any("&lt;a href=" in s for s in shown)  # the name is still there, as text


# --- 11. an invalid graph is the model's problem, not the converter's ------------------------------------------
def _cyclic() -> onnx.ModelProto:
    return graph_model([helper.make_node("Relu", ["b"], ["a"], name="loop_a"),
                        helper.make_node("Relu", ["a"], ["b"], name="loop_b"),
                        helper.make_node("Add", ["x", "a"], ["y"], name="add")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])


def _duplicate_output() -> onnx.ModelProto:
    return graph_model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                        helper.make_node("Sigmoid", ["x"], ["y"], name="second")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])


def _output_listed_twice() -> onnx.ModelProto:
    return graph_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])] * 2)


@pytest.mark.parametrize("make, says", [(_cyclic, "cycle through nodes 'loop_"),
                                        (_duplicate_output, "tensor 'y' is produced twice: by node 'first'"),
                                        (_output_listed_twice, "graph output 'y' is listed twice")])
@pytest.mark.parametrize("ref", ["ort", "ref"])
def test_an_invalid_graph_is_reported_as_the_models_problem(tmp_path, make, says, ref):
    model = save(make(), tmp_path / "bad.onnx")
    line = one_line(run("compare", model, "--ref", ref, "--cand", "ort:fp16"))
    assert "the model is invalid" in line and says in line
    assert "converter" not in line and "onnxruntime" not in line and "ReferenceEvaluator" not in line


def test_an_invalid_graph_never_reaches_a_converter():
    from workbench.variants import make_variant

    for make in (_cyclic, _duplicate_output, _output_listed_twice):
        with pytest.raises(ModelStructureError):
            make_variant(make(), "fp16")


def test_inspect_lists_cycles_as_problems():
    from workbench.inspection import inspect_model

    problems = inspect_model(_cyclic(), probe=False).to_json()["problems"]
    assert any(p["code"] == "cycle" and "'loop_a'" in p["message"] for p in problems)
    problems = inspect_model(_output_listed_twice(), probe=False).to_json()["problems"]
    assert [p["code"] for p in problems if p["severity"] == "error"] == ["duplicate-graph-output"], problems
    empty = graph_model([], [], [])
    problems = inspect_model(empty, probe=False).to_json()["problems"]
    assert [p["code"] for p in problems if p["severity"] == "error"] == ["no-outputs"], problems


@pytest.mark.slow
def test_ctrl_c_interrupts_a_long_session_build(tmp_path):
    """A 60,000-node model keeps ONNX Runtime's session build busy for seconds: Ctrl-C during the comparison's
    engine phase stops the CLI (exit 130, one line). No clock bound: how soon is load-dependent (the wait is a hang
    guard)."""
    import time

    n = 60_000
    nodes = [helper.make_node("Add", [f"t{i}", "one"], [f"t{i + 1}"], name=f"a{i}") for i in range(n)]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    model = tmp_path / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "-v", "compare", str(model), "--cand", "ort",
                             "--no-culprits"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stderr:  # wait until a session build has started (the progress line names the engine)
            if "reference engine" in line or "candidate engine" in line:
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=HANG_S)
    finally:
        proc.kill()
    rest = proc.stderr.read()
    assert rc == 130, (rc, rest[-500:])
    assert rest.strip().splitlines()[-1] == "workbench: interrupted"
