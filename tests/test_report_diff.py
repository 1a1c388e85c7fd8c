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
