"""Diff of two comparisons on real runs: before/after a fix (keep the clamped BatchNormalization in FP32),
as results JSON files and as bundles, from Python and from the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLES

from workbench.cli import main
from workbench.compare.api import compare
from workbench.report import diff_results, save_bundle

MODEL = SAMPLES / "fp16_clamp_constant.onnx"
BN = "/bn_big_var/BatchNormalization"


@pytest.fixture(scope="module")
def before_after(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    before = compare(MODEL, "ort", "ort:fp16")
    after = compare(MODEL, "ort", "ort:fp16", keep_fp32=[BN])
    before.save_json(d / "before.json")
    after.save_json(d / "after.json")
    save_bundle(before, dest=d / "before_bundle")
    save_bundle(after, dest=d / "after_bundle", zip=True)
    return d, before, after


def test_diff_before_after_a_fix(before_after):
    d, before, after = before_after
    diff = diff_results(d / "before.json", d / "after.json")
    assert diff.verdict_changed and diff.first_divergent_changed and diff.top_culprit_changed
    assert not diff.same_conclusion and not diff.metrics_match()
    doc = diff.to_json()
    assert doc["schema"] == "workbench.diff/1"
    assert doc["first_divergent"]["before"]["node"] == BN and doc["first_divergent"]["after"] is None
    assert doc["culprits"]["before"][0]["node"] == BN
    assert not any(c["introduces_divergence"] for c in doc["culprits"]["after"])
    assert doc["versions_changed"] == {} and doc["specs_changed"] == {}
    changes = {t["tensor"]: t for t in doc["tensors"]}
    bn = changes[BN + "_output_0"]
    assert bn["before"] < 0 < 60 < bn["after"] and bn["change"] == pytest.approx(bn["after"] - bn["before"])
    assert bn["diverged_before"] and not bn["diverged_after"]
    # the largest change is a tensor downstream of the clamp, not the untouched first Conv
    assert doc["largest_changes"][0]["tensor"] != "/conv/Conv_output_0"
    text = diff.render()
    assert "verdict: DIVERGED -> ok (changed)" in text and "largest sqnr_db changes" in text
    # the verdict is output-led: its reason, and the output that decides it
    assert doc["verdict_reason"]["before"] == "output(s) logits fail sqnr_db < 30 or non-finite mismatch"
    assert doc["verdict_reason"]["after"].startswith("every output passes")
    assert doc["failed"] == {"before": True, "after": False, "changed": True}
    [out] = doc["outputs"]
    assert out["tensor"] == "logits" and out["state_before"] == "DIVERGED" and out["state_after"] == "ok"
    assert out["before"] < 0 < 30 < out["after"] and out["changed"]
    assert "output logits: sqnr_db -" in text and "(DIVERGED -> ok)" in text
    assert doc["precision"]["before"]["candidate"]["precision"] == "fp16"
    assert bn["floor_before"] == pytest.approx(before.tensor(BN + "_output_0").floor["sqnr_db"])
    assert doc["internal_dips"]["changed"] is False and doc["notes"] == []
    json.dumps(doc, allow_nan=False)


def test_diff_of_a_result_with_itself_and_of_bundles(before_after):
    d, before, _ = before_after
    same = diff_results(before, d / "before.json")
    assert same.same_conclusion and same.metrics_match() and same.largest() == []
    bundles = diff_results(d / "before_bundle", d / "after_bundle.zip")
    assert bundles.first_divergent_changed and bundles.to_json()["first_divergent"]["before"]["node"] == BN


def test_diff_reports_engine_version_changes(before_after, tmp_path):
    d, before, _ = before_after
    doc = json.loads(json.dumps(before.to_json()))  # a deep copy: to_json shares the result's dicts
    doc["engines"]["candidate"]["onnxruntime"] = "1.17.0"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    diff = diff_results(tmp_path / "old.json", d / "before.json")
    assert diff.versions["candidate.onnxruntime"] == ["1.17.0", before.engines["candidate"]["onnxruntime"]]
    assert "candidate.onnxruntime 1.17.0 ->" in diff.render()


def test_cli_diff(before_after, tmp_path, capsys):
    d, _, _ = before_after
    out = tmp_path / "diff.json"
    assert main(["diff", str(d / "before.json"), str(d / "after_bundle.zip"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first divergent: /bn_big_var/BatchNormalization_output_0 -> none (changed)" in text
    assert json.loads(out.read_text())["verdict"] == {"before": True, "after": False, "changed": True}
    assert main(["diff", str(d / "before.json"), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0]
    (tmp_path / "inspect.json").write_text(json.dumps({"schema": "workbench.inspect/1"}))
    assert main(["diff", str(d / "before.json"), str(tmp_path / "inspect.json")]) == 2
    assert "workbench.compare/1" in capsys.readouterr().err


def _strip_to_old_format(doc: dict) -> dict:
    """A results JSON as written before precision-aware verdicts: no precision, verdict, floors or impact."""
    doc = json.loads(json.dumps(doc))
    del doc["precision"], doc["verdict"]
    for t in doc["tensors"]:
        t.pop("floor", None), t.pop("at_floor", None)
    for c in doc["culprits"]:
        for key in ("floor", "beyond_floor", "impact"):
            c.pop(key, None)
    return doc


def test_results_from_before_precision_floors_load_and_diff(before_after, tmp_path):
    d, before, after = before_after
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_strip_to_old_format(before.to_json())))
    diff = diff_results(old, d / "after.json")
    assert diff.before.precision == {} and all(t.floor is None for t in diff.before.tensors)
    assert diff.verdict_changed and diff.first_divergent_changed and diff.top_culprit_changed
    doc = diff.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["verdict"] == {"before": True, "after": False, "changed": True}
    assert doc["precision"]["before"] is None and "candidate_precision" not in doc["specs_changed"]
    assert len(doc["notes"]) == 1 and "before was written before precision-aware verdicts" in doc["notes"][0]
    assert f"note: {diff.labels[0]} was written before precision-aware verdicts" in diff.render()
    # a result diffed with its own old-format copy: the same conclusion and the same metrics
    same = diff_results(before, old)
    assert same.same_conclusion and same.metrics_match() and not same.internal_dips_changed
    assert main(["diff", str(old), str(d / "after.json")]) == 0


def test_diff_reports_internal_dip_changes(tmp_path):
    """ort:fp16 passes with internal dips in the second LayerNorm; FP16 arithmetic (ref:fp16) overflows its Pow
    and the output diverges: the dips become the divergence."""
    feeds = SAMPLES / "transformer_block_inputs.npz"
    ort = compare(SAMPLES / "transformer_block.onnx", "ort", "ort:fp16", feeds=feeds)
    ref = compare(SAMPLES / "transformer_block.onnx", "ref", "ref:fp16", feeds=feeds)
    pow_out = "/block/ln2/Pow_output_0"
    assert not ort.diverged and pow_out in [t.tensor for t in ort.internal_dips] and ref.diverged
    diff = diff_results(ort, ref, labels=("ort", "ref"))
    assert diff.verdict_changed and diff.internal_dips_changed
    dips = diff.to_json()["internal_dips"]
    assert pow_out in dips["before"] and dips["after"] == [] and pow_out in dips["gone"] and dips["changed"]
    assert diff.to_json()["first_divergent"]["after"]["tensor"] == pow_out
    text = diff.render()
    assert f"internal dips: {len(ort.internal_dips)} -> 0; gone: {pow_out}" in text
    assert "verdict: ok -> DIVERGED (changed)" in text and "output y: sqnr_db" in text and "(ok -> DIVERGED)" in text
    back = diff_results(ref, ort)
    assert back.internal_dips["new"] == [t.tensor for t in ort.internal_dips]
    unchanged = diff_results(ort, ort)
    assert not unchanged.internal_dips_changed and unchanged.same_conclusion
    assert f"internal dips: {len(ort.internal_dips)} -> {len(ort.internal_dips)}" in unchanged.render()


def test_diff_of_two_fused_comparisons_says_whether_the_fusions_changed():
    model = MODEL
    ort_a = compare(model, "ort", "ort:fp16", granularity="fused", culprits=False)
    ort_b = compare(model, "ort", "ort:fp16", granularity="fused", culprits=False)
    same = diff_results(ort_a, ort_b)
    assert any(n.startswith("fusions: unchanged") for n in same.notes)
    pytest.importorskip("openvino")
    ov = compare(model, "ort", "openvino:fp16", granularity="fused", culprits=False)
    changed = diff_results(ort_a, ov, labels=("ort", "openvino"))
    assert any(n.startswith("fusions CHANGED") and "only openvino" in n for n in changed.notes)
    plain = diff_results(compare(model, "ort", "ort:fp16", culprits=False), ort_a)
    assert not any("fusions" in n for n in plain.notes)


def test_diff_names_changed_inputs_and_moves_the_top_option_hides(before_after, tmp_path, capsys):
    d, before, _ = before_after
    seeded = compare(MODEL, "ort", "ort:fp16", seed=7)
    seeded.save_json(tmp_path / "seed7.json")
    diff = diff_results(d / "before.json", tmp_path / "seed7.json")
    assert diff.specs_changed["feeds.seed"] == [0, 7] and "feeds.seed: 0 -> 7" in diff.render()
    # --top 0 lists no tensor but says how many changed
    assert main(["diff", str(d / "before.json"), str(d / "after.json"), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "tensor(s) changed (--top 0 lists none)" in out and "no change" not in out
    # a metric that turns NaN (or disappears) moved; NaN in both did not
    doc = json.loads(json.dumps(before.to_json()))
    name = doc["tensors"][-1]["tensor"]
    doc["tensors"][-1]["metrics"]["sqnr_db"] = None
    (tmp_path / "gone.json").write_text(json.dumps(doc))
    moved = diff_results(d / "before.json", tmp_path / "gone.json")
    assert name in [t.tensor for t in moved.largest()] and not moved.metrics_match()
    # results of two different models: said
    other = compare(SAMPLES / "healthy_cnn.onnx", "ort", "ort:fp16")
    assert any("different models" in n for n in diff_results(before, other).notes)
