"""Engine adapters against independent answers: numpy, float64 evaluation, a second runtime, torch itself.

ORT CPU, OpenVINO, the float64 reference and torch really run here; the GPU engines (ort-cuda, ort-trt, trt) are
checked for honest unavailability (no silent CPU fallback) and TensorRT's GPU tests skip with a reason.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.engines import available_engines, engine_class, get_engine, should_isolate
from workbench.errors import EngineRunError, EngineUnavailableError, SpecError

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_models"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
SAMPLE_NAMES = [m["name"] for m in MANIFEST["models"]]


def _entry(name: str) -> dict:
    return next(m for m in MANIFEST["models"] if m["name"] == name)


def _sample(name: str) -> onnx.ModelProto:
    from workbench.model.load import load_model

    return load_model(SAMPLES / _entry(name)["file"]).proto


def _feeds(name: str) -> dict[str, np.ndarray]:
    entry = _entry(name)
    if "sample_inputs" in entry:
        return dict(np.load(SAMPLES / entry["sample_inputs"]["file"]))
    rng = np.random.default_rng(0)
    return {k: np.array(True) if v["dtype"] == "bool" else rng.standard_normal(v["shape"]).astype(np.float32)
            for k, v in entry["inputs"].items()}


def _top_level_tensors(model: onnx.ModelProto) -> list[str]:
    return [o for node in model.graph.node for o in node.output if o]


def _normalised_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over finite elements; non-finite elements must sit at the same places."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    if not finite.any():
        return 0.0
    scale = np.abs(want[finite]).max()
    return float(np.abs(got[finite] - want[finite]).max() / scale) if scale else float(np.abs(got[finite]).max())


# ---------------------------------------------------------------------------------------------------- ORT (a)


def test_ort_cpu_marks_intermediates_matches_numpy(tiny):
    x = np.array([[1.0, -2.0, 3.0, -4.0]], np.float32)
    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
    engine = get_engine("ort")
    with engine.prepare(tiny, ["h", "y", "x"]) as session:
        out = session.run({"x": x})
    assert set(out) == {"h", "y", "x"}
    np.testing.assert_allclose(out["h"], x @ w, rtol=1e-6)
    np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-6)
    assert (x @ w < 0).any() and (out["y"] >= 0).all()  # Relu really clipped something
    assert tiny.graph.output[0].name == "y" and len(tiny.graph.output) == 1  # caller's model untouched
    info = engine.describe()
    assert info["engine"] == "ort" and info["providers"] == ["CPUExecutionProvider"] and info["device"] == "cpu"
    assert info["onnxruntime"] and info["graph_optimization"] == "all"


@pytest.mark.parametrize("level", ["all", "basic", "disable"])
def test_ort_optimization_levels_agree(level):
    model, feeds = _sample("healthy_cnn"), _feeds("healthy_cnn")
    names = _top_level_tensors(model)
    base = get_engine("ort", graph_optimization="disable").prepare(model, names).run(feeds)
    got = get_engine("ort", graph_optimization=level, threads=1).prepare(model, names).run(feeds)
    assert max(_normalised_error(got[n], base[n]) for n in names) < 1e-5


def test_ort_threads_from_the_environment(monkeypatch, capsys):
    """WORKBENCH_ORT_THREADS caps every ORT session not given threads (scripts/test.sh sets 1 for its test workers); the
    answer is the reference evaluator's; a bad value is one clear line from the CLI, not a traceback."""
    from workbench.cli import main

    model, feeds = _sample("healthy_cnn"), _feeds("healthy_cnn")
    names = _top_level_tensors(model)
    monkeypatch.setenv("WORKBENCH_ORT_THREADS", "1")
    engine = get_engine("ort")
    session = engine.prepare(model, names)
    assert session._session.get_session_options().intra_op_num_threads == 1
    assert engine.describe()["threads"] == 1 and get_engine("ort", threads=2).threads == 2  # given beats the env
    got, want = session.run(feeds), get_engine("ref").prepare(model, names).run(feeds)
    assert max(_normalised_error(got[n], want[n]) for n in names) < 1e-5
    for bad in ("0", "two", "1\nverdict: ok"):
        monkeypatch.setenv("WORKBENCH_ORT_THREADS", bad)
        assert main(["compare", str(SAMPLES / _entry("healthy_cnn")["file"]), "--cand", "ort:fp16"]) == 2
        err = capsys.readouterr().err
        assert "WORKBENCH_ORT_THREADS=" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_ort_errors_are_one_line_and_name_the_node():
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="/fc/MatMul")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 99
    with pytest.raises(EngineRunError, match=r"could not create a session: Unsupported model IR version: 99"):
        get_engine("ort").prepare(model, ["y"])
    model.ir_version = 8
    unknown = onnx.ModelProto()
    unknown.CopyFrom(model)
    unknown.graph.node.append(helper.make_node("FooBar", ["y"], ["z"], name="/x/FooBar"))
    with pytest.raises(EngineRunError, match=r"could not create a session at node /x/FooBar: .*No Op registered"):
        get_engine("ort").prepare(unknown, ["z"])
    session = get_engine("ort").prepare(model, ["y"])
    with pytest.raises(EngineRunError) as err:
        session.run({"x": np.ones((1, 5), np.float32)})
    assert "/fc/MatMul" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EngineRunError, match="no_such_tensor"):
        get_engine("ort").prepare(model, ["no_such_tensor"])


