"""Check the ``ref:fp16`` emulation against real FP16 kernels on a GPU, tensor by tensor.

    python scripts/gpu_check.py [--device cuda] [--models bert cnn stress] [--bert-layers 2] [--out DIR]

Each model is a torch.nn.Module exported to ONNX (legacy exporter, opset 17) and converted to FP16 by the same
converter ``ort:fp16`` uses. Then, on the same feed:
- truth: onnx's ReferenceEvaluator in float64 on the FP32 export (``ref``);
- emulation: ``ref:fp16`` on the FP16 export, in both accumulation modes of the reference engine
  (``float32``: accumulating nodes in FP32 as GPU kernels do, the default; ``float16``: numpy float16 inside
  them, the emulation before this check);
- GPU: the module itself in FP16 on the device (``torch-cuda:fp16``: module.half(), cuBLAS/cuDNN kernels), and
  in FP32 with TF32 on and off (``torch-cuda:tf32``, ``torch-cuda``) for what TF32 alone changes.
Per tensor the GPU engine maps (module outputs -> ONNX names) it reports the FP16 ulp distance between emulation
and GPU (max, p99, share within 1 ulp), where one overflows (inf/NaN) and the other does not, and each side's
SQNR against the float64 truth. An emulation mode *disagrees materially* on a tensor when its overflow positions
differ from the GPU's, or its SQNR against the truth is more than 6 dB from the GPU's while one of them is
under 40 dB. Prints a table, writes ``gpu_check.json`` (and the table) to --out, and exits 0 whether or not
they agree (it is a measurement); 2 when the device cannot be used.

``--device cpu`` runs the same path on the CPU (PyTorch's CPU half kernels): a dry run, labelled as such, never a
GPU result. Runs in about a minute on an H100 with the defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

log = logging.getLogger("gpu_check")

MODES = ("float32", "float16")  # the reference engine's accumulation modes
MATERIAL_DB = 6.0


# ------------------------------------------------------------------------------------------------ models
def _stress_modules():
    """Small modules that sit where FP16 arithmetic breaks: (name, module, example inputs)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)

    class LayerNormLarge(nn.Module):  # |x - mean| ~ 1e3: squared deviations overflow FP16 if computed in FP16
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 256)
            self.ln = nn.LayerNorm(256)

        def forward(self, x):
            return self.ln(self.proj(x) * 40.0)

    class LayerNormManual(nn.Module):  # LayerNorm written out: the Pow node itself overflows on every engine
        def forward(self, x):
            x = x * 600.0
            mu = x.mean(-1, keepdim=True)
            var = (x - mu).pow(2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + 1e-5)

    class SoftmaxLarge(nn.Module):  # logits up to ~1e4
        def forward(self, x):
            return torch.softmax(x * 3000.0, dim=-1)

    class LongSum(nn.Module):  # sums past 65504 (inf on every engine) and means of the same rows (finite)
        def forward(self, x):
            y = x.abs() * 12.0 + 4.0
            return y.sum(-1), y.mean(-1)

    class CancellingMatMul(nn.Module):  # partial sums past 65504, result small: FP32 accumulation keeps it
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4096, 16, bias=False)
            with torch.no_grad():
                w = torch.ones(16, 4096)
                w[:, 2048:] = -1.0
                self.fc.weight.copy_(w * 30.0)

        def forward(self, x):
            return self.fc(x.abs() + 1.0)

    class ResidualOverflow(nn.Module):  # two finite halves whose sum overflows
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)
            with torch.no_grad():
                self.fc.weight.mul_(100.0)

        def forward(self, x):
            h = self.fc(x * 100.0)
            return h + h

    class WideConv(nn.Module):  # a convolution wide enough for tensor-core (TF32) kernels
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(128, 128, 3, padding=1)

        def forward(self, x):
            return self.conv(x)

    return [
        ("wide_conv", WideConv(), (torch.randn(1, 128, 28, 28, generator=g),)),
        ("layernorm_large", LayerNormLarge(), (torch.randn(4, 64, generator=g),)),
        ("layernorm_manual", LayerNormManual(), (torch.randn(4, 256, generator=g),)),
        ("softmax_large", SoftmaxLarge(), (torch.randn(4, 512, generator=g),)),
        ("long_sum", LongSum(), (torch.randn(4, 8192, generator=g),)),
        ("cancelling_matmul", CancellingMatMul(), (torch.randn(2, 4096, generator=g),)),
        ("residual_overflow", ResidualOverflow(), (torch.randn(4, 32, generator=g),)),
    ]


