"""calibrate() end to end on real models: the planted INT8 outlier, QDQ models, the sweep, representativeness,
JSON, chunking under a memory budget, and the `workbench calibrate` CLI."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import onnx
import pytest
from conftest import SAMPLES
from onnx import numpy_helper

from workbench.calibrate import calibrate
from workbench.calibrate.collect import activation_tensors, collect
from workbench.calibrate.methods import METHODS
from workbench.calibrate.qdq import insert_qdq
from workbench.calibrate.report import CalibrationReport
from workbench.cli import main
from workbench.compare.strategies import Cancelled
from workbench.errors import InputError, WorkbenchError
from workbench.model.load import load_model

MODEL = SAMPLES / "int8_outlier.onnx"
OUTLIER = "/mlp/fc2/Add_output_0"


def recipe(count: int = 32, seed: int = 0, transform=lambda x: x) -> list[dict[str, np.ndarray]]:
    """The manifest's calibration recipe: rng = default_rng(seed); count x rng.standard_normal((1, 64))."""
    rng = np.random.default_rng(seed)
    return [{"x": transform(rng.standard_normal((1, 64))).astype(np.float32)} for _ in range(count)]


@pytest.fixture(scope="module")
def report() -> CalibrationReport:
    return calibrate(MODEL, recipe(), percentile=99.9, eval_data=recipe(16, seed=1), sweep=True)


def test_outlier_tensor_is_worst_under_max_and_percentile_repairs_its_bulk(report):
    worst = report.worst("max")
    assert worst[0].tensor == OUTLIER
    by = report.errors[OUTLIER]
    # max: scale ~3.1, ordinary values crushed to a few levels; the outliers' energy hides it in the total SQNR
    assert report.ranges["max"][OUTLIER] > 390 and by["max"].bulk_sqnr_db < 3 < 15 < by["max"].sqnr_db
    # 99.9-percentile: the 0.05% outliers are clipped, the bulk is repaired
    assert report.ranges["percentile"][OUTLIER] < 6 and by["percentile"].bulk_sqnr_db > 35
    assert 0.0004 < by["percentile"].clipped_fraction < 0.002
    # TensorRT's entropy cannot clip into the empty bins below the outlier column: no repair
    assert report.ranges["entropy"][OUTLIER] > 300 and by["entropy"].bulk_sqnr_db < 6
    # every other tensor is healthy under max
    assert all(e.worst_sqnr_db > 19 for e in worst[2:])


def test_default_percentile_does_not_reach_the_outliers():
    """99.99% is above the 99.95% of ordinary values: the default percentile keeps the outliers."""
    r = calibrate(MODEL, recipe(), methods=("max", "percentile"))
    assert r.config["percentile"] is None and r.method == "max"  # None: the rule's own default, 99.99
    assert r.ranges["percentile"][OUTLIER] > 300 and r.errors[OUTLIER]["percentile"].bulk_sqnr_db < 5


def _numpy_forward(model: onnx.ModelProto, x: np.ndarray, quantize=None) -> np.ndarray:
    """The MLP in numpy (independent of ONNX Runtime); ``quantize`` = (tensor, amax) fake-quantizes that tensor
    as ONNX QuantizeLinear does (round half to even, clip to [-128, 127])."""
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {"x": x}
    for node in model.graph.node:
        a, b = (values[i] if i in values else w[i] for i in [*node.input, node.input[0]][:2])
        if node.op_type == "MatMul":
            out = a @ b
        elif node.op_type == "Add":
            out = a + b
        else:
            out = np.maximum(a, 0)
        if quantize and node.output[0] == quantize[0]:
            scale = np.float32(quantize[1] / 127)
            out = np.clip(np.rint(out / scale), -128, 127).astype(np.float32) * scale
        values[node.output[0]] = out
    return values[model.graph.output[0].name]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return 10 * math.log10(float(np.sum(ref.astype(np.float64) ** 2) / np.sum((got - ref).astype(np.float64) ** 2)))


def test_sweep_matches_an_independent_numpy_forward(report):
    proto = onnx.load(MODEL)
    sweep = report.sweep
    assert sweep.method == "entropy" and sweep.feeds == 4 and len(sweep.entries) == len(report.tensors)
    entry = next(e for e in sweep.entries if e.tensor == OUTLIER)
    feeds = report.sample_feeds
    ref = np.concatenate([_numpy_forward(proto, f["x"]) for f in feeds])
    got = np.concatenate([_numpy_forward(proto, f["x"], (OUTLIER, report.ranges["entropy"][OUTLIER])) for f in feeds])
    assert entry.only_sqnr_db == pytest.approx(_sqnr(ref, got), abs=0.05)
    assert sweep.entries[0].tensor in (OUTLIER, "/mlp/relu2/Relu_output_0") and entry.only_sqnr_db < 6
    assert all(e.only_sqnr_db > 20 for e in sweep.entries[2:])


