"""Adversarial use of the command line and the Python API: tampered bundles (sealed and unsealed, folder and zip),
every output option of every subcommand (from the parser) given '-', over-long names and a full disk, and inputs
that must give a documented exit code and one line (huge sizes, unknown element types, empty spec variants,
criteria that can never fire, a 3,000-node chain, no subcommand), and wrong argument types in the public API.

Real engines and real files throughout: the bundles are saved from a sample model compared on ONNX Runtime."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, SAMPLES
from onnx import TensorProto, helper

from workbench.cli import _size, build_parser, main
from workbench.output_options import output_actions
from workbench.report.bundle import _write_npz
from workbench.report.safety import SEAL, sha256_file

MODEL = SAMPLES / "healthy_cnn.onnx"
OVERFLOW = SAMPLES / "cnn_fp16_overflow.onnx"  # diverges on ref vs ref:fp16: reduce and repair have work to do


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _line(err: str) -> str:
    """The one line a refusal prints on stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------------- bundles (5)

@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """One comparison bundle (folder and zip) and one dataset bundle of a sample model, on ONNX Runtime."""
    root = tmp_path_factory.mktemp("saved")
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.savez(data / f"s{i}.npz", image=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    for dest, extra in (("folder", []), ("bundle.zip", []), ("dataset", ["--inputs", data, "--per-sample"])):
        code = main([str(a) for a in ("compare", MODEL, "--bundle", root / dest, *extra)])
        assert code == 0, dest
    return {"folder": root / "folder", "zip": root / "bundle.zip", "dataset": root / "dataset"}


def _copy(saved: dict[str, Path], kind: str, dest: Path, edit) -> Path:
    """A copy of the saved bundle ``kind`` with ``edit(folder)`` applied (re-zipped for the zip)."""
    if kind != "zip":
        shutil.copytree(saved[kind], dest)
        edit(dest)
        return dest
    unpacked = dest.with_suffix(".d")
    with zipfile.ZipFile(saved["zip"]) as zf:
        zf.extractall(unpacked)
    edit(unpacked)
    out = dest.with_suffix(".zip")
    with zipfile.ZipFile(out, "w") as zf:
        for p in sorted(unpacked.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(unpacked).as_posix())
    return out


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _put(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _loosen_criterion(m: dict) -> None:
    """A criterion no output of the sample model passes (its FP16 outputs reach ~64 dB)."""
    section = m.get("compare") or m["dataset_compare"]
    for doc in (m.get("criterion"), section["criterion"]):
        if doc is not None:
            doc.update(threshold=200.0, text="sqnr_db < 200")
    if "criterion" in section["options"]:
        section["options"]["criterion"] = "sqnr_db<200"


def _edit_file(path: Path) -> None:
    """A well-formed edit of one bundle file of any kind: arrays shifted, a JSON key added, a model's doc string."""
    if path.suffix == ".npz":
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        _write_npz(path, {k: (v * 3 + 1).astype(v.dtype) for k, v in arrays.items()})
    elif path.suffix == ".json":
        doc = json.loads(path.read_text())
        doc["edited"] = True
        path.write_text(json.dumps(doc))
    elif path.suffix == ".onnx":
        proto = onnx.load(str(path))
        proto.doc_string = "edited"
        onnx.save(proto, str(path))
    else:
        raise AssertionError(f"a bundle file of a kind this test does not edit: {path.name}")


def _unseal(folder: Path, edit=None) -> None:
    m = _manifest(folder)
    m.pop(SEAL)
    if edit:
        edit(m, folder)
    _put(folder, m)


def _swap_feed_rehashed(m: dict, folder: Path) -> None:
    """The feed replaced and its recorded sha256 updated: only the (removed) seal could tell."""
    feed = m["feeds"]["files"][0]
    _edit_file(folder / feed)
    m["files"][feed] = sha256_file(folder / feed)


UNSEALED = {
    "seal removed": None,
    "seal removed, criterion loosened": lambda m, folder: _loosen_criterion(m),
    "seal removed, feed swapped and re-hashed": _swap_feed_rehashed,
}


@pytest.mark.parametrize("kind, case", [(k, c) for k in ("folder", "zip", "dataset") for c in UNSEALED
                                        if not (k == "dataset" and "feed" in c)])  # dataset: sample hashes only
def test_an_unsealed_bundle_is_refused_unless_trusted(saved, tmp_path, capsys, kind, case):
    b = _copy(saved, kind, tmp_path / "b", lambda d: _unseal(d, UNSEALED[case]))
    code, out, err = _run(capsys, "rerun", b)
    assert code == 2 and out == ""
    line = _line(err)
    assert "carries no seal" in line and "--trust-unsealed" in line
    code, out, err = _run(capsys, "rerun", b, "--trust-unsealed")
    # trusted: it runs, and what the edit changed shows (the loosened criterion makes the outputs diverge)
    assert code == (1 if "criterion" in case else 0), err
    assert "rerun of" in out


@pytest.mark.parametrize("kind", ["zip", "dataset"])
def test_diff_refuses_an_unsealed_bundle_unless_trusted(saved, tmp_path, capsys, kind):
    b = _copy(saved, kind, tmp_path / "b", _unseal)
    a = saved[kind]
    code, out, err = _run(capsys, "diff", a, b)
    assert code == 2 and out == ""
    assert "carries no seal" in _line(err) and "--trust-unsealed" in _line(err)
    code, out, err = _run(capsys, "diff", a, b, "--trust-unsealed", "--json", "-")
    assert code == 0, err
    doc = json.loads(out)  # the seal was all that changed: the same answer, every layer equal
    if kind == "dataset":
        assert doc["changed_samples"] == [] and doc["only_before"] == doc["only_after"] == [], doc
        assert doc["verdict"]["before"] == doc["verdict"]["after"], doc
    else:
        assert doc["same_conclusion"] and doc["tensors"], doc
        assert all(t["change"] == 0.0 for t in doc["tensors"]), doc["tensors"]


def test_the_python_api_refuses_an_unsealed_bundle_unless_trusted(saved, tmp_path):
    from workbench.report import UnsealedBundleError, rerun_bundle

    b = _copy(saved, "folder", tmp_path / "b", _unseal)
    with pytest.raises(UnsealedBundleError, match="carries no seal"):
        rerun_bundle(b)
    assert rerun_bundle(b, trust_unsealed=True).reproduced


def _file_kind(rel: str) -> str:
    return rel.split("/", 1)[0] if "/" in rel else rel


@pytest.fixture(scope="module")
def bundle_files(saved) -> dict[str, list[str]]:
    """Every file the saved comparison bundle lists, by kind (folder: inputs, model, tensors; or the file)."""
    kinds: dict[str, list[str]] = {}
    for rel in _manifest(saved["folder"])["files"]:
        kinds.setdefault(_file_kind(rel), []).append(rel)
    return kinds


FILE_KINDS = ["inputs", "model", "tensors", "results.json"]


def test_every_file_kind_of_a_bundle_is_tampered_below(bundle_files):
    assert sorted(bundle_files) == sorted(FILE_KINDS)


@pytest.mark.parametrize("kind", ["folder", "zip"])
@pytest.mark.parametrize("file_kind", FILE_KINDS)
def test_an_edited_file_of_a_sealed_bundle_is_refused_naming_it(saved, bundle_files, tmp_path, capsys, kind,
                                                                 file_kind):
    for i, rel in enumerate(bundle_files[file_kind]):
        b = _copy(saved, kind, tmp_path / f"b{i}", lambda d, rel=rel: _edit_file(d / rel))
        code, out, err = _run(capsys, "rerun", b)
        assert code == 2 and out == "", err
        line = _line(err)
        assert (Path(rel).name if file_kind == "model" else rel) in line, line


@pytest.mark.parametrize("kind", ["folder", "zip", "dataset"])
@pytest.mark.parametrize("edit", ["criterion", "options"])
def test_an_edited_manifest_with_its_seal_kept_is_refused(saved, tmp_path, capsys, kind, edit):
    def change(folder: Path) -> None:
        m = _manifest(folder)
        section = m.get("compare") or m["dataset_compare"]
        if edit == "criterion":
            section["criterion"]["threshold"] = 200.0
        else:
            section["options"]["max_culprits"] = 1
        _put(folder, m)

    b = _copy(saved, kind, tmp_path / "b", change)
    code, out, err = _run(capsys, "rerun", b)
    assert code == 2 and "manifest.json changed" in _line(err)


# ---------------------------------------------------------------------------------------------------- outputs (6)

#: a command line per subcommand that does real work; the output options are added by the tests
BASE = {
    "inspect": lambda s: ["inspect", MODEL, "--engine", "ort", "--runs", "0"],
    "compare": lambda s: ["compare", MODEL],
    "calibrate": lambda s: ["calibrate", MODEL, "--data", "2", "--methods", "max", "--method", "max"],
    "rerun": lambda s: ["rerun", s["folder"]],
    "diff": lambda s: ["diff", s["folder"], s["folder"]],
    "reduce": lambda s: ["reduce", OVERFLOW, "--ref", "ref", "--cand", "ref:fp16"],
    "repair": lambda s: ["repair", OVERFLOW, "--ref", "ref", "--cand", "ref:fp16", "--max-builds", "2"],
}
OUTPUTS = [(command, action.option_strings[0], kind) for command, action, kind in output_actions(build_parser())]
IDS = [f"{command} {option}" for command, option, _ in OUTPUTS]


def _other_outputs(command: str, option: str, folder: Path) -> list:
    """A valid path for every other output option of ``command`` (so a late failure would leave files)."""
    args = []
    for cmd, other, _ in OUTPUTS:
        if cmd == command and other != option:
            name = f"ok{other.strip('-')}" + (".onnx" if other in ("--qdq",) or (cmd, other) == ("repair", "--out")
                                              else "")
            args += [other, folder / name]
    return args


def test_every_output_option_is_marked_in_the_parser():
    """Options that write (their help says so) are OutputOptions, so the checks below reach them."""
    marked = {(c, o) for c, o, _ in OUTPUTS}
    for command, p in _subcommands().items():
        assert command in BASE, f"add a command line for `{command}` to BASE"
        for action in p._actions:
            text = (action.help or "").lower()
            if text.startswith(("write", "save")) or "where to write" in text or "folder for the files" in text:
                assert (command, action.option_strings[0]) in marked, (command, action.option_strings)


@pytest.mark.parametrize("command, option, kind", OUTPUTS, ids=IDS)
def test_dash_is_stdout_or_refused(saved, tmp_path, capsys, monkeypatch, command, option, kind):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, *BASE[command](saved), *_other_outputs(command, option, tmp_path / "o"), option,
                          "-")
    assert not (tmp_path / "-").exists()
    if kind.stdout:
        assert code in (0, 1), err
        assert json.loads(out)["schema"].startswith("workbench.")
    else:
        assert code == 2 and out == ""
        assert f"argument {option}" in _line(err) and "standard output" in err
        assert not (tmp_path / "o").exists()


def test_compare_a_model_named_dash_does_not_overwrite_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(MODEL, tmp_path / "-")
    code, _, err = _run(capsys, "compare", "./-", "--report", "-")
    assert code == 2 and (tmp_path / "-").read_bytes() == MODEL.read_bytes()


LONG = {"300-character name": "x" * 300, "path past PATH_MAX": "/".join(["y" * 200] * 25)}


@pytest.mark.parametrize("long", list(LONG))
@pytest.mark.parametrize("command, option, kind", OUTPUTS, ids=IDS)
def test_an_impossible_output_path_is_refused_before_any_work(saved, tmp_path, capsys, command, option, kind, long):
    folder = tmp_path / "o"
    folder.mkdir()
    code, out, err = _run(capsys, *BASE[command](saved), *_other_outputs(command, option, folder), option,
                          folder / LONG[long])
    assert code == 2 and out == ""
    assert option in _line(err) and "shorter" in err
    assert list(folder.iterdir()) == []  # no other output was written first


def test_a_long_name_that_fits_is_written(tmp_path, capsys):
    """A name near NAME_MAX: the temporary written beside it must fit too."""
    dest = tmp_path / ("n" * 250)
    code, _, err = _run(capsys, "compare", MODEL, "--json", dest, "--bundle", tmp_path / ("b" * 250))
    assert code == 0, err
    assert json.loads(dest.read_text())["schema"] == "workbench.compare/1"


def _limited(limit: int):
    def preexec() -> None:  # RLIMIT_FSIZE: a write past ``limit`` bytes fails with EFBIG (SIGXFSZ ignored)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("option, name, limit", [("--report", "r.html", 64 * 1024), ("--bundle", "b", 4096)])
def test_a_write_that_runs_out_of_room_names_the_destination(tmp_path, option, name, limit):
    """Files are capped (RLIMIT_FSIZE, EFBIG: what a full disk gives as ENOSPC, through the same path; the HTML
    report is megabytes, the bundle's feed 12 KiB); the line names the output, not the model."""
    dest = tmp_path / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "workbench", "compare", str(MODEL), option, str(dest)], env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=_limited(limit), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = _line(proc.stderr)
    assert f"writing {option} {dest}" in line and str(MODEL) not in line, line
    assert not dest.exists()


