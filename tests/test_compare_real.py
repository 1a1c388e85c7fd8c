"""Layer-wise comparison on real models from PyPI wheels (PP-OCR v4 det/rec, PP-OCR cls), real engines."""

from __future__ import annotations

import math

import pytest

from workbench.compare.api import compare

pytestmark = pytest.mark.slow

DET = {"x": [1, 3, 320, 320]}
CLS = {"x": [1, 3, 48, 192]}
REC = {"x": [1, 3, 48, 320]}


def test_det_fp16_culprit_is_the_clamped_batchnorm(fetch_model):
    """The FP16 converter clamps PP-OCR-det's BatchNormalization variances (up to 9.8e7) to 65504."""
    result = compare(fetch_model("ppocr-det"), "ort", "ort:fp16", input_shapes=DET)
    top = result.culprits[0]
    assert top.op_type == "BatchNormalization" and top.introduces_divergence
    assert "batch_norm_0.w_2" in top.explanation and "clamped" in top.explanation
    assert result.first_divergent.node == top.node
    assert result.tensor("sigmoid_0.tmp_0").diverged
    assert len(result.tensors) > 300 and result.builds == 4  # + the impact model, the failing output unmarked
    assert not [n for n in result.notes if n.startswith("on ort as deployed")]  # the clamp breaks it there too


def test_det_fp16_bisect_agrees_within_log_builds(fetch_model):
    full = compare(fetch_model("ppocr-det"), "ort", "ort:fp16", input_shapes=DET, culprits=False)
    bis = compare(fetch_model("ppocr-det"), "ort", "ort:fp16", input_shapes=DET, mode="bisect")
    assert bis.first_divergent.tensor == full.first_divergent.tensor
    assert bis.builds <= math.ceil(math.log2(len(full.tensors))) + 3
    assert bis.culprits[0].node == full.first_divergent.node


def test_cls_ort_vs_openvino_agree_and_isolation_runs_on_openvino(fetch_model):
    result = compare(fetch_model("ppocr-cls"), "ort", "openvino", input_shapes=CLS)
    assert not result.diverged
    assert len(result.tensors) > 200
    assert result.culprits and not any("isolation could not run" in n for n in result.notes)
    assert min(t.metrics["sqnr_db"] for t in result.tensors if t.tensor in result.outputs) > 90


def test_cls_ort_vs_float64_reference(fetch_model):
    """Needs the BatchNormalization-9 fix in the reference engine (onnx's evaluator uses training mode)."""
    result = compare(fetch_model("ppocr-cls"), "ref", "ort", input_shapes=CLS, culprits=False)
    assert not result.diverged
    assert min(t.metrics["sqnr_db"] for t in result.tensors if t.tensor in result.outputs) > 90


def test_rec_fp16_has_only_rounding_error(fetch_model):
    result = compare(fetch_model("ppocr-rec"), "ort", "ort:fp16", input_shapes=REC, culprits=False)
    assert not result.diverged
    assert len(result.tensors) > 400


def test_cls_int8_runs_and_ranks_culprits(fetch_model):
    result = compare(fetch_model("ppocr-cls"), "ort", "ort:int8", input_shapes=CLS, feed_count=4)
    assert result.variant["variant"] == "int8"
    assert len(result.tensors) > 200 and result.culprits
    assert all(c.introduced["norm_mean_abs"] is not None for c in result.culprits)
