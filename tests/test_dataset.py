"""Drift over a dataset (issue 14): streamed samples, task metrics checked against independent decodes, per-sample
results identical on every executor (serial, local processes, Ray), worker deaths retried, bundles rerun."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench.dataset import compare_dataset, open_dataset, parse_metric
from workbench.dataset.evaluate import FAULT_ENV
from workbench.dataset.executors import ExecutorSpec
from workbench.errors import InputError

REPO = Path(__file__).resolve().parents[1]
PREP = f"{REPO / 'scripts' / 'ocr_dataset.py'}:rec_image"
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))


# --- tiny model and data --------------------------------------------------------------------------------------
def _softmax_model(path: Path) -> Path:
    """x (1, 4, 8) -> MatMul W (8, 6) -> Softmax: a 'classifier' over 6 classes at 4 positions."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [8, 6], rng.normal(size=(8, 6)).astype(np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Softmax", ["h"], ["y"], name="sm", axis=-1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _npz_folder(folder: Path, n: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.savez(folder / f"s{i:03d}.npz", x=rng.normal(size=(1, 4, 8)).astype(np.float32) * (1 + i))
    return folder


def SAMPLE_RESULT(tmp_path: Path) -> Path:  # noqa: N802 - reads like a constant at the call site
    """A single comparison's JSON (not a dataset one)."""
    from workbench.compare.api import compare

    model = _softmax_model(tmp_path / "single.onnx")
    return compare(model, "ort", "ref:fp16").save_json(tmp_path / "single.json")


# --- metrics against independent arithmetic ------------------------------------------------------------------
def test_builtin_metrics_match_independent_arithmetic():
    from ocr_truth import ctc_indices

    rng = np.random.default_rng(1)
    ref = rng.normal(size=(2, 40, 30)).astype(np.float32)
    cand = ref + rng.normal(scale=0.8, size=ref.shape).astype(np.float32)
    # CTC: the test suite's own greedy decoder (tests/ocr_truth.py) is the truth
    seqs_r, seqs_c = ctc_indices(ref), ctc_indices(cand)
    got = parse_metric("ctc")({"o": ref}, {"o": cand})
    assert got["ctc"] == np.mean([a == b for a, b in zip(seqs_r, seqs_c)])
    assert parse_metric("ctc")({"o": ref}, {"o": ref}) == {"ctc": 1.0, "ctc_cer": 0.0}
    # top1 / topk by brute force
    flat_r, flat_c = ref.reshape(-1, 30), cand.reshape(-1, 30)
    assert parse_metric("top1")({"o": ref}, {"o": cand})["top1"] == pytest.approx(
        np.mean([int(np.argmax(a) == np.argmax(b)) for a, b in zip(flat_r, flat_c)]))
    want = np.mean([len(set(np.argsort(-a)[:3]) & set(np.argsort(-b)[:3])) / 3 for a, b in zip(flat_r, flat_c)])
    assert parse_metric("topk:3")({"o": ref}, {"o": cand})["top3"] == pytest.approx(want)
    # mask IoU by set arithmetic
    a, b = ref > 0.5, cand > 0.5
    pa, pb = set(zip(*np.nonzero(a))), set(zip(*np.nonzero(b)))
    assert parse_metric("mask_iou:0.5")({"o": ref}, {"o": cand})["mask_iou"] == pytest.approx(
        len(pa & pb) / len(pa | pb))
    assert parse_metric("mask_iou")({"o": np.zeros(4)}, {"o": np.zeros(4)})["mask_iou"] == 1.0


@pytest.mark.parametrize("spec, fragment", [("bogus", "unknown metric"), ("topk:x", "parameter"),
                                            ("topk:0", "K must be"), ("nosuchmodule_zz:fn", "cannot import"),
                                            ("top1:3", "no parameter")])
def test_bad_metric_specs_say_what_to_write(spec, fragment):
    with pytest.raises(InputError, match=fragment):
        parse_metric(spec)


def test_custom_metric_from_a_file(tmp_path):
    f = tmp_path / "mymetric.py"
    f.write_text("import numpy as np\nlower_is_better = None\n"
                 "def gap(ref, cand):\n    return {'gap': float(np.abs(next(iter(ref.values())) - "
                 "next(iter(cand.values()))).max())}\ngap.lower_is_better = {'gap'}\n")
    m = parse_metric(f"{f}:gap")
    assert m({"y": np.ones(3)}, {"y": np.array([1.0, 1.5, 1.0])}) == {"gap": 0.5}
    assert m.lower_is_better == {"gap"} and not m.builtin


# --- sources ----------------------------------------------------------------------------------------------------
def test_sources_stream_and_hash(tmp_path):
    folder = _npz_folder(tmp_path / "d", 3)
    ds = open_dataset(folder, input_names=["x"])
    samples = list(ds)
    assert [s.source for s in samples] == ["s000.npz", "s001.npz", "s002.npz"] and len(ds) == 3
    import hashlib

    assert samples[1].sha256 == hashlib.sha256((folder / "s001.npz").read_bytes()).hexdigest()
    # a generator is read once; a second pass says so
    gen = open_dataset(({"x": np.full((1, 4, 8), i, np.float32)} for i in range(2)), input_names=["x"])
    assert len(list(gen)) == 2
    with pytest.raises(InputError, match="already read"):
        list(gen)
    # bare arrays and DataLoader-style (x, label) tuples are named after the model's inputs
    arr = open_dataset([np.zeros((1, 4, 8), np.float32)], input_names=["x"])
    assert list(next(iter(arr)).feed) == ["x"]
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(3, 4, 8), torch.arange(3)), batch_size=1)
    fed = list(open_dataset(loader, input_names=["x"]))
    assert len(fed) == 3 and fed[0].feed["x"].shape == (1, 4, 8)


