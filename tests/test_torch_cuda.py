"""The torch engine on CUDA (``torch-cuda[:fp16|tf32|autocast]``) and the ``ref:fp16`` emulation's arithmetic.

Without a GPU: the spec, the one-line refusal, the same code path on the CPU (PyTorch's CPU half kernels, checked
against numpy), the module-to-ONNX mapping, the emulation against torch's half kernels, and scripts/gpu_check.py
as a dry run. With a GPU (``torch.cuda.is_available()``), the real thing; those tests skip elsewhere, saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from workbench.compare.api import compare  # noqa: E402
from workbench.engines import get_engine  # noqa: E402
from workbench.engines.spec import EngineSpec  # noqa: E402
from workbench.errors import EngineUnavailableError, SpecError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device here (torch.cuda.is_available() is False)")


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """FP16 ulps between a and b (computed here, independently of scripts/gpu_check.py)."""
    def keys(x):
        bits = np.asarray(x, np.float16).view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)
    return np.abs(keys(a) - keys(b))


class _Stack(torch.nn.Module):
    """Linear + LayerNorm layers in a ModuleList iterated in forward() (as BERT-style encoders do)."""

    def __init__(self, width: int = 32, depth: int = 2):
        super().__init__()
        self.inp = torch.nn.Linear(16, width)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.LayerNorm(width)) for _ in range(depth))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


def _export(module, args) -> onnx.ModelProto:
    from workbench.model.load import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return load_model(module.eval(), example_inputs=args).proto


# ------------------------------------------------------------------------------------------------ specs
def test_torch_cuda_specs_name_their_variants():
    for text in ("torch-cuda", "torch-cuda:fp16", "torch-cuda:tf32", "torch-cuda:autocast"):
        assert str(EngineSpec.parse(text)) == text
    with pytest.raises(SpecError, match="no tf32 variant"):
        EngineSpec.parse("ort:tf32")
    with pytest.raises(SpecError, match="no fp16 variant"):
        EngineSpec.parse("torch:fp16")


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the refusal cannot be seen")
def test_torch_cuda_without_a_gpu_is_one_clear_refusal():
    net = _Stack()
    x = torch.randn(2, 16)
    ok, reason = get_engine("torch-cuda", module=net).availability()
    assert not ok and "no CUDA device" in reason
    with pytest.raises(EngineUnavailableError, match="no CUDA device") as info:
        compare(net, "torch", "torch-cuda:fp16", example_inputs=(x,))
    assert "torch" in str(info.value.hint if hasattr(info.value, "hint") else info.value)


def test_onnx_model_with_a_torch_engine_is_refused():
    from tests.conftest import tiny_model

    with pytest.raises(SpecError, match="torch-cuda.*nn.Module"):
        compare(tiny_model(), "ort", "torch-cuda:fp16")


# ------------------------------------------------------------------------------------------------ same path on CPU
def test_fp16_code_path_on_cpu_matches_numpy_and_leaves_the_module_alone():
    torch.manual_seed(0)
    net = _Stack().train()
    x = torch.randn(3, 16)
    model = _export(net, (x,))
    net.train()
    names = [o for n in model.graph.node for o in n.output if o]
    engine = get_engine("torch-cuda:fp16", module=net, example_inputs=(x,), variant="fp16", device="cpu")
    with engine.prepare(model, names) as sess:
        got = sess.run({model.graph.input[0].name: x.numpy()})
    # the caller's module: still float32, on the CPU, in train mode
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in net.parameters())
    assert net.training
    first = next(n for n in names if n.startswith("/inp/") and n in got)
    assert got[first].dtype == np.float16
    w = net.inp.weight.detach().numpy().astype(np.float16).astype(np.float64)
    b = net.inp.bias.detach().numpy().astype(np.float16).astype(np.float64)
    want = (x.numpy().astype(np.float16).astype(np.float64) @ w.T + b).astype(np.float16)
    assert _ulps(got[first], want).max() <= 2
    assert engine.describe()["variant"] == "fp16"


def test_torch_mapping_follows_a_modulelist_iterated_in_forward():
    torch.manual_seed(1)
    net = _Stack(depth=3).eval()
    x = torch.randn(2, 16)
    model = _export(net, (x,))
    names = [o for n in model.graph.node for o in n.output if o]
    feeds = {model.graph.input[0].name: x.numpy()}
    got = get_engine("torch", module=net, example_inputs=(x,)).prepare(model, names).run(feeds)
    want = get_engine("ort").prepare(model, names).run(feeds)
    norms = [n for n in got if "LayerNormalization" in n]
    assert len(norms) == 3  # each layer's LayerNorm, found under /layers.N/ (not /layers/layers.N/)
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


# ------------------------------------------------------------------------------------------------ the emulation
def _layernorm_model(width: int) -> onnx.ModelProto:
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5, name="ln")
    graph = helper.make_graph(
        [node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, width])],
        [numpy_helper.from_array(np.ones(width, np.float16), "s"), numpy_helper.from_array(np.zeros(width, np.float16),
                                                                                           "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_ref_fp16_normalizes_large_rows_as_half_kernels_do():
    """|x - mean| ~ 1e3: squared deviations overflow if held in FP16; half kernels accumulate in FP32."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 256)) * 1000).astype(np.float16)
    model = _layernorm_model(256)
    torch_half = torch.nn.functional.layer_norm(torch.from_numpy(x), (256,), eps=1e-5).numpy()
    xf = x.astype(np.float64)
    truth = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + 1e-5)

    default = get_engine("ref", precision="native").prepare(model, ["y"]).run({"x": x})["y"]
    assert default.dtype == np.float16
    assert _ulps(default, torch_half).max() <= 2
    np.testing.assert_allclose(default, truth, atol=2e-2)
    legacy = get_engine("ref", precision="native", accumulate="float16").prepare(model, ["y"]).run({"x": x})["y"]
    assert not np.allclose(legacy, truth, atol=0.5)  # what the emulation did before: rows wiped out


