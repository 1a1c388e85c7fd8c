"""Task metrics: what a sample's answer is worth, reference against candidate, as named numbers.

A metric is a function ``fn(ref, cand) -> {name: number}`` over the two sides' graph outputs (dicts by output
name). Built-in (``NAME`` or ``NAME:PARAM``), each reading the first graph output unless ``output=`` is given:

- ``top1``: argmax over the last axis agrees (mean over the other positions): ``top1``
- ``topk[:K]``: overlap of the top-K sets over the last axis, 0..1 (K=5): ``top5``
- ``ctc``: greedy CTC decode (argmax per step, repeats merged, blank 0 dropped): ``ctc`` (1 when the decoded
  sequences are equal) and ``ctc_cer`` (edit distance / reference length)
- ``mask_iou[:T]``: IoU of the masks ``output > T`` (T=0.3, the DB text detector's threshold); 1 when both are
  empty: ``mask_iou``

Custom: ``module:function`` (or ``file.py:function``). Larger is better unless the name is listed in the
function's ``lower_is_better`` attribute (a set of result names), as ``ctc_cer`` is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

Outputs = Mapping[str, np.ndarray]
BUILTIN = ("top1", "topk", "ctc", "mask_iou")


@dataclass
class TaskMetric:
    """A named task metric: ``spec`` as the user wrote it, the function, and which results are lower-is-better."""

    spec: str
    fn: Callable[[Outputs, Outputs], Mapping[str, float]]
    lower_is_better: set[str] = field(default_factory=set)
    builtin: bool = True

    def __call__(self, ref: Outputs, cand: Outputs) -> dict[str, float]:
        try:
            got = self.fn(ref, cand)
        except InputError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - user code: one line naming the metric
            raise InputError(f"metric {self.spec!r} failed: {type(e).__name__}: {e}",
                             "check that the metric fits the model's outputs") from None
        if not isinstance(got, Mapping):
            raise InputError(f"metric {self.spec!r} returned a {type(got).__name__}, not named numbers",
                             "return a dict {name: number}")
        out = {}
        for k, v in got.items():
            try:
                if isinstance(v, (str, bytes)):  # "0.5" parses, but text is not what a metric measures
                    raise TypeError
                out[str(k)] = float(v)
            except (TypeError, ValueError, OverflowError):
                shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
                raise InputError(f"metric {self.spec!r}: {k!r} is not a number ({shown})",
                                 "return a dict {name: number} (NaN and +-inf are allowed)") from None
        return out


def parse_metric(spec: str) -> TaskMetric:
    """A :class:`TaskMetric` from ``top1``, ``topk:5``, ``ctc``, ``mask_iou:0.5`` or ``module:function``."""
    text = str(spec).strip()
    name, _, param = text.partition(":")
    if name in BUILTIN:
        return _builtin(name, param, text)
    if ":" in text:
        from .source import load_function

        fn = load_function(text, "metric")
        return TaskMetric(text, fn, set(getattr(fn, "lower_is_better", ()) or ()), builtin=False)
    raise InputError(f"unknown metric {text!r}", f"use one of {', '.join(BUILTIN)} or module:function")


def _builtin(name: str, param: str, text: str) -> TaskMetric:
    if name == "top1":
        if param:
            raise InputError(f"metric {text!r}: top1 takes no parameter", "write top1 (or topk:K)")
        return TaskMetric(text, lambda r, c: {"top1": top1(_first(r), _first(c))})
    if name == "topk":
        k = _param(param, 5, int, text)
        if k < 1:
            raise InputError(f"metric {text!r}: K must be >= 1", "write e.g. topk:5")
        return TaskMetric(text, lambda r, c: {f"top{k}": topk_overlap(_first(r), _first(c), k)})
    if name == "ctc":
        blank = _param(param, 0, int, text)
        if blank < 0:
            raise InputError(f"metric {text!r}: the blank class must be >= 0", "write ctc (blank 0) or ctc:N")
        return TaskMetric(text, lambda r, c: ctc_agreement(_first(r), _first(c), blank), {"ctc_cer"})
    threshold = _param(param, 0.3, float, text)
    if not math.isfinite(threshold):  # every comparison with NaN is false: IoU 1 on any masks
        raise InputError(f"metric {text!r}: the threshold must be a finite number", "write e.g. mask_iou:0.5")
    return TaskMetric(text, lambda r, c: {"mask_iou": mask_iou(_first(r), _first(c), threshold)})


def _param(text: str, default, kind, whole: str):
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise InputError(f"cannot read the parameter of metric {whole!r}", "write e.g. topk:5 or mask_iou:0.5") \
            from None


def _first(outputs: Outputs) -> np.ndarray:
    return np.asarray(next(iter(outputs.values())))


def top1(ref: np.ndarray, cand: np.ndarray) -> float:
    """Share of positions (all axes but the last) whose argmax over the last axis agrees."""
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)))


def topk_overlap(ref: np.ndarray, cand: np.ndarray, k: int) -> float:
    """Mean share of the reference's top-``k`` classes (last axis) the candidate also ranks in its top ``k``."""
    k = min(k, ref.shape[-1])
    r = np.argsort(-ref.reshape(-1, ref.shape[-1]), axis=-1, kind="stable")[:, :k]
    c = np.argsort(-cand.reshape(-1, cand.shape[-1]), axis=-1, kind="stable")[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(r.tolist(), c.tolist())]))


def ctc_greedy(probs: np.ndarray, blank: int = 0) -> list[list[int]]:
    """Greedy CTC decode per batch row of ``(batch, time, classes)`` scores: argmax, merge repeats, drop blank."""
    ids = np.argmax(probs.reshape(-1, *probs.shape[-2:]), axis=-1)
    out = []
    for row in ids:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        out.append([int(t) for t in row[keep] if t != blank])
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def ctc_agreement(ref: np.ndarray, cand: np.ndarray, blank: int = 0) -> dict[str, float]:
    """``ctc``: share of rows whose greedy-decoded sequences are equal; ``ctc_cer``: edit distance over the
    reference's length (summed over rows)."""
    rs, cs = ctc_greedy(ref, blank), ctc_greedy(cand, blank)
    same = float(np.mean([a == b for a, b in zip(rs, cs)]))
    errors = sum(edit_distance(a, b) for a, b in zip(rs, cs))
    length = sum(len(a) for a in rs)
    return {"ctc": same, "ctc_cer": errors / length if length else float(errors > 0)}


def mask_iou(ref: np.ndarray, cand: np.ndarray, threshold: float = 0.3) -> float:
    """IoU of the binary masks ``ref > threshold`` and ``cand > threshold`` (1 when both are empty)."""
    a, b = np.asarray(ref) > threshold, np.asarray(cand) > threshold
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else float(np.count_nonzero(a & b) / union)