# ------------------------------------------------------------------------------------------------- exit codes (7)

def _model(tmp_path: Path, name: str, nodes, initializers=(), elem_type: int | None = None) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if elem_type is not None:
        proto.graph.initializer[0].data_type = elem_type
    path = tmp_path / name
    onnx.save(proto, str(path))
    return path


@pytest.fixture(scope="module")
def odd_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("odd")
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], [1.0] * 4)
    chain = [helper.make_node("Identity", ["x" if i == 0 else f"t{i}"], ["y" if i == 2999 else f"t{i + 1}"])
             for i in range(3000)]
    renamed = _model(root, "renamed.onnx", [helper.make_node("Relu", ["x"], ["z"])])
    proto = onnx.load(str(renamed))
    proto.graph.output[0].name = "z"  # the same model, its output under another name
    onnx.save(proto, str(renamed))
    relu = _model(root, "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])])
    empty = onnx.helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(empty, str(root / "empty.onnx"))
    echo = helper.make_model(helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]),
                             opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(echo, str(root / "echo.onnx"))
    return {"type 77": _model(root, "t77.onnx", [helper.make_node("Add", ["x", "w"], ["y"])], [w], elem_type=77),
            "chain": _model(root, "chain.onnx", chain), "renamed": renamed, "relu": relu,
            "empty": root / "empty.onnx", "echo": root / "echo.onnx"}