def test_ort_large_model_goes_through_a_private_external_data_file(monkeypatch):
    from workbench.engines import serialize

    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    monkeypatch.setattr(serialize, "PROTOBUF_LIMIT", 1024)  # pretend 16 KB is past protobuf's 2 GB limit
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    session = get_engine("ort").prepare(model, ["h", "y"])
    folder = Path(session._payload.source).parent
    assert (folder / "weights.bin").stat().st_size == w.nbytes and folder != Path.cwd()
    out = session.run({"x": x})
    np.testing.assert_allclose(out["h"], x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    session.close()
    assert not folder.exists()
    pytest.importorskip("openvino")
    np.testing.assert_allclose(get_engine("openvino").prepare(model, ["y"]).run({"x": x})["y"], out["y"],
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ ORT GPU honesty (d)


@pytest.mark.parametrize("name, provider", [("ort-cuda", "CUDAExecutionProvider"),
                                            ("ort-trt", "TensorrtExecutionProvider")])
def test_ort_gpu_providers_are_unavailable_here_and_refuse_to_run(tiny, name, provider):
    import onnxruntime as ort

    if provider in ort.get_available_providers():
        pytest.skip(f"{provider} is available on this machine")
    engine = get_engine(name)
    available, reason = engine.availability()
    assert not available and provider in reason and "onnxruntime-gpu" in reason
    row = next(r for r in available_engines() if r["name"] == name)
    assert row["available"] is False and provider in row["reason"]
    with pytest.raises(EngineUnavailableError, match=provider):
        engine.prepare(tiny, ["y"])
    assert should_isolate(name)


def test_silent_cpu_fallback_is_detected(monkeypatch, tiny):
    """Pretend the CUDA provider is available: CPU-only ORT then really falls back to CPU, which must be refused."""
    import onnxruntime as ort

    from workbench.engines import ort as ort_engine

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA provider really available here")
    monkeypatch.setattr(ort_engine, "_unavailable", lambda provider: None)
    with pytest.warns(UserWarning), pytest.raises(EngineUnavailableError) as err:  # ORT's own fallback warning
        get_engine("ort-cuda").prepare(tiny, ["y"])
    text = str(err.value)
    assert "silently fell back from CUDAExecutionProvider to CPUExecutionProvider" in text
    assert "onnxruntime_providers_cuda" in text and "onnxruntime-gpu" in text and "\n" not in text


def test_ort_distribution_clash_is_logged(monkeypatch, caplog):
    from workbench.engines import ort as ort_engine

    monkeypatch.setattr(ort_engine, "installed_ort_distributions",
                        lambda: ["onnxruntime==1.31.1", "onnxruntime-gpu==1.31.1"])
    with caplog.at_level(logging.WARNING, logger="workbench.engines.ort"):
        assert ort_engine.warn_if_distributions_clash.__wrapped__() is True
    assert "onnxruntime==1.31.1 and onnxruntime-gpu==1.31.1" in caplog.text and "pip uninstall" in caplog.text


# ------------------------------------------------------------------------------------ float64 reference (b)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_reference_float64_agrees_with_ort(name):
    model, feeds = _sample(name), _feeds(name)
    names = _top_level_tensors(model)
    ref = get_engine("ref").prepare(model, names).run(feeds)
    ort_out = get_engine("ort").prepare(model, names).run(feeds)
    assert all(ref[n].dtype == np.float64 for n in names if ort_out[n].dtype == np.float32)
    errors = {n: _normalised_error(ort_out[n], ref[n]) for n in names}
    assert max(errors.values()) < 1e-4, errors
    assert get_engine("ref").describe() == {"engine": "ref", "onnx": onnx.__version__, "dtype": "float64"}


def test_reference_widens_every_float():
    from workbench.engines.reference import to_float64

    then = helper.make_graph([helper.make_node("Cast", ["c"], ["t"], to=TensorProto.FLOAT)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])
    nodes = [
        helper.make_node("Constant", [], ["c"], value_float=0.1),
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array([0.5], np.float16))),
        helper.make_node("Cast", ["half"], ["half32"], to=TensorProto.FLOAT),
        helper.make_node("ConstantOfShape", ["shape"], ["fill"],
                         value=numpy_helper.from_array(np.array([0.1], np.float32))),
        helper.make_node("RandomNormal", [], ["noise"], dtype=TensorProto.FLOAT, shape=[1], scale=0.0),
        helper.make_node("If", ["flag"], ["branch"], then_branch=then, else_branch=then),
        helper.make_node("Add", ["branch", "half32"], ["s1"]),
        helper.make_node("Add", ["s1", "fill"], ["s2"]),
        helper.make_node("Add", ["s2", "noise"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([1], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    wide = to_float64(model)
    text = str(wide)
    assert "elem_type: 1\n" not in text and "data_type: 1\n" not in text and "data_type: 10\n" not in text
    out = get_engine("ref").prepare(model, ["y", "c", "half32"]).run({"flag": np.array(True)})
    assert out["y"].dtype == np.float64 and out["c"].dtype == np.float64
    # the attributes hold float32 0.1; everything after that is float64 (a float32 sum would round differently)
    assert out["y"][0] == 2 * float(np.float32(0.1)) + 0.5
    assert model.graph.node[0].attribute[0].name == "value_float"  # caller's model untouched


def test_reference_reports_missing_op_and_subgraph_tensors():
    graph = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], domain="custom.ops", name="/x/Fancy")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)])
    with pytest.raises(EngineRunError, match="FancyOp"):
        get_engine("ref").prepare(model, ["y"])
    with pytest.raises(EngineRunError, match="If/Loop/Scan"):
        get_engine("ref").prepare(_sample("if_subgraph"), ["/branch/then/Exp_output_0"])


