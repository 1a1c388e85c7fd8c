"""Engine specs as users type them: ``ENGINE[:VARIANT]``, e.g. ``ort``, ``ort:fp16``, ``trt:int8``, or a
class path ``package.module:Class[:VARIANT]``."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError

VARIANTS = {
    "fp32": "the model as given",
    "fp16": "float16 weights and activations (I/O kept float32), converter clamps reported",
    "int8": "explicit Q/DQ quantization, calibrated on the given feeds",
    "tf32": "TF32 matmuls and convolutions (torch-cuda): 10-bit mantissa inputs, FP32 accumulation",
    "autocast": "torch.autocast float16 (torch-cuda): FP32 weights, FP16 matmuls/convolutions, FP32 reductions",
}


@dataclass(frozen=True)
class EngineSpec:
    """A parsed ``ENGINE[:VARIANT]``; ``engine`` is a registered name or a ``module:Class`` path."""

    engine: str
    variant: str = "fp32"

    @classmethod
    def parse(cls, text: str | EngineSpec) -> EngineSpec:
        from .registry import class_for, is_dotted_path, registered

        if isinstance(text, EngineSpec):
            return text
        raw = str(text).strip()
        if raw.endswith(":") or raw.startswith(":") or not raw:  # 'ort:' would silently mean fp32
            raise SpecError(f"spec {text!r} has an empty engine or variant",
                            "write ENGINE or ENGINE:VARIANT, e.g. ort (fp32) or ort:fp16")
        if is_dotted_path(raw):
            module, _, rest = raw.partition(":")
            attr, _, variant = rest.partition(":")
            engine, variant = f"{module}:{attr}", (variant.lower() or "fp32")
        else:
            engine, _, variant = raw.lower().partition(":")
            variant = variant or "fp32"
            if engine not in registered():
                raise SpecError(f"unknown engine {engine!r} in spec {text!r}",
                                f"use ENGINE[:VARIANT] with ENGINE one of {', '.join(registered())}, or "
                                "package.module:Class")
        engine_cls = class_for(engine)
        if variant not in VARIANTS:
            own = [v for v in engine_cls.variants if v in VARIANTS]
            raise SpecError(f"unknown variant {variant!r} in spec {text!r}: a variant is one of the workbench's "
                            f"transformations of the model ({', '.join(VARIANTS)}), and an engine class's `variants` "
                            "attribute says which of them it runs",
                            f"the {engine_cls.name or engine} engine runs {', '.join(own) or 'none of them'}"
                            + (f" (e.g. {engine}:{own[1]})" if len(own) > 1 else ""))
        if variant not in engine_cls.variants:
            raise SpecError(f"spec {text!r}: the {engine_cls.name or engine} engine has no {variant} variant",
                            f"it runs {', '.join(engine_cls.variants)}"
                            + ("; use 'ref' (float64) as the golden reference, or 'ort:int8'" if engine == "ref"
                               else ""))
        return cls(engine, variant)

    def __str__(self) -> str:
        return self.engine if self.variant == "fp32" else f"{self.engine}:{self.variant}"