def _subcommands() -> dict:
    parser = build_parser()
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices


SIZE_OPTIONS = [(c, a.option_strings[0]) for c, p in _subcommands().items() for a in p._actions if a.type is _size]


@pytest.mark.parametrize("command, option", SIZE_OPTIONS)
def test_a_400_digit_size_is_refused_in_one_line(capsys, command, option):
    assert SIZE_OPTIONS, "no size options found in the parser"
    code, out, err = _run(capsys, command, MODEL, option, "9" * 400)
    assert code == 2 and "too large" in _line(err)


REFUSED = {
    "unknown element type (compare)": ("compare", "{type 77}"),
    "unknown element type (inspect)": ("inspect", "{type 77}"),
    "empty candidate variant": ("compare", MODEL, "--cand", "ort:"),
    "empty reference variant": ("compare", MODEL, "--ref", "ort:"),
    "empty engine": ("compare", MODEL, "--cand", ":fp16"),
    "a criterion that can never fire": ("compare", MODEL, "--criterion", "cosine<-2"),
    "a criterion that fires on every tensor": ("compare", MODEL, "--criterion", "max_abs>-1"),
    "no subcommand": (),
    # nothing would be compared: never a verdict "ok"
    "a candidate file that computes none of the outputs": ("compare", "{relu}", "--cand", "ort",
                                                          "--cand-model", "{renamed}"),
    "a model with no output": ("compare", "{empty}", "--cand", "ort:fp16"),
    "a model whose output is its input": ("compare", "{echo}", "--cand", "ort:fp16"),
}
FRAGMENT = {"unknown element type": "element type 77", "variant": "empty engine or variant", "engine": "empty",
            "never fire": "never fire", "every tensor": "every tensor", "subcommand": "no command given",
            "none of the outputs": "the candidate computes none of the reference's graph outputs (y); its outputs "
                                   "are z", "no output": "the model is invalid: the graph has no output",
            "its input": "every graph output of the model is one of its inputs (x)"}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_input_gives_exit_2_and_one_line(odd_models, capsys, case):
    argv = [odd_models[a[1:-1]] if isinstance(a, str) and a.startswith("{") else a for a in REFUSED[case]]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    fragment = next(v for k, v in FRAGMENT.items() if k in case)
    assert fragment in _line(err)


