"""Colour bands of a divergence metric: "good" at or better than one value, "bad" worse than another, "marginal"
between. The user sets them once (the Workbench's colour bands box); the graph's error colouring, the Errors
curve and the distribution chart all take them as an argument, so they colour alike. Defaults come from the run's
criterion: "bad" is its tolerance, "good" ten times better in error (10 dB for SQNR). Pure: nothing here draws."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.metric_info import HIGHER_IS_BETTER, METRIC_INFO, unit_of
from ..errors import WorkbenchError

GOOD, MARGINAL, BAD = 0, 1, 2
#: band -> (colour, name)
BAND_STYLE = {GOOD: ("#43a047", "good"), MARGINAL: ("#ffb300", "marginal"), BAD: ("#e53935", "bad")}
NONFINITE_COLOR = "#6a1b9a"


class ThresholdError(WorkbenchError):
    """Colour thresholds that cannot be used (not numbers, or the wrong way round)."""

    default_hint = "type two numbers: the value at which a tensor is good and the one below which it is bad"


@dataclass(frozen=True)
class Bands:
    """``metric``'s colour bands: GOOD when at least as good as ``good``, BAD when worse than ``bad``, else
    MARGINAL ("better" is higher for sqnr_db and cosine, lower for the error metrics). ``source``: "criterion"
    (the run's defaults) or "user"."""

    metric: str
    good: float
    bad: float
    source: str = "criterion"

    def __post_init__(self) -> None:
        if self.metric not in METRIC_INFO:
            raise ThresholdError(f"no metric {self.metric!r} to colour by", f"use one of {', '.join(METRIC_INFO)}")
        for what, v in (("good", self.good), ("bad", self.bad)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ThresholdError(f"the {what} threshold {v!r} is not a finite number", "type e.g. 40")
        if self.higher_is_better and self.good < self.bad:
            raise ThresholdError(
                f"the good threshold ({self.good:g}) is below the bad one ({self.bad:g}): for {self.metric} higher "
                "is better, so good must be at or above bad", f"e.g. good {self.bad + 10:g}, bad {self.bad:g}")
        if not self.higher_is_better and self.good > self.bad:
            raise ThresholdError(
                f"the good threshold ({self.good:g}) is above the bad one ({self.bad:g}): for {self.metric} lower "
                "is better, so good must be at or below bad", f"e.g. good {self.bad / 10:g}, bad {self.bad:g}")

    @property
    def higher_is_better(self) -> bool:
        return self.metric in HIGHER_IS_BETTER

    @classmethod
    def from_criterion(cls, criterion: Any) -> Bands:
        """The defaults of a run's criterion: bad = its tolerance, good = ten times less error."""
        metric, t = criterion.metric, float(criterion.threshold)
        if metric == "sqnr_db":
            good = t + 10.0
        elif metric in HIGHER_IS_BETTER:  # cosine: 1 - value ten times smaller
            good = 1.0 - (1.0 - t) / 10.0
        else:
            good = t / 10.0
        return cls(metric, good, t, "criterion")

    @classmethod
    def parse(cls, metric: str, good: Any, bad: Any) -> Bands:
        """From what the user typed (text or numbers); ThresholdError with one clear line when unusable."""
        return cls(metric, _number(good, "good"), _number(bad, "bad"), "user")

    def classify(self, value: Any) -> int | None:
        """GOOD, MARGINAL or BAD for a metric value; None when missing. +inf dB (an exact match) is GOOD; NaN and
        the other infinities are BAD."""
        if value is None or isinstance(value, (str, bool)):
            return None
        v = float(value)
        if math.isnan(v):
            return BAD
        if self.higher_is_better:
            return GOOD if v >= self.good else BAD if v < self.bad else MARGINAL
        return GOOD if v <= self.good else BAD if v > self.bad else MARGINAL

    def label(self, band: int) -> str:
        """``good: sqnr_db >= 40 dB`` (what the legend states)."""
        u = unit_of(self.metric)
        u = f" {u}" if u else ""
        ge, le = "\u2265", "\u2264"
        if band == GOOD:
            return f"good: {self.metric} {ge if self.higher_is_better else le} {self.good:g}{u}"
        if band == BAD:
            return f"bad: {self.metric} {'<' if self.higher_is_better else '>'} {self.bad:g}{u}"
        lo, hi = sorted((self.good, self.bad))
        return f"marginal: {lo:g}-{hi:g}{u}"

    def legend(self) -> list[tuple[str, str]]:
        """(label, colour) per band, good first."""
        return [(self.label(b), BAND_STYLE[b][0]) for b in (GOOD, MARGINAL, BAD)]

    def describe(self) -> str:
        """``sqnr_db: good >= 40 dB, bad < 30 dB (the run's criterion)``."""
        u = unit_of(self.metric)
        u = f" {u}" if u else ""
        better, worse = ("\u2265", "<") if self.higher_is_better else ("\u2264", ">")
        whose = "yours" if self.source == "user" else "from the run's criterion"
        return f"{self.metric}: good {better} {self.good:g}{u}, bad {worse} {self.bad:g}{u} ({whose})"

    def to_json(self) -> dict:
        return {"metric": self.metric, "good": self.good, "bad": self.bad, "source": self.source}


def band_color(band: int | None) -> str | None:
    return BAND_STYLE[band][0] if band is not None else None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ThresholdError(f"the {what} threshold {value!r} is not a number", "type e.g. 40")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value or "").strip()
    if not text:
        raise ThresholdError(f"the {what} threshold is empty", "type a number, e.g. 40")
    try:
        number = float(text)
    except ValueError:
        raise ThresholdError(f"the {what} threshold {text[:40]!r} is not a number", "type e.g. 40 or 1e-3") from None
    if not math.isfinite(number):
        raise ThresholdError(f"the {what} threshold {text[:40]!r} is not a finite number", "type e.g. 40 or 1e-3")
    return number
