"""A dataset run judged by its task: ``NAME OP NUMBER`` on every sample (``ctc>=1``: every crop reads as the
reference reads it; ``mask_iou>=0.99``), or ``mean NAME OP NUMBER`` on the mean over the samples (NNCF's
accuracy-control reading of a drop). ``NAME`` is one result of the run's task metrics; left out
(``>=1``, ``mean>=0.95``), it is the first metric's first result.

Without a task target a dataset run fails when any sample's outputs diverge under the criterion; with one it
fails only when the target does, and the outputs' divergence is reported beside it ("diverged" stays about the
outputs: a quantized recognizer's softmax can move past every output tolerance while each crop still decodes to
the same text). A sample whose metric gave NaN (or no value) fails the target, and makes a mean target's mean
NaN."""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from ..errors import InputError
from ..textfmt import safe_name

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
_AGGREGATES = ("every", "mean")
_TEXT = re.compile(r"^\s*(?:(mean)(?:\s+|(?=\s*[<>=])))?(.*?)\s*(>=|<=|==|>|<)\s*(\S+)\s*$", re.S)
_NUMBER = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
_HINT = ("write NAME OP NUMBER, e.g. 'ctc>=1' (every sample) or 'mean top1>=0.95' (the mean over the samples); "
         "NAME is one of the task metrics' results")


def number_text(x: float) -> str:
    """``x`` as short as it reads back exactly (``1``, ``0.95``, ``0.5625001``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


@dataclass(frozen=True)
class TaskTarget:
    """``name`` (None: the first task result), ``op``, ``threshold``, ``aggregate`` ("every" or "mean")."""

    name: str | None
    op: str
    threshold: float
    aggregate: str = "every"

    def __post_init__(self):
        if self.op not in _OPS:
            raise InputError(f"task target: unknown comparison {str(self.op)[:10]!r}", f"use one of {', '.join(_OPS)}")
        if self.aggregate not in _AGGREGATES:
            raise InputError(f"task target: aggregate {str(self.aggregate)[:20]!r} is not every or mean",
                             "aggregate='every' (every sample) or 'mean' (the mean over the samples)")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not math.isfinite(self.threshold):
            raise InputError(f"task target needs a finite threshold, not {str(self.threshold)[:20]!r}",
                             "write e.g. 'ctc>=1'")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise InputError("task target: the name must be non-empty text (or None: the first task result)")
        object.__setattr__(self, "threshold", float(self.threshold))

    @classmethod
    def parse(cls, text: str) -> TaskTarget:
        m = _TEXT.match(str(text))
        shown = str(text)[:80]
        if not m:
            raise InputError(f"cannot read task target {shown!r}", _HINT)
        mean, name, op, number = m.groups()
        if any(ord(c) < 32 or ord(c) == 127 for c in name) or any(c in "<>=!" for c in name):
            raise InputError(f"cannot read task target {shown!r}: the name holds a control character or one of "
                             "< > = !", _HINT)
        if not _NUMBER.match(number):
            raise InputError(f"task target {shown!r}: {number[:40]!r} is not a number", "write e.g. 'ctc>=1' or "
                             "'mean top1>=0.95' (plain digits, a point, an optional exponent)")
        threshold = float(number)
        if not math.isfinite(threshold):
            raise InputError(f"task target {shown!r} needs a finite threshold", "write e.g. 'ctc>=1'")
        if threshold == 0 and re.search(r"[1-9]", number.lower().partition("e")[0]):
            raise InputError(f"task target {shown!r}: {number[:40]} is too small for a float (it reads as 0)",
                             "write a threshold a float64 holds")
        return cls(name or None, op, threshold, "mean" if mean else "every")

    @classmethod
    def from_json(cls, doc: dict | str) -> TaskTarget:
        """From :meth:`to_json` (its fields, exactly) or from a target's text."""
        if isinstance(doc, str):
            return cls.parse(doc)
        if not isinstance(doc, dict):
            raise InputError(f"a task target is an object or text, not a {type(doc).__name__}")
        try:
            return cls(doc.get("name"), doc["op"], doc["threshold"], doc.get("aggregate", "every"))
        except KeyError as e:
            raise InputError(f"a task target lacks {e.args[0]!r}") from None

    def resolved(self, names: list[str], fixed: bool = True) -> TaskTarget:
        """This target with its name fixed to one of the task results ``names`` (the first when left out).
        ``fixed``: every metric's result names are known (built-in metrics) -- a name not among them is refused;
        else (a custom metric may report a result on later samples only) it is kept for :meth:`check_reported`."""
        if self.name is None:
            if not names:
                raise InputError(f"task target {self.text()!r} names no result, and the first sample's task metrics "
                                 "reported none to take", "name the result: e.g. 'NAME>=1'")
            return TaskTarget(names[0], self.op, self.threshold, self.aggregate)
        if self.name not in names and fixed:
            self._unreported(names)
        return self

    def check_reported(self, names: set[str]) -> None:
        """Refuse a target whose result no sample reported (every sample would fail it, for a typo)."""
        if self.name not in names:
            self._unreported(sorted(names))

    def _unreported(self, names) -> None:
        raise InputError(f"task target {self.text()!r} names {safe_name(str(self.name))!r}, which no task metric "
                         f"reports", f"name one of {', '.join(safe_name(n) for n in names)}")

    def holds(self, value: float) -> bool:
        """Whether one value passes (NaN never does)."""
        return not math.isnan(value) and bool(_OPS[self.op](value, self.threshold))

    def text(self) -> str:
        return f"{'mean ' if self.aggregate == 'mean' else ''}{self.name or ''}{self.op}{number_text(self.threshold)}"

    def condition(self) -> str:
        """``ctc >= 1``: the test one value (or the mean) must pass."""
        return f"{safe_name(self.name or 'the first task result')} {self.op} {number_text(self.threshold)}"

    def describe(self) -> str:
        return f"the mean of {self.condition()}" if self.aggregate == "mean" else f"{self.condition()} on every sample"

    def shown(self, value: float) -> str:
        """``value`` with the fewest digits (4 at least) that keep its relation to the threshold readable."""
        if math.isnan(value) or math.isinf(value) or value == self.threshold:
            return number_text(value) if math.isfinite(value) else f"{value:g}"
        for digits in (4, 6, 9, 12):
            s = f"{value:.{digits}g}"
            if float(s) != self.threshold and self.holds(float(s)) == self.holds(value):
                return s
        return repr(value)

    def judge(self, samples: list[dict]) -> dict:
        """``{"met", "failing" (indices of the samples that fail the test alone), "value" (the mean, for mean
        targets), "nan" (samples without a number)}``; a sample without the result counts as failing."""
        values = [float(s["task"].get(self.name, math.nan)) for s in samples]
        failing = [s["index"] for s, v in zip(samples, values) if not self.holds(v)]
        nan = sum(math.isnan(v) for v in values)
        if self.aggregate == "mean":
            try:
                total = math.fsum(values)
            except (ValueError, OverflowError):  # inf + -inf, or a finite sum past float's range
                total = sum(values)
            mean = total / len(values) if values else math.nan
            return {"met": self.holds(mean), "failing": failing, "value": mean, "nan": nan}
        return {"met": bool(samples) and not failing, "failing": failing, "value": None, "nan": nan}

    def to_json(self) -> dict:
        return {"text": self.text(), "name": self.name, "op": self.op, "threshold": self.threshold,
                "aggregate": self.aggregate, "describe": self.describe()}
