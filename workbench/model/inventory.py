"""Opset inventory: which operators a model uses, from which domain and opset, and how often."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import onnx

from .validate import STANDARD_DOMAINS
from .walk import iter_nodes, opset_imports


@dataclass(frozen=True)
class OpRow:
    """One operator type: how many nodes use it and the schema version that applies at the model's opset."""

    op_type: str
    domain: str
    count: int
    since_version: int | None
    deprecated: bool = False
    in_subgraphs: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Inventory:
    """What a model is made of: opsets, operators, IR version, producer."""

    ir_version: int
    producer_name: str
    producer_version: str
    opset_imports: dict[str, int]
    ops: list[OpRow]
    custom_domains: list[str] = field(default_factory=list)

    @property
    def deprecated_ops(self) -> list[str]:
        return [r.op_type for r in self.ops if r.deprecated]

    def to_json(self) -> dict:
        return {
            "ir_version": self.ir_version, "producer_name": self.producer_name,
            "producer_version": self.producer_version, "opset_imports": dict(self.opset_imports),
            "ops": [r.to_json() for r in self.ops], "custom_domains": list(self.custom_domains),
            "deprecated_ops": self.deprecated_ops,
        }

    def to_frame(self):
        """The ops as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([r.to_json() for r in self.ops])


def _schema(op_type: str, domain: str, opset: int | None) -> onnx.defs.OpSchema | None:
    if opset is None or domain not in STANDARD_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return None


def inventory(model: onnx.ModelProto) -> Inventory:
    """Count every node's (domain, op_type), subgraphs included, and look up each schema version."""
    imports = opset_imports(model)
    top = Counter((n.domain or "ai.onnx", n.op_type) for n in model.graph.node)
    every = Counter((n.domain or "ai.onnx", n.op_type) for n in iter_nodes(model.graph))
    rows = []
    for (domain, op_type), count in sorted(every.items(), key=lambda kv: (-kv[1], kv[0])):
        schema = _schema(op_type, domain, imports.get(domain))
        rows.append(OpRow(
            op_type=op_type, domain=domain, count=count,
            since_version=schema.since_version if schema else None,
            deprecated=bool(schema and schema.deprecated), in_subgraphs=count - top.get((domain, op_type), 0),
        ))
    custom = sorted({d for d, _ in every} - STANDARD_DOMAINS)
    return Inventory(model.ir_version, model.producer_name, model.producer_version, imports, rows, custom)