def _cnn():
    import torch
    from torch import nn

    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class SmallResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = block(3, 16, 1)
            self.b1 = block(16, 32, 2)
            self.b2 = block(32, 32, 1)
            self.b3 = block(32, 64, 2)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.stem(x)
            x = self.b1(x)
            x = x + self.b2(x)
            return self.fc(torch.flatten(self.pool(self.b3(x)), 1))

    torch.manual_seed(0)
    net = SmallResNet()
    with torch.no_grad():  # trained-looking BatchNorm statistics instead of the identity defaults
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(1)
    return [("cnn", net.eval(), (torch.rand(1, 3, 32, 32, generator=g),))]


def _bert(layers: int):
    import bert_model
    import torch

    module = bert_model._build_module(layers)
    feed = bert_model.make_feed()
    args = (torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"]))
    return [(f"bert-L{layers}", module, args)]


# ------------------------------------------------------------------------------------------------ measures
def ulp_keys(x: np.ndarray) -> np.ndarray:
    """FP16 values as integers in value order (adjacent FP16 numbers differ by 1; +0 and -0 are both 0)."""
    bits = np.ascontiguousarray(x, dtype=np.float16).view(np.uint16).astype(np.int32)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


def sqnr_db(truth: np.ndarray, x: np.ndarray) -> float:
    truth, x = truth.astype(np.float64), x.astype(np.float64)
    if not np.isfinite(x).all():
        return -math.inf
    noise = float(np.sum((x - truth) ** 2))
    signal = float(np.sum(truth ** 2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def tensor_report(truth: np.ndarray, gpu: np.ndarray, emu: np.ndarray) -> dict:
    """How far the emulation ``emu`` is from the GPU's ``gpu`` (both FP16 values) and each from ``truth``."""
    gpu16, emu16 = np.asarray(gpu).astype(np.float16), np.asarray(emu).astype(np.float16)
    fin_g, fin_e = np.isfinite(gpu16), np.isfinite(emu16)
    both = fin_g & fin_e
    ulps = np.abs(ulp_keys(gpu16[both]) - ulp_keys(emu16[both])) if both.any() else np.zeros(1, np.int32)
    # near zero (cancellation) one FP16 step is tiny and ulp counts explode: also count on the values that matter
    t = np.abs(np.asarray(truth, np.float64))
    big = both & (t >= 0.01 * (t[np.isfinite(t)].max() if np.isfinite(t).any() else 0.0))
    ulps_big = np.abs(ulp_keys(gpu16[big]) - ulp_keys(emu16[big])) if big.any() else np.zeros(1, np.int32)
    mismatch = np.flatnonzero((fin_g != fin_e).ravel())
    out = {
        "elements": int(gpu16.size),
        "max_ulp": int(ulps.max()), "p99_ulp": float(np.percentile(ulps, 99)),
        "max_ulp_large": int(ulps_big.max()),  # over values >= 1% of the tensor's largest
        "within_1_ulp": float(np.mean(ulps <= 1)),
        "nonfinite_gpu": int((~fin_g).sum()), "nonfinite_emu": int((~fin_e).sum()),
        "overflow_mismatch": int(mismatch.size),
        "overflow_mismatch_at": [np.unravel_index(int(i), gpu16.shape) for i in mismatch[:5]],
        "sqnr_gpu_db": sqnr_db(truth, gpu16), "sqnr_emu_db": sqnr_db(truth, emu16),
    }
    out["overflow_mismatch_at"] = [[int(v) for v in idx] for idx in out["overflow_mismatch_at"]]
    a, b = out["sqnr_gpu_db"], out["sqnr_emu_db"]
    gap = abs(a - b) if math.isfinite(a) and math.isfinite(b) else (0.0 if a == b else math.inf)
    out["material"] = bool(out["overflow_mismatch"] or (gap > MATERIAL_DB and min(a, b) < 40.0))
    return out


# ------------------------------------------------------------------------------------------------ one model
def check_model(name: str, module, example_inputs: tuple, device: str, folder: Path) -> dict:
    import onnx
    import torch

    from workbench.engines.reference import ReferenceEngine
    from workbench.engines.torch_cuda import TorchCudaEngine
    from workbench.variants import make_variant

    t0 = time.perf_counter()
    path = folder / f"{name}.onnx"
    n_in = len(example_inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter, on purpose (names by scope)
        torch.onnx.export(module, example_inputs, str(path), dynamo=False, opset_version=17,
                          input_names=[f"in{i}" for i in range(n_in)], do_constant_folding=True)
    fp32 = onnx.load(str(path))
    fp16 = make_variant(fp32, "fp16").model
    feed = {f"in{i}": t.numpy() for i, t in enumerate(example_inputs)}
    produced = [o for n in fp16.graph.node for o in n.output if o]

    gpu = TorchCudaEngine(module, example_inputs, variant="fp16", device=device)
    with gpu.prepare(fp16, produced) as sess:
        gpu_vals = sess.run(feed)
    in_fp32 = {o for n in fp32.graph.node for o in n.output}  # the converter's own Casts have no truth
    names = [n for n in produced if n in gpu_vals and n in in_fp32]
    truth = ReferenceEngine().prepare(fp32, names).run(feed)
    emus = {mode: ReferenceEngine("native", mode).prepare(fp16, names).run(feed) for mode in MODES}
    fp32_runs = {}
    for variant in ("fp32", "tf32"):
        with TorchCudaEngine(module, example_inputs, variant=variant, device=device).prepare(fp32, names) as s:
            vals = s.run(feed)
        fp32_runs[variant] = {n: sqnr_db(truth[n], vals[n]) for n in names if n in vals}

    tensors = []
    for n in names:
        row = {"tensor": n, "shape": list(np.shape(gpu_vals[n]))}
        for mode in MODES:
            row[mode] = tensor_report(truth[n], gpu_vals[n], emus[mode][n])
        row["sqnr_fp32_db"] = fp32_runs["fp32"].get(n)
        row["sqnr_tf32_db"] = fp32_runs["tf32"].get(n)
        tensors.append(row)
    return {"model": name, "nodes": len(fp32.graph.node), "mapped_tensors": len(names),
            "seconds": round(time.perf_counter() - t0, 2), "tensors": tensors,
            "material": {mode: [r["tensor"] for r in tensors if r[mode]["material"]] for mode in MODES}}


# ------------------------------------------------------------------------------------------------ report
def _fmt_db(v) -> str:
    if v is None:
        return "-"
    return "inf" if v == math.inf else ("-inf" if v == -math.inf else f"{v:.1f}")


def table(results: list[dict]) -> str:
    lines = [f"{'model':18} {'tensor':42} {'gpu dB':>7} | {'emu32 dB':>8} {'maxulp':>6} {'ovf':>4} | "
             f"{'emu16 dB':>8} {'maxulp':>6} {'ovf':>4} | {'fp32':>6} {'tf32':>6}"]
    for r in results:
        for t in r["tensors"]:
            a, b = t["float32"], t["float16"]
            lines.append(f"{r['model'][:18]:18} {t['tensor'][-42:]:42} {_fmt_db(a['sqnr_gpu_db']):>7} | "
                         f"{_fmt_db(a['sqnr_emu_db']):>8} {a['max_ulp_large']:>6} {a['overflow_mismatch']:>4}"
                         f"{'*' if a['material'] else ' '}| {_fmt_db(b['sqnr_emu_db']):>8} {b['max_ulp_large']:>6} "
                         f"{b['overflow_mismatch']:>4}{'*' if b['material'] else ' '}| "
                         f"{_fmt_db(t['sqnr_fp32_db']):>6} {_fmt_db(t['sqnr_tf32_db']):>6}")
    lines.append("dB: SQNR against the float64 truth; maxulp: FP16 ulps between emulation and GPU (values >= 1% of the "
                 "tensor's largest; all values in the JSON); "
                 "ovf: positions where one overflows and the other does not; *: material disagreement")
    for mode in MODES:
        bad = [f"{r['model']}:{t}" for r in results for t in r["material"][mode]]
        lines.append(f"emulation accumulate={mode}: {len(bad)} material disagreement(s) in "
                     f"{sum(len(r['tensors']) for r in results)} tensors" + (f": {', '.join(bad[:12])}" if bad else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu for a dry run (default cuda)")
    parser.add_argument("--models", nargs="+", default=["stress", "cnn", "bert"], choices=["stress", "cnn", "bert"])
    parser.add_argument("--bert-layers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.txt")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import torch

    from workbench.engines.torch_cuda import TorchCudaEngine

    if not args.device.startswith("cpu"):
        ok, reason = TorchCudaEngine.availability()
        if not ok:
            print(f"gpu_check: {reason}", file=sys.stderr)
            return 2
    dev = torch.device(args.device)
    gpu_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (dry run: PyTorch's CPU half kernels)"
    header = {"device": gpu_name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
              "dry_run": dev.type != "cuda"}
    print(json.dumps(header))
    made = {"stress": _stress_modules, "cnn": _cnn, "bert": lambda: _bert(args.bert_layers)}
    results = []
    with tempfile.TemporaryDirectory(prefix="workbench-gpu-check-") as tmp:
        for group in args.models:
            for name, module, inputs in made[group]():
                results.append(check_model(name, module.eval(), inputs, args.device, Path(tmp)))
                print(f"{name}: {results[-1]['mapped_tensors']} tensors in {results[-1]['seconds']} s", flush=True)
    text = table(results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"schema": "workbench.gpu_check/1", **header, "models": results}
        for fname, body in (("gpu_check.json", json.dumps(doc, indent=1, default=str)), ("gpu_check.txt", text)):
            tmp_path = args.out / f".{fname}.tmp"
            tmp_path.write_text(body)
            os.replace(tmp_path, args.out / fname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
