"""The workbench's default verdict against task-level truth: real FP16 conversions of real OCR models.

tests/ocr_truth.py builds the corpus (PP-OCR det/rec/cls from rapidocr wheels, plus the det models with their
BatchNormalization variances folded; FP16 by onnxruntime.transformers and by onnxconverter-common) and judges each
conversion with onnxruntime alone, at the task level: det text-mask flips, rec greedy-CTC strings, cls classes.
Here the workbench compares each pair exactly as a user would (a folder of .npz feeds, the user's own FP16 file) and
its default verdict must agree with that truth; for harmful conversions the top culprit must be the node that breaks
the task. The first run builds the corpus (about a minute); later runs read it back from the cache.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import ocr_truth
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.compare.api import compare
from workbench.errors import WorkbenchError

pytestmark = pytest.mark.slow

CASE_IDS = ocr_truth.case_ids()
RANDOM_FOLDED = [i for i in CASE_IDS if i.endswith(".random") and i.split(".")[0] in ocr_truth.DERIVED]
CLI_CASES = ["ppocrv3-det-folded.ort.text", "ppocrv3-det.ort.text"]  # same FP32 function: healthy, harmful


@pytest.fixture(scope="module")
def corpus(model_cache, fetch_model) -> dict[str, ocr_truth.Case]:
    """Case id -> Case: models, conversions, feeds and truth built once, cached under <cache>/corpus-small."""
    return {c.id: c for c in ocr_truth.corpus_cases(model_cache.parent, fetch=fetch_model)}


@pytest.fixture(scope="module")
def results() -> dict:
    """Case id -> CompareResult: each case is compared once for the whole module."""
    return {}


def _case(corpus: dict, case_id: str) -> ocr_truth.Case | None:
    """The case, or None for an ERROR row (a converter whose model onnxruntime refuses): then the workbench must
    refuse that file with one clear line too (checked here), not compare it."""
    if case_id in corpus:
        return corpus[case_id]
    row = next(r for r in ocr_truth.load_corpus(fetch=None)["rows"] if r["id"] == case_id)
    assert row["error"], f"{case_id} is neither a case nor an ERROR row"
    with pytest.raises(WorkbenchError) as err:
        compare(row["fp32_model"], "ort", "ort", cand_model=row["fp16_model"], feeds=row["feeds_dir"])
    assert "\n" not in str(err.value) and "Cast" in str(err.value)
    return None


def _compare(results: dict, case: ocr_truth.Case):
    if case.id not in results:
        results[case.id] = compare(case.fp32, "ort", "ort", cand_model=case.fp16, feeds=case.feeds_dir)
    return results[case.id]


def _describe(case: ocr_truth.Case, r) -> str:
    top = [(c.node, c.op_type, c.introduces_divergence) for c in r.culprits[:3]]
    first = r.first_divergent
    return (f"{case.id}: truth {'healthy' if case.healthy else 'harmful'} ({case.summary}); workbench "
            f"{'DIVERGED' if r.diverged else 'ok'}, first divergent {first.tensor if first else None}, "
            f"top culprits {top}")


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_default_verdict_matches_task_truth(corpus, results, case_id):
    case = _case(corpus, case_id)
    if case is None:
        return
    r = _compare(results, case)
    assert r.diverged == (not case.healthy), _describe(case, r)
    if not case.healthy:
        assert case.culprit_node, f"{case.id}: harmful, but the corpus names no culprit"
        assert r.culprits and r.culprits[0].node == case.culprit_node, _describe(case, r)
    assert r.precision["candidate"]["precision"] == "fp16", f"{case.id}: {r.precision}"


@pytest.mark.parametrize("case_id", RANDOM_FOLDED)
def test_random_inputs_raise_no_unmarked_false_alarm(corpus, results, case_id):
    """Healthy FP16 det models fed uniform noise: activations fall below FP16's smallest subnormal, where a
    layer-wise comparison sees large relative errors that do not matter. The verdict must be ok, and a culprit
    said to introduce divergence must be marked harmless."""
    case = _case(corpus, case_id)
    assert case.healthy, f"{case.id}: the corpus says harmful ({case.summary})"
    r = _compare(results, case)
    assert not r.diverged, _describe(case, r)
    unmarked = [(c.node, c.op_type, c.impact) for c in r.culprits
                if c.introduces_divergence and (c.impact or {}).get("harmless") is not True]
    assert not unmarked, f"{case.id}: culprits flagged as introducing divergence, not marked harmless: {unmarked}"


@pytest.mark.parametrize("case_id", CLI_CASES)
def test_cli_exit_code_and_json_match_task_truth(corpus, tmp_path, case_id):
    case = _case(corpus, case_id)
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "compare", str(case.fp32), "--ref", "ort", "--cand", "ort",
         "--cand-model", str(case.fp16), "--inputs", str(case.feeds_dir), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    expected = 0 if case.healthy else 1
    assert proc.returncode == expected, (f"{case.id}: exit {proc.returncode}, expected {expected}\n"
                                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    assert json.loads(out.read_text())["diverged"] == (not case.healthy)


def _bn_model(shared: bool, as_constants: bool) -> onnx.ModelProto:
    """x[1,3,4,4] -> BatchNormalization -> BatchNormalization -> y, variances up to 1e8 (beyond FP16)."""
    rng = np.random.default_rng(0)
    params = {
        "scale": rng.uniform(0.5, 2, 3).astype(np.float32), "bias": rng.uniform(-1, 1, 3).astype(np.float32),
        "mean": rng.uniform(-1, 1, 3).astype(np.float32), "var": np.array([1e8, 2.5, 4e5], dtype=np.float32),
    }
    names = [{k: k if shared else f"{k}{i}" for k in params} for i in range(2)]
    tensors = {n: params[k] for layer in names for k, n in layer.items()}
    nodes = [helper.make_node("BatchNormalization", ["x", *names[0].values()], ["h"], name="bn0", epsilon=1e-5),
             helper.make_node("BatchNormalization", ["h", *names[1].values()], ["y"], name="bn1", epsilon=1e-3)]
    inits = []
    if as_constants:
        nodes = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v, n)) for n, v in
                 tensors.items()] + nodes
    else:
        inits = [numpy_helper.from_array(v, n) for n, v in tensors.items()]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
@pytest.mark.parametrize("as_constants", [False, True], ids=["initializers", "constants"])
def test_fold_batchnorm_variance_keeps_fp32_outputs(tmp_path, shared, as_constants):
    """The corpus's derived models rest on this: same FP32 outputs, no BatchNormalization parameter beyond FP16."""
    model = _bn_model(shared, as_constants)
    assert {c["node"] for c in ocr_truth.clamped_batchnorms(model)} == {"bn0", "bn1"}
    folded = ocr_truth.fold_batchnorm_variance(model)
    onnx.checker.check_model(folded, full_check=True)
    assert ocr_truth.clamped_batchnorms(folded) == []
    assert ocr_truth.clamped_batchnorms(model), "the input model was modified"
    onnx.save(model, tmp_path / "a.onnx")
    onnx.save(folded, tmp_path / "b.onnx")
    feeds = [{"x": np.random.default_rng(1).normal(0, 100, (1, 3, 4, 4)).astype(np.float32)}]
    before, after = (ocr_truth.run_model(tmp_path / f, feeds) for f in ("a.onnx", "b.onnx"))
    assert ocr_truth.relative_change(before, after) < 1e-6
    only = ocr_truth.fold_batchnorm_variance(model, ["bn1"])
    assert {c["node"] for c in ocr_truth.clamped_batchnorms(only)} == {"bn0"}
