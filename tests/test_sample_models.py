"""Sample models: byte-for-byte determinism, validity, and independent checks that each planted fault is real.

The fault checks use only numpy, onnx, onnxruntime and onnxconverter_common, never workbench code.
ORT's CPU provider runs most "float16" kernels in float32 behind inserted Casts, so true FP16 arithmetic is
emulated with numpy float16 casts or ``onnx.reference.ReferenceEvaluator`` on the converted model.
"""

from __future__ import annotations

import json
import pathlib
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import load_file
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SCRIPT = ROOT / "scripts" / "make_sample_models.py"
FP16_MAX = 65504.0
MODEL_NAMES = ["cnn_fp16_overflow", "transformer_block", "fp16_clamp_constant", "int8_outlier", "if_subgraph",
               "mlp_external", "healthy_cnn"]


def _load_script():
    return load_file(SCRIPT)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((SAMPLES / "manifest.json").read_text())


def _entry(manifest: dict, name: str) -> dict:
    return next(m for m in manifest["models"] if m["name"] == name)


def _load(name: str, manifest: dict) -> onnx.ModelProto:
    return onnx.load(str(SAMPLES / _entry(manifest, name)["file"]))


def _session(model: onnx.ModelProto | pathlib.Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    src = str(model) if isinstance(model, pathlib.Path) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _run(model, feeds: dict) -> dict[str, np.ndarray]:
    sess = _session(model)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _run_all(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Run ORT with every top-level node output exposed as a graph output."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}
    edited = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in edited.graph.output}
    for node in edited.graph.node:
        for out in node.output:
            if out not in existing:
                edited.graph.output.append(helper.make_tensor_value_info(out, types[out], None))
    return _run(edited, feeds)


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    edited = onnx.ModelProto.FromString(model.SerializeToString())
    edited.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    return edited


def _feeds(entry: dict, seed: int = 0) -> dict[str, np.ndarray]:
    if "sample_inputs" in entry:
        return dict(np.load(SAMPLES / entry["sample_inputs"]["file"]))
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, spec in entry["inputs"].items():
        if spec["dtype"] == "bool":
            feeds[name] = np.array(True)
        else:
            feeds[name] = rng.standard_normal(spec["shape"]).astype(np.float32)
    return feeds


def _init(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def _to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(model, keep_io_types=True)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def _sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    noise = np.sum((ref - test.astype(np.float64)) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref**2) / noise))


def _all_graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_graphs(attr.g)


# -------------------------------------------------------------------------------------- determinism, schema


def test_regeneration_is_byte_identical(tmp_path, manifest):
    built = _load_script().build_all(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(SAMPLES) for p in SAMPLES.rglob("*") if p.is_file())
    assert set(fresh) <= set(committed), "run scripts/make_sample_models.py and commit sample_models/"
    artifacts = {".onnx", ".bin", ".npz", ".json"}
    assert not [p for p in committed if p.suffix in artifacts and p not in fresh], "stale sample artifacts"
    assert not [p for p in fresh if any(part.startswith(".") for part in p.parts)], "temp files left behind"
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (SAMPLES / rel).read_bytes(), f"{rel} differs"
    assert built == manifest


