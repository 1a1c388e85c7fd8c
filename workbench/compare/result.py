"""Comparison results: typed records with JSON in/out (``workbench.compare/1``) and DataFrame views."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.floats import decode_float, decode_metrics, encode_float, encode_metrics
from ..errors import WorkbenchError
from .criterion import Criterion

SCHEMA = "workbench.compare/1"


@dataclass
class TensorResult:
    """One compared tensor, in the reference's topological order."""

    tensor: str
    node: str
    op_type: str
    topo_index: int
    metrics: dict[str, Any]
    diverged: bool
    candidate_tensor: str | None = None
    #: the precision floor: metrics of the reference held in the candidate's format, with the format and the
    #: shares of values under/over its range (None: the candidate holds this tensor in float32 or wider)
    floor: dict[str, Any] | None = None
    #: fails the criterion only because its format cannot hold the reference values (see Criterion.at_floor)
    at_floor: bool = False

    def to_json(self) -> dict:
        doc = {"tensor": self.tensor, "node": self.node, "op_type": self.op_type, "topo_index": self.topo_index,
               "metrics": encode_metrics(self.metrics), "diverged": self.diverged}
        if self.candidate_tensor and self.candidate_tensor != self.tensor:
            doc["candidate_tensor"] = self.candidate_tensor
        if self.floor is not None:
            doc["floor"] = encode_metrics(self.floor)
        if self.at_floor:
            doc["at_floor"] = True
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TensorResult:
        return cls(d["tensor"], d["node"], d["op_type"], int(d["topo_index"]), decode_metrics(d["metrics"]),
                   bool(d["diverged"]), d.get("candidate_tensor"),
                   decode_metrics(d["floor"]) if isinstance(d.get("floor"), dict) else None, bool(d.get("at_floor")))


@dataclass
class Culprit:
    """A node ranked by the error it introduces when run alone on the candidate with reference inputs."""

    node: str
    op_type: str
    tensor: str
    topo_index: int
    introduced: dict[str, Any]
    received: dict[str, Any]
    introduces_divergence: bool
    explanation: str = ""
    #: the precision floor of its output tensor (see TensorResult.floor)
    floor: dict[str, Any] | None = None
    #: the introduced error beyond the floor, in the criterion's metric (see workbench.compare.culprits)
    beyond_floor: float | None = None
    #: what fixing it does to the outputs: {"gain": {output: gain in dB}, "best_gain_db", "harmless": bool,
    #: "fixed": "how the fix was applied"} (None: not measured)
    impact: dict[str, Any] | None = None
    #: at granularity "fused": the candidate engine's node this error belongs to, {"engine_node", "kind",
    #: "onnx_nodes"} (the culprit ran as that whole group)
    group: dict[str, Any] | None = None

    @property
    def harmless(self) -> bool:
        """Measured, and fixing it gains (almost) nothing on any output."""
        return bool(self.impact and self.impact.get("harmless"))

    def to_json(self) -> dict:
        doc = {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "topo_index": self.topo_index,
               "introduced": encode_metrics(self.introduced), "received": encode_metrics(self.received),
               "introduces_divergence": self.introduces_divergence, "explanation": self.explanation}
        if self.floor is not None:
            doc["floor"] = encode_metrics(self.floor)
        if self.beyond_floor is not None:
            doc["beyond_floor"] = encode_float(self.beyond_floor)
        if self.impact is not None:
            doc["impact"] = _encode_impact(self.impact)
        if self.group is not None:
            doc["group"] = self.group
        return doc

    @classmethod
    def from_json(cls, d: dict) -> Culprit:
        impact = d.get("impact")
        if isinstance(impact, dict):
            impact = {**impact, "gain": decode_metrics(impact.get("gain") or {}),
                      "best_gain_db": decode_float(impact.get("best_gain_db")),
                      "after": {o: decode_metrics(m) for o, m in (impact.get("after") or {}).items()}}
        return cls(d["node"], d["op_type"], d["tensor"], int(d.get("topo_index", -1)),
                   decode_metrics(d["introduced"]), decode_metrics(d["received"]),
                   bool(d.get("introduces_divergence", True)), d.get("explanation", ""),
                   decode_metrics(d["floor"]) if isinstance(d.get("floor"), dict) else None,
                   decode_float(d.get("beyond_floor")), impact if isinstance(impact, dict) else None,
                   d.get("group") if isinstance(d.get("group"), dict) else None)


