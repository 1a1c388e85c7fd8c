"""What making a precision variant produced: the model, and what changed on the way."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx


@dataclass
class ClampRecord:
    """A float constant the FP16 converter changed beyond rounding.

    ``kind``: "overflow" (``|x|`` above the converter's max_finite_val, clamped down) or "underflow"
    (nonzero ``|x|`` below its min_positive_val, raised to it or flushed to 0). ``original`` holds the
    most extreme changed values, ``converted`` what each became; ``consumers`` the original graph's
    nodes reading the constant (through any Cast the converter inserted).
    """

    name: str
    source: str  # "initializer" | "constant" (a Constant node's value) | "attribute" ("node:attr")
    kind: str
    count: int
    size: int
    original: list[float]
    converted: list[float]
    max_rel_change: float
    max_abs_change: float
    consumers: list[str]
    indices: list[int] = field(default_factory=list)  # flat indices of the first changed elements
    by: str = "the FP16 converter"  # who changed it: a converter, or "the candidate file" (a user's own file)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VariantResult:
    """A variant model plus its record. ``tensor_map`` lists only original intermediate tensors whose name
    differs in the variant (None: no counterpart); every other original name exists unchanged."""

    model: onnx.ModelProto
    variant: str  # "fp32" | "fp16" | "int8"
    converter: str
    clamped: list[ClampRecord] = field(default_factory=list)
    tensor_map: dict[str, str | None] = field(default_factory=dict)
    kept_fp32: list[str] = field(default_factory=list)
    excluded_nodes: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Write the variant model to ``path`` atomically; past 2 GB, or with weights left in files (a model over
        the inline limit), its weights go to ``NAME.data`` beside it. Returns the files written."""
        from ..model.mapped import save_model

        return save_model(self.model, path)

    def to_json(self) -> dict[str, Any]:
        """Everything but the model, JSON-ready."""
        return {
            "variant": self.variant,
            "converter": self.converter,
            "clamped": [c.to_json() for c in self.clamped],
            "tensor_map": dict(self.tensor_map),
            "kept_fp32": list(self.kept_fp32),
            "excluded_nodes": [dict(e) for e in self.excluded_nodes],
            "notes": list(self.notes),
            "details": dict(self.details),
        }