def test_ref_fp16_still_overflows_where_the_stored_value_does():
    """A sum past 65504 is inf in FP16 on every engine: FP32 accumulation must not hide it."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 8192])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])],
                              [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.full((2, 8192), 10.0, np.float16)
    y = get_engine("ref", precision="native").prepare(model, ["y"]).run({"x": x})["y"]
    assert y.dtype == np.float16 and np.isinf(y).all()
    assert np.isinf(torch.from_numpy(x).sum(-1).numpy()).all()  # torch's half kernel agrees


def test_gpu_check_dry_run_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu",
                           "--models", "stress", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["dry_run"] is True and "CPU" in doc["device"]
    by_model = {m["model"]: m for m in doc["models"]}
    assert doc["models"] and all(m["mapped_tensors"] > 0 for m in doc["models"])
    assert by_model["layernorm_large"]["material"]["float16"]  # the old arithmetic wipes the rows out
    assert not by_model["layernorm_large"]["material"]["float32"]
    # every engine overflows on the written-out LayerNorm's squares and on the long sum: positions agree
    for name in ("layernorm_manual", "long_sum"):
        for row in by_model[name]["tensors"]:
            assert row["float32"]["overflow_mismatch"] == 0, (name, row["tensor"])


# ------------------------------------------------------------------------------------------------ on a GPU
@needs_gpu
def test_torch_cuda_fp16_against_fp32_on_the_gpu():
    torch.manual_seed(0)
    net = _Stack(width=64).eval()
    x = torch.randn(8, 16)
    result = compare(net, "torch-cuda", "torch-cuda:fp16", example_inputs=(x,))
    assert not result.diverged
    assert result.precision["candidate"]["precision"] == "fp16"
    assert result.engines["candidate"]["device"].startswith("cuda") and result.engines["candidate"].get("gpu")
    out = result.tensors[-1].metrics["sqnr_db"]
    assert 40 < out < 90  # real FP16 rounding, neither exact nor broken
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in net.parameters())


@needs_gpu
@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_tf32_is_off_for_fp32_and_on_for_tf32(layer):
    torch.manual_seed(0)
    if layer == "linear":
        net = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).eval()
        x = torch.randn(64, 1024)
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1, bias=False)).eval()
        x = torch.randn(1, 128, 28, 28)
    model = _export(net, (x,))
    out = model.graph.output[0].name
    feeds = {model.graph.input[0].name: x.numpy()}
    with torch.no_grad():
        truth = net.double()(x.double()).numpy()
    net.float()

    def sqnr(variant):
        with get_engine("torch-cuda", module=net, example_inputs=(x,), variant=variant).prepare(model, [out]) as s:
            got = s.run(feeds)[out].astype(np.float64)
        return 10 * np.log10(np.sum(truth ** 2) / np.sum((got - truth) ** 2))

    fp32, tf32 = sqnr("fp32"), sqnr("tf32")
    assert fp32 > 100 and tf32 < 80 and fp32 - tf32 > 20, (fp32, tf32)


@needs_gpu
def test_autocast_runs_and_is_judged_as_fp16():
    torch.manual_seed(0)
    net = _Stack().eval()
    x = torch.randn(4, 16)
    result = compare(net, "torch-cuda", "torch-cuda:autocast", example_inputs=(x,))
    assert result.precision["candidate"]["family"] == "fp16"
    assert not result.diverged
