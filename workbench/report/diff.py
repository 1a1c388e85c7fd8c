"""What changed between two comparisons (before/after a fix, two runtime versions): the output-led verdict and
its reason, the graph outputs, internal dips, per-tensor metric changes (and floors), first divergent layer,
culprits, inferred precisions and versions.

Results JSON written before precision-aware verdicts (no "precision", "verdict" or "floor" keys) load and diff
too: their verdict is re-judged from their graph outputs, and what they do not record is simply absent.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare.result import CompareResult
from ..core import arguments
from ..core.floats import decode_float, encode_float, encode_metrics
from ..core.metric_info import METRICS
from ..errors import WorkbenchError
from ..textfmt import safe_name
from .env import diff_versions

SCHEMA = "workbench.diff/1"


def load_result(source: Any, *, trust_unsealed: bool = False) -> CompareResult:
    """A CompareResult from itself, a ``workbench.compare/1`` JSON file, or a bundle (folder or .zip; one without a
    seal only when ``trust_unsealed``)."""
    from .bundle import MANIFEST, load_bundle
    from .safety import BundleError, read_json

    if isinstance(source, CompareResult):
        return source
    path = Path(source).expanduser()
    if not path.exists():
        raise BundleError(f"not found: {path}", "pass a results JSON (`workbench compare --json`) or a bundle")
    if path.is_dir() or path.suffix.lower() == ".zip" or path.name == MANIFEST:
        with load_bundle(path.parent if path.name == MANIFEST else path, trust_unsealed=trust_unsealed) as bundle:
            return bundle.result
    doc = read_json(path, path.name, schema="workbench.compare/1")
    if doc.get("kind") == "dataset":
        raise BundleError(f"{path.name} is a dataset comparison (per-sample results), not a single comparison",
                          "diff it against another dataset result: workbench diff A.json B.json")
    try:
        return CompareResult.from_json(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{path.name} is an incomplete comparison result ({type(e).__name__}: {e})",
                          "pass a file written by `workbench compare --json`") from None


def delta(before: Any, after: Any) -> float | None:
    """``after - before``; 0 for equal infinities; None when either is missing."""
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)):
        return None
    if before == after:
        return 0.0
    with_nan = math.isnan(before) or math.isnan(after)
    return math.nan if with_nan else float(after) - float(before)


def changed(before: Any, after: Any) -> bool:
    """Whether a metric's value moved: two NaNs are the same value; a value that appears, disappears or turns
    non-numeric moved."""
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return not (math.isnan(before) and math.isnan(after)) and before != after
    return before != after


def _size(d: float | None) -> float:
    """How much a change weighs when ranked: a change that is not a number (a value that appeared, disappeared or
    is not numeric) ranks with the infinite ones."""
    if d is None:
        return math.inf
    return math.inf if not math.isfinite(d) else abs(d)


@dataclass
class TensorChange:
    """One tensor compared in both results."""

    tensor: str
    node: str
    op_type: str
    topo_index: int
    before: dict
    after: dict
    diverged_before: bool
    diverged_after: bool
    at_floor_before: bool = False
    at_floor_after: bool = False
    floor_before: dict | None = None
    floor_after: dict | None = None

    def change(self, metric: str) -> float | None:
        return delta(self.before.get(metric), self.after.get(metric))

    def to_json(self, metric: str) -> dict:
        return {"tensor": self.tensor, "node": self.node, "op_type": self.op_type, "topo_index": self.topo_index,
                "metric": metric, "before": encode_float(self.before.get(metric)),
                "after": encode_float(self.after.get(metric)), "change": encode_float(self.change(metric)),
                "diverged_before": self.diverged_before, "diverged_after": self.diverged_after,
                "at_floor_before": self.at_floor_before, "at_floor_after": self.at_floor_after,
                "floor_before": encode_float((self.floor_before or {}).get(metric)),
                "floor_after": encode_float((self.floor_after or {}).get(metric)),
                "metrics_before": encode_metrics(self.before), "metrics_after": encode_metrics(self.after)}


def _first(r: CompareResult) -> dict | None:
    t = r.first_divergent
    return None if t is None else {"tensor": t.tensor, "node": t.node, "op_type": t.op_type,
                                   "topo_index": t.topo_index}


def _culprits(r: CompareResult, metric: str) -> list[dict]:
    return [{"node": c.node, "op_type": c.op_type, "introduces_divergence": c.introduces_divergence,
             "harmless": c.harmless, "best_gain_db": encode_float((c.impact or {}).get("best_gain_db")),
             metric: encode_float(c.introduced.get(metric))} for c in r.culprits]


def _harmful(r: CompareResult) -> list[str]:
    """Culprits that introduce divergence and are not measured harmless, in rank order."""
    return [c.node for c in r.culprits if c.introduces_divergence and not c.harmless]


def _dips(r: CompareResult) -> list[str]:
    return [t.tensor for t in r.internal_dips]


def _state(diverged: bool, at_floor: bool = False) -> str:
    return "DIVERGED" if diverged else ("ok, at its floor" if at_floor else "ok")


def predates_verdicts(r: CompareResult) -> bool:
    """Written before precision-aware verdicts: no inferred precision and no floor anywhere."""
    return not r.precision and all(t.floor is None for t in r.tensors)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(d, (str, int, float, bool)) or d is None:
        out[prefix[:-1]] = d
    else:
        out[prefix[:-1]] = str(d)
    return out


def engine_versions(r: CompareResult) -> dict[str, Any]:
    """``{"reference.onnxruntime": "1.20.1", ...}``: version-like fields of both engines' descriptions."""
    flat = _flat(r.engines or {})
    return {k: v for k, v in flat.items() if k == "workbench" or not k.endswith((".device", ".threads"))}


