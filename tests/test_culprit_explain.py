"""A culprit's explanation agrees with its measured impact: a node whose fix gains something on the outputs is not
blamed on the format's floor in the same card, and an unbounded gain reads in words (never "inf dB")."""

from __future__ import annotations

import math

import numpy as np

from workbench.compare.explain import FLOOR_BLAME, explain, gain_text, reconcile
from workbench.compare.impact import impact_record
from workbench.compare.result import Culprit
from workbench.compare.text import _impact
from workbench.core.metrics import ErrorStats

FLOOR = {"format": "fp16", "share_flushed": 0.99, "sqnr_db": 40.0}


def _culprit(after_db: float) -> Culprit:
    """A Sigmoid whose reference values mostly flush to zero in FP16 (the explanation blames the format), with the
    impact measured on one output from 20 dB before the fix to ``after_db`` after it."""
    ref = np.full(1000, 1e-9, np.float32)
    ref[:10] = 0.5
    stats = ErrorStats().update(ref, ref.astype(np.float16).astype(np.float32))
    text = explain("/head/Sigmoid", "fp16", stats, stats.metrics(), [], tensor="/head/Sigmoid_output_0",
                   floor=FLOOR, op_type="Sigmoid")
    assert FLOOR_BLAME in text, text
    impact = impact_record("sqnr_db", {"out": {"sqnr_db": 20.0, "nonfinite_mismatch": 0}},
                           {"out": {"sqnr_db": after_db, "nonfinite_mismatch": 0}})
    return Culprit("/head/Sigmoid", "Sigmoid", "/head/Sigmoid_output_0", 3, stats.metrics(), stats.metrics(), True,
                   explanation=text, floor=FLOOR, impact=impact)


def test_a_harmful_culprit_is_not_blamed_on_the_format():
    c = _culprit(math.inf)  # fixing it makes the output exact: it matters
    assert c.impact["best_gain_db"] == math.inf and not c.harmless
    reconcile(c)
    assert "not the node" not in c.explanation and FLOOR_BLAME not in c.explanation
    assert "flush to zero" in c.explanation  # the fact stays, the blame goes
    assert "match the reference exactly" in c.explanation and "it adds error beyond that floor" in c.explanation
    assert "inf dB" not in _impact(c) and "match the reference exactly" in _impact(c)


def test_a_harmless_culprit_keeps_the_format_blame():
    c = _culprit(21.0)  # fixing it gains 1 dB: harmless, the format's floor is the reason
    assert c.harmless
    before = c.explanation
    reconcile(c)
    assert c.explanation == before and "not the node" in c.explanation


def test_gain_text_says_unbounded_and_lost_gains_in_words():
    assert gain_text(12.34) == "fixing it gains 12.3 dB on the outputs"
    assert "exactly" in gain_text(math.inf) and "inf" not in gain_text(math.inf)
    assert gain_text(-math.inf) == "fixing it alone makes the outputs worse"
    assert gain_text(None) == gain_text(math.nan) == "what fixing it gains was not measured"


def test_the_text_says_inf_nan_removed_not_a_finite_values_gain():
    """A fix that removes inf/NaN from the outputs reads as that (the dB figure reads only the finite values, and
    here it even drops); a culprit whose patched value overflows too gets the impact's note, not a gain."""
    c = _culprit(19.99)
    c.impact = impact_record("sqnr_db", {"out": {"sqnr_db": 20.0, "nonfinite_mismatch": 768}},
                             {"out": {"sqnr_db": 19.99, "nonfinite_mismatch": 0}})
    assert not c.harmless
    assert _impact(c).endswith("fixing it removes 768 inf/NaN from the outputs (on their finite values: -0.01 dB)")
    c.impact["note"] = "its reference values exceed the format's range"
    assert _impact(c).endswith("its reference values exceed the format's range") and "dB" not in _impact(c)


def test_a_node_that_amplifies_a_small_received_error_is_the_culprit():
    """INT8 of the clamp sample: /conv/Conv's quantization adds 0.013 (under the criterion), the BatchNormalization
    with the huge variance turns that into 0.92 (the first divergent tensor), and alone it adds 0.008. Before, every
    culprit read 'below the criterion' beside a DIVERGED verdict. Now the amplifier is flagged, and its measured fix
    is checked here independently: its Q/DQ removed (islands.remove_qdq), onnxruntime run directly, numpy metric."""
    import onnx
    from conftest import SAMPLES
    from test_repair import norm_mean_abs, ort_run

    from workbench.compare.api import compare
    from workbench.repair.islands import remove_qdq

    model = SAMPLES / "fp16_clamp_constant.onnx"
    result = compare(str(model), "ort", "ort:int8")
    first = result.culprits[0]
    assert result.diverged and first.node == "/bn_big_var/BatchNormalization" and first.introduces_divergence
    assert not first.harmless and first.impact["best_gain_db"] > 20, first.impact
    assert first.explanation.startswith("it amplifies the error it receives: its inputs arrive at norm_mean_abs "
                                        "0.0128 (under the criterion) and its output is at 0.923"), first.explanation
    feeds = result.used_feeds
    refs = ort_run(onnx.load(str(model)), feeds)
    fixed = ort_run(remove_qdq(result.plan.cand_model, result.plan.ref_model, [first.node]), feeds)
    broken = ort_run(result.plan.cand_model, feeds)
    assert max(norm_mean_abs(r[0], c[0]) for r, c in zip(refs, broken)) > 0.1
    assert max(norm_mean_abs(r[0], c[0]) for r, c in zip(refs, fixed)) < 0.1