def test_a_list_of_numbers_from_preprocess_says_how_it_was_read():
    """A preprocess returning [1, 2, 3] for a one-input model was reported as "input 'x' has shape [] (rank 0)":
    a sequence is one array per input. It now says so."""
    from workbench.dataset.source import _as_feed

    with pytest.raises(InputError, match=r"gave a list of 3 number\(s\): a sequence is read as one array per model "
                                         r"input") as e:
        _as_feed([1, 2, 3], ["x"], "sample 0 (a.png) through prep.py:f")
    assert "np.asarray" in str(e.value)
    assert _as_feed((np.zeros(2), 7), ["x"], "s")["x"].shape == (2,)  # a DataLoader's (x, label): x


def test_image_folder_without_preprocess_is_refused(tmp_path):
    from ocr_dataset import render

    render(tmp_path / "img", 2)
    with pytest.raises(InputError, match="--preprocess"):
        open_dataset(tmp_path / "img", input_names=["x"])


@pytest.mark.parametrize("executor, workers, fragment", [("serial", 2, "one worker"), ("spark", 1, "unknown executor"),
                                                         ("ray://", 1, "Ray address"), (None, 0, ">= 1")])
def test_executor_spec_errors(executor, workers, fragment):
    with pytest.raises(InputError, match=fragment):
        ExecutorSpec.parse(executor, workers)


# --- the tiny model end to end ---------------------------------------------------------------------------------
def test_tiny_dataset_per_sample_results(tmp_path):
    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 6)
    r = compare_dataset(model, "ort", "ref:fp16", data, metrics=["top1", "topk:2"])
    doc = r.to_json()
    assert [s["index"] for s in doc["samples"]] == list(range(6))
    assert {"samples", "worst", "task", "layers"} <= set(doc) and doc["kind"] == "dataset"
    # independent truth: argmax agreement recomputed from numpy runs of both sides
    from workbench.engines import get_engine

    m = onnx.load(model)
    from workbench.variants import make_variant

    fp16 = make_variant(m, "fp16").model
    ref_s = get_engine("ort").prepare(m, ["y"])
    cand_s = get_engine("ref", precision="native").prepare(fp16, ["y"])
    for s in doc["samples"]:
        x = np.load(data / s["source"])["x"]
        a, b = ref_s.run({"x": x})["y"], cand_s.run({"x": x})["y"]
        assert s["task"]["top1"] == pytest.approx(np.mean(a.argmax(-1) == b.argmax(-1)))
    assert len(doc["worst"]) == 5 and doc["task"]["top1"]["worst"] == min(s["task"]["top1"] for s in doc["samples"])
    assert [row["tensor"] for row in doc["layers"]] == ["h", "y"]


