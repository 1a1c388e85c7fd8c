"""Datasets for calibrate and repair (issue 14): calibration streams a folder of images through a real PP-OCR
recognizer with the ranges a list of the same feeds gives, holds a bounded number of feeds whatever the number of
samples, and bundles the exact feeds; repair reads datasets within the memory budget and evaluates its candidate
builds on worker processes with the serial result."""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench.calibrate import calibrate
from workbench.cli import main
from workbench.dataset.evaluate import FAULT_ENV
from workbench.errors import InputError, WorkbenchError
from workbench.repair import repair

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_models"
REC_PREP = f"{REPO / 'scripts' / 'ocr_dataset.py'}:rec_image"
sys.path.insert(0, str(REPO / "scripts"))


# --- tiny model and data -------------------------------------------------------------------------------------
def _scale_relu(path: Path, shape=(1, 1, 16, 16)) -> Path:
    """x -> Mul(2) -> Relu -> Sub(1) -> y: three float activations besides the input."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["m"], name="mul"),
                           helper.make_node("Relu", ["m"], ["r"], name="relu"),
                           helper.make_node("Sub", ["r", "one"], ["y"], name="sub")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], [two, one])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _images(folder: Path, count: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return folder


PREP_CODE = '''
import numpy as np
from PIL import Image


def load(path):
    with Image.open(path) as im:
        return (np.asarray(im, dtype=np.float32)[None, None] / 127.5 - 1.0)


def wrong(path):
    return np.zeros((1, 3, 16, 16), np.float32)
'''


def _prep(tmp_path: Path) -> Path:
    f = tmp_path / "prep.py"
    f.write_text(PREP_CODE)
    return f


def _load(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im, dtype=np.float32)[None, None] / 127.5 - 1.0


def _outlier_feeds(n: int = 8) -> list[dict]:
    return [{"x": np.random.default_rng(s).standard_normal((1, 64)).astype(np.float32)} for s in range(n)]


def _same_histograms(a, b) -> None:
    assert a.tensors == b.tensors
    for t in a.tensors:
        np.testing.assert_array_equal(a.histograms[t].abs_counts, b.histograms[t].abs_counts)
        np.testing.assert_array_equal(a.histograms[t].signed_counts, b.histograms[t].signed_counts)


# --- calibrate -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_rec_image_folder_calibrates_like_the_same_feeds_as_a_list(fetch_model, tmp_path):
    """16 rendered text lines through the PP-OCR recognizer: the folder streamed with --preprocess gives exactly the
    ranges and histograms of the preprocessed feeds handed over as a list."""
    from ocr_dataset import rec_image, render

    model = fetch_model("ppocr-rec")
    paths = render(tmp_path / "rec", 16)
    streamed = calibrate(model, tmp_path / "rec", preprocess=REC_PREP, methods=("max",), method="max")
    feeds = [{"x": rec_image(str(p))} for p in paths]
    listed = calibrate(model, feeds, methods=("max",), method="max")
    assert len(streamed.tensors) > 100
    assert streamed.ranges == listed.ranges
    _same_histograms(streamed, listed)
    data = streamed.config["data"]
    assert data["kind"] == "images" and data["count"] == 16 and data["preprocess"] == REC_PREP
    assert streamed.config["feeds"] == listed.config["feeds"] == 16
    assert len(streamed.sample_feeds) == 4
    np.testing.assert_array_equal(streamed.sample_feeds[3]["x"], feeds[3]["x"])


class _Counted:
    """A sized, re-iterable source of feeds (not a list) that counts how many of its arrays are alive at once."""

    def __init__(self, count: int, shape=(1, 1, 16, 16)):
        self.count, self.shape = count, shape
        self.refs: list[weakref.ref] = []
        self.most_alive = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for i in range(self.count):
            x = np.random.default_rng(i).standard_normal(self.shape).astype(np.float32)
            self.refs = [r for r in self.refs if r() is not None] + [weakref.ref(x)]
            self.most_alive = max(self.most_alive, len(self.refs))
            yield {"x": x}


def test_calibration_holds_a_bounded_number_of_feeds_whatever_the_samples(tmp_path):
    model = _scale_relu(tmp_path / "m.onnx")
    counts = {}
    for n in (8, 64):
        source = _Counted(n)
        report = calibrate(model, source, methods=("max", "ort-entropy"), method="max")
        assert report.config["feeds"] == n
        counts[n] = source.most_alive
    # every pass reads one sample at a time; the report keeps 4 for its QDQ check: not 64 (a list would)
    assert counts[64] == counts[8] <= 6, counts
    listed = calibrate(model, [{"x": np.random.default_rng(i).standard_normal((1, 1, 16, 16)).astype(np.float32)}
                               for i in range(64)], methods=("max", "ort-entropy"), method="max")
    assert report.ranges == listed.ranges
    _same_histograms(report, listed)


def test_calibration_peak_memory_does_not_grow_with_a_folder(tmp_path):
    import tracemalloc

    model = _scale_relu(tmp_path / "m.onnx", (1, 64, 64, 16))  # 256 KiB feeds
    feed_bytes = 64 * 64 * 16 * 4
    peaks = {}
    for n in (8, 64):
        folder = tmp_path / f"npz{n}"
        folder.mkdir()
        for i in range(n):
            np.savez(folder / f"{i:04d}.npz", x=np.random.default_rng(i).standard_normal((1, 64, 64, 16))
                     .astype(np.float32))
        tracemalloc.start()
        calibrate(model, folder, methods=("max",), method="max")
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # 56 more samples held would add 14 MiB; streamed, the peak stays within the reader's queue (8 feeds, full when
    # the consumer is slowed by a busy machine, while 8 files may never fill it) and the few feeds in hand: 3 MiB
    assert peaks[64] < peaks[8] + 12 * feed_bytes, peaks


def test_a_generator_is_read_once_and_calibrates_like_a_list(tmp_path):
    model = _scale_relu(tmp_path / "m.onnx")
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, 1, 16, 16)).astype(np.float32)} for i in range(12)]
    reads = []

    def gen():
        for i, f in enumerate(feeds):
            reads.append(i)
            yield f

    streamed = calibrate(model, gen(), methods=("max", "ort-percentile"), method="max")
    listed = calibrate(model, feeds, methods=("max", "ort-percentile"), method="max")
    assert reads == list(range(12))  # once, though collection reads the data twice (ORT's second pass)
    assert streamed.ranges == listed.ranges and streamed.config["data"]["spilled"] == 12


def test_cli_calibrates_an_image_folder_and_its_bundle_reruns_without_preprocess(tmp_path, capsys):
    model = _scale_relu(tmp_path / "m.onnx")
    images = _images(tmp_path / "imgs", 16)
    prep = _prep(tmp_path)
    out, bundle = tmp_path / "r.json", tmp_path / "bundle"
    code = main(["calibrate", str(model), "--data", str(images), "--preprocess", f"{prep}:load", "--methods", "max",
                 "entropy", "--json", str(out), "--bundle", str(bundle)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["config"]["data"]["count"] == 16 and doc["config"]["data"]["preprocess"] == f"{prep}:load"
    listed = calibrate(model, [{"x": _load(p)} for p in sorted(images.glob("*.png"))], methods=("max", "entropy"))
    assert doc["ranges"] == json.loads(json.dumps(listed.to_json()))["ranges"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["feeds"]["count"] == 16 and len(manifest["feeds"]["files"]) == 16
    assert manifest["feeds"]["source"]["kind"] == "images"
    saved = np.load(bundle / manifest["feeds"]["files"][5])
    np.testing.assert_array_equal(saved["x"], _load(sorted(images.glob("*.png"))[5]))
    (prep).unlink()  # the bundle holds the feeds: its rerun runs no preprocessing
    capsys.readouterr()
    assert main(["rerun", str(bundle)]) == 0, capsys.readouterr().err


def test_a_dataset_changed_before_its_bundle_is_saved_is_refused(tmp_path):
    from workbench.calibrate.bundle import save_calibration_bundle

    model = _scale_relu(tmp_path / "m.onnx")
    images = _images(tmp_path / "imgs", 6)
    report = calibrate(model, images, preprocess=f"{_prep(tmp_path)}:load", methods=("max",), method="max")
    first = sorted(images.glob("*.png"))[2]
    _images(tmp_path / "other", 3)
    (tmp_path / "other" / "001.png").replace(first)
    with pytest.raises(InputError, match="changed while it was read"):
        save_calibration_bundle(report, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("data, preprocess, fragment", [
    ("imgs", None, "holds images but no preprocessing function"),
    ("imgs", "prep.py:wrong", r"sample 0 \(000.png\): feeds do not fit the model"),
    ("imgs", "prep.py:nothing", "has no function 'nothing'"),
    (4, "prep.py:load", "preprocess applies to a dataset"),
    ("empty", None, "holds no .npz"),
])
def test_calibrate_bad_datasets_say_what_to_do(tmp_path, data, preprocess, fragment):
    model = _scale_relu(tmp_path / "m.onnx")
    _images(tmp_path / "imgs", 3)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    _prep(tmp_path)
    if isinstance(data, str):
        data = tmp_path / data
    with pytest.raises(WorkbenchError, match=fragment):
        calibrate(model, data, preprocess=f"{tmp_path / preprocess}" if preprocess else None, methods=("max",),
                  method="max")


# --- repair ----------------------------------------------------------------------------------------------------
def _comparable(result) -> dict:
    """The repair JSON (of a result, or read back) without timings and where it ran."""
    doc = json.loads(json.dumps(result if isinstance(result, dict) else result.to_json()))
    for key in ("timing", "executor", "model"):
        doc.pop(key)
    for e in doc["evaluations"]:
        e.pop("seconds")
    for side in doc["verification"].values():
        side.pop("seconds", None)
    return doc


def test_repair_on_two_workers_is_the_serial_repair(tmp_path, monkeypatch):
    """Q/DQ removal (a build per set) and FP16 islands on the switchable model (ref:fp16: numpy FP16 arithmetic):
    the same sets judged in the same order, the same numbers, the same repaired model. One worker dies once on the
    way: its sets run again and the note says so."""
    feeds = _outlier_feeds()
    model = str(SAMPLES / "int8_outlier.onnx")
    # ONNX Runtime's placement (keep_placement): more sets to hand out than in TensorRT's, which needs 4
    serial = repair(model, "ort", "ort:int8", feeds=feeds, verify=None, keep_placement=True)
    parallel = repair(model, "ort", "ort:int8", feeds=feeds, verify=None, workers=2, keep_placement=True)
    assert parallel.executor == {"kind": "processes", "workers": 2, "address": None}
    assert _comparable(parallel) == _comparable(serial)
    assert sorted(serial.kept) == ["/mlp/fc2/Add", "/mlp/fc3/MatMul"] and len(serial.evaluations) >= 6
    assert parallel.model.SerializeToString() == serial.model.SerializeToString()

    monkeypatch.setenv(FAULT_ENV, str(tmp_path / "died-once"))
    overflow = str(SAMPLES / "cnn_fp16_overflow.onnx")
    serial = repair(overflow, "ref", "ref:fp16", verify=None, rewrites=False)  # islands (else one fold-scale)
    parallel = repair(overflow, "ref", "ref:fp16", verify=None, workers=2, rewrites=False)
    assert (tmp_path / "died-once").exists() and any("worker died" in n for n in parallel.notes)
    assert serial.kept == ["/stage2/conv/Conv", "/stage2/scale/Mul"]
    assert {e["how"] for e in _comparable(serial)["evaluations"]} >= {"switch"}
    noted = _comparable(parallel)
    noted["notes"] = [n for n in noted["notes"] if "worker died" not in n]
    assert noted == _comparable(serial)


def test_a_worker_builds_from_the_builders_own_reference(tmp_path):
    """The search's FP32 source may be a rewrite of the plan's FP32 model (depthwise inputs equalized, BatchNorms
    folded): a worker process builds a kept set from that same model, so its build is byte for byte the caller's
    (it built from the plan's model, un-equalized weights beside equalized inputs, and judged every set wrong)."""
    from workbench.compare.plan import ComparisonPlan
    from workbench.dataset.executors import ExecutorSpec
    from workbench.repair.islands import IslandBuilder
    from workbench.repair.parallel import _job, _State

    plan = ComparisonPlan(str(SAMPLES / "int8_outlier.onnx"), "ort", "ort:int8", feeds=_outlier_feeds(2))
    try:
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(plan.ref_model)
        weight = next(t for t in rewritten.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 2)
        weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 2, weight.name))
        builder = IslandBuilder(plan.cand_model, rewritten)
        reader = next(n.name for n in plan.cand_model.graph.node if n.op_type in ("MatMul", "Gemm")
                      and n.name in builder.idx.by_name)
        outputs = [o.name for o in plan.cand_model.graph.output]
        state = _State(_job(plan, builder, outputs, ExecutorSpec("processes", 2), str(tmp_path)))  # as a worker
        ours = builder.build([reader])
        assert state.builder.build([reader]).SerializeToString() == ours.SerializeToString()
        doubled = onnx.numpy_helper.to_array(weight)
        assert any(np.array_equal(onnx.numpy_helper.to_array(t), doubled) for t in ours.graph.initializer)
    finally:
        plan.close()


