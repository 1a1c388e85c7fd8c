"""FP16 arithmetic that ONNX Runtime's CPU provider hides: it computes most FP16 operators in FP32, so a Linear whose
outputs pass 65504 before a scale brings them back passes there, while a GPU running the file as written (torch,
TensorRT; benchmarks/results/gpu_transformer_check-h100.txt: H100, NaN outputs) fails. ``ref:fp16`` on a user's
FP16 file runs that file in numpy FP16 arithmetic, and repair, when its model passes on ``ort`` but fails that
check, searches again on ``ref:fp16``. The truth here: numpy, by hand, in FP16 storage with FP32 accumulation (as
GPU GEMMs do) and in float64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_repair_rewrites import _linear_then_scale

from workbench.compare.api import compare
from workbench.errors import SpecError
from workbench.repair import repair


def _fp16_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x @ w + b as a GPU GEMM computes FP16 tensors: FP32 accumulation, the product stored in FP16."""
    with np.errstate(over="ignore"):
        mm = (x.astype(np.float16).astype(np.float32) @ w.astype(np.float16).astype(np.float32)).astype(np.float16)
        return (mm.astype(np.float32) + b.astype(np.float16).astype(np.float32)).astype(np.float16)


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    """(FP32 path, its plain FP16 conversion's path, feed, float64 truth of the output)."""
    from workbench.variants import make_variant

    folder = tmp_path_factory.mktemp("fp16arith")
    model, feed = _linear_then_scale("matmul+add")
    fp32, fp16 = folder / "m.onnx", folder / "m.fp16.onnx"
    onnx.save(model, str(fp32))
    make_variant(model, "fp16").save(fp16)
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    truth = np.maximum((feed["x"].astype(np.float64) @ w["W"] + w["B"]) * w["C"], 0.0)
    # as a GPU runs the plain conversion: the Linear's output overflows FP16 before the scale
    assert np.isinf(_fp16_linear(feed["x"], w["W"], w["B"])).any()
    return fp32, fp16, feed, truth


def test_ref_fp16_runs_a_users_fp16_file_in_fp16_arithmetic(linear):
    fp32, fp16, feed, _ = linear
    on_ort = compare(str(fp32), "ort", "ort", cand_model=str(fp16), feeds=[feed])
    assert not on_ort.diverged  # hidden on ort, which says where a GPU would overflow
    said = [n for n in on_ort.notes if n.startswith("the outputs pass on ONNX Runtime's CPU provider")]
    assert len(said) == 1 and "2 tensor(s) hold reference values past FP16's 65504 (first: mm, node fc/MatMul)" \
        in said[0], on_ort.notes
    res = compare(str(fp32), "ort", "ref:fp16", cand_model=str(fp16), feeds=[feed])
    assert res.diverged and res.precision["candidate"]["precision"] == "fp16"
    y = next(t for t in res.tensors if t.tensor == "y")
    assert y.metrics["nonfinite_mismatch"] > 0
    with pytest.raises(SpecError, match="holds no FP16 tensor"):
        compare(str(fp32), "ort", "ref:fp16", cand_model=str(fp32), feeds=[feed])


def test_repair_on_ort_searches_again_where_fp16_arithmetic_shows(linear, tmp_path):
    fp32, _, feed, truth = linear
    out = tmp_path / "fixed.onnx"
    bar: list[tuple[float, str]] = []
    res = repair(str(fp32), "ort", "ort:fp16", feeds=[feed], out=out, progress=lambda f, m: bar.append((f, m)))
    assert res.met and res.candidate == "ref:fp16", res.render()
    # one bar over both searches: it never goes back, the second search says what it is, and it ends at 1
    fractions = [f for f, _ in bar]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0, bar
    assert any(m.startswith("again in FP16 arithmetic (ref:fp16): ") for _, m in bar), bar
    assert res.notes[0].startswith("on ort:fp16 the target was met keeping nothing, but that model failed in FP16 "
                                   "arithmetic"), res.notes
    assert [(r["node"], r["kind"]) for r in res.repairs] == [("fc/scale", "fold-scale")]
    assert res.verification["independent"]["engine"] == "ort" and res.verification["independent"]["met"]
    fixed = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    w = next(v for k, v in fixed.items() if k.startswith("W"))
    b = next(v for k, v in fixed.items() if k.startswith("B"))
    assert w.dtype == b.dtype == np.float16
    got = np.maximum(_fp16_linear(feed["x"], w, b).astype(np.float64), 0.0)  # the saved weights, as a GPU runs them
    assert np.isfinite(got).all() and np.abs(got - truth).max() < 1e-2 * np.abs(truth).max()


def test_an_interrupt_during_the_second_search_leaves_no_model_at_out(linear, tmp_path, monkeypatch):
    """The first pass wrote its model (the one that failed in FP16 arithmetic) before the second search began: a
    Ctrl-C there left that known-bad file at --out. The first pass now writes only when no second search follows."""
    import workbench.repair.api as api

    fp32, _, feed, _ = linear
    out = tmp_path / "fixed.onnx"

    def interrupted(steps, engine):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "_second_pass", interrupted)  # the second search starts: the user presses Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        repair(str(fp32), "ort", "ort:fp16", feeds=[feed], out=out)
    assert not out.exists() and not list(tmp_path.iterdir())