# --------------------------------------------------------------------------------------------- OpenVINO (c)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_openvino_agrees_with_ort_on_every_tensor(name):
    pytest.importorskip("openvino")
    model, feeds = _sample(name), _feeds(name)
    names = _top_level_tensors(model)
    engine = get_engine("openvino")
    ov_out = engine.prepare(model, names).run(feeds)
    ort_out = get_engine("ort").prepare(model, names).run(feeds)
    common = [n for n in names if n in ov_out and n in ort_out]
    assert len(common) == len(names)
    errors = {n: _normalised_error(ov_out[n], ort_out[n]) for n in common}
    assert max(errors.values()) < 1e-4, errors
    info = engine.describe()
    assert info["inference_precision_hint"] == "f32" and "float32" in info["inference_precision"]


def test_openvino_missing_output_is_a_clear_error():
    pytest.importorskip("openvino")
    from workbench.engines.openvino_engine import _map_ports

    class Port:
        def __init__(self, names):
            self._names = names

        def get_names(self):
            return self._names

    class Compiled:
        outputs = [Port({"a"}), Port(set())]

    with pytest.raises(EngineRunError, match="no output for marked tensor.*'?b"):
        _map_ports(Compiled(), ["a", "b", "c"])
    assert list(_map_ports(Compiled(), ["a", "b"])) == ["a", "b"]  # one port per marked tensor: by position


