"""The tensor scan before INT8 quantization (workbench/variants/nonfinite.py): every float tensor's range and
NaN/inf found on ONNX Runtime, run in groups of at most SCAN_BYTES of marked tensors per run, checked against onnx's
reference evaluator on the bundled transformer block (its attention mask holds -inf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from workbench.variants import nonfinite
from workbench.variants.nonfinite import scan_tensors

MODELS = Path(__file__).resolve().parents[1] / "sample_models"


def _case():
    model = onnx.load(str(MODELS / "transformer_block.onnx"))
    with np.load(MODELS / "transformer_block_inputs.npz") as z:
        feed = {k: z[k] for k in z.files}
    rng = np.random.default_rng(0)
    feeds = [feed, {**feed, "x": (feed["x"] + rng.normal(size=feed["x"].shape)).astype(np.float32)}]
    return model, feeds


def test_scan_in_groups_equals_one_run_and_the_reference(monkeypatch):
    model, feeds = _case()
    whole = scan_tensors(model, feeds, keep_ranges=True)
    monkeypatch.setattr(nonfinite, "SCAN_BYTES", 1)  # one marked tensor per run
    grouped = scan_tensors(model, feeds, keep_ranges=True)
    assert grouped.nonfinite == whole.nonfinite and "attention_mask" in whole.nonfinite
    assert set(grouped.ranges) == set(whole.ranges) and len(whole.ranges) > 20
    for name, (lo, hi) in whole.ranges.items():
        assert grouped.ranges[name][0] == lo and grouped.ranges[name][1] == hi, name
    evaluator = ReferenceEvaluator(model)
    names = list(whole.ranges)
    runs = [dict(zip(names, evaluator.run(names, f))) for f in feeds]
    for name, (lo, hi) in whole.ranges.items():  # float32 on both engines: equal to rounding (of the tensor's scale)
        ref = np.concatenate([np.ravel(r[name]) for r in runs])
        np.testing.assert_allclose([float(lo[0]), float(hi[0])], [ref.min(), ref.max()], rtol=1e-4,
                                   atol=1e-5 * float(np.abs(ref).max()), err_msg=name)


def test_scan_of_chosen_tensors_only():
    model, feeds = _case()
    wanted = {n.output[0] for n in model.graph.node if n.op_type == "MatMul"}
    scan = scan_tensors(model, feeds, keep_ranges=True, only=wanted)
    assert set(scan.ranges) == wanted | {"x"}  # the graph inputs come from the feeds
    inputs_only = scan_tensors(model, feeds, keep_ranges=True, only=set())  # the graph inputs, from the feeds
    assert set(inputs_only.ranges) == {"x"} and set(inputs_only.nonfinite) == {"attention_mask"}
