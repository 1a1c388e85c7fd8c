"""Interop on real files: Polygraphy's own CLI records runs that we load and compare against live engines;
our RunResults are read by Polygraphy's own loader; Model Explorer node data; the Netron helper."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.report.interop import (
    RecordingError,
    compare_with_recording,
    model_explorer_node_data,
    netron_command,
    open_in_netron,
    read_run_results,
    record_run,
    save_model_explorer_node_data,
    write_inputs_json,
    write_run_results,
)
from workbench.report.recorded import RecordedEngine

pytest.importorskip("polygraphy")
POLYGRAPHY = Path(sys.executable).with_name("polygraphy")


def _polygraphy_run(model: Path, folder: Path) -> tuple[Path, Path]:
    """`polygraphy run MODEL --onnxrt --onnx-outputs mark all --save-inputs --save-results`, for real."""
    folder.mkdir(parents=True, exist_ok=True)
    inputs, results = folder / "in.json", folder / "out.json"
    proc = subprocess.run([str(POLYGRAPHY), "run", str(model), "--onnxrt", "--onnx-outputs", "mark", "all",
                           "--save-inputs", str(inputs), "--save-results", str(results)],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return inputs, results


@pytest.fixture(scope="module")
def healthy_recording(tmp_path_factory):
    return _polygraphy_run(SAMPLES / "healthy_cnn.onnx", tmp_path_factory.mktemp("pg_healthy"))


@pytest.fixture(scope="module")
def clamp_recording(tmp_path_factory):
    return _polygraphy_run(SAMPLES / "fp16_clamp_constant.onnx", tmp_path_factory.mktemp("pg_clamp"))


def test_polygraphy_file_layout_is_what_we_read(healthy_recording):
    """The real file: {"lst": [[runner, [IterationResult]]], "polygraphy_class": "RunResults"}, arrays as
    LazyArray-wrapped base64 .npy."""
    _, results = healthy_recording
    doc = json.loads(results.read_text())
    assert doc["polygraphy_class"] == "RunResults"
    runner, iterations = doc["lst"][0]
    it = iterations[0]
    assert it["polygraphy_class"] == "IterationResult" and it["runner_name"] == runner
    value = next(iter(it["outputs"].values()))
    assert value["polygraphy_class"] == "LazyArray" and value["values"]["polygraphy_class"] == "ndarray"
    loaded = read_run_results(results)
    assert loaded.runners == [runner] and runner.startswith("onnxrt-runner")
    outputs = loaded.runs[0][1][0].outputs
    assert "logits" in outputs and len(outputs) >= 8  # every tensor was marked
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in outputs.values())


def test_recorded_polygraphy_run_matches_live_ort(healthy_recording):
    inputs, results = healthy_recording
    r = compare_with_recording(SAMPLES / "healthy_cnn.onnx", results, "ort", inputs_json=inputs)
    assert not r.diverged
    assert r.reference.startswith("recorded:onnxrt-runner") and r.engines["reference"]["engine"] == "recorded"
    assert len(r.tensors) >= 8
    assert min(t.metrics["sqnr_db"] for t in r.tensors) > 90


def test_recorded_run_against_fp16_finds_the_bn_culprit(clamp_recording):
    inputs, results = clamp_recording
    r = compare_with_recording(SAMPLES / "fp16_clamp_constant.onnx", results, "ort:fp16", inputs_json=inputs)
    assert r.diverged
    assert r.first_divergent.node == "/bn_big_var/BatchNormalization"
    assert r.culprits[0].node == "/bn_big_var/BatchNormalization" and r.culprits[0].introduces_divergence
    assert "clamped" in r.culprits[0].explanation


def test_recorded_engine_matches_iterations_by_inputs_or_order(healthy_recording):
    from workbench.inputs import load_feeds

    inputs, results = healthy_recording
    feeds = load_feeds(inputs)
    engine = RecordedEngine(results, inputs=inputs)
    with engine.prepare(None, ["logits", "not_recorded"]) as session:
        out = session.run(feeds[0])
    assert set(out) == {"logits"}
    from workbench.engines import get_engine
    from workbench.model.load import load_model

    with get_engine("ort").prepare(load_model(SAMPLES / "healthy_cnn.onnx").proto, ["logits"]) as live:
        np.testing.assert_allclose(out["logits"], live.run(feeds[0])["logits"], rtol=1e-6, atol=1e-6)
    other = {k: v + 1 for k, v in feeds[0].items()}
    with pytest.raises(Exception, match="match none"), engine.prepare(None, ["logits"]) as session:
        session.run(other)
    by_order = RecordedEngine(results)
    with by_order.prepare(None, ["logits"]) as session:
        assert "logits" in session.run(other)  # replayed in order: the first iteration
        with pytest.raises(Exception, match="iteration"):
            session.run(other)


def test_our_run_results_load_in_polygraphy(tmp_path, healthy_recording):
    from polygraphy.comparator import RunResults

    inputs, _ = healthy_recording
    ours = record_run(SAMPLES / "healthy_cnn.onnx", "ort", inputs, path=tmp_path / "ours.json", runner_name="wb-ort")
    theirs = RunResults.load(str(tmp_path / "ours.json"))
    assert list(theirs.keys()) == ["wb-ort"]
    recorded = ours.runs[0][1][0].outputs
    assert set(theirs["wb-ort"][0].keys()) == set(recorded)
    for name, value in recorded.items():
        np.testing.assert_array_equal(theirs["wb-ort"][0][name], value)
    # and back: our reader on our file, and our file as a reference engine
    again = read_run_results(tmp_path / "ours.json")
    np.testing.assert_array_equal(again.runs[0][1][0].outputs["logits"], recorded["logits"])
    r = compare_with_recording(SAMPLES / "healthy_cnn.onnx", tmp_path / "ours.json", "ort", inputs_json=inputs)
    assert not r.diverged


def test_polygraphy_api_written_results_round_trip(tmp_path):
    """Polygraphy's own writer (RunResults.save) with several runners and iterations."""
    from polygraphy.comparator import IterationResult, RunResults

    rng = np.random.default_rng(0)
    a = [{"y": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(2)]
    b = [{"y": x["y"].astype(np.float16)} for x in a]
    results = RunResults()
    results.append(("runner-a", [IterationResult(o, runner_name="runner-a") for o in a]))
    results.append(("runner-b", [IterationResult(o, runner_name="runner-b") for o in b]))
    results.save(str(tmp_path / "pg.json"))
    loaded = read_run_results(tmp_path / "pg.json")
    assert loaded.runners == ["runner-a", "runner-b"]
    assert loaded.pick("runner-b")[1][1].outputs["y"].dtype == np.float16
    np.testing.assert_array_equal(loaded.pick("runner-a")[1][1].outputs["y"], a[1]["y"])
    with pytest.raises(RecordingError, match="ambiguous"):
        loaded.pick("runner")
    write_run_results(tmp_path / "ours.json", {"x": [{"y": a[0]["y"]}]})
    assert RunResults.load(str(tmp_path / "ours.json"))["x"][0]["y"].shape == (2, 3)


def test_model_explorer_node_data(tmp_path):
    from workbench.compare.api import compare

    r = compare(SAMPLES / "fp16_clamp_constant.onnx", "ort", "ort:fp16")
    doc = model_explorer_node_data(r)
    assert list(doc) == ["fp16_clamp_constant"]  # the ONNX graph's name: the ONNX adapter's graph id
    graph = doc["fp16_clamp_constant"]
    assert set(graph) == {"results", "thresholds"}
    results = graph["results"]
    assert "/bn_big_var/BatchNormalization" in results and "[io]logits" in results
    assert results["/bn_big_var/BatchNormalization"]["value"] < 30 < results["/conv/Conv"]["value"]
    values = [t["value"] for t in graph["thresholds"]]
    assert values == sorted(values) and all(t["bgColor"].startswith("#") for t in graph["thresholds"])
    # the BN node (below the tolerance) falls in the first (red) band; Model Explorer: value <= threshold
    assert results["/bn_big_var/BatchNormalization"]["value"] <= values[0]
    path = save_model_explorer_node_data(r, tmp_path / "nd.json", metric="max_abs")
    saved = json.loads(path.read_text())  # strict JSON: no inf/NaN
    assert all(isinstance(v["value"], float) for v in saved["fp16_clamp_constant"]["results"].values())
    healthy = compare(SAMPLES / "healthy_cnn.onnx", "ort", "ort")  # exact: inf dB written as a finite cap
    json.dumps(model_explorer_node_data(healthy), allow_nan=False)


def test_netron_helper(tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copyfile(SAMPLES / "healthy_cnn.onnx", model)
    cmd = netron_command(model)
    assert cmd[-1] == str(model.resolve()) and ("netron" in cmd[0] or cmd[1:3] == ["-m", "netron"])
    import importlib.util

    if shutil.which("netron") is None and importlib.util.find_spec("netron") is None:
        message = open_in_netron(model)
        assert isinstance(message, str) and "pip install netron" in message


def test_inputs_json_for_polygraphy(tmp_path):
    """Our inputs JSON is what `polygraphy run --load-inputs` reads: Polygraphy's loader, then its CLI, on it."""
    from polygraphy.json import load_json

    from workbench.inputs import load_feeds

    feeds = [{"image": np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32)} for i in range(2)]
    path = write_inputs_json(tmp_path / "in.json", feeds)
    theirs = load_json(str(path))
    assert len(theirs) == 2 and np.array_equal(theirs[1]["image"], feeds[1]["image"])
    np.testing.assert_array_equal(load_feeds(path)[0]["image"], feeds[0]["image"])
    proc = subprocess.run([str(POLYGRAPHY), "run", str(SAMPLES / "healthy_cnn.onnx"), "--onnxrt", "--load-inputs",
                           str(path), "--save-results", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(read_run_results(tmp_path / "out.json").runs[0][1]) == 2