# ------------------------------------------------------------------------------------------------- torch (e)


def _torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.bn(self.conv(x)) + x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            self.layer1 = nn.Sequential(Block(), Block())
            self.drop = nn.Dropout(0.5)
            self.fc1 = nn.Linear(4 * 8 * 8, 16)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(16, 10)

        def forward(self, x):
            h = self.drop(self.layer1(self.stem(x)))
            return self.fc2(self.act(self.fc1(h.flatten(1))))

    torch.manual_seed(0)
    net = Net()
    for block in net.layer1:  # non-trivial BatchNorm statistics, so a pre-BN value cannot pass for the fused one
        block.bn.running_mean.uniform_(-1, 1)
        block.bn.running_var.uniform_(0.5, 2.0)
        block.bn.weight.data.uniform_(0.5, 2.0)
    return torch, net


def test_torch_engine_maps_module_outputs_to_ort_tensors():
    torch, net = _torch_net()
    from workbench.model.load import load_model

    x = torch.randn(1, 3, 8, 8)
    net.eval()
    model = load_model(net, example_inputs=(x,)).proto
    net.train()
    net.layer1[0].eval()  # mixed flags, which the engine must restore
    flags = {name: m.training for name, m in net.named_modules()}
    names = _top_level_tensors(model)
    feeds = {model.graph.input[0].name: x.numpy()}

    engine = get_engine("torch", module=net, example_inputs=(x,))
    got = engine.prepare(model, names).run(feeds)
    want = get_engine("ort").prepare(model, names).run(feeds)

    assert {name: m.training for name, m in net.named_modules()} == flags
    convs_and_linears = [n for n in names if n.endswith(("/Conv_output_0", "/Gemm_output_0"))]
    assert len(convs_and_linears) == 4 and all(n in got for n in convs_and_linears)
    assert model.graph.output[0].name in got  # fc2's Gemm is the graph output
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    info = engine.describe()
    assert info["mapped_tensors"] == len(got) and info["requested_tensors"] == len(names)


def test_torch_scope_prefix_follows_the_legacy_exporter():
    pytest.importorskip("torch")
    from workbench.engines.torch_engine import scope_prefix

    assert scope_prefix("fc1") == "/fc1/"
    assert scope_prefix("layer1.0.conv1") == "/layer1/layer1.0/conv1/"
    assert scope_prefix("head.1") == "/head/head.1/"
    assert scope_prefix("a.0.1") == "/a/a.0/a.0.1/"
    # a ModuleList iterated in forward() is never called itself: its items' scopes sit at the top
    from workbench.engines.torch_engine import scope_prefixes

    assert scope_prefixes("layers.0.ln1") == ["/layers/layers.0/ln1/", "/layers.0/ln1/"]
    assert scope_prefixes("fc1") == ["/fc1/"]


# -------------------------------------------------------------------------------------------- TensorRT (f)


def test_tensorrt_unavailable_here_with_reason():
    from workbench.engines.tensorrt import TensorRTEngine

    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorrt is installed here")
    available, reason = TensorRTEngine.availability()
    assert not available
    assert reason == ("tensorrt is not installed (needs an NVIDIA GPU and the TensorRT wheels: "
                      "pip install onnx-drift-workbench[gpu])")
    with pytest.raises(EngineUnavailableError, match="tensorrt is not installed"):
        TensorRTEngine().prepare(onnx.ModelProto(), ["y"])
    assert TensorRTEngine.marks_all_cheaply is False and should_isolate("trt") and should_isolate("trt:fp16")


