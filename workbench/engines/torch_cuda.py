"""The torch.nn.Module on an NVIDIA GPU, in the arithmetic a GPU user gets: ``torch-cuda[:VARIANT]``.

- ``fp32``: true FP32: TF32 is switched off for matmuls and cuDNN convolutions (cuDNN allows TF32 by default,
  so an FP32 model on Ampere or newer silently multiplies in 10-bit mantissas unless told not to);
- ``tf32``: TF32 matmuls and convolutions (10-bit mantissa inputs, FP32 accumulation), what recent GPUs do by
  default for convolutions;
- ``fp16``: ``module.half()``: parameters, buffers and float inputs in FP16 (outputs come back as FP16);
- ``autocast``: ``torch.autocast("cuda", torch.float16)``: FP32 weights, matmuls and convolutions in FP16,
  reductions and normalizations in FP32 (mixed-precision inference as most training code runs it).

The caller's module is never moved or cast: each session holds the parameters and buffers on the device (in the
variant's dtype) and runs the module through ``torch.func.functional_call``. Layer-wise capture is the CPU
engine's: forward hooks mapped to the ONNX export's node names.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from .torch_engine import TorchEngine

log = logging.getLogger(__name__)

VARIANTS = ("fp32", "tf32", "fp16", "autocast")


class TorchCudaEngine(TorchEngine):
    """``module`` run eagerly on ``device`` (default ``cuda``) in the variant's arithmetic (module docstring).
    ``device`` may name another CUDA device (``cuda:1``); ``"cpu"`` runs the same code path on the CPU (what the
    tests without a GPU exercise: FP16 there is PyTorch's CPU half arithmetic, TF32 and autocast do nothing)."""

    name = "torch-cuda"
    label = "the torch.nn.Module on an NVIDIA GPU (fp32 with TF32 off, tf32, fp16 = module.half(), autocast)"
    variants = VARIANTS

    def __init__(self, module: Any, example_inputs: Any = None, variant: str = "fp32", device: str = "cuda"):
        super().__init__(module, example_inputs, variant)
        self.device = str(device)

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        ok, reason = super().availability()
        if not ok:
            return ok, reason
        import torch

        if not torch.cuda.is_available():
            built = torch.version.cuda
            return False, (f"no CUDA device: torch {torch.__version__} "
                           f"{'was built with CUDA ' + built + ' but sees no GPU' if built else 'is a CPU-only build'}"
                           " -- run on a machine with an NVIDIA GPU and a CUDA build of torch, or use 'torch' (CPU)")
        return True, ""

    def usable(self) -> tuple[bool, str]:
        return TorchEngine.availability() if self.device.startswith("cpu") else self.availability()

    def _dtype(self):
        import torch

        return torch.float16 if self.variant == "fp16" else None

    def placed(self) -> dict[str, Any]:
        """The module's parameters and buffers on the device (FP16 for ``fp16``): one copy per session."""
        import torch

        dtype = self._dtype()
        state = {}
        with torch.no_grad():
            for name, t in list(self.module.named_parameters()) + list(self.module.named_buffers()):
                cast = dtype if dtype is not None and t.is_floating_point() else None
                state[name] = t.detach().to(device=self.device, dtype=cast)
        return state

    def to_inputs(self, args: tuple) -> tuple:
        dtype = self._dtype()
        return tuple(a.to(device=self.device, dtype=dtype if dtype is not None and a.is_floating_point() else None)
                     if hasattr(a, "to") else a for a in args)

    def call(self, placed: Any, args: tuple) -> Any:
        from torch.func import functional_call

        return functional_call(self.module, placed, args)

    def hint(self, error: BaseException) -> str:
        text = str(error)
        if self.variant == "fp16" and ("dtype" in text or "Half" in text):
            return ("under module.half() the module met a float32 tensor it makes itself (e.g. .to(torch.float32) "
                    "or torch.tensor(...) in forward()): make it follow the input's dtype, or use "
                    "'torch-cuda:autocast'")
        if "out of memory" in text.lower():
            return "the GPU ran out of memory: use smaller feeds or fewer marked tensors (--memory-budget)"
        return super().hint(error)

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        import torch

        with _tf32(self.variant == "tf32"):
            if self.variant == "autocast" and not self.device.startswith("cpu"):
                with torch.autocast("cuda", dtype=torch.float16):
                    yield
            else:
                yield

    def describe(self) -> dict:
        import torch

        info = super().describe()
        info["device"] = self.device
        info["variant"] = self.variant
        info["tf32"] = self.variant == "tf32"
        if not self.device.startswith("cpu") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.device(self.device))
            info["cuda"] = torch.version.cuda
            info["cudnn"] = torch.backends.cudnn.version()
        return info


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """TF32 on or off for matmuls and cuDNN convolutions for the duration, the previous settings restored."""
    import torch

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(getattr(conv, "conv", None), "fp32_precision"):
        before = (matmul.fp32_precision, conv.conv.fp32_precision)  # torch >= 2.9
        mode = "tf32" if enabled else "ieee"
        matmul.fp32_precision, conv.conv.fp32_precision = mode, mode
        try:
            yield
        finally:
            matmul.fp32_precision, conv.conv.fp32_precision = before
        return
    before = (matmul.allow_tf32, conv.allow_tf32)
    matmul.allow_tf32, conv.allow_tf32 = enabled, enabled
    try:
        yield
    finally:
        matmul.allow_tf32, conv.allow_tf32 = before
