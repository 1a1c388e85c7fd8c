"""INT8 against exhaustive truth on a real model (issue 23, item 3): the PP-OCR direction classifier quantized by
ONNX Runtime's own ``quantize_static`` on a mismatched (blank) calibration set, which flips a held-out crop's class.

The truth is computed here without the workbench (scripts/int8_qdq_truth.py): onnxruntime runs the FP32 and the
Q/DQ models on rendered crops, the class is read by argmax, and the culprit truth is the exhaustive sweep --
every quantized node dequantized back to float alone, the task re-measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from workbench.cli import main

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import int8_qdq_truth as Q  # noqa: E402


@pytest.fixture(scope="module")
def cls_case(tmp_path_factory, fetch_model):
    """(prepared FP32 classifier, its quantize_static Q/DQ model calibrated on blank images, held-out feeds)."""
    work = tmp_path_factory.mktemp("int8_truth")
    fp32 = Q.prepare(fetch_model("ppocr-cls"), work / "cls.fp32.onnx")
    qdq = Q.quantize(fp32, work / "cls.minmax.blank.onnx", Q.calib_feeds("cls", "blank"), "MinMax", False)
    return fp32, qdq, Q.heldout_feeds("cls"), work


def _classes(model, feeds) -> list[int]:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return [int(session.run(None, f)[0][0].argmax()) for f in feeds]


def test_top_culprit_of_a_harmful_quantize_static_model_is_in_the_sweeps_top_3(cls_case):
    from workbench.compare.api import compare

    fp32, qdq, feeds, _ = cls_case
    runner = Q.Runner("cls", fp32, feeds, level="extended")
    model = onnx.load(str(qdq))
    assert not runner.score(model)["healthy"], "the blank calibration must flip a held-out class"
    rows = Q.sweep(runner, model)
    assert len(rows) > 150  # every quantized node of the classifier
    result = compare(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds)
    assert result.diverged
    top = result.culprits[0].node
    rank = Q.rank_of(top, rows)
    assert rank is not None and rank <= 3, (top, rank, [n for n, _ in rows[:5]])


def test_repair_of_the_quantize_static_model_removes_one_pair_and_restores_every_class(cls_case):
    from workbench.repair.api import repair

    fp32, qdq, feeds, _ = cls_case
    want = _classes(fp32, feeds)
    assert _classes(qdq, feeds) != want
    result = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls, target=">=1",
                    verify=None)
    assert result.met
    assert len(result.kept) == 1  # the minimum: the Q/DQ model fails as is, so at least one pair must go
    assert _classes(result.model, feeds) == want
    dq = {n.name for n in onnx.load(str(qdq)).graph.node if n.op_type == "DequantizeLinear"}
    assert len([n for n in result.model.graph.node if n.op_type == "DequantizeLinear"]) < len(dq)


def test_cli_repair_int8_from_fp32_with_calibration_data(cls_case, tmp_path, capsys):
    """``--calib 8``: eight seeded standard-normal feeds, twice the input's [-1, 1] range: the INT8 variant flips
    one of 24 held-out crops until repair dequantizes what it needs."""
    fp32, _, _, _ = cls_case
    feeds = Q.heldout_feeds("cls", 24)
    inputs = Q.save_feeds(feeds, tmp_path / "heldout")
    out, js = tmp_path / "cls.int8.onnx", tmp_path / "r.json"
    code = main(["repair", str(fp32), "--cand", "ort:int8", "--calib", "8", "--input-shapes", "x:[1,3,48,192]",
                 "--inputs", str(inputs), "--metric", f"{REPO / 'scripts' / 'int8_qdq_truth.py'}:agree_cls",
                 "--target", ">=1", "--verify", "none", "--out", str(out), "--json", str(js)])
    capsys.readouterr()
    doc = json.loads(js.read_text())
    assert code == 0 and doc["met"]
    assert not doc["before"]["met"], "calibrated on random feeds, the INT8 variant must flip a held-out class"
    repaired = onnx.load(str(out))
    total, int8 = _weighted_int8(repaired)
    assert int8 >= total - 3 > 0, (total, int8)  # still an INT8 model
    assert _classes(out, feeds) == _classes(fp32, feeds)
    assert len(doc["kept"]) <= 3


def test_cli_repair_calib_needs_a_usable_value(cls_case, tmp_path, capsys):
    fp32, _, _, _ = cls_case
    for cand, calib, said in (("ort:int8", str(tmp_path / "missing"), "missing"),
                              ("ort:int8", "0", "at least one feed"),
                              ("ort:fp16", "4", "no side is an :int8 variant")):  # it would go unused
        code = main(["repair", str(fp32), "--cand", cand, "--calib", calib, "--input-shapes", "x:[1,3,48,192]",
                     "--out", str(tmp_path / "x.onnx")])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, err


@pytest.mark.parametrize("at_once", [True, False])
def test_group_testing_finds_the_single_pair_the_sweep_needs(cls_case, monkeypatch, at_once):
    """The ordering by blocks (used above qdq_groups.SMALL quantized nodes, forced here on the classifier): the
    sweep says one pair's removal heals the task, and repair by group testing removes exactly one, with blocks
    measured two at a time on one-thread sessions (ONNX Runtime CPU) or one after the other (other engines)."""
    from workbench.repair import qdq_groups
    from workbench.repair.api import repair

    monkeypatch.setattr(qdq_groups, "SMALL", 0)
    if not at_once:
        monkeypatch.setattr(qdq_groups, "_one_thread_engine", lambda engine: None)
    fp32, qdq, feeds, _ = cls_case
    want = _classes(fp32, feeds)
    result = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls, target=">=1",
                    verify=None)
    assert any("group testing" in n for n in result.notes), result.notes
    assert result.met and len(result.kept) == 1 and result.minimal
    # the descent ends at the node that meets the target alone, well before its build budget
    assert result.builds_detail["ranking"] < qdq_groups.BUDGET, result.builds_detail
    said = next(n for n in result.notes if "ordered by group testing" in n)
    assert ("2 at a time" in said) == at_once, said
    assert _classes(result.model, feeds) == want
    # independently: that one node's Q/DQ removed by the truth script's own edit heals every crop
    healed = Q.remove_qdq(Q.name_unnamed(onnx.load(str(qdq))), onnx.load(str(fp32)), result.kept)
    assert _classes(healed, feeds) == want


def test_group_testing_says_which_blocks_the_engine_refused(cls_case, monkeypatch):
    """A block whose build ONNX Runtime refuses (here: an op it has no kernel for, put in the first block's build)
    is ranked as not helping, and the result says so; the repair still meets the task on real builds."""
    from onnx import helper

    from workbench.repair import qdq_groups
    from workbench.repair.api import repair

    monkeypatch.setattr(qdq_groups, "SMALL", 0)
    real = qdq_groups.order_by_groups

    def refusing(ev, builder, pool, *args, **kwargs):
        first = builder.build
        block = len(qdq_groups.quantized_nodes(builder)) // qdq_groups.GROUPS + 1

        def build(nodes):
            model = first(nodes)
            if "Conv@0" in nodes and 1 < len(nodes) <= block:  # the first block
                # gets a node ORT cannot make a kernel for
                model.graph.node.append(helper.make_node("NoSuchOp", [model.graph.input[0].name], ["unused"],
                                                         domain="wb.test"))
                model.opset_import.append(helper.make_opsetid("wb.test", 1))
            return model

        monkeypatch.setattr(builder, "build", build)
        try:
            return real(ev, builder, pool, *args, **kwargs)
        finally:
            monkeypatch.setattr(builder, "build", first)

    monkeypatch.setattr(qdq_groups, "order_by_groups", refusing)
    fp32, qdq, feeds, _ = cls_case
    result = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls, target=">=1",
                    verify=None)
    said = [n for n in result.notes if "could not build or run" in n]
    assert said and "1 block(s)" in said[0] and "NoSuchOp" in said[0], result.notes
    assert result.met and _classes(result.model, feeds) == _classes(fp32, feeds)


def test_a_mean_target_is_judged_on_the_mean_over_the_feeds(cls_case):
    """``mean>=X``: met when the share of held-out crops classified as in FP32 reaches X (NNCF's reading of a
    drop), not on every crop."""
    from workbench.repair.api import repair

    fp32, qdq, feeds, _ = cls_case
    want, got = _classes(fp32, feeds), _classes(qdq, feeds)
    share = sum(a == b for a, b in zip(want, got)) / len(feeds)
    assert 0 < share < 1
    lenient = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls,
                     target=f"mean>={share}", verify=None)
    assert lenient.met and lenient.kept == [] and lenient.target["aggregate"] == "mean"
    assert abs(lenient.before["value"] - share) < 1e-9
    strict = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls,
                    target=f"mean>={min(1.0, share + 1 / len(feeds))}", verify=None)
    assert not strict.before["met"] and strict.met and len(strict.kept) >= 1
    # a mean of bools: a set that misses stops at the feed that puts the threshold out of reach (here the first
    # node of the pool given, the classifier's first Conv, does not help); met sets run every feed
    again = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=Q.agree_cls,
                   target=f"mean>={min(1.0, share + 1 / len(feeds))}", verify=None, nodes=["Conv@0", *strict.kept])
    runs = [e for e in again.evaluations if e["how"] == "build"]
    assert again.met and again.kept == strict.kept
    assert runs[0]["kept"] == ["Conv@0"] and not runs[0]["met"] and runs[0]["feeds"] < len(feeds), runs[0]
    assert all(e["feeds"] == len(feeds) for e in runs if e["met"])


def test_int8_repair_folds_the_detectors_batchnorm_and_keeps_every_node_int8(tmp_path, fetch_model):
    """In ONNX Runtime's Q/DQ placement (``keep_placement``), the PP-OCRv4 detector's INT8 variant reads no
    held-out page's text mask as the FP32 model does: a
    BatchNormalization left after its Conv (running variances up to 9.8e7) puts a Q/DQ pair on the Conv's raw
    output. Repair folds the BatchNormalizations into their Convs and quantizes again: no Q/DQ pair is removed,
    every page's mask reads as in FP32 (re-checked here on onnxruntime, masks decoded by scripts/int8_qdq_truth.py),
    and the result names each fold (before it, the search dequantized around ``p2o.BatchNormalization.1``, the one
    pair the exhaustive sweep finds needed in ONNX Runtime's own MinMax per-channel model on these calibration pages:
    benchmarks/results/int8_truth-det.txt)."""
    from workbench.repair.api import repair

    fp32 = Q.prepare(fetch_model("ppocr-det"), tmp_path / "det.fp32.onnx")
    calib, held = Q.calib_feeds("det", "text"), Q.heldout_feeds("det", 8)
    out = tmp_path / "fixed.onnx"
    res = repair(str(fp32), "ort", "ort:int8", feeds=held, calibration=calib, metric=Q.healthy_det, target=">=1",
                 verify=None, out=out, keep_placement=True)
    assert res.met and not res.before["met"] and res.kept == [], res.render()
    folds = {r["node"]: r.get("into") for r in res.repairs if r["kind"] == "fold-bn"}
    assert folds.get("p2o.BatchNormalization.1") == "p2o.Conv.61", res.repairs
    assert {r["kind"] for r in res.repairs} == {"fold-bn"}
    assert "p2o.BatchNormalization.1 (fold-bn: folded into p2o.Conv.61 before quantization)" in res.render()
    fixed = onnx.load(str(out))
    assert not {n.name for n in fixed.graph.node} & set(folds)
    conv = next(n for n in fixed.graph.node if n.name == "p2o.Conv.61")
    reads = {o: n.op_type for n in fixed.graph.node for o in n.output}
    assert all(reads.get(i) == "DequantizeLinear" for i in conv.input), "the folded Conv computes in INT8"
    ref, cand = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, out))
    assert all(Q.task_score("det", [ref.run(None, f)[0]], [cand.run(None, f)[0]])["healthy"] for f in held)


def _weighted_int8(model: onnx.ModelProto) -> tuple[int, int]:
    """(weighted nodes, those computing in INT8: activation input and weight both read through a
    DequantizeLinear)."""
    reads = {o: n.op_type for n in model.graph.node for o in n.output}
    weighted = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm")]
    return len(weighted), sum(all(reads.get(i) == "DequantizeLinear" for i in n.input[:2]) for n in weighted)


def _repaired_as_placed(fp32, held, calib, metric, out):
    """Repair of ``fp32``'s INT8 variant judged on ``held`` (``metric`` >= 1 on every feed), checked to meet by the
    two whole-model rewrites alone -> (result, the written model, its (weighted nodes, INT8 ones))."""
    from workbench.repair.api import repair

    res = repair(str(fp32), "ort", "ort:int8", feeds=held, calibration=calib, metric=metric, target=">=1",
                 verify=None, out=out)
    assert res.met and not res.before["met"] and res.kept == [], res.render()
    assert [r["kind"] for r in res.repairs] == ["equalize-depthwise", "qdq-placement"], res.repairs
    fixed = onnx.load(str(out))
    return res, fixed, _weighted_int8(fixed)


def test_int8_repair_quantizes_the_detector_again_in_tensorrts_placement(tmp_path, fetch_model):
    """By default repair first quantizes the FP32 model again with Q/DQ pairs on the inputs of the weighted ops
    alone (TensorRT's recommended placement): on the PP-OCRv4 detector that model reads every held-out page's text
    mask as the FP32 model does (re-checked here on onnxruntime, masks decoded by scripts/int8_qdq_truth.py), with
    no pair removed and every Conv computing in INT8; the result says which placement it is (and that the
    depthwise Convs' inputs were equalized first: :mod:`workbench.variants.equalize`)."""

    fp32 = Q.prepare(fetch_model("ppocr-det"), tmp_path / "det.fp32.onnx")
    calib, held = Q.calib_feeds("det", "text"), Q.heldout_feeds("det", 8)
    out = tmp_path / "fixed.onnx"
    res, fixed, (total, int8) = _repaired_as_placed(fp32, held, calib, Q.healthy_det, out)
    assert "TensorRT's recommended placement" in res.render()
    assert total == int8 == 64, (total, int8)  # every Conv and ConvTranspose of the detector
    consumers: dict[str, set] = {}
    for n in fixed.graph.node:
        for i in n.input:
            consumers.setdefault(i, set()).add(n.op_type)
    readers = [consumers.get(n.output[0], set()) for n in fixed.graph.node if n.op_type == "DequantizeLinear"]
    assert all(r & {"Conv", "ConvTranspose"} for r in readers)  # each pair is there for a weighted op's input
    ref, cand = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, out))
    assert all(Q.task_score("det", [ref.run(None, f)[0]], [cand.run(None, f)[0]])["healthy"] for f in held)


def test_int8_repair_equalizes_the_v3_recognizers_depthwise_inputs(tmp_path, fetch_model):
    """The PP-OCRv3 recognizer's depthwise Convs read channels up to 3e3 apart in range: ONNX Runtime's
    per-tensor INT8 (quantize_static called directly, TensorRT's placement, MinMax) decodes no held-out crop as the
    FP32 model does. Repair (judged on those held-out crops, as benchmarks/anchors_int8.py judges it and NNCF's
    accuracy control) equalizes those inputs per channel before quantizing and meets with no pair removed: every
    Conv and MatMul computes in INT8 with one scale per activation tensor, and every held-out crop decodes as in
    FP32 (re-checked here on onnxruntime, greedy CTC decode by scripts/int8_qdq_truth.py)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    fp32 = Q.prepare(fetch_model("ppocrv3-rec"), tmp_path / "rec.fp32.onnx")
    calib, held = Q.calib_feeds("rec", "text"), Q.heldout_feeds("rec", 8)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    weighted = ["Conv", "ConvTranspose", "MatMul", "Gemm"]
    direct = tmp_path / "direct.onnx"
    quantize_static(str(fp32), str(direct), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=weighted,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                   "OpTypesToExcludeOutputQuantization": weighted, "DedicatedQDQPair": True})
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, direct)]
    refs = [sessions[0].run(None, f)[0] for f in held]
    assert Q.task_score("rec", refs, [sessions[1].run(None, f)[0] for f in held])["error"] > 0.5

    out = tmp_path / "fixed.onnx"
    res, fixed, (total, int8) = _repaired_as_placed(fp32, held, calib, Q.agree_rec, out)
    assert "the inputs of 13 depthwise Conv(s) equalized per channel" in res.render()
    assert total == int8 > 40, (total, int8)
    consts = {t.name: t for t in fixed.graph.initializer}
    for q in (n for n in fixed.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in consts):
        scale, zero = (onnx.numpy_helper.to_array(consts[i]) for i in q.input[1:3])
        assert scale.size == 1 and zero.dtype == "int8" and int(zero) == 0  # TensorRT's activation format
    cand = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert Q.task_score("rec", refs, [cand.run(None, f)[0] for f in held])["healthy"]


def test_int8_repair_of_the_v5_recognizer_keeps_the_unit_its_ordering_confirms(tmp_path, fetch_model):
    """The PP-OCRv5 recognizer quantized again in TensorRT's placement (depthwise inputs equalized) still misreads
    held-out crops: the ordering measures each unit's removal alone on the worst failing crop, checks those that
    heal it on the other crops until one holds on every crop, and the search keeps exactly that one unit; every
    held-out crop then decodes as in FP32 (re-checked on onnxruntime with scripts/int8_qdq_truth.py's greedy CTC
    decode), every other Conv/MatMul stays INT8."""
    from workbench.repair.api import repair

    fp32 = Q.prepare(fetch_model("ppocrv5-rec"), tmp_path / "rec.fp32.onnx")
    calib, held = Q.calib_feeds("rec", "text"), Q.heldout_feeds("rec", 8)
    out = tmp_path / "fixed.onnx"
    res = repair(str(fp32), "ort", "ort:int8", feeds=held, calibration=calib, metric=Q.agree_rec, target=">=1",
                 verify=None, out=out)
    assert res.met and not res.before["met"], res.render()
    note = next(n for n in res.notes if n.startswith("Q/DQ pool:"))
    held_unit = note.rpartition("holds on every feed: ")[2]
    assert "holds on every feed" in note and res.kept == [held_unit], (note, res.kept)
    total, int8 = _weighted_int8(onnx.load(str(out)))
    assert int8 == total - 1 > 40, (total, int8)
    ref, cand = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, out))
    assert Q.task_score("rec", [ref.run(None, f)[0] for f in held], [cand.run(None, f)[0] for f in held])["healthy"]