def test_tensorrt_cache_key_and_precision_flags(tiny):
    from workbench.engines.tensorrt import engine_cache_key, precision_flags

    key = engine_cache_key("abc", ["h", "y"], "10.8.0", {"strongly_typed": True})
    assert len(key) == 64 and key == engine_cache_key("abc", ["y", "h", "y"], "10.8.0", {"strongly_typed": True})
    assert len({key, engine_cache_key("abd", ["h", "y"], "10.8.0", {"strongly_typed": True}),
                engine_cache_key("abc", ["h"], "10.8.0", {"strongly_typed": True}),
                engine_cache_key("abc", ["h", "y"], "11.0.0", {"strongly_typed": True}),
                engine_cache_key("abc", ["h", "y"], "10.8.0", {"strongly_typed": False})}) == 5
    assert precision_flags(tiny) == {}
    half = onnx.ModelProto()
    half.CopyFrom(tiny)
    half.graph.node.insert(0, helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16))
    assert precision_flags(half) == {"fp16": True, "precision_constraints": "obey"}


@pytest.mark.trt
def test_tensorrt_matches_ort_on_healthy_cnn(tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT not installed: needs an NVIDIA GPU (pip install "
                                           "onnx-drift-workbench[gpu])")
    model, feeds = _sample("healthy_cnn"), _feeds("healthy_cnn")
    names = _top_level_tensors(model)
    engine = get_engine("trt", engine_cache_dir=str(tmp_path))
    got = engine.prepare(model, names).run(feeds)
    want = get_engine("ort").prepare(model, names).run(feeds)
    assert model.graph.output[0].name in got
    for name in got:
        assert _normalised_error(got[name], want[name]) < 1e-3, name
    assert list(tmp_path.glob("*.engine"))
    assert get_engine("trt", engine_cache_dir=str(tmp_path)).prepare(model, names).run(feeds).keys() == got.keys()


# --------------------------------------------------------------------------------------------------- registry


def test_registry_and_specs():
    from workbench.engines.ort import OrtEngine

    assert isinstance(get_engine("ort:fp16"), OrtEngine)
    assert get_engine("ort-cuda").provider == "cuda" and get_engine("ort-trt").marks_all_cheaply is False
    assert engine_class("engine_fixtures:MisbehavingEngine")[0].__name__ == "MisbehavingEngine"
    assert not should_isolate("ort") and not should_isolate("openvino")
    with pytest.raises(SpecError):
        get_engine("nope")
    with pytest.raises(SpecError):
        get_engine("ort", graph_optimization="max")
    rows = {r["name"]: r for r in available_engines()}
    assert set(rows) == {"ort", "ort-cuda", "ort-trt", "openvino", "ref", "torch", "torch-cuda", "trt"}
    assert rows["ort"]["available"] and rows["ref"]["available"]
    assert all(set(r) == {"name", "description", "available", "reason", "variants"} for r in rows.values())
    assert rows["ref"]["variants"] == ("fp32", "fp16") and rows["ort"]["variants"] == ("fp32", "fp16", "int8")
    assert all(r["reason"] for r in rows.values() if not r["available"])


def test_importing_engines_stays_light():
    import subprocess
    import sys

    code = ("import sys, workbench.engines, workbench.engines.ort, workbench.engines.openvino_engine, "
            "workbench.engines.reference, workbench.engines.torch_engine, workbench.engines.torch_cuda, "
            "workbench.engines.tensorrt, workbench.engines.fp16_arith, "
            "workbench.engines.isolated; "
            "print([m for m in ('onnxruntime', 'openvino', 'torch', 'tensorrt', 'polygraphy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_class_path_is_a_spec_with_its_own_variant():
    """A new engine is one file: ``package.module:Class[:VARIANT]`` works as a spec without registering."""
    from workbench.compare.api import compare
    from workbench.engines.spec import EngineSpec

    spec = EngineSpec.parse("engine_fixtures:CountingReference:fp16")
    assert spec.engine == "engine_fixtures:CountingReference" and spec.variant == "fp16"
    assert str(spec) == "engine_fixtures:CountingReference:fp16"
    with pytest.raises(SpecError, match="no int8 variant"):
        EngineSpec.parse("engine_fixtures:CountingReference:int8")
    before = __import__("engine_fixtures").CountingReference.sessions
    ours = compare(SAMPLES / "fp16_clamp_constant.onnx", "ort", "engine_fixtures:CountingReference:fp16")
    builtin = compare(SAMPLES / "fp16_clamp_constant.onnx", "ort", "ref:fp16")
    assert __import__("engine_fixtures").CountingReference.sessions > before
    assert ours.candidate == "engine_fixtures:CountingReference:fp16"
    assert [c.node for c in ours.culprits][:1] == [c.node for c in builtin.culprits][:1]
    assert ours.tensor("logits").metrics["sqnr_db"] == pytest.approx(builtin.tensor("logits").metrics["sqnr_db"])


def test_entry_points_register_third_party_engines(tmp_path, monkeypatch):
    import sys

    from workbench.engines import registry
    from workbench.engines.spec import EngineSpec

    dist = tmp_path / "thirdparty_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[workbench.engines]\ncounting = engine_fixtures:CountingReference\n"
                                           "ort = engine_fixtures:CountingReference\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    registry.registered.cache_clear()
    try:
        names = registry.registered()
        assert names["counting"] == "engine_fixtures:CountingReference"
        assert names["ort"] == registry.BUILTIN["ort"]  # an entry point cannot shadow a built-in engine
        assert EngineSpec.parse("counting:fp16") == EngineSpec("counting", "fp16")
        row = next(r for r in available_engines() if r["name"] == "counting")
        assert row["available"] and row["description"].startswith("onnx reference evaluator")
    finally:
        monkeypatch.undo()
        registry.registered.cache_clear()
    assert "counting" not in registry.registered()


def test_ref_runs_opset_13_qdq_models_as_numpy_computes_them():
    """onnx 1.23's evaluator has no DequantizeLinear before opset 19: the Q/DQ models ONNX Runtime's quantize_static
    writes (opset 13) ran nowhere but ORT. Truth: Q/DQ by hand in numpy (round half to even, saturate)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 127, (3, 4)).astype(np.int8)
    ws = np.array([0.1, 0.02, 0.5], np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),  # per channel
             helper.make_node("MatMul", ["wd", "xd"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
                              [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                               numpy_helper.from_array(np.array(3, np.uint8), "z"),
                               numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.normal(size=(4, 2)).astype(np.float32) * 8
    x[0, 0] = 20.0  # saturates at 255
    xd = ((np.clip(np.round(x / np.float32(0.05)) + 3, 0, 255) - 3) * np.float32(0.05)).astype(np.float32)
    truth = (w.astype(np.float32) * ws[:, None]) @ xd
    with get_engine("ref", precision="native").prepare(model, ["y", "xq"]) as session:
        got = session.run({"x": x})
    assert got["xq"].dtype == np.uint8 and got["xq"][0, 0] == 255 and (got["xq"] == 0).any()
    np.testing.assert_allclose(got["y"], truth, rtol=1e-6, atol=1e-6)


def test_a_closed_reference_session_frees_its_evaluator_at_once():
    """onnx's ReferenceEvaluator and its operators reference each other: a closed session's evaluator and the
    weights it holds waited for a garbage collection, which counts objects, not bytes (2.6 GB of a 0.9 GB decoder's
    FP16-arithmetic repair). Closing collects it."""
    import gc
    import weakref

    from workbench.compare.plan import make_engine
    from workbench.engines.spec import EngineSpec

    model = onnx.load(str(SAMPLES / "transformer_block.onnx"))
    feeds = dict(np.load(SAMPLES / "transformer_block_inputs.npz"))
    session = make_engine(EngineSpec.parse("ref")).prepare(model, [o.name for o in model.graph.output])
    expected = session.run(feeds)
    evaluator = weakref.ref(session._evaluator)
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection may stand in for the close
    try:
        session.close()
        assert evaluator() is None
    finally:
        if enabled:
            gc.enable()
    assert all(np.isfinite(v).all() for v in expected.values())


def test_a_closed_reference_session_frees_its_subgraph_evaluators_too():
    """An If node's branches get ReferenceEvaluators of their own, each in the same kind of cycle: closing frees them
    with the outer one, without a garbage collection (a full collection costs ~0.2 s in a kernel that has loaded
    plotly and ipywidgets, and a repair closes one session per build)."""
    import gc
    import weakref

    from workbench.compare.plan import make_engine
    from workbench.engines.spec import EngineSpec

    def branch(name: str, value: float) -> onnx.GraphProto:
        c = helper.make_node("Constant", [], [f"{name}_c"],
                             value=numpy_helper.from_array(np.full(4, value, np.float32)))
        return helper.make_graph([c, helper.make_node("Add", ["x", f"{name}_c"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4])])

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("t", 1.0), else_branch=branch("e", -1.0))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [numpy_helper.from_array(np.float32(0), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = make_engine(EngineSpec.parse("ref")).prepare(model, ["y"])
    np.testing.assert_array_equal(session.run({"x": np.ones(4, np.float32)})["y"], np.full(4, 2.0))  # 1 + 1
    np.testing.assert_array_equal(session.run({"x": -np.ones(4, np.float32)})["y"], np.full(4, -2.0))  # -1 - 1
    evaluators = [weakref.ref(session._evaluator)] + [
        weakref.ref(v) for node in session._evaluator.rt_nodes_ for v in vars(node).values() if hasattr(v, "rt_nodes_")]
    assert len(evaluators) == 3
    enabled = gc.isenabled()
    gc.disable()
    try:
        collections = sum(s["collections"] for s in gc.get_stats())
        session.close()
        assert [e() for e in evaluators] == [None, None, None]
        assert sum(s["collections"] for s in gc.get_stats()) == collections  # broken, not collected
    finally:
        if enabled:
            gc.enable()


def test_a_closed_reference_session_frees_function_nodes_that_point_back_at_it():
    """Gelu at opset 20 runs as its function body; where the evaluator does not know its input type it makes a
    context-dependent node that holds the evaluator itself (``parent``) and itself (``impl_``). Closing frees them
    all without a collection (each evaluator visited once: following ``parent`` again multiplied the work per such
    node)."""
    import gc
    import weakref

    from workbench.compare.plan import make_engine
    from workbench.engines.spec import EngineSpec

    nodes = [helper.make_node("Gelu", [f"g{i - 1}" if i else "x"], [f"g{i}"], name=f"gelu{i}") for i in range(3)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("g2", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    session = make_engine(EngineSpec.parse("ref")).prepare(model, ["g2"])
    x = np.linspace(-2, 2, 4)
    want = x
    for _ in range(3):
        want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2)))
    np.testing.assert_allclose(session.run({"x": x.astype(np.float32)})["g2"], want, rtol=1e-6)
    kinds = [type(n).__name__ for n in session._evaluator.rt_nodes_]
    assert "OpFunctionContextDependant" in kinds, kinds  # the case at hand (onnx 1.23)
    held = [weakref.ref(session._evaluator)] + [weakref.ref(n) for n in session._evaluator.rt_nodes_]
    enabled = gc.isenabled()
    gc.disable()
    try:
        session.close()
        assert [h() for h in held] == [None] * len(held)
    finally:
        if enabled:
            gc.enable()
