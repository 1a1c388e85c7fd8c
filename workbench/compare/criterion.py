"""When is a tensor "diverged"? A threshold on one metric, with defaults per precision family, aware of the
precision floor.

Ordinary FP16 rounding gives 45-60 dB SQNR on healthy layers and INT8 quantization 20-40 dB, so a fixed
elementwise tolerance (Polygraphy's 1e-5 default) flags everything. The defaults sit well below healthy rounding
noise and well above a real break; a non-finite value on one side only always counts. A tensor whose error is at
its precision floor (:mod:`workbench.compare.floor`) while the floor itself fails the criterion through underflow
(values below the format's smallest subnormal) is "at its floor", not diverged: the format cannot hold those
values, and no node is at fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from ..core.metric_info import HIGHER_IS_BETTER, JUDGED, METRIC_INFO
from ..errors import WorkbenchError

#: precision family -> (metric, threshold). FP32 engine pairs agree to 90+ dB; FP16 rounding gives 45-60 dB on
#: healthy layers and BF16 (8-bit mantissa) about 25-45 dB; INT8 is judged by the typical error relative to the
#: typical value (healthy tensors 0.01-0.03; outlier-crushed ones near 1), as SQNR is dominated by the outliers.
DEFAULTS = {"fp32": ("sqnr_db", 60.0), "fp16": ("sqnr_db", 30.0), "bf16": ("sqnr_db", 20.0),
            "int8": ("norm_mean_abs", 0.1)}
#: absolute floor: errors at most this large never count. Only for FP32 engine pairs, where differences below
#: 1e-6 are float32 round-off whatever the tensor's scale (e.g. a Sigmoid driven to 1e-7 by random inputs).
DEFAULT_ATOL = {"fp32": 1e-6}

_PATTERN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*(\S+)\s*$")


class CriterionError(WorkbenchError):
    """A criterion text that cannot be read or that would judge the wrong way round."""

    default_hint = "write METRIC<VALUE for closeness metrics (sqnr_db<30, cosine<0.999) or METRIC>VALUE for " \
                   "error metrics (max_abs>1e-3, norm_mean_abs>0.1); append ,atol=1e-6 for an absolute floor"


@dataclass(frozen=True)
class Criterion:
    """A tensor diverges when ``metric`` is worse than ``threshold`` (below it for sqnr_db and cosine, above it
    for error metrics) or when non-finite values disagree. ``atol``: errors with max_abs at most this never count.
    """

    metric: str = "sqnr_db"
    threshold: float = 30.0
    nonfinite: bool = True
    atol: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in JUDGED:
            raise CriterionError(f"unknown criterion metric {self.metric!r}", f"use one of {', '.join(JUDGED)}")
        if not isinstance(self.threshold, (int, float)) or not math.isfinite(self.threshold):
            raise CriterionError(f"criterion threshold {self.threshold!r} is not a finite number",
                                 "write e.g. sqnr_db<30")
        if not math.isfinite(self.atol) or self.atol < 0:
            raise CriterionError(f"criterion atol {self.atol!r} must be a finite number >= 0", "write e.g. atol=1e-6")
        lo, hi = METRIC_INFO[self.metric].bounds
        op = "<" if self.metric in HIGHER_IS_BETTER else ">"
        never = self.threshold <= lo if op == "<" else self.threshold >= hi
        always = self.threshold > hi if op == "<" else self.threshold < lo
        if never or always:
            raise CriterionError(f"criterion {self.metric}{op}{self.threshold:g} "
                                 f"{'can never fire' if never else 'fires on every tensor'}: {self.metric} lies in "
                                 f"[{lo:g}, {hi:g}]",
                                 f"pick a threshold inside that range, e.g. {self.metric}{op}"
                                 f"{METRIC_INFO[self.metric].tolerance:g}")

    @classmethod
    def default_for(cls, family: str) -> Criterion:
        """The default for a precision family ("fp32", "fp16", "bf16", "int8"; variants "fp16"/"int8" too)."""
        metric, threshold = DEFAULTS.get(family, DEFAULTS["fp32"])
        return cls(metric, threshold, atol=DEFAULT_ATOL.get(family, 0.0))

    @classmethod
    def parse(cls, text: str) -> Criterion:
        """``"sqnr_db<30"``, ``"cosine<0.999"``, ``"norm_max_abs>1e-2"``, ``"max_abs>1e-3"``; append
        ``",atol=1e-6"`` for an absolute floor. The operator must point the way divergence lies: ``sqnr_db>30``
        (diverged when agreement is BETTER than 30 dB) is refused, never silently flipped."""
        head, _, tail = str(text).partition(",")
        atol = 0.0
        if tail:
            key, _, value = tail.partition("=")
            if key.strip() != "atol":
                raise CriterionError(f"cannot read criterion {text!r}: unknown option {key.strip()!r}")
            atol = _number(value, text)
        m = _PATTERN.match(head)
        if not m:
            raise CriterionError(f"cannot read criterion {text!r}")
        metric, op, value = m.group(1), m.group(2), _number(m.group(3), text)
        if metric not in JUDGED:
            raise CriterionError(f"unknown criterion metric {metric!r} in {text!r}", f"use one of {', '.join(JUDGED)}")
        wanted = "<" if metric in HIGHER_IS_BETTER else ">"
        if op[0] != wanted:
            better = "higher" if metric in HIGHER_IS_BETTER else "lower"
            side = "above" if op[0] == ">" else "below"
            raise CriterionError(
                f"criterion {text!r} would call a tensor diverged when its {metric} is {side} "
                f"{value:g}, i.e. when it agrees better ({better} {metric} is closer)",
                f"write {metric}{wanted}{value:g}: a criterion says when a tensor diverges")
        return cls(metric, value, atol=atol)

    def fails(self, metrics: dict) -> bool:
        """The metric is past the threshold (ignores non-finite mismatches and floors)."""
        if self.atol > 0 and metrics.get("max_abs") is not None and metrics["max_abs"] <= self.atol:
            return False
        value = metrics.get(self.metric)
        if value is None:  # nothing measured (no position finite on both sides): the non-finite count decides
            return False
        if isinstance(value, float) and math.isnan(value):  # measured, but not a number: never a pass
            return True
        return value < self.threshold if self.metric in HIGHER_IS_BETTER else value > self.threshold

    def diverged(self, metrics: dict, floor: dict | None = None) -> bool:
        """Shapes of different sizes, non-finite mismatch, or past the threshold and not :meth:`at_floor`."""
        if metrics.get("shape_mismatch"):  # the candidate computed something else: nothing to measure, not a pass
            return True
        if self.nonfinite and (metrics.get("nonfinite_mismatch") or 0) > 0:
            return True
        return self.fails(metrics) and not self.at_floor(metrics, floor)

    def at_floor(self, metrics: dict, floor: dict | None) -> bool:
        """The tensor fails only because its format cannot hold the reference values: the floor itself fails
        through underflow (values flushed below the smallest subnormal, no overflow) and the measured error is
        within :data:`~workbench.compare.floor.FLOOR_MARGIN_DB` of it."""
        from .floor import FLOOR_MARGIN_DB, excess_db

        if not floor or not self.fails(metrics) or not self.fails(floor):
            return False
        if (floor.get("nonfinite_mismatch") or 0) > 0 or (floor.get("share_over_max") or 0) > 0:
            return False
        if not (floor.get("share_flushed") or 0) > 0 or floor.get("format") not in ("fp16", "bf16"):
            return False
        excess = excess_db(self.metric, metrics, floor)
        return excess is not None and excess <= FLOOR_MARGIN_DB

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

    def text(self) -> str:
        """The criterion as ``--criterion`` takes it."""
        op = "<" if self.metric in HIGHER_IS_BETTER else ">"
        return f"{self.metric}{op}{self.threshold:g}" + (f",atol={self.atol:g}" if self.atol else "")

    def to_json(self) -> dict:
        return asdict(self) | {"text": self.describe()}

    @classmethod
    def from_json(cls, doc: dict) -> Criterion:
        return cls(doc["metric"], float(doc["threshold"]), bool(doc.get("nonfinite", True)),
                   float(doc.get("atol", 0.0)))


def _number(text: str, whole: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CriterionError(f"cannot read the number {text.strip()!r} in criterion {whole!r}") from None
    if not math.isfinite(value):
        raise CriterionError(f"criterion {whole!r} has a non-finite number ({text.strip()})",
                             "use a finite threshold, e.g. sqnr_db<30")
    return value