def test_insert_qdq_places_an_exact_int8_pair():
    proto = onnx.load(MODEL)
    x = recipe(1)[0]
    amax = {"x": 3.0, OUTLIER: 100.0}
    marked = insert_qdq(proto, amax)
    onnx.checker.check_model(marked)
    from workbench.engines import get_engine

    with get_engine("ort").prepare(marked, [OUTLIER, "x__wb_dq"]) as session:
        out = session.run(x)
    with get_engine("ort").prepare(proto, [OUTLIER]) as session:
        plain = session.run({"x": np.clip(np.rint(x["x"] / np.float32(3 / 127)), -128, 127).astype(np.float32)
                             * np.float32(3 / 127)})[OUTLIER]
    scale = np.float32(100 / 127)
    np.testing.assert_allclose(out[OUTLIER], np.clip(np.rint(plain / scale), -128, 127) * scale, rtol=0, atol=1e-5)
    assert len(marked.graph.node) == len(proto.graph.node) + 4 and len(proto.graph.node) == 8  # caller's unchanged


def test_qdq_model_runs_on_ort_and_is_compared_with_fp32(report, tmp_path):
    path = report.save_qdq(tmp_path / "m.int8.onnx", "percentile")
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    from workbench.engines import get_engine

    feeds = report.sample_feeds
    with get_engine("ort").prepare(model, ["logits"]) as q, get_engine("ort").prepare(onnx.load(MODEL),
                                                                                   ["logits"]) as f:
        got = np.concatenate([q.run(x)["logits"] for x in feeds])
        ref = np.concatenate([f.run(x)["logits"] for x in feeds])
    check = report.check_qdq("percentile")
    assert check["sqnr_db"] == pytest.approx(_sqnr(ref, got), abs=1e-3)
    assert check["outputs"]["logits"]["cosine"] > 0.95
    # at the model's outputs, percentile's clipping of the outlier column costs far less than max's crushed bulk
    assert check["sqnr_db"] > report.check_qdq("max")["sqnr_db"] + 10
    assert set(report.to_json()["qdq"]) == {"percentile", "max"}


def test_representativeness_flags_shifted_data_only():
    calib = recipe()
    same = calibrate(MODEL, calib, eval_data=recipe(32, seed=1)).representativeness
    assert same and not any(r.flagged for r in same)
    for transform in (lambda x: 3 * x, lambda x: x + 2):
        rows = calibrate(MODEL, calib, eval_data=recipe(32, seed=1, transform=transform)).representativeness
        flagged = [r for r in rows if r.flagged]
        assert len(flagged) >= 4 and rows[0].flagged
        assert "x" in {r.tensor for r in flagged}
    scaled = {r.tensor: r for r in calibrate(MODEL, calib, eval_data=recipe(32, 1, lambda x: 3 * x),
                                             method="max").representativeness}
    assert scaled["x"].beyond_fraction > 0.15 and scaled["x"].max_ratio > 2


def test_report_json_round_trip_and_frames(report, tmp_path):
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["schema"] == "workbench.calibrate/1" and doc["model"]["sha256"] == load_model(MODEL).fingerprint
    back = CalibrationReport.from_json(doc)
    assert back.to_json() == doc
    saved = CalibrationReport.load_json(report.save_json(tmp_path / "r.json"))
    assert saved.to_json() == report.to_json()
    assert list(report.ranges_frame()["tensor"]) == report.tensors
    errors = report.errors_frame()
    assert len(errors) == len(report.tensors) * len(METHODS) and set(errors["method"]) == set(METHODS)
    assert report.sensitivity_frame()["rank"].tolist() == list(range(1, len(report.tensors) + 1))
    assert report.representativeness_frame()["flagged"].dtype == bool
    assert len(report.sweep_frame()) == len(report.tensors)
    with pytest.raises(WorkbenchError, match="no model"):
        back.to_qdq()
    with pytest.raises(WorkbenchError, match="not a calibration report"):
        CalibrationReport.from_json({"schema": "workbench.compare/1"})


def test_chunks_under_a_small_budget_give_identical_histograms():
    loaded = load_model(SAMPLES / "healthy_cnn.onnx")
    from workbench.inputs import random_feeds

    feeds = random_feeds(loaded.proto, seed=0, count=3)
    tensors = activation_tensors(loaded)
    one = collect(loaded, feeds, tensors, budget=1 << 30)
    many = collect(loaded, feeds, tensors, budget=8 << 10)
    assert one.chunks == 1 and many.chunks > 3
    for t in tensors:
        np.testing.assert_array_equal(one.histograms[t].abs_counts, many.histograms[t].abs_counts)
        np.testing.assert_array_equal(one.histograms[t].signed_counts, many.histograms[t].signed_counts)


