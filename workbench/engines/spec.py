"""Engine specs as users type them: ``ENGINE[:VARIANT]``, e.g. ``ort``, ``ort:fp16``, ``trt:int8``."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError

ENGINES = {
    "ort": "ONNX Runtime, CPU execution provider",
    "ort-cuda": "ONNX Runtime, CUDA execution provider (onnxruntime-gpu)",
    "ort-trt": "ONNX Runtime, TensorRT execution provider (onnxruntime-gpu + TensorRT)",
    "openvino": "OpenVINO, CPU plugin, f32 inference precision",
    "ref": "onnx's ReferenceEvaluator in float64: the golden answer ('ref:fp16': the FP16 variant in numpy "
           "float16 arithmetic, an emulation that shows FP16 overflow on a CPU)",
    "torch": "the torch.nn.Module itself, run eagerly",
    "trt": "TensorRT (strongly typed networks on TRT >= 10)",
}
VARIANTS = {
    "fp32": "the model as given",
    "fp16": "float16 weights and activations (I/O kept float32), converter clamps reported",
    "int8": "explicit Q/DQ quantization, calibrated on the given feeds",
}


@dataclass(frozen=True)
class EngineSpec:
    """A parsed ``ENGINE[:VARIANT]``."""

    engine: str
    variant: str = "fp32"

    @classmethod
    def parse(cls, text: str | EngineSpec) -> EngineSpec:
        if isinstance(text, EngineSpec):
            return text
        raw = str(text).strip().lower()
        engine, _, variant = raw.partition(":")
        variant = variant or "fp32"
        if engine not in ENGINES:
            raise SpecError(f"unknown engine {engine!r} in spec {text!r}",
                            f"use ENGINE[:VARIANT] with ENGINE one of {', '.join(ENGINES)}")
        if variant not in VARIANTS:
            raise SpecError(f"unknown variant {variant!r} in spec {text!r}",
                            f"use one of {', '.join(VARIANTS)} (e.g. ort:fp16)")
        if engine == "ref" and variant == "int8":
            raise SpecError(f"spec {text!r}: the reference evaluator has no INT8 variant",
                            "use 'ref' (float64) as the golden reference, or 'ort:int8'")
        return cls(engine, variant)

    def __str__(self) -> str:
        return self.engine if self.variant == "fp32" else f"{self.engine}:{self.variant}"