def test_cli_repairs_on_an_npz_folder_with_workers_like_the_api_on_a_list(tmp_path, capsys):
    folder = tmp_path / "feeds"
    folder.mkdir()
    feeds = _outlier_feeds()
    for i, f in enumerate(feeds):
        np.savez(folder / f"{i:02d}.npz", **f)
    model = str(SAMPLES / "int8_outlier.onnx")
    out, js = tmp_path / "fixed.onnx", tmp_path / "r.json"
    code = main(["repair", model, "--ref", "ort", "--cand", "ort:int8", "--inputs", str(folder), "--workers", "2",
                 "--verify", "none", "--out", str(out), "--json", str(js)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(js.read_text())
    serial = repair(model, "ort", "ort:int8", feeds=feeds, verify=None)
    assert doc["executor"] == {"kind": "processes", "workers": 2, "address": None}
    assert _comparable(doc) == _comparable(serial)


def test_repair_reads_an_image_folder_with_preprocess(tmp_path):
    """A folder of images through a preprocess file gives the repair of the same feeds as a list."""
    from PIL import Image

    images = tmp_path / "imgs"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(images / f"{i}.png")
    (tmp_path / "prep64.py").write_text("import numpy as np\nfrom PIL import Image\n\n\ndef load(path):\n"
                                        "    with Image.open(path) as im:\n"
                                        "        return np.asarray(im, np.float32).reshape(1, 64) / 32 - 4\n")
    model = str(SAMPLES / "int8_outlier.onnx")
    from_folder = repair(model, "ort", "ort:int8", feeds=images, preprocess=f"{tmp_path / 'prep64.py'}:load",
                         verify=None, max_builds=4)
    listed = [{"x": np.asarray(Image.open(p), np.float32).reshape(1, 64) / 32 - 4}
              for p in sorted(images.glob("*.png"))]
    from_list = repair(model, "ort", "ort:int8", feeds=listed, verify=None, max_builds=4)
    assert _comparable(from_folder) == _comparable(from_list)
    assert from_folder.plan.feed_info["count"] == 6 and from_folder.plan.feed_info["dataset"]["kind"] == "images"


def test_repair_refuses_a_dataset_over_the_memory_budget_with_the_numbers(tmp_path, capsys):
    folder = tmp_path / "feeds"
    folder.mkdir()
    for i, f in enumerate(_outlier_feeds()):  # 256 bytes each
        np.savez(folder / f"{i:02d}.npz", **f)
    model = str(SAMPLES / "int8_outlier.onnx")
    with pytest.raises(InputError) as err:
        repair(model, "ort", "ort:int8", feeds=folder, memory_budget=1000)
    text = str(err.value)
    assert "the first 4 of 8 samples already take 1.0 KiB, over the memory budget of 1000 B" in text
    assert "all 8 would take about 2.0 KiB" in text and "raise --memory-budget" in text
    code = main(["repair", model, "--cand", "ort:int8", "--inputs", str(folder), "--memory-budget", "1K",
                 "--out", str(tmp_path / "fixed.onnx")])
    err_text = capsys.readouterr().err.strip()
    assert code == 2 and "over the memory budget of 1.0 KiB" in err_text and len(err_text.splitlines()) == 1
    assert not (tmp_path / "fixed.onnx").exists()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"workers": 0}, "workers must be a whole number"),
    ({"executor": "spark"}, "unknown executor"),
    ({"executor": "serial", "workers": 2}, "one worker"),
    ({"preprocess": "prep.py:load"}, "preprocess applies to a dataset"),
    ({"feeds": "imgs"}, "holds images but no preprocessing function"),
    ({"feeds": "imgs", "preprocess": "prep.py:load"}, r"sample 0 \(000.png\): feeds do not fit the model"),
])
def test_repair_bad_inputs_give_one_clear_error(tmp_path, kwargs, fragment):
    _images(tmp_path / "imgs", 2)
    _prep(tmp_path)
    kwargs = {k: (str(tmp_path / v) if k in ("feeds", "preprocess") else v) for k, v in kwargs.items()}
    with pytest.raises(WorkbenchError, match=fragment):
        repair(str(SAMPLES / "int8_outlier.onnx"), "ort", "ort:int8", verify=None, **kwargs)


def test_cli_repair_preprocess_without_inputs_exits_2(tmp_path, capsys):
    prep = _prep(tmp_path)
    code = main(["repair", str(SAMPLES / "int8_outlier.onnx"), "--cand", "ort:int8", "--preprocess",
                 f"{prep}:load", "--out", str(tmp_path / "fixed.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--preprocess needs a dataset" in err and len(err.splitlines()) == 1


def test_repair_on_ray_without_ray_fails_first_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code = main(["repair", str(SAMPLES / "int8_outlier.onnx"), "--cand", "ort:int8", "--executor", "ray",
                 "--out", str(tmp_path / "fixed.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Ray is not installed" in err and "[ray]" in err and len(err.splitlines()) == 1