@dataclass
class ResultDiff:
    """``before`` vs ``after``. ``tensors``: compared in both, in topological order."""

    before: CompareResult
    after: CompareResult
    metric: str
    tensors: list[TensorChange] = field(default_factory=list)
    only_before: list[str] = field(default_factory=list)
    only_after: list[str] = field(default_factory=list)
    labels: tuple[str, str] = ("before", "after")

    @property
    def first_divergent_changed(self) -> bool:
        a, b = _first(self.before), _first(self.after)
        return (a and a["tensor"]) != (b and b["tensor"])

    @property
    def verdict_changed(self) -> bool:
        """The output-led verdict (``CompareResult.diverged``) differs."""
        return self.before.diverged != self.after.diverged

    @property
    def failed_changed(self) -> bool:
        """What the exit code follows (the verdict, plus internal dips under ``fail_on_internal_dips``) differs."""
        return self.before.failed != self.after.failed

    @property
    def internal_dips(self) -> dict[str, list[str]]:
        """Internal dips (internal tensors under the criterion while the outputs pass) on each side, and which
        appeared or went away."""
        a, b = _dips(self.before), _dips(self.after)
        return {"before": a, "after": b, "new": [t for t in b if t not in set(a)],
                "gone": [t for t in a if t not in set(b)]}

    @property
    def internal_dips_changed(self) -> bool:
        dips = self.internal_dips
        return bool(dips["new"] or dips["gone"])

    def outputs(self) -> list[dict]:
        """Each graph output compared in both: the metric and state before and after."""
        m = self.metric
        after = {t.tensor: t for t in self.after.output_results}
        rows = []
        for t in self.before.output_results:
            u = after.get(t.tensor)
            if u is None:
                continue
            rows.append({"tensor": t.tensor, "before": encode_float(t.metrics.get(m)),
                         "after": encode_float(u.metrics.get(m)),
                         "change": encode_float(delta(t.metrics.get(m), u.metrics.get(m))),
                         "state_before": _state(t.diverged, t.at_floor), "state_after": _state(u.diverged, u.at_floor),
                         "changed": (t.diverged, t.at_floor) != (u.diverged, u.at_floor)})
        return rows

    @property
    def top_culprit_changed(self) -> bool:
        """The top harmful culprit (introduces divergence, not measured harmless) differs."""
        def top(r):
            flagged = _harmful(r)
            return flagged[0] if flagged else None

        return top(self.before) != top(self.after)

    @property
    def notes(self) -> list[str]:
        out = []
        for label, r in zip(self.labels, (self.before, self.after)):
            if predates_verdicts(r):
                out.append(f"{label} was written before precision-aware verdicts (no inferred precision or floors "
                           "recorded): its verdict is re-judged from its graph outputs")
        ga, gb = getattr(self.before, "granularity", None), getattr(self.after, "granularity", None)
        if ga and gb:  # two fused-granularity comparisons: did the engine fuse the same groups?
            from ..engine_graphs.diff import fusion_change, render_fusion_change

            out.append(render_fusion_change(fusion_change(ga, gb), self.labels).replace("\n", "; "))
        sa, sb = self.before.model.get("sha256"), self.after.model.get("sha256")
        if sa and sb and sa != sb:
            out.append(f"the two results are of different models ({self.before.model.get('name')} and "
                       f"{self.after.model.get('name')}): tensors are matched by name only")
        return out

    @property
    def versions(self) -> dict[str, list]:
        return diff_versions(engine_versions(self.before), engine_versions(self.after))

    @property
    def specs_changed(self) -> dict[str, list]:
        out = {}
        for key in ("reference", "candidate"):
            a, b = getattr(self.before, key), getattr(self.after, key)
            if a != b:
                out[key] = [a, b]
        if self.before.criterion != self.after.criterion:
            out["criterion"] = [self.before.criterion.describe(), self.after.criterion.describe()]
        sha_a, sha_b = self.before.model.get("sha256"), self.after.model.get("sha256")
        if sha_a != sha_b:
            out["model_sha256"] = [sha_a, sha_b]
        for side in ("reference", "candidate"):  # only when both record it (older results do not)
            a = ((self.before.precision or {}).get(side) or {}).get("precision")
            b = ((self.after.precision or {}).get(side) or {}).get("precision")
            if a and b and a != b:
                out[f"{side}_precision"] = [a, b]
        for key in ("source", "seed", "count", "shapes", "ranges"):  # the inputs, where both record them
            a, b = (self.before.feeds or {}).get(key), (self.after.feeds or {}).get(key)
            if (self.before.feeds and self.after.feeds) and a != b:
                out[f"feeds.{key}"] = [a, b]
        for key, label in (("calibration_method", "method"), ("calibration_feeds", "feeds")):  # INT8 calibration
            a = ((self.before.variant or {}).get("details") or {}).get(key)
            b = ((self.after.variant or {}).get("details") or {}).get(key)
            if (a is not None or b is not None) and a != b:
                out[f"calibration.{label}"] = [a, b]
        return out

    def largest(self, n: int = 10, metric: str | None = None) -> list[TensorChange]:
        """Tensors whose ``metric`` changed most (infinite or NaN changes first), ties in topological order."""
        m = metric or self.metric
        moved = [t for t in self.tensors if changed(t.before.get(m), t.after.get(m))
                 or t.diverged_before != t.diverged_after or t.at_floor_before != t.at_floor_after]
        moved.sort(key=lambda t: (-_size(t.change(m)), t.topo_index))
        return moved[:n]

    def metrics_match(self, rel: float = 1e-4, abs_: float = 1e-9) -> bool:
        """Every metric of every common tensor equal within tolerance, and no tensor added or removed."""
        if self.only_before or self.only_after:
            return False
        for t in self.tensors:
            for k in set(t.before) | set(t.after):
                a, b = t.before.get(k), t.after.get(k)
                if not changed(a, b):  # equal, or NaN in both
                    continue
                if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
                    return False
                if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > abs_ + rel * max(abs(a), abs(b)):
                    return False
        return True

    @property
    def same_conclusion(self) -> bool:
        """Same verdict, same first divergent tensor, same top culprit."""
        return not (self.verdict_changed or self.first_divergent_changed or self.top_culprit_changed)

    def to_json(self, top: int = 20) -> dict:
        return {
            "schema": SCHEMA,
            "labels": list(self.labels),
            "metric": self.metric,
            "same_conclusion": self.same_conclusion,
            "metrics_match": self.metrics_match(),
            "verdict": {"before": self.before.diverged, "after": self.after.diverged, "changed": self.verdict_changed},
            "verdict_reason": {"before": self.before.verdict()["reason"], "after": self.after.verdict()["reason"]},
            "failed": {"before": self.before.failed, "after": self.after.failed, "changed": self.failed_changed},
            "outputs": self.outputs(),
            "internal_dips": {**self.internal_dips, "changed": self.internal_dips_changed},
            "precision": {"before": self.before.precision or None, "after": self.after.precision or None},
            "first_divergent": {"before": _first(self.before), "after": _first(self.after),
                                "changed": self.first_divergent_changed},
            "culprits": {"before": _culprits(self.before, self.metric), "after": _culprits(self.after, self.metric),
                         "top_changed": self.top_culprit_changed},
            "specs_changed": self.specs_changed,
            "versions_changed": self.versions,
            "tensors_only_before": self.only_before,
            "tensors_only_after": self.only_after,
            "largest_changes": [t.to_json(self.metric) for t in self.largest(top)],
            "tensors": [t.to_json(self.metric) for t in self.tensors],
            "notes": self.notes,
        }

    def render(self, top: int = 10) -> str:
        """A readable summary."""
        from ..compare.text import fmt
        from ..textfmt import table

        a, b = self.labels
        m = self.metric
        a, b = safe_name(a), safe_name(b)
        lines = [f"{a}: {safe_name(self.before.reference)} vs {safe_name(self.before.candidate)} on "
                 f"{safe_name(self.before.model.get('name'))}; {b}: {safe_name(self.after.reference)} vs "
                 f"{safe_name(self.after.candidate)} on {safe_name(self.after.model.get('name'))}"]
        verdict = {True: "DIVERGED", False: "ok"}
        lines.append(f"verdict: {verdict[self.before.diverged]} -> {verdict[self.after.diverged]}"
                     + (" (changed)" if self.verdict_changed else " (same)"))
        lines.append(f"  {a}: {self.before.verdict()['reason']}")
        lines.append(f"  {b}: {self.after.verdict()['reason']}")
        if self.failed_changed:
            lines.append(f"exit status: {'fails' if self.before.failed else 'passes'} -> "
                         f"{'fails' if self.after.failed else 'passes'}")
        for o in self.outputs():
            lines.append(f"output {safe_name(o['tensor'])}: {m} {fmt(decode_float(o['before']), m)} -> "
                         f"{fmt(decode_float(o['after']), m)} "
                         f"({o['state_before']} -> {o['state_after']})")
        dips = self.internal_dips
        if dips["before"] or dips["after"]:
            lines.append(f"internal dips: {len(dips['before'])} -> {len(dips['after'])}"
                         + (f"; new: {', '.join(dips['new'][:5])}" if dips["new"] else "")
                         + (f"; gone: {', '.join(dips['gone'][:5])}" if dips["gone"] else ""))
        fa, fb = _first(self.before), _first(self.after)
        lines.append(f"first divergent: {fa['tensor'] if fa else 'none'} -> {fb['tensor'] if fb else 'none'}"
                     + (" (changed)" if self.first_divergent_changed else " (same)"))
        ca, cb = _harmful(self.before)[:3], _harmful(self.after)[:3]
        lines.append(f"harmful culprits: {', '.join(ca) or 'none'} -> {', '.join(cb) or 'none'}"
                     + (" (top culprit changed)" if self.top_culprit_changed else ""))
        for key, (x, y) in self.specs_changed.items():
            lines.append(f"{key}: {x} -> {y}")
        versions = self.versions
        lines.append("engine versions: " + ("; ".join(f"{k} {x} -> {y}" for k, (x, y) in versions.items())
                                            if versions else "unchanged"))
        if self.only_before or self.only_after:
            lines.append(f"tensors only in {a}: {len(self.only_before)}, only in {b}: {len(self.only_after)}")
        everything = self.largest(len(self.tensors))
        moved, total = everything[:top], len(everything)
        if total > len(moved):
            lines.append(f"per-tensor {m}: {total} tensor(s) changed" + (f", the {len(moved)} largest below"
                                                                          if moved else " (--top 0 lists none)"))
        if moved:
            lines += ["", f"largest {m} changes:", table(
                ["#", "tensor", "op_type", a, b, "change", "diverged"],
                [[t.topo_index, t.tensor, t.op_type, fmt(t.before.get(m), m), fmt(t.after.get(m), m),
                  _fmt_change(t.change(m), m), f"{'yes' if t.diverged_before else 'no'} -> "
                  f"{'yes' if t.diverged_after else 'no'}"] for t in moved])]
        elif not total:
            lines.append(f"per-tensor {m}: no change")
        lines += [f"note: {safe_name(n)}" for n in self.notes]
        return "\n".join(lines)