def test_manifest(manifest):
    import hashlib

    assert manifest["schema"] == "workbench.samples/1"
    assert manifest["generator"] == "scripts/make_sample_models.py"
    assert [m["name"] for m in manifest["models"]] == MODEL_NAMES
    for entry in manifest["models"]:
        path = SAMPLES / entry["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        assert path.stat().st_size < 1_000_000
        model = onnx.load(str(path))
        assert entry["nodes"] == len(model.graph.node)
        fault = entry["fault"]
        assert set(fault) >= {"kind", "node", "tensor", "op_type", "pair", "explanation"}
        # FP16 arithmetic overflow reaches the outputs only in FP16 arithmetic (ref:fp16); ORT's CPU provider
        # computes in FP32 and keeps it an internal dip, so those faults name the ref/ref:fp16 pair
        expected = "ref" if fault["kind"] == "fp16_overflow" else "ort"
        assert fault["pair"]["reference"] == expected
        if fault["kind"] is None:
            continue
        nodes = {n.name: n for g in _all_graphs(model.graph) for n in g.node}
        assert nodes[fault["node"]].op_type == fault["op_type"]
        assert fault["tensor"] in nodes[fault["node"]].output
    ext = _entry(manifest, "mlp_external")
    assert ext["external_data"] == ["weights.bin"]
    weights = SAMPLES / "external_data" / "weights.bin"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == ext["external_data_sha256"]["weights.bin"]
    assert weights.stat().st_size < 1_000_000
    tb = _entry(manifest, "transformer_block")
    assert tb["inputs"]["attention_mask"]["recipe"] == "causal -inf mask"
    assert "/block/attn/mask/Add_output_0" in tb["nonfinite_by_design"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_is_valid_and_runs(name, manifest):
    entry = _entry(manifest, name)
    path = SAMPLES / entry["file"]
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.graph.doc_string
    names = [n.name for g in _all_graphs(model.graph) for n in g.node]
    tensors = [o for g in _all_graphs(model.graph) for n in g.node for o in n.output]
    assert all(n.startswith("/") for n in names) and len(set(names)) == len(names)
    assert len(set(tensors)) == len(tensors)
    outputs = _run(path, _feeds(entry))  # by path, so external data resolves from its folder
    assert all(np.isfinite(v).all() for v in outputs.values())


# -------------------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("dist", ["normal", "uniform"])
def test_cnn_fp16_overflow(dist, manifest):
    model = _load("cnn_fp16_overflow", manifest)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 32, 32)) if dist == "normal" else rng.uniform(0, 1, (1, 3, 32, 32))
    feeds = {"image": x.astype(np.float32)}
    acts = _run_all(model, feeds)
    planted = "/stage2/conv/Conv_output_0"
    assert np.abs(acts[planted]).max() > 1e5
    with np.errstate(over="ignore"):
        assert np.isinf(acts[planted].astype(np.float16)).any()
    over = {k for k, v in acts.items() if np.abs(v).max() > FP16_MAX}
    assert over == {planted}
    order = [n.output[0] for n in model.graph.node]
    assert all(np.abs(acts[t]).max() < 1000 for t in order[: order.index(planted)])
    assert np.isfinite(acts["logits"]).all() and np.abs(acts["logits"]).max() < 100
    # True FP16 arithmetic (numpy reference evaluator on the converted model) turns the logits non-finite.
    with np.errstate(over="ignore", invalid="ignore"):
        y16 = ReferenceEvaluator(_to_fp16(model)).run(None, feeds)[0]
    assert not np.isfinite(y16).all()


def test_transformer_ln2_square_overflows(manifest):
    entry = _entry(manifest, "transformer_block")
    model = _load("transformer_block", manifest)
    feeds = _feeds(entry)
    mask = feeds["attention_mask"]
    assert mask.shape == (1, 1, 16, 16) and mask.dtype == np.float32
    assert np.all(np.isneginf(mask[0, 0][np.triu_indices(16, 1)]))
    assert np.all(mask[0, 0][np.tril_indices(16)] == 0)
    x0 = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    np.testing.assert_array_equal(feeds["x"], x0)
    acts = _run_all(model, feeds)
    planted = entry["fault"]["tensor"]
    assert planted == "/block/ln2/Pow_output_0"
    assert np.abs(acts[planted]).max() > 2 * FP16_MAX
    masked = acts["/block/attn/mask/Add_output_0"]
    assert np.isneginf(masked).any() and not np.isposinf(masked).any() and not np.isnan(masked).any()
    assert np.isfinite(acts["/block/attn/softmax/Softmax_output_0"]).all()
    order = [n.output[0] for n in model.graph.node]
    for t in order[: order.index(planted)]:
        finite = acts[t][np.isfinite(acts[t])]
        assert np.abs(finite).max() < FP16_MAX, t
        if t != "/block/attn/mask/Add_output_0":
            assert np.isfinite(acts[t]).all(), t
    assert np.isfinite(acts["y"]).all()
    # Robust to the input draw, not just the stored feed.
    for seed in (1, 2, 3):
        x = np.random.default_rng(seed).standard_normal((1, 16, 64)).astype(np.float32)
        assert np.abs(_run_all(model, {"x": x, "attention_mask": mask})[planted]).max() > FP16_MAX


def test_fp16_clamp_constant(manifest):
    model = _load("fp16_clamp_constant", manifest)
    var = _init(model, "/bn_big_var/running_var")
    assert var[3] == np.float32(9.8e7) and np.all(np.delete(var, 3) < 2)
    assert _init(model, "/head/eps").item() == np.float32(1e-9)
    assert np.abs(_init(model, "/conv/weight")).max() < 1e4  # only the BN variance gets clamped
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)}
    acts = _run_all(model, feeds)
    assert np.abs(acts["/conv/Conv_output_0"][0, 3]).max() > 5000
    assert np.abs(acts["/bn_big_var/BatchNormalization_output_0"]).max() < 10  # sane in FP32

    fp16 = _to_fp16(model)
    var16 = _init(fp16, "/bn_big_var/running_var")
    assert var16.dtype == np.float16 and var16[3] == np.float16(1e4)
    assert _init(fp16, "/head/eps").item() == np.float16(1e-7)
    y32, y16 = acts["logits"], _run(fp16, feeds)["logits"]
    assert _rel_err(y16, y32) > 10