def test_missing_dataset_and_empty_folder(tmp_path):
    model = _softmax_model(tmp_path / "m.onnx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no .npz samples"):
        compare_dataset(model, "ort", "ref:fp16", tmp_path / "empty")
    with pytest.raises(InputError, match="no dataset"):
        compare_dataset(model, "ort", "ref:fp16", None)


def test_a_small_dataset_is_spread_over_every_worker():
    """4 samples on 2 workers went as one task of 4 to one worker; a known size now cuts the tasks to fill them."""
    from workbench.dataset.api import CHUNK, chunk_size

    assert chunk_size(4, 2) == 2 and chunk_size(3, 2) == 2 and chunk_size(1, 2) == 1
    assert chunk_size(100, 2) == CHUNK and chunk_size(None, 2) == CHUNK and chunk_size(4, 1) == CHUNK


def test_a_dying_worker_is_reported_and_its_chunk_retried(tmp_path, monkeypatch):
    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 10)
    serial = compare_dataset(model, "ort", "ref:fp16", data, metrics=["top1"]).to_json()
    monkeypatch.setenv(FAULT_ENV, str(tmp_path / "died-once"))
    r = compare_dataset(model, "ort", "ref:fp16", data, metrics=["top1"], workers=2)
    assert (tmp_path / "died-once").exists()
    assert any("worker died" in n and "retried once" in n for n in r.notes)
    assert r.to_json()["samples"] == serial["samples"]