def _fmt_change(d: float | None, metric: str) -> str:
    if d is None:
        return "-"
    if not math.isfinite(d):
        return "nan" if math.isnan(d) else ("+inf" if d > 0 else "-inf")
    unit = " dB" if metric == "sqnr_db" else ""
    return f"{d:+.3g}{unit}"


@arguments.checked(before=lambda _name, _value: None, after=lambda _name, _value: None)
def diff_results(before: Any, after: Any, *, metric: str | None = None,
                 labels: tuple[str, str] = ("before", "after"), trust_unsealed: bool = False) -> ResultDiff:
    """Compare two results (CompareResult objects, results JSON files or bundles; bundles without a seal only when
    ``trust_unsealed``). ``metric``: the one ranked (default: the ``before`` criterion's). Two engine graphs
    (``workbench.engine_graph/1``) give an :class:`~workbench.engine_graphs.diff.EngineGraphDiff` instead: changed
    fusions, providers, precisions, latency."""
    from ..engine_graphs.diff import diff_graphs, load_graph

    if load_graph(before) is not None or load_graph(after) is not None:
        return diff_graphs(before, after, metric=metric, labels=labels)
    a, b = load_result(before, trust_unsealed=trust_unsealed), load_result(after, trust_unsealed=trust_unsealed)
    m = metric or a.criterion.metric
    known = list(dict.fromkeys([*METRICS, *(k for t in a.tensors for k in t.metrics)]))
    if m not in known:
        raise WorkbenchError(f"unknown metric {m!r} to rank changes by", f"use one of {', '.join(known)}")
    by_b = {t.tensor: t for t in b.tensors}
    names_a = {t.tensor for t in a.tensors}
    changes = [TensorChange(t.tensor, t.node, t.op_type, t.topo_index, t.metrics, by_b[t.tensor].metrics,
                            t.diverged, by_b[t.tensor].diverged, t.at_floor, by_b[t.tensor].at_floor, t.floor,
                            by_b[t.tensor].floor) for t in a.tensors if t.tensor in by_b]
    return ResultDiff(a, b, m, changes, [t.tensor for t in a.tensors if t.tensor not in by_b],
                      [t.tensor for t in b.tensors if t.tensor not in names_a], labels)


def label_of(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return Path(source).name
    return "result"
