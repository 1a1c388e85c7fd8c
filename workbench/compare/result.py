"""Comparison results: typed records with JSON in/out (``workbench.compare/1``) and DataFrame views."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from .criterion import Criterion
from .metrics import decode_metrics, encode_metrics

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

    def to_json(self) -> dict:
        doc = {"tensor": self.tensor, "node": self.node, "op_type": self.op_type, "topo_index": self.topo_index,
               "metrics": encode_metrics(self.metrics), "diverged": self.diverged}
        if self.candidate_tensor and self.candidate_tensor != self.tensor:
            doc["candidate_tensor"] = self.candidate_tensor
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TensorResult:
        return cls(d["tensor"], d["node"], d["op_type"], int(d["topo_index"]), decode_metrics(d["metrics"]),
                   bool(d["diverged"]), d.get("candidate_tensor"))


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

    def to_json(self) -> dict:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "topo_index": self.topo_index,
                "introduced": encode_metrics(self.introduced), "received": encode_metrics(self.received),
                "introduces_divergence": self.introduces_divergence, "explanation": self.explanation}

    @classmethod
    def from_json(cls, d: dict) -> Culprit:
        return cls(d["node"], d["op_type"], d["tensor"], int(d.get("topo_index", -1)),
                   decode_metrics(d["introduced"]), decode_metrics(d["received"]),
                   bool(d.get("introduces_divergence", True)), d.get("explanation", ""))


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
    #: not serialised (None/empty after ``from_json``): the feeds compare() used and the options it ran with,
    #: what :func:`workbench.report.save_bundle` needs to make the comparison rerunnable
    used_feeds: list | None = field(default=None, repr=False, compare=False)
    run_options: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def first_divergent(self) -> TensorResult | None:
        return next((t for t in self.tensors if t.diverged), None)

    @property
    def diverged(self) -> bool:
        """True when any compared tensor (graph outputs included) diverged."""
        return any(t.diverged for t in self.tensors)

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
            "outputs": self.outputs,
            "model": self.model,
            "engines": self.engines,
            "variant": self.variant,
            "feeds": self.feeds,
            "notes": self.notes,
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
        )

    def save_json(self, path: str | Path) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load_json(cls, path: str | Path) -> CompareResult:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise WorkbenchError(f"cannot read comparison result {path}: {e}", "pass a valid JSON file") from None
        return cls.from_json(doc)

    def tensors_frame(self):
        """One row per compared tensor: topo_index, tensor, node, op_type, diverged and every metric."""
        import pandas as pd

        rows = [{"topo_index": t.topo_index, "tensor": t.tensor, "node": t.node, "op_type": t.op_type,
                 "diverged": t.diverged, **t.metrics} for t in self.tensors]
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
            row["explanation"] = c.explanation
            rows.append(row)
        return pd.DataFrame(rows)
