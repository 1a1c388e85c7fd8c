"""The outcome of a repair: JSON ``workbench.repair/1`` and a text summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ..textfmt import safe_name

SCHEMA = "workbench.repair/1"


@dataclass
class RepairResult:
    """``kept``: nodes kept in reference precision (reference names); ``met``: the repaired model meets the
    target on the candidate engine; ``model``: the repaired ModelProto (``model_path``: where it was saved)."""

    reference: str
    candidate: str
    kept: list[str]
    met: bool
    minimal: bool
    builds: int
    target: dict
    before: dict
    after: dict
    evaluations: list[dict]
    pool: list[str]
    verification: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    checker: dict = field(default_factory=dict)
    model_path: str | None = None
    kind: str = "float"
    timing: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    builds_detail: dict = field(default_factory=dict)
    #: where the search's evaluations ran: {"kind": serial|processes|ray, "workers", "address"}
    executor: dict = field(default_factory=lambda: {"kind": "serial", "workers": 1, "address": None})
    #: every repair, by kind: rewrites that keep a node in the candidate precision ("restore-constant", "fold-bn",
    #: "rescale": {"node", "kind", "detail", "tensors", "into"?}), then the FP32 islands ("fp32-island")
    repairs: list[dict] = field(default_factory=list)
    #: the comparison bundle of the reference vs the repaired model, once saved: {"path", "diverged", "verdict"}
    bundle: dict | None = None
    #: not serialised: the repaired model, and what a bundle needs (the comparison plan)
    model: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    plan: Any = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        """0: the target is met; 1: not reachable (the best set found is reported)."""
        return 0 if self.met else 1

    @property
    def independent_failed(self) -> str | None:
        """The independent engine's label when the repaired model ran there and missed the target, else None."""
        v = self.verification.get("independent") or {}
        return str(v.get("engine")) if v.get("met") is False else None

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "reference": self.reference, "candidate": self.candidate, "met": self.met,
                "kept": list(self.kept), "minimal": self.minimal, "builds": self.builds,
                "builds_detail": self.builds_detail, "target": self.target, "before": self.before,
                "after": self.after, "evaluations": self.evaluations, "pool": self.pool, "kind": self.kind,
                "verification": self.verification, "weights": self.weights, "checker": self.checker,
                "model": self.model_path, "bundle": self.bundle, "executor": self.executor, "timing": self.timing,
                "notes": self.notes, "repairs": self.repair_list}

    @property
    def repair_list(self) -> list[dict]:
        """``repairs``, or (a result made without them) one ``fp32-island``/``remove-qdq`` entry per kept node."""
        if self.repairs:
            return list(self.repairs)
        kind = "fp32-island" if self.kind == "float" else "remove-qdq"
        return [{"node": n, "kind": kind} for n in self.kept]

    def save_json(self, path: str | Path) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False, default=str) + "\n")

    def save_bundle(self, dest: str | Path, **kwargs: Any) -> Path:
        """A comparison bundle of the reference vs the saved repaired model, rerunnable with `workbench rerun`."""
        from .bundle import save_repair_bundle

        return save_repair_bundle(self, dest, **kwargs)

    def render(self) -> str:
        """A few lines: verdict, kept nodes, before/after per output, verification, weights, cost."""
        lines = [f"repair {safe_name(self.candidate)} against {safe_name(self.reference)}: target "
                 f"{'MET' if self.met else 'NOT REACHED'} ({safe_name(self.target.get('text', ''))})"
                 + (f"; NOT met on the independent check ({safe_name(self.independent_failed)}): see below"
                    if self.met and self.independent_failed else "")]
        label = "kept in reference precision (fp32-island)" if self.kind == "float" else "Q/DQ removed around"
        best = "" if self.met else " (best set found)"
        shown = ", ".join(map(safe_name, self.kept[:KEPT_SHOWN])) if self.kept else "(nothing)"
        if len(self.kept) > KEPT_SHOWN:
            shown = f"{len(self.kept)} nodes: {shown}, ... (every one in --json / .to_json()['kept'])"
        lines.append(f"  {label}{best}: {shown}" + ("" if self.minimal or not self.kept else " (not proven 1-minimal)"))
        from .qdq_placement import MODEL_NODE
        from .rewrites import KEPT_KINDS

        for r in (r for r in self.repairs if r.get("node") == MODEL_NODE):  # the whole model (Q/DQ placement),
            detail = safe_name(r.get("detail", ""))  # said before the nodes removed from it
            lines.insert(len(lines) - 1, f"  rewritten, the whole model ({r['kind']}): {detail}")
        rewrites = [r for r in self.repairs if r.get("kind") not in KEPT_KINDS and r.get("node") != MODEL_NODE]
        if rewrites:
            lines.append("  rewritten, kept in the candidate precision: " + "; ".join(
                f"{safe_name(r['node'])} ({r['kind']}: {safe_name(r.get('detail', ''))})" for r in rewrites))
        metric = self.target.get("criterion", "")
        for out, b in (self.before.get("outputs") or {}).items():
            a = (self.after.get("outputs") or {}).get(out, {})
            key = next((k for k in b if k not in ("nonfinite_mismatch", "diverged")), None)
            lines.append(f"  output {safe_name(out)}: {key} {_with_nonfinite(b, key)} -> {_with_nonfinite(a, key)}")
        if self.target.get("kind") == "metric":
            lines.append(f"  {safe_name(self.target.get('metric'))}: {_fmt(self.before.get('value'))} -> "
                         f"{_fmt(self.after.get('value'))} "
                         f"({'mean over the feeds' if self.target.get('aggregate') == 'mean' else 'worst feed'})")
        for role, v in self.verification.items():
            if v.get("skipped"):
                lines.append(f"  verified on {role}: skipped ({v['skipped']})")
            elif v.get("error"):  # the engine could not run the repaired model: not a verdict on it
                lines.append(f"  verified on {role} ({safe_name(v.get('engine'))}): could not run "
                             f"({safe_name(v['error'], 300)})")
            else:
                lines.append(f"  verified on {role} ({v.get('engine')}): {'met' if v.get('met') else 'NOT met'}")
        share = self.weights.get("after", {}).get("share")
        if share is not None:
            lines.append(f"  weight bytes still in the candidate precision: {100 * share:.2f}%")
        lines.append(f"  {len(self.evaluations)} evaluations, {self.builds} candidate builds, "
                     f"{self.timing.get('total_s', 0):.1f}s" + (f"; criterion {metric}" if metric else ""))
        if self.model_path:
            lines.append(f"  repaired model: {safe_name(self.model_path)}")
        lines += [f"  note: {safe_name(n)}" for n in self.notes]
        return "\n".join(lines)


#: kept nodes named on the printed result; more are counted (the JSON lists them all)
KEPT_SHOWN = 12


def _with_nonfinite(metrics: dict, key: str | None) -> str:
    """An output's metric, and how many of its values are inf/NaN where the reference's are finite (the metric
    reads the finite values only)."""
    bad = metrics.get("nonfinite_mismatch") or 0
    return _fmt(metrics.get(key)) + (f" ({bad} inf/NaN where the reference is finite)" if bad else "")


def _fmt(v: Any) -> str:
    if v is None:  # not measured (e.g. no position finite on both sides): as the comparison's tables print it
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
