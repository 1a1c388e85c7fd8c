"""When is a tensor "diverged"? A threshold on one metric, with defaults per candidate precision.

Ordinary FP16 rounding gives 45-60 dB SQNR on healthy layers and INT8 quantization 20-40 dB, so a
fixed elementwise tolerance (Polygraphy's 1e-5 default) flags everything. The defaults here sit well
below healthy rounding noise and well above a real break; a non-finite value on one side only always
counts as divergence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import WorkbenchError
from .metrics import HIGHER_IS_BETTER, METRICS

#: candidate precision -> (metric, threshold). FP32 engine pairs agree to 90+ dB; FP16 rounding gives 45-60 dB on
#: healthy layers; INT8 is judged by the typical error relative to the typical value (healthy tensors sit at
#: 0.01-0.03; outlier-crushed ones near 1), because SQNR is dominated by the very outliers that do the damage.
DEFAULTS = {"fp32": ("sqnr_db", 60.0), "fp16": ("sqnr_db", 30.0), "int8": ("norm_mean_abs", 0.1)}
#: absolute floor: errors at most this large never count. Only for FP32 engine pairs, where differences below
#: 1e-6 are float32 round-off whatever the tensor's scale (e.g. a Sigmoid driven to 1e-7 by random inputs:
#: 35 dB "SQNR" from 1.3e-7 differences). FP16/INT8 keep 0: a tiny tensor scaled up later can carry the fault.
DEFAULT_ATOL = {"fp32": 1e-6, "fp16": 0.0, "int8": 0.0}


@dataclass(frozen=True)
class Criterion:
    """A tensor diverges when ``metric`` is worse than ``threshold`` (below it for sqnr_db and cosine,
    above it for error metrics) or when non-finite values disagree."""

    metric: str = "sqnr_db"
    threshold: float = 30.0
    nonfinite: bool = True
    atol: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS or self.metric == "nonfinite_mismatch":
            raise WorkbenchError(f"unknown criterion metric {self.metric!r}",
                                 f"use one of {', '.join(m for m in METRICS if m != 'nonfinite_mismatch')}")

    @classmethod
    def default_for(cls, variant: str) -> Criterion:
        """The default for a candidate precision ("fp32", "fp16", "int8")."""
        metric, threshold = DEFAULTS.get(variant, DEFAULTS["fp32"])
        return cls(metric, threshold, atol=DEFAULT_ATOL.get(variant, 0.0))

    @classmethod
    def parse(cls, text: str) -> Criterion:
        """``"sqnr_db<30"``, ``"cosine<0.999"``, ``"norm_max_abs>1e-2"``, ``"max_abs>1e-3"``; append
        ``",atol=1e-6"`` for an absolute floor."""
        head, _, tail = text.partition(",")
        atol = 0.0
        if tail:
            key, _, value = tail.partition("=")
            try:
                atol = float(value) if key.strip() == "atol" else float("nan")
            except ValueError:
                atol = float("nan")
            if math.isnan(atol):
                raise WorkbenchError(f"cannot read criterion {text!r}", "write e.g. sqnr_db<60,atol=1e-6")
        for sep in ("<", ">"):
            if sep in head:
                metric, _, value = head.partition(sep)
                try:
                    return cls(metric.strip(), float(value), atol=atol)
                except ValueError:
                    break
        raise WorkbenchError(f"cannot read criterion {text!r}", "write METRIC<VALUE or METRIC>VALUE, e.g. sqnr_db<30")

    def diverged(self, metrics: dict) -> bool:
        if self.nonfinite and (metrics.get("nonfinite_mismatch") or 0) > 0:
            return True
        if self.atol > 0 and metrics.get("max_abs") is not None and metrics["max_abs"] <= self.atol:
            return False
        value = metrics.get(self.metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        return value < self.threshold if self.metric in HIGHER_IS_BETTER else value > self.threshold

    def badness(self, metrics: dict) -> float:
        """A sort key: larger is worse. Non-finite mismatches rank first."""
        value = metrics.get(self.metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            value = -math.inf if self.metric in HIGHER_IS_BETTER else math.inf
        score = -value if self.metric in HIGHER_IS_BETTER else value
        return score + (1e300 if (metrics.get("nonfinite_mismatch") or 0) > 0 else 0.0)

    def describe(self) -> str:
        op = "<" if self.metric in HIGHER_IS_BETTER else ">"
        text = f"{self.metric} {op} {self.threshold:g}"
        if self.atol > 0:
            text += f" (and max_abs > {self.atol:g})"
        return text + (" or non-finite mismatch" if self.nonfinite else "")

    def to_json(self) -> dict:
        return asdict(self) | {"text": self.describe()}

    @classmethod
    def from_json(cls, doc: dict) -> Criterion:
        return cls(doc["metric"], float(doc["threshold"]), bool(doc.get("nonfinite", True)),
                   float(doc.get("atol", 0.0)))