def _encode_impact(impact: dict) -> dict:
    return {**impact, "gain": encode_metrics(impact.get("gain") or {}),
            "best_gain_db": encode_float(impact.get("best_gain_db")),
            "after": {o: encode_metrics(m) for o, m in (impact.get("after") or {}).items()}}


@dataclass
class CompareResult:
    """Everything a comparison found. ``to_json()`` follows the compare contract; ``from_json`` reads it back."""

    reference: str
    candidate: str
    criterion: Criterion
    tensors: list[TensorResult]
    culprits: list[Culprit]
    mode: str
    model: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)
    variant: dict = field(default_factory=dict)
    feeds: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    builds: int = 0
    notes: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    #: what each side computes in, inferred from its model: {"reference"|"candidate": {"precision", "source"}}
    precision: dict = field(default_factory=dict)
    #: internal tensors under the criterion count as a divergence too (a CI gate)
    fail_on_internal_dips: bool = False
    #: at granularity "fused": {"mode", "engine", "compared", "unobservable": [{"tensor", "node", "op_type",
    #: "reason"}], "groups": {tensor: group}, "fusion_check"} (empty: every tensor was compared)
    granularity: dict = field(default_factory=dict)
    #: not serialised (None/empty after ``from_json``): the feeds compare() used and the options it ran with,
    #: what :func:`workbench.report.save_bundle` needs to make the comparison rerunnable
    used_feeds: list | None = field(default=None, repr=False, compare=False)
    run_options: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def output_results(self) -> list[TensorResult]:
        """The compared graph outputs, in the model's output order."""
        by_name = {t.tensor: t for t in self.tensors}
        return [by_name[o] for o in self.outputs if o in by_name]

    @property
    def diverged(self) -> bool:
        """The verdict: True when a graph output diverged (fails the criterion beyond its precision floor, or
        holds inf/NaN where the other side does not). When no output could be compared, any tensor decides."""
        outs = self.output_results
        return any(t.diverged for t in (outs if outs else self.tensors))

    @property
    def internal_dips(self) -> list[TensorResult]:
        """Internal tensors under the criterion (diverged, or at their floor) while the outputs pass."""
        if self.diverged:
            return []
        outs = set(self.outputs)
        return [t for t in self.tensors if t.tensor not in outs and (t.diverged or t.at_floor)]

    @property
    def failed(self) -> bool:
        """What the exit code follows: the verdict, plus internal dips when ``fail_on_internal_dips``."""
        return self.diverged or (self.fail_on_internal_dips and any(t.diverged for t in self.internal_dips))

    @property
    def first_divergent(self) -> TensorResult | None:
        """For a diverged run, the first tensor (topological order) that diverged; None otherwise."""
        if not self.diverged:
            return None
        return next((t for t in self.tensors if t.diverged), None)

    @property
    def harmful_culprits(self) -> list[Culprit]:
        return [c for c in self.culprits if c.introduces_divergence and not c.harmless]

    def verdict(self) -> dict:
        """Why the run is ok or diverged, output by output, and the internal dips."""
        m = self.criterion.metric
        outs = [{"tensor": t.tensor, m: encode_float(t.metrics.get(m)),
                 "nonfinite_mismatch": t.metrics.get("nonfinite_mismatch"), "diverged": t.diverged,
                 "at_floor": t.at_floor, "floor": None if t.floor is None else encode_float(t.floor.get(m)),
                 **({"shape_mismatch": t.metrics["shape_mismatch"]} if t.metrics.get("shape_mismatch") else {})}
                for t in self.output_results]
        bad = [o["tensor"] for o in outs if o["diverged"]]
        shapes = [o["tensor"] for o in outs if o.get("shape_mismatch")]
        if shapes:
            reason = (f"output(s) {', '.join(shapes)} have another shape on the candidate (nothing to compare)"
                      + (f"; output(s) {', '.join(b for b in bad if b not in shapes)} fail {self.criterion.describe()}"
                         if set(bad) - set(shapes) else ""))
        elif bad:
            reason = f"output(s) {', '.join(bad)} fail {self.criterion.describe()}"
        elif outs:
            reason = f"every output passes {self.criterion.describe()}" + (
                f" ({sum(o['at_floor'] for o in outs)} at the candidate format's floor)"
                if any(o["at_floor"] for o in outs) else "")
        else:
            reason = "no graph output was compared: judged on every compared tensor"
        dips = [{"tensor": t.tensor, "node": t.node, "op_type": t.op_type, "topo_index": t.topo_index,
                 m: encode_float(t.metrics.get(m)), "floor": None if t.floor is None else encode_float(t.floor.get(m)),
                 "at_floor": t.at_floor} for t in self.internal_dips]
        return {"diverged": self.diverged, "failed": self.failed, "reason": reason, "outputs": outs,
                "internal_dips": dips, "fail_on_internal_dips": self.fail_on_internal_dips}

    def tensor(self, name: str) -> TensorResult:
        for t in self.tensors:
            if t.tensor == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict:
        first = self.first_divergent
        return {
            "schema": SCHEMA,
            "reference": self.reference,
            "candidate": self.candidate,
            "criterion": self.criterion.to_json(),
            "first_divergent": None if first is None else {
                "node": first.node, "op_type": first.op_type, "tensor": first.tensor, "topo_index": first.topo_index},
            "culprits": [c.to_json() for c in self.culprits],
            "tensors": [t.to_json() for t in self.tensors],
            "timing": self.timing,
            "mode": self.mode,
            "builds": self.builds,
            "diverged": self.diverged,
            "verdict": self.verdict(),
            "precision": self.precision,
            "outputs": self.outputs,
            "model": self.model,
            "engines": self.engines,
            "variant": self.variant,
            "feeds": self.feeds,
            "notes": self.notes,
            **({"granularity": self.granularity} if self.granularity else {}),
        }

    @classmethod
    def from_json(cls, doc: dict) -> CompareResult:
        if doc.get("schema") != SCHEMA:
            raise WorkbenchError(f"not a comparison result (schema {doc.get('schema')!r}, expected {SCHEMA!r})",
                                 "pass a file written by `workbench compare --json`")
        return cls(
            reference=doc["reference"], candidate=doc["candidate"], criterion=Criterion.from_json(doc["criterion"]),
            tensors=[TensorResult.from_json(t) for t in doc["tensors"]],
            culprits=[Culprit.from_json(c) for c in doc["culprits"]], mode=doc.get("mode", "all"),
            model=doc.get("model", {}), engines=doc.get("engines", {}), variant=doc.get("variant", {}),
            feeds=doc.get("feeds", {}), timing=doc.get("timing", {}), builds=int(doc.get("builds", 0)),
            notes=list(doc.get("notes", [])), outputs=list(doc.get("outputs", [])),
            precision=dict(doc.get("precision") or {}),
            fail_on_internal_dips=bool((doc.get("verdict") or {}).get("fail_on_internal_dips", False)),
            granularity=dict(doc.get("granularity") or {}),
        )

    def save_json(self, path: str | Path) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load_json(cls, path: str | Path) -> CompareResult:
        from .._files import read_json

        return cls.from_json(read_json(path, "comparison result", hint="pass a valid JSON file"))

    def tensors_frame(self):
        """One row per compared tensor: topo_index, tensor, node, op_type, diverged and every metric."""
        import pandas as pd

        rows = [{"topo_index": t.topo_index, "tensor": t.tensor, "node": t.node, "op_type": t.op_type,
                 "diverged": t.diverged, "at_floor": t.at_floor, **t.metrics,
                 **{f"floor_{k}": v for k, v in (t.floor or {}).items()}} for t in self.tensors]
        return pd.DataFrame(rows)

    def culprits_frame(self):
        """One row per culprit, worst first: introduced and received metrics side by side."""
        import pandas as pd

        rows = []
        for rank, c in enumerate(self.culprits, 1):
            row = {"rank": rank, "node": c.node, "op_type": c.op_type, "tensor": c.tensor,
                   "introduces_divergence": c.introduces_divergence}
            row |= {f"introduced_{k}": v for k, v in c.introduced.items()}
            row |= {f"received_{k}": v for k, v in c.received.items()}
            row["harmless"] = c.harmless if c.impact else None
            row["best_gain_db"] = (c.impact or {}).get("best_gain_db")
            row["explanation"] = c.explanation
            rows.append(row)
        return pd.DataFrame(rows)