@pytest.mark.parametrize("argv", [["compare", "--no-culprits"], ["inspect", "--no-probe"]], ids=["compare", "inspect"])
def test_a_3000_node_chain_works(odd_models, capsys, argv):
    code, out, err = _run(capsys, argv[0], odd_models["chain"], *argv[1:])
    assert code == 0, err
    assert "chain.onnx" in out


def _api():
    """The public functions, imported as the README names them: from ``workbench`` itself."""
    import workbench

    names = ("compare", "inspect_model", "load_model", "calibrate", "repair", "reduce", "save_bundle", "load_bundle",
             "rerun_bundle", "engine_graph", "compare_dataset")
    return {name: getattr(workbench, name) for name in names}


API_CASES = [
    ("compare", (MODEL,), {"seed": "1"}, TypeError, "seed"),
    ("compare", (MODEL,), {"seed": -1}, ValueError, "seed"),
    ("compare", (MODEL,), {"feed_count": 1.5}, TypeError, "feed_count"),
    ("compare", (MODEL, 5), {}, TypeError, "reference"),
    ("inspect_model", (MODEL,), {"targets": 5}, TypeError, "targets"),
    ("inspect_model", (MODEL,), {"targets": "trt-10"}, TypeError, "targets"),
    ("load_model", (5,), {}, TypeError, "source"),
    ("load_model", (None,), {}, TypeError, "source"),
    ("inspect_model", (None,), {}, TypeError, "source"),
    ("compare", (None,), {}, TypeError, "model"),
    ("calibrate", (MODEL, 2), {"seed": "x"}, TypeError, "seed"),
    ("calibrate", (MODEL, 2), {"top_k": "all"}, TypeError, "top_k"),
    ("repair", (MODEL,), {"max_builds": "a"}, TypeError, "max_builds"),
    ("reduce", (MODEL,), {"out": 5}, TypeError, "out"),
    ("save_bundle", ("not a result",), {"dest": "b"}, TypeError, "result"),
    ("load_bundle", (5,), {}, TypeError, "path"),
    ("rerun_bundle", (5,), {}, TypeError, "bundle"),
    ("rerun_bundle", ("b",), {"trust_unsealed": "yes"}, TypeError, "trust_unsealed"),
    ("engine_graph", (MODEL,), {"runs": "3"}, TypeError, "runs"),
    ("compare_dataset", (MODEL,), {"workers": 2.5}, TypeError, "workers"),
]


