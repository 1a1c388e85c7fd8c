"""workbench.inspect_tensor: one tensor's values on both sides, for the Errors panel's detail view."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.compare.api import compare
from workbench.compare.metrics import ErrorStats
from workbench.compare.result import CompareResult
from workbench.errors import WorkbenchError
from workbench.inspect_tensor import TensorProbe, probe_for, tensor_values

CLAMP = SAMPLES / "fp16_clamp_constant.onnx"
BN = "/bn_big_var/BatchNormalization_output_0"


def test_values_reproduce_the_comparison_metrics():
    result = compare(CLAMP, "ort", "ort:fp16", seed=0)
    ref, cand = tensor_values(CLAMP, "ort", "ort:fp16", BN, result.used_feeds)
    assert ref.shape == cand.shape and ref.dtype == np.float32 and cand.dtype == np.float16
    stats = ErrorStats()
    stats.update(ref, cand)
    assert stats.metrics()["sqnr_db"] == pytest.approx(result.tensor(BN).metrics["sqnr_db"], rel=1e-6)


def test_a_result_read_from_json_reruns_its_random_feeds(tmp_path):
    result = compare(CLAMP, "ort", "ort:fp16", seed=5, feed_count=2)
    loaded = CompareResult.load_json(result.save_json(tmp_path / "r.json"))
    assert loaded.used_feeds is None
    probe = probe_for(loaded, CLAMP)
    for i in range(2):
        ref, cand = probe.values(BN, feed_index=i)
        np.testing.assert_array_equal(ref, TensorProbe(CLAMP, feeds=result.used_feeds).values(BN, i)[0])
    with pytest.raises(WorkbenchError, match="feed 2 does not exist"):
        probe.values(BN, feed_index=2)


def test_int8_uses_the_quantized_view():
    model = SAMPLES / "int8_outlier.onnx"
    probe = TensorProbe(model, "ort", "ort:int8", seed=0, feed_count=4)
    name = "/mlp/fc2/Add_output_0"
    ref, cand = probe.values(name)
    assert probe.candidate_name(name) != name  # DequantizeLinear(QuantizeLinear(T)) stands for T
    assert ref.shape == cand.shape and not np.allclose(ref, cand)


def test_unknown_tensor_is_a_clear_error():
    with pytest.raises(WorkbenchError, match="no tensor 'nope'"):
        tensor_values(CLAMP, "ort", "ort:fp16", "nope")


def test_marking_one_tensor_lets_the_engine_fuse():
    """Marking changes fusions: with only the BatchNormalization output marked, ONNX Runtime may fold it into the
    Conv; mark="all" (what the comparison did) keeps its exact numbers, mark="one" is bisection's view."""
    feeds = compare(CLAMP, "ort", "ort:fp16", seed=0).used_feeds
    ref_all, cand_all = TensorProbe(CLAMP, feeds=feeds, mark="all").values(BN)
    ref_one, cand_one = TensorProbe(CLAMP, feeds=feeds, mark="one").values(BN)
    assert ref_one.shape == ref_all.shape and cand_one.shape == cand_all.shape
    np.testing.assert_allclose(ref_one, ref_all, rtol=1e-4, atol=1e-3)
    with pytest.raises(WorkbenchError, match="unknown mark"):
        TensorProbe(CLAMP, mark="some")