def test_cli_dataset_bundle_reruns_and_sees_changed_data(tmp_path):
    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 5)
    out, bundle = tmp_path / "o.json", tmp_path / "b"
    wb = [sys.executable, "-m", "workbench"]
    p = subprocess.run([*wb, "compare", str(model), "--cand", "ref:fp16", "--inputs", str(data), "--metric", "top1",
                        "--json", str(out), "--bundle", str(bundle)], capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(out.read_text())
    assert len(doc["samples"]) == 5 and "top1" in doc["task"]
    p = subprocess.run([*wb, "rerun", str(bundle), "--json", str(tmp_path / "r.json")], capture_output=True, text=True)
    rr = json.loads((tmp_path / "r.json").read_text())
    assert rr["reproduced"] and rr["kind"] == "dataset", p.stdout + p.stderr
    np.savez(data / "s002.npz", x=np.ones((1, 4, 8), np.float32))  # the data changed since
    p = subprocess.run([*wb, "rerun", str(bundle)], capture_output=True, text=True)
    assert "NOT REPRODUCED" in p.stdout and "#2 s002.npz (content differs)" in p.stdout and p.returncode == 1
    # diff: the saved run against a new one on the changed data names exactly that sample
    out2 = tmp_path / "o2.json"
    subprocess.run([*wb, "compare", str(model), "--cand", "ref:fp16", "--inputs", str(data), "--metric", "top1",
                    "--json", str(out2)], capture_output=True, text=True)
    p = subprocess.run([*wb, "diff", str(bundle), str(out2), "--json", str(tmp_path / "d.json")], capture_output=True,
                       text=True)
    d = json.loads((tmp_path / "d.json").read_text())
    assert p.returncode == 0 and [c["index"] for c in d["changed_samples"]] == [2], p.stderr
    assert "different data" in d["changed_samples"][0]["what"]
    p = subprocess.run([*wb, "diff", str(out), str(SAMPLE_RESULT(tmp_path))], capture_output=True, text=True)
    assert p.returncode == 2 and "dataset" in p.stderr
    # the bad-input paths: one line, exit 2
    p = subprocess.run([*wb, "compare", str(model), "--metric", "top1"], capture_output=True, text=True)
    assert p.returncode == 2 and "need a dataset" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([*wb, "compare", str(model), "--inputs", str(data), "--metric", "nope"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "unknown metric" in p.stderr


def _ort_qdq(model: Path, data: Path, out: Path) -> Path:
    """A Q/DQ model made by ONNX Runtime's own quantize_static (not the workbench), calibrated on ``data``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": np.load(f)["x"]} for f in sorted(data.glob("*.npz"))])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ)
    return out


def test_a_task_target_reads_back_exactly_and_refuses_what_it_cannot_read():
    from workbench.dataset.task_target import TaskTarget

    for text in ("mean ctc>=0.5625001", "x<=123456789", "top1>=1", "mean>=0.95", "mAP@0.5>=0.2", "F1 score>=0.5",
                 "ctc_cer<=0.05", "a.b-c==0"):
        t = TaskTarget.parse(text)
        assert TaskTarget.parse(t.text()) == t == TaskTarget.from_json(t.to_json()), text
    assert TaskTarget.parse("mean ctc>=0.5625001").threshold == 0.5625001
    assert TaskTarget.parse("mean>=1") == TaskTarget(None, ">=", 1.0, "mean")
    assert TaskTarget.parse(" F1 score >= 0.5 ").name == "F1 score"
    judged = TaskTarget.parse("mean q>=0").judge([{"index": i, "task": {"q": v}}
                                                  for i, v in enumerate((math.inf, -math.inf, 1.0))])
    assert not judged["met"] and math.isnan(judged["value"])  # inf + -inf: a NaN mean, not a crash
    assert TaskTarget.parse("mean q>=0").judge([{"index": i, "task": {"q": 1e308}} for i in range(2)])["met"]
    assert TaskTarget.parse("mean ctc>=0.5625001").shown(0.5625001) == "0.5625001"
    near = TaskTarget.parse("mean ctc>=0.5625001")
    assert near.shown(0.5625) == "0.5625" and not near.holds(0.5625)  # the value is not printed as the threshold
    for text, said in (("top1>=0_95", "not a number"), ("ctc>=\u0661", "not a number"), ("top1>=1e-400", "reads as 0"),
                       ("top1!=1", "cannot read"), ("top1=>1", "cannot read"), ("top1>=nan", "not a number"),
                       ("top1>=1e309", "finite"), ("a\nb>=1", "control character")):
        with pytest.raises(InputError, match=said):
            TaskTarget.parse(text)
    for args, said in ((("top1", "!=", 1.0), "unknown comparison"), (("top1", ">=", float("nan")), "finite"),
                       (("top1", ">=", 1.0, "median"), "not every or mean"), (("", ">=", 1.0), "non-empty")):
        with pytest.raises(InputError, match=said):
            TaskTarget(*args)


def test_a_task_target_judges_the_run_by_the_task(tmp_path):
    """With --target the run fails exactly when the task does: here INT8 outputs pass the criterion while the
    argmax flips at some positions (the output verdict alone says ok and exits 0). The failing samples are the
    ones an independent onnxruntime run of both files names; a bundle reruns with the same target."""
    import dataclasses

    import onnxruntime as ort

    from workbench.dataset.task_target import TaskTarget

    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 6)
    qdq = _ort_qdq(model, data, tmp_path / "q.onnx")
    sides = [ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]) for f in (model, qdq)]
    truth = []
    for f in sorted(data.glob("*.npz")):
        a, b = (s.run(None, {"x": np.load(f)["x"]})[0] for s in sides)
        truth.append(float(np.mean(a.argmax(-1) == b.argmax(-1))))
    flipped = [i for i, t in enumerate(truth) if t < 1]
    assert flipped and len(flipped) < len(truth)  # the case this test is about: some answers change, not all
    r = compare_dataset(model, "ort", "ort", data, cand_model=qdq, metrics=["top1"], task_target="top1>=1",
                        layers=False)
    v = r.verdict()
    assert v["task_failing_samples"] == flipped and r.failed and v["headline"] == "FAILED"
    assert not r.diverged  # the outputs pass the criterion: only the task says this run fails
    assert f"{len(flipped)} of 6 sample(s) miss top1 >= 1" in r.render()
    mean = float(np.mean(truth))
    assert not dataclasses.replace(r, task_target=TaskTarget.parse(f"mean top1>={mean - 1e-9}")).failed
    assert dataclasses.replace(r, task_target=TaskTarget.parse(f"mean top1>={mean + 1e-6}")).failed
    # a threshold a rounded text would move across the mean: the bundle reruns to the same verdict
    from workbench.dataset.bundle import rerun_dataset, save_dataset_bundle
    from workbench.report.bundle import load_bundle

    close = compare_dataset(model, "ort", "ort", data, cand_model=qdq, metrics=["top1"], layers=False,
                            task_target=f"mean top1>={mean + 3e-8!r}")
    assert close.failed and f"{mean + 3e-8!r}" in close.verdict()["reason"]
    save_dataset_bundle(close, tmp_path / "close")
    again = rerun_dataset(load_bundle(tmp_path / "close"))
    assert again.reproduced and again.result.failed and not again.verdict_changed
    # a custom metric's result that only later samples report is judged (a sample without it fails), not refused
    calls = []

    def late(ref, cand):
        calls.append(1)
        return {"late": 1.0} if len(calls) > 1 else {}

    r_late = compare_dataset(model, "ort", "ort", data, cand_model=qdq, metrics=[late], task_target="late>=1",
                             layers=False)
    assert r_late.verdict()["task_failing_samples"] == [0]
    wrong = compare_dataset(model, "ort", "ort", data, cand_model=qdq, metrics=["ctc"], task_target="ctc_cer>=0.05",
                            layers=False)
    assert any("ctc_cer is lower-is-better" in n for n in wrong.notes)
    assert r.to_json()["task_target"]["text"] == "top1>=1"
    from workbench.plots.dataset import sample_metric

    fig = sample_metric(r)  # the points that miss the target say so, and the target is drawn
    assert [i for i, t in enumerate(fig.data[0].text) if "(task target missed)" in t] == flipped
    assert [shape.y0 for shape in fig.layout.shapes] == [1.0]

    # the other way round: a strict criterion fails FP16's outputs while every argmax holds
    strict = compare_dataset(model, "ort", "ref:fp16", data, metrics=["top1"], criterion="sqnr_db<200", layers=False)
    assert strict.diverged and all(s["task"]["top1"] == 1 for s in strict.samples)
    assert any("judged by the task the run passes: all 6 sample(s) keep top1 = 1" in n for n in strict.notes)
    both = compare_dataset(model, "ort", "ref:fp16", data, metrics=["mask_iou:0.1", "top1"], criterion="sqnr_db<200",
                           layers=False)  # the note reads top1's own result, not the first metric's
    assert any("keep top1 = 1" in n for n in both.notes) and not any("mask_iou = 1" in n for n in both.notes)

    wb = [sys.executable, "-m", "workbench"]
    args = [*wb, "compare", str(model), "--cand", "ort", "--cand-model", str(qdq), "--inputs", str(data),
            "--metric", "top1", "--no-layers"]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0 and "ok: every output" in p.stdout, p.stdout + p.stderr  # outputs pass...
    assert (f"judged by the task the run fails: {len(flipped)} of 6 sample(s) have top1 < 1" in p.stdout
            and "--target 'top1>=1' makes the task the verdict" in p.stdout)  # ...and a note says the task does not
    bundle = tmp_path / "b"
    report = tmp_path / "r.html"
    p = subprocess.run([*args, "--target", "top1>=1", "--bundle", str(bundle), "--report", str(report)],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "FAILED: task target" in p.stdout, p.stdout + p.stderr
    page = report.read_text()
    assert "top1 &gt;= 1 on every sample" in page and page.count("misses the task target") == 1
    p = subprocess.run([*args, "--target", "mean top1 >= 0.5", "--json", str(tmp_path / "mean.json")],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "ok: task target: the mean of top1" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([*wb, "diff", str(bundle), str(tmp_path / "mean.json")], capture_output=True, text=True)
    assert "task target top1>=1 -> mean top1>=0.5: FAILED -> ok" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([*wb, "rerun", str(bundle)], capture_output=True, text=True)
    assert p.returncode == 1 and "REPRODUCED" in p.stdout and "now: FAILED" in p.stdout, p.stdout + p.stderr
    for extra, said in ((["--target", "ctc>=1"], "which no task metric reports"),
                        (["--target", "top1>=x"], "is not a number"),
                        (["--target", "top1 about 1"], "cannot read task target")):
        p = subprocess.run([*args, *extra], capture_output=True, text=True)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = subprocess.run([*wb, "compare", str(model), "--inputs", str(data), "--target", "top1>=1"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "needs a task metric" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_rerun_and_diff_pair_samples_by_file_name_when_one_is_removed(tmp_path):
    """One file of five removed: rerun names it missing and finds the other four identical, diff lists it as only
    in the first run (both paired samples by position: every later sample was compared with its neighbour's record,
    and the removed file was never named)."""
    from workbench.cli import main

    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 5)
    bundle, before, after = tmp_path / "b", tmp_path / "before.json", tmp_path / "after.json"
    args = ["compare", str(model), "--cand", "ref:fp16", "--inputs", str(data), "--metric", "top1"]
    assert main([*args, "--json", str(before), "--bundle", str(bundle)]) in (0, 1)
    (data / "s001.npz").unlink()
    assert main([*args, "--json", str(after)]) in (0, 1)
    assert main(["rerun", str(bundle), "--json", str(tmp_path / "r.json")]) == 1
    rr = json.loads((tmp_path / "r.json").read_text())
    assert rr["data_changed"] == [{"index": 1, "source": "s001.npz", "why": "missing now"}], rr["data_changed"]
    assert rr["changed_samples"] == []
    assert main(["diff", str(before), str(after), "--json", str(tmp_path / "d.json")]) == 0
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["changed_samples"] == [] and d["only_before"] == [{"index": 1, "source": "s001.npz"}]
    assert d["only_after"] == []


def test_calib_n_draws_random_calibration_feeds_for_a_dataset_too(tmp_path, capsys):
    """--calib N means N seeded random feeds for a dataset comparison as for a single one (it was read as a file
    named "4"); --no-layers says the layers were not compared instead of "no layer diverged"."""
    from conftest import SAMPLES

    from workbench.cli import main

    code = main(["compare", str(SAMPLES / "int8_outlier.onnx"), "--cand", "ort:int8", "--calib", "4", "--inputs",
                 str(_outlier_folder(tmp_path / "o", 4)), "--no-layers", "--per-sample", "--json",
                 str(tmp_path / "r.json")])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert len(doc["samples"]) == 4 and not any("first 4 sample(s) of the dataset" in n for n in doc["notes"])
    assert "no layer diverged" not in out.out


def _outlier_folder(folder: Path, n: int) -> Path:
    """``n`` feeds for int8_outlier.onnx (its inputs and shapes read from the model)."""
    import onnx
    from conftest import SAMPLES

    folder.mkdir()
    model = onnx.load(SAMPLES / "int8_outlier.onnx")
    rng = np.random.default_rng(1)
    for i in range(n):
        feed = {vi.name: rng.standard_normal([d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]).astype(
            np.float32) for vi in model.graph.input}
        np.savez(folder / f"s{i:03d}.npz", **feed)
    return folder


def test_without_ray_one_line_says_how_to_install(tmp_path):
    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 2)
    code = ("import sys; sys.modules['ray'] = None\nfrom workbench.cli import main\n"
            f"sys.exit(main(['compare', {str(model)!r}, '--cand', 'ref:fp16', '--inputs', {str(data)!r}, "
            "'--executor', 'ray']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 2 and "Ray is not installed" in p.stderr and "[ray]" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --- the real recognizer ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rec_images(tmp_path_factory):
    from ocr_dataset import render

    folder = tmp_path_factory.mktemp("rec64")
    render(folder, 64)
    return folder


@pytest.fixture(scope="module")
def rec_images_32(tmp_path_factory):
    """Half the crops: enough for 16 per worker; the executors' identity does not need 64 (three INT8 runs)."""
    from ocr_dataset import render

    folder = tmp_path_factory.mktemp("rec32")
    render(folder, 32)
    return folder


@pytest.mark.slow
def test_rec_int8_identical_on_serial_processes_and_ray(fetch_model, rec_images_32):
    import ray

    rec_images = rec_images_32

    model = fetch_model("ppocr-rec")
    kw = {"preprocess": PREP, "metrics": ["ctc"], "layers": False}
    serial = compare_dataset(model, "ort", "ort:int8", rec_images, **kw).to_json()
    procs = compare_dataset(model, "ort", "ort:int8", rec_images, workers=2, **kw).to_json()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = compare_dataset(model, "ort", "ort:int8", rec_images, executor="ray", workers=2, **kw).to_json()
    finally:
        ray.shutdown()
    assert len(serial["samples"]) == 32 and procs["executor"]["kind"] == "processes"
    assert on_ray["executor"]["kind"] == "ray"
    for other in (procs, on_ray):
        assert other["samples"] == serial["samples"] and other["worst"] == serial["worst"]
        assert other["task"] == serial["task"]
    # INT8 (ORT quantize_static, calibrated on 16 of the images) changes the decoded text of real crops
    assert serial["task"]["ctc"]["mean"] < 0.5 and serial["diverged"]


@pytest.mark.slow
def test_rec_fp16_task_metric_is_the_independent_decode(fetch_model, rec_images, tmp_path):
    """FP32 vs an FP16 file made by onnxconverter-common (outside the workbench): every sample's CTC agreement is the
    one tests/ocr_truth.py's decoder gives on plain onnxruntime runs of both files."""
    from ocr_dataset import rec_image
    from ocr_truth import ctc_indices, make_fp16, run_model

    model = fetch_model("ppocr-rec")
    fp16 = make_fp16(model, "occ", tmp_path / "rec16.onnx")
    r = compare_dataset(model, "ort", "ort", rec_images, preprocess=PREP, metrics=["ctc"], cand_model=fp16,
                        task_target="ctc>=1")
    doc = r.to_json()
    paths = sorted(rec_images.glob("*.png"))
    feeds = [{"x": rec_image(str(p))} for p in paths]
    ref = run_model(model, feeds)
    cand = run_model(fp16, feeds)
    want = [float(ctc_indices(a[0]) == ctc_indices(b[0])) for a, b in zip(ref, cand)]
    assert [s["task"]["ctc"] for s in doc["samples"]] == want
    assert 0 < want.count(0.0) < len(want)  # both kinds of crop are judged (one in 64 reads otherwise in FP16)
    # judged by the task, the run fails on exactly the crops whose text changed, whatever the outputs' criterion says
    assert doc["verdict"]["task_failing_samples"] == [i for i, w in enumerate(want) if w < 1]
    assert r.failed == (min(want) < 1)
    assert [s["source"] for s in doc["samples"]] == [p.name for p in paths]
    # per-layer statistics across the 64 samples, and each worst sample names where it first diverged
    assert len(doc["layers"]) > 100 and all(row["worst"] is not None for row in doc["layers"])
    names = {row["tensor"] for row in doc["layers"]}
    assert all(s["first_divergent"] is None or s["first_divergent"]["tensor"] in names for s in doc["worst"])
    sqnr = [row["mean"] for row in doc["layers"] if isinstance(row["mean"], float)]
    assert min(sqnr) < 60  # FP16 storage and arithmetic leave a measurable, finite error inside the network


@pytest.mark.slow
def test_rec_layer_statistics_identical_with_workers(fetch_model, rec_images, tmp_path):
    import shutil

    model = fetch_model("ppocr-rec")
    few = tmp_path / "few"
    few.mkdir()
    for p in sorted(rec_images.glob("*.png"))[:12]:
        shutil.copy(p, few / p.name)
    serial = compare_dataset(model, "ort", "ort:fp16", few, preprocess=PREP, metrics=["ctc"]).to_json()
    procs = compare_dataset(model, "ort", "ort:fp16", few, preprocess=PREP, metrics=["ctc"], workers=2).to_json()
    assert procs["layers"] == serial["layers"] and procs["samples"] == serial["samples"]


@pytest.mark.slow
def test_readme_dataset_workflow_runs_as_written(tmp_path, model_cache, fetch_model):
    """The README's three dataset commands, verbatim (their /tmp outputs moved into this test's folder, and the
    README's .cache/models/ into the model cache, which $WORKBENCH_CACHE may put elsewhere)."""
    fetch_model("ppocr-rec")
    import re
    import shlex

    readme = (REPO / "README.md").read_text()
    block = re.search(r"### Drift over a dataset.*?```bash\n(.*?)```", readme, re.S).group(1)
    commands = [c.split("  #")[0].strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert len(commands) == 3
    for command in commands:
        argv = [a.replace("/tmp/", f"{tmp_path}/").replace(".cache/models/", f"{model_cache}/")
                for a in shlex.split(command)]
        argv[0] = sys.executable if argv[0] == "python" else str(Path(sys.executable).with_name(argv[0]))
        p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 1), f"{command}\n{p.stderr[-2000:]}"
    doc = json.loads((tmp_path / "drift.json").read_text())
    assert len(doc["samples"]) == 64 and doc["executor"]["workers"] == 2 and "ctc" in doc["task"]
    assert (tmp_path / "drift.html").stat().st_size > 10_000


def test_cancel_stops_the_workers(tmp_path):
    import threading

    import psutil

    from workbench.errors import Cancelled

    model = _softmax_model(tmp_path / "m.onnx")
    data = _npz_folder(tmp_path / "d", 40)
    cancel = threading.Event()
    seen = []

    def progress(fraction, message):
        seen.append(message)
        if "samples" in message:
            cancel.set()  # after the first chunk came back

    # children other tests' session fixtures left running (a JupyterLab server) are not this run's workers
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(Cancelled):
        compare_dataset(model, "ort", "ref:fp16", data, workers=2, progress=progress, cancel=cancel)
    assert any("samples" in m for m in seen) and not any(m.startswith("40/40") for m in seen)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's own, for the whole session
    assert left == [], [(p.pid, p.cmdline()) for p in left]


def test_a_worker_reads_a_model_file_as_the_loader_does(tmp_path, monkeypatch):
    """Workers read their model file with onnx's own external-data loader: weights past the inline limit were read
    whole into every worker (a 1.3 GB decoder's worker: 5.1 GB), and a location outside the model's folder was
    followed. They now stay in their files, mapped, and a location outside the folder is refused."""
    from onnx import numpy_helper

    from workbench.dataset.evaluate import ModelRef
    from workbench.errors import WorkbenchError
    from workbench.model.mapped import is_mapped, tensor_array

    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)

    inline = ModelRef(path=str(path)).load().graph.initializer[0]
    assert not is_mapped(inline) and np.array_equal(numpy_helper.to_array(inline), w)
    monkeypatch.setenv("WORKBENCH_INLINE_WEIGHTS_BYTES", "1K")
    mapped = ModelRef(path=str(path)).load().graph.initializer[0]
    assert is_mapped(mapped) and np.array_equal(np.asarray(tensor_array(mapped)), w)

    outside = tmp_path / "inner"
    outside.mkdir()
    escaping = onnx.load(str(path), load_external_data=False)
    entry = next(e for e in escaping.graph.initializer[0].external_data if e.key == "location")
    entry.value = "../m.data"
    onnx.save(escaping, outside / "m.onnx")
    with pytest.raises(WorkbenchError, match="climbs out of the model folder"):
        ModelRef(path=str(outside / "m.onnx")).load()
