"""What "repaired" means: every output passes a criterion on every feed (default: the candidate precision's),
or a task metric ``fn(reference_outputs, candidate_outputs) -> number | bool`` holds a threshold on the worst
feed (``>=0.99``) or on its mean over the feeds (``mean>=0.95``: NNCF's accuracy-control reading, a drop on the
dataset's mean)."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compare.criterion import Criterion
from ..core.floats import encode_float
from .graph import RepairError

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
_THRESHOLD = re.compile(r"^\s*(mean\s*)?(>=|<=|==|>|<)\s*(\S+)\s*$")
#: ``ctc>=1``, ``mean top1>=0.95``: the dataset comparison's form, the result named (it must be the one judged)
_NAMED = re.compile(r"^\s*(mean\s+)?([^<>=!\s][^<>=!]*?)\s*(>=|<=|==|>|<)\s*(\S+)\s*$")


def load_metric(spec: str | Callable) -> tuple[Callable, str]:
    """(function, label) for a built-in task metric of compare (``top1``, ``topk:K``, ``ctc``, ``mask_iou:T``: its
    first result, e.g. the mask IoU), ``module:function`` or ``path/to/file.py:function`` (or a callable), loaded
    the way dataset metrics and preprocessing are (:func:`workbench.dataset.source.load_function`); a
    ``sys.exit()`` in it is an error of the metric, not the end of the run."""
    from ..dataset.metrics import BUILTIN, parse_metric
    from ..dataset.source import guarded, load_function
    from ..errors import InputError

    if callable(spec):
        label = f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"
        return guarded(spec, label), label
    text = str(spec)
    if text.strip().partition(":")[0] in BUILTIN:  # compare's built-in task metrics: their first result
        try:
            task = parse_metric(text)
        except InputError as e:
            raise RepairError(e.message, e.hint) from None
        return (lambda ref, cand: next(iter(task(ref, cand).values()))), text.strip()
    try:
        return load_function(text, "metric"), text
    except InputError as e:
        hint = e.hint if ":" in text else "use a built-in task metric (top1, topk:K, ctc, mask_iou:T) or your own " \
            "as module:function or path/to/file.py:function"
        raise RepairError(e.message, hint) from None


def judged_names(label: str) -> list[str]:
    """The names a target may give the number repair judges: a built-in metric's first result (``top5`` for
    ``topk:5``, ``ctc``, ``mask_iou``), else the metric's function name and its whole label."""
    from ..dataset.metrics import BUILTIN

    name, _, param = label.strip().partition(":")
    if name in BUILTIN:
        return [f"top{param or 5}" if name == "topk" else name]
    return [label.rpartition(":")[2], label]


@dataclass
class Judgement:
    """One evaluation's verdict: met, per-output worst metrics, the task value (metric targets), a score."""

    met: bool
    outputs: dict[str, dict]
    value: float | None = None
    failing: int = 0  # (feed, output) pairs failing, or feeds failing the task metric
    badness: float = 0.0  # larger is worse (ties between unmet sets)

    def to_json(self) -> dict:
        doc: dict[str, Any] = {"met": self.met, "outputs": self.outputs, "failing": self.failing}
        if self.value is not None:
            doc["value"] = encode_float(self.value)
        return doc


def criterion_target(target: str) -> Criterion:
    """A target given without a task metric: an output criterion (``sqnr_db<30``). A task metric's threshold
    (``>=0.99``) is refused with what to pass instead."""
    if _THRESHOLD.match(str(target)):
        raise RepairError(f"target {target!r} is a threshold for a task metric, and no --metric is given",
                          "pass --metric module:function (or file.py:function), or give an output criterion such as "
                          "'sqnr_db<30'")
    return Criterion.parse(target)