def test_activation_tensors_skip_constants_weights_and_integers():
    loaded = load_model(SAMPLES / "transformer_block.onnx")
    tensors = activation_tensors(loaded)
    graph = loaded.graph
    constant = {o for n in graph.nodes if n.op_type == "Constant" for o in n.outputs}
    assert tensors[0] in graph.inputs and not constant & set(tensors)
    assert all(graph.tensors[t].dtype in (None, "float32", "float16") for t in tensors)
    r = calibrate(loaded, SAMPLES / "transformer_block_inputs.npz", methods=("max", "entropy"))
    mask = r.histograms["/block/attn/mask/Add_output_0"]
    assert mask.nonfinite > 0 and np.isfinite(r.ranges["max"]["/block/attn/mask/Add_output_0"])
    assert any("NaN/inf" in n for n in r.notes)


def test_memory_does_not_grow_with_the_number_of_feeds():
    import tracemalloc

    loaded = load_model(SAMPLES / "healthy_cnn.onnx")
    from workbench.inputs import random_feeds

    tensors = activation_tensors(loaded)
    peaks = []
    for count in (4, 48):
        feeds = random_feeds(loaded.proto, seed=0, count=count)
        tracemalloc.start()
        collect(loaded, feeds, tensors)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    feed_bytes = sum(v.nbytes for v in feeds[0].values())
    assert peaks[1] < peaks[0] * 1.2 + 48 * feed_bytes, peaks


def test_progress_and_cancel():
    seen = []
    calibrate(MODEL, 4, progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and seen == sorted(seen)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        calibrate(MODEL, 4, cancel=cancel)


def test_bad_inputs_raise_one_clear_error(tmp_path):
    np.savez(tmp_path / "wrong.npz", y=np.zeros((1, 64), np.float32))
    with pytest.raises(InputError, match="unknown input"):
        calibrate(MODEL, tmp_path / "wrong.npz")
    for kwargs in ({"methods": ("minmax",)}, {"num_bins": 1000}, {"percentile": 0}, {"method": "kl"}):
        with pytest.raises(WorkbenchError):
            calibrate(MODEL, 2, **kwargs)
    with pytest.raises(WorkbenchError):
        calibrate(MODEL, 0)


def test_cli_calibrate_writes_outputs_and_a_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    np.savez(tmp_path / "calib.npz", x=recipe(1)[0]["x"])
    code = main(["calibrate", str(MODEL), "--data", "32", "--eval-data", str(tmp_path / "calib.npz"),
                 "--method", "percentile", "--percentile", "99.9", "--cache", str(out / "m.cache"),
                 "--qdq", str(out / "m.int8.onnx"), "--json", str(out / "r.json"), "--ort-table", str(out / "ort")])
    text = capsys.readouterr().out
    assert code == 0
    assert f"1. {OUTLIER}" in text and "Representativeness" in text and "QDQ model (percentile" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.npz", "out"]
    doc = json.loads((out / "r.json").read_text())
    assert doc["method"] == "percentile" and doc["qdq"]["percentile"]["feeds"] == 1
    assert (out / "m.cache").read_text().startswith("TRT-100300-EntropyCalibration2\nx: ")
    onnx.checker.check_model(onnx.load(out / "m.int8.onnx"))
    assert (out / "ort" / "calibration.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--data", "{tmp}/wrong.npz"], "unknown input(s) 'y'"),
    (["--data", "4", "--num-bins", "1000"], "power of two"),
    (["--data", "4", "--method", "kl"], "invalid choice"),
    (["--data", "{tmp}/missing.npz"], "not found"),
    (["--data", "4", "--import-cache", "{tmp}/wrong.npz"], "neither a TensorRT"),
    (["--data", "4", "--cache", "/proc/no/such/dir/m.cache"], "cannot write"),
])
def test_cli_bad_input_gives_one_line_and_exit_2(tmp_path, capsys, args, message):
    np.savez(tmp_path / "wrong.npz", y=np.zeros((1, 64), np.float32))
    code = main(["calibrate", str(MODEL), *[a.format(tmp=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_ppocr_rec_end_to_end(fetch_model, tmp_path):
    path = fetch_model("ppocr-rec")
    r = calibrate(path, 3, input_shapes=["x:[1,3,48,320]"], memory_budget="48M", eval_data=2)
    assert r.config["chunks"] > 1 and len(r.tensors) > 350 and not r.skipped
    assert all(r.histograms[t].count > 0 for t in r.tensors)
    cache = r.write_trt_cache(tmp_path / "rec.cache", "entropy")
    again = tmp_path / "again.cache"
    from workbench.calibrate.formats import read_trt_cache, write_trt_cache

    write_trt_cache(again, read_trt_cache(cache))
    assert again.read_bytes() == cache.read_bytes()
    doc = json.loads(json.dumps(r.to_json(), allow_nan=False))
    assert CalibrationReport.from_json(doc).to_json() == doc
    assert len(r.representativeness) == len(r.tensors)
