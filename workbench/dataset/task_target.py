"""A dataset run judged by its task: ``NAME OP NUMBER`` on every sample (``ctc>=1``: every crop reads as the
reference reads it; ``mask_iou>=0.99``), or ``mean NAME OP NUMBER`` on the mean over the samples (NNCF's
accuracy-control reading of a drop). ``NAME`` is one result of the run's task metrics; left out
(``>=1``), it is the first metric's first result.

Without a task target a dataset run fails when any sample's outputs diverge under the criterion; with one it
fails only when the target does, and the outputs' divergence is reported beside it ("diverged" stays about the
outputs: a quantized recognizer's softmax can move past every output tolerance while each crop still decodes to
the same text)."""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from ..errors import InputError
from ..textfmt import safe_name

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
_TEXT = re.compile(r"^\s*(mean\s+)?([A-Za-z_][\w.\-]*)?\s*(>=|<=|==|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class TaskTarget:
    """``name`` (None: the first task result), ``op``, ``threshold``, ``aggregate`` ("every" or "mean")."""

    name: str | None
    op: str
    threshold: float
    aggregate: str = "every"

    @classmethod
    def parse(cls, text: str) -> TaskTarget:
        m = _TEXT.match(str(text))
        if not m:
            raise InputError(f"cannot read task target {str(text)[:80]!r}",
                             "write NAME OP NUMBER, e.g. 'ctc>=1' (every sample) or 'mean top1>=0.95' (the mean "
                             "over the samples); NAME is one of the task metrics' results")
        try:
            threshold = float(m.group(4))
        except ValueError:
            raise InputError(f"task target {str(text)[:80]!r}: {m.group(4)[:40]!r} is not a number",
                             "write e.g. 'ctc>=1'") from None
        if not math.isfinite(threshold):
            raise InputError(f"task target {str(text)[:80]!r} needs a finite threshold", "write e.g. 'ctc>=1'")
        return cls(m.group(2), m.group(3), threshold, "mean" if m.group(1) else "every")

    @classmethod
    def from_json(cls, doc: dict) -> TaskTarget:
        return cls.parse(str(doc["text"]))

    def resolved(self, names: list[str]) -> TaskTarget:
        """This target with its name fixed to one of the task results ``names`` (the first when left out)."""
        if not names:
            raise InputError("a task target needs a task metric", "pass --metric (e.g. ctc, top1, mask_iou) with "
                             "--target, or drop --target to judge the outputs")
        if self.name is None:
            return TaskTarget(names[0], self.op, self.threshold, self.aggregate)
        if self.name not in names:
            raise InputError(f"task target {self.text()!r} names {safe_name(self.name)!r}, which no task metric "
                             f"reports", f"name one of {', '.join(safe_name(n) for n in names)}")
        return self

    def holds(self, value: float) -> bool:
        """Whether one value passes (NaN never does)."""
        return not math.isnan(value) and bool(_OPS[self.op](value, self.threshold))

    def text(self) -> str:
        return f"{'mean ' if self.aggregate == 'mean' else ''}{self.name or ''}{self.op}{self.threshold:g}"

    def describe(self) -> str:
        what = f"{safe_name(self.name or 'the first task result')} {self.op} {self.threshold:g}"
        return f"the mean of {what}" if self.aggregate == "mean" else f"{what} on every sample"

    def judge(self, samples: list[dict]) -> dict:
        """``{"met", "failing" (indices of samples under the threshold), "value" (the mean, for mean targets)}``;
        a sample without the result (a metric that skipped it) counts as failing."""
        values = [float(s["task"].get(self.name, math.nan)) for s in samples]
        failing = [s["index"] for s, v in zip(samples, values) if not self.holds(v)]
        if self.aggregate == "mean":
            mean = math.fsum(values) / len(values) if values else math.nan
            return {"met": self.holds(mean), "failing": failing, "value": mean}
        return {"met": bool(samples) and not failing, "failing": failing, "value": None}

    def to_json(self) -> dict:
        return {"text": self.text(), "name": self.name, "op": self.op, "threshold": self.threshold,
                "aggregate": self.aggregate, "describe": self.describe()}