@dataclass
class Target:
    """Criterion target (``metric is None``): an output fails on a feed when ``criterion.diverged(metrics,
    floor)``. Metric target: ``op threshold`` on the worst feed's value (bool results: True passes)."""

    criterion: Criterion
    floors: dict[str, dict | None] = field(default_factory=dict)
    metric: Callable | None = None
    metric_label: str | None = None
    op: str | None = None
    threshold: float | None = None
    aggregate: str = "worst"  # "worst": every feed holds the threshold; "mean": the mean over the feeds does

    @classmethod
    def build(cls, criterion: Criterion, target: str | None, metric: Any, floors: dict) -> Target:
        """From ``--target``/``--metric``: no metric -> ``target`` is a criterion text (or None: the default);
        with a metric -> ``target`` is ``OP NUMBER`` (``>=0.99``), optional when the metric returns bools."""
        if metric is None:
            return cls(criterion_target(target) if target else criterion, floors)
        fn, label = load_metric(metric)
        op = threshold = None
        aggregate = "worst"
        if target:
            m = _THRESHOLD.match(str(target))
            if m:
                mean, op, number = m.groups()
            else:
                named = _NAMED.match(str(target))
                if not named:
                    raise RepairError(f"cannot read target {target!r} for metric {label}",
                                      "write e.g. '>=0.99' (every feed) or 'mean>=0.95' (the mean over the feeds)")
                mean, name, op, number = named.groups()
                judged = judged_names(label)
                if name not in judged:
                    raise RepairError(f"target {target!r} names {name!r}, but repair judges one number per feed: "
                                      f"metric {label}'s {judged[0]!r}",
                                      f"write '{'mean ' if mean else ''}{op}{number}' (or name {judged[0]!r})")
            aggregate = "mean" if mean else "worst"
            try:
                threshold = float(number)
            except ValueError:
                raise RepairError(f"target {target!r}: {number!r} is not a number") from None
            if not math.isfinite(threshold):
                raise RepairError(f"target {target!r} needs a finite threshold")
        return cls(criterion, floors, fn, label, op, threshold, aggregate)

    def describe(self) -> str:
        if self.metric is None:
            return f"every output passes ({self.criterion.describe()}) on every feed"
        if self.op is None:
            return f"{self.metric_label} is True on every feed"
        if self.aggregate == "mean":
            return f"the mean of {self.metric_label} over the feeds {self.op} {self.threshold:g}"
        return f"{self.metric_label} {self.op} {self.threshold:g} on the worst feed"

    def to_json(self) -> dict:
        if self.metric is None:
            return {"kind": "criterion", "criterion": self.criterion.text(), "aggregate": "every feed",
                    "text": self.describe()}
        return {"kind": "metric", "metric": self.metric_label, "op": self.op, "threshold": self.threshold,
                "aggregate": "mean" if self.aggregate == "mean" else "worst feed", "text": self.describe(),
                "criterion": self.criterion.text()}

    def judge(self, per_feed: list[dict[str, dict]], task: list[Any] | None = None) -> Judgement:
        """``per_feed``: per feed, output -> metrics; ``task``: per feed, the metric function's result."""
        crit = self.criterion
        outputs: dict[str, dict] = {}
        failing, badness = 0, -math.inf
        for metrics in per_feed:
            for out, m in metrics.items():
                bad = crit.diverged(m, self.floors.get(out))
                failing += bad
                badness = max(badness, crit.badness(m))
                worst = outputs.get(out)
                if worst is None or crit.badness(m) > crit.badness(worst["_m"]):
                    outputs[out] = {"_m": m}
                outputs[out]["diverged"] = outputs[out].get("diverged", False) or bad
        summary = {out: {crit.metric: encode_float(v["_m"].get(crit.metric)),
                         "nonfinite_mismatch": v["_m"].get("nonfinite_mismatch"), "diverged": v["diverged"]}
                   for out, v in outputs.items()}
        if self.metric is None:
            return Judgement(failing == 0, summary, None, failing, badness)
        values = [self._value(v) for v in task or []]
        if self.op is None:
            ok = [bool(v) for v in values]
            worst = float(min(ok)) if ok else None
            return Judgement(all(ok), summary, worst, ok.count(False), -(worst or 0.0))
        fails = [not _OPS[self.op](v, self.threshold) or math.isnan(v) for v in values]
        if self.aggregate == "mean":  # failing: the feeds under the threshold, for ranking sets that miss it
            mean = float(np.mean(values)) if values else math.nan
            met = bool(values) and not math.isnan(mean) and _OPS[self.op](mean, self.threshold)
            score = -mean if self.op in (">=", ">") else mean
            return Judgement(met, summary, mean, sum(fails), score if not math.isnan(mean) else math.inf)
        worst = (min(values) if self.op in (">=", ">") else max(values)) if values else None
        score = -(worst or 0.0) if self.op in (">=", ">") else (worst or 0.0)
        return Judgement(not any(fails), summary, worst, sum(fails), score)

    def _value(self, v: Any) -> float | bool:
        if isinstance(v, (bool, np.bool_)):
            if self.op is not None and self.op != "==":
                return float(v)
            return bool(v)
        if isinstance(v, np.ndarray) and v.size == 1:
            v = v.item()
        if isinstance(v, (int, float, np.integer, np.floating)):
            try:
                number = float(v)
            except OverflowError:  # an int past float's range
                raise RepairError(f"metric {self.metric_label} returned {str(v)[:20]}..., a number past float's "
                                  "range", "return a float (or a bool) per feed") from None
            if self.op is None:
                raise RepairError(f"metric {self.metric_label} returned a number ({number:g})",
                                  "give the threshold with --target, e.g. '>=0.99'")
            return number
        raise RepairError(f"metric {self.metric_label} returned a {type(v).__name__}",
                          "it must return a number or a bool per feed")

    def task_value(self, ref: dict, cand: dict) -> Any:
        """The metric function on one feed's outputs (reference output names on both sides)."""
        try:
            return self.metric(ref, cand)
        except RepairError:
            raise
        except Exception as e:  # noqa: BLE001 - user code
            raise RepairError(f"metric {self.metric_label} raised {type(e).__name__}: {e}") from None