def test_healthy_cnn_fp16_is_only_rounding(manifest):
    model = _load("healthy_cnn", manifest)
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    ref = _run_all(model, feeds)
    fp16 = _to_fp16(model)
    assert _rel_err(_run(fp16, feeds)["logits"], ref["logits"]) < 1e-2
    # Per-tensor SQNR under true FP16 arithmetic (reference evaluator on the converted model).
    names = [n.output[0] for n in model.graph.node]
    exposed = onnx.ModelProto.FromString(fp16.SerializeToString())
    exposed.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT16, None)
                                for t in names if t != "logits")
    order = ["logits"] + [t for t in names if t != "logits"]
    got = dict(zip(order, ReferenceEvaluator(exposed).run(None, feeds)))
    for t in names:
        assert _sqnr_db(ref[t], got[t]) > 40, t


def test_int8_outlier(manifest):
    entry = _entry(manifest, "int8_outlier")
    calib = entry["calibration"]
    assert (calib["seed"], calib["count"]) == (0, 32)
    model = _load("int8_outlier", manifest)
    rng = np.random.default_rng(calib["seed"])
    sess = _session(_with_outputs(model, ["/mlp/fc2/Add_output_0"]))
    feeds = [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(calib["count"])]
    acts = np.concatenate([sess.run(["/mlp/fc2/Add_output_0"], f)[0] for f in feeds])
    col = entry["fault"]["outlier_channel"]
    assert np.all((np.abs(acts[:, col]) > 150) & (np.abs(acts[:, col]) < 600))
    ordinary = np.delete(acts, col, axis=1)
    assert np.abs(ordinary).max() < 10
    assert acts[:, col].size / acts.size < 1e-3  # outliers are under 0.1% of elements

    def fake_quant(t: np.ndarray, amax: float) -> np.ndarray:
        scale = amax / 127
        return np.clip(np.round(t / scale), -127, 127) * scale

    sqnr_max = _sqnr_db(ordinary, np.delete(fake_quant(acts, np.abs(acts).max()), col, axis=1))
    sqnr_pct = _sqnr_db(ordinary, np.delete(fake_quant(acts, np.percentile(np.abs(acts), 99.9)), col, axis=1))
    assert sqnr_max < 20
    assert sqnr_pct > 30 and sqnr_pct > sqnr_max + 20


def test_if_subgraph_exp_overflow(manifest):
    model = _load("if_subgraph", manifest)
    if_node = next(n for n in model.graph.node if n.name == "/branch/If")
    then_g = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert "/branch/then/Exp" in [n.name for n in then_g.node]
    then_w = {t.name: numpy_helper.to_array(t) for t in then_g.initializer}
    else_g = next(a.g for a in if_node.attribute if a.name == "else_branch")
    else_w = {t.name: numpy_helper.to_array(t) for t in else_g.initializer}
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    h = x @ _init(model, "/pre/weight") + _init(model, "/pre/bias")
    e = np.exp(h * then_w["/branch/then/scale"] + then_w["/branch/then/shift"])
    with np.errstate(over="ignore"):
        assert e.max() > FP16_MAX and np.isinf(e.astype(np.float16)).any()
    bias = _init(model, "/post/bias")
    y_then = _run(model, {"x": x, "use_exp": np.array(True)})["y"]
    np.testing.assert_allclose(y_then, e / then_w["/branch/then/divisor"] + bias, rtol=1e-4)
    assert np.isfinite(y_then).all() and np.abs(y_then).max() < 1000
    y_else = _run(model, {"x": x, "use_exp": np.array(False)})["y"]
    expected = np.maximum(h @ else_w["/branch/else/weight"], 0) + bias
    np.testing.assert_allclose(y_else, expected, rtol=1e-4, atol=1e-5)


def test_external_weights_flush_to_zero(manifest):
    entry = _entry(manifest, "mlp_external")
    path = SAMPLES / entry["file"]
    raw = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in raw.graph.initializer)
    model = onnx.load(str(path))
    w = _init(model, "/fc2/weight")
    assert 0 < np.abs(w).min() and np.abs(w).max() < 2.98e-8  # below half the smallest FP16 subnormal
    assert not np.any(w.astype(np.float16))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)}
    y32 = _run(path, feeds)["y"]
    assert np.isfinite(y32).all() and np.abs(y32).max() > 1e-3
    # Plain FP16 cast of every float initializer (values only): y collapses to exactly 0, nothing else breaks.
    cast = onnx.ModelProto.FromString(model.SerializeToString())
    for t in cast.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            rounded = numpy_helper.to_array(t).astype(np.float16).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(rounded, t.name))
    y16 = _run(cast, feeds)["y"]
    assert np.isfinite(y16).all() and not np.any(y16)