@pytest.mark.parametrize("name, args, kwargs, error, argument", API_CASES,
                         ids=[f"{c[0]} {c[4]}" for c in API_CASES])
def test_the_api_names_a_wrong_argument(name, args, kwargs, error, argument):
    with pytest.raises(error, match=rf"{name}\(\): {argument} "):
        _api()[name](*args, **kwargs)


def test_every_public_api_function_checks_its_arguments():
    unchecked = [name for name, fn in _api().items() if not hasattr(fn, "__wrapped__")]
    assert unchecked == []
    assert {c[0] for c in API_CASES} == set(_api())


def test_a_full_temporary_folder_is_named_instead_of_the_output(tmp_path, monkeypatch, capsys):
    """With TMPDIR on a small file system, a big model's scratch copies filled it and the line blamed the output
    being written ('No space left on device writing --json full.json -- free disk space'), on a disk with 69 GB
    free. The run's scratch is named now, with what to do."""
    import errno

    import workbench.compare.api as compare_api
    import workbench.output_options as oo
    from workbench.cli import main
    from workbench.core.scratch import run_scratch

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_scratch() / "workbench-weights-x" / "w.bin"))

    monkeypatch.setattr(compare_api, "ComparisonPlan", full)
    assert main(["compare", str(MODEL), "--json", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "No space left on device in the temporary folder" in err and "set TMPDIR" in err and "--json" not in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out.json").exists()
    # no file named: the scratch when no output shares its file system, else the output (its disk may be full)
    unnamed = OSError(errno.ENOSPC, "No space left on device")
    parser_args = ["compare", str(MODEL), "--json", str(tmp_path / "out.json")]
    from workbench.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(parser_args)
    monkeypatch.setattr(oo, "_device", lambda path: 1)  # the output on the temporary folder's file system
    assert oo.scratch_out_of_space(unnamed, parser, args) is None
    monkeypatch.setattr(oo, "_device", lambda path: 1 if str(path).startswith(str(tmp_path)) else 2)
    assert oo.scratch_out_of_space(unnamed, parser, args) is not None
    efbig = OSError(errno.EFBIG, "File too large")  # a file-size limit is the output's, never the folder's
    assert oo.scratch_out_of_space(efbig, parser, args) is None
