"""``inspect``: everything the workbench can say about a model without running a comparison."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .core.arguments import checked
from .model.inventory import Inventory, inventory
from .model.load import LoadedModel, load_model
from .model.validate import Problem

SCHEMA = "workbench.inspect/1"


def _json(obj: Any) -> Any:
    return obj.to_json() if hasattr(obj, "to_json") else dataclasses.asdict(obj)


@dataclass
class Inspection:
    """The result of :func:`inspect_model`; ``to_json()`` follows the ``workbench.inspect/1`` contract."""

    model: LoadedModel
    inventory: Inventory
    problems: list[Problem]
    compatibility: list[Any] = field(default_factory=list)
    probes: list[Any] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return len(self.model.proto.graph.node)

    @property
    def nodes_total(self) -> int:
        return sum(r.count for r in self.inventory.ops)

    def _io(self, names: list[str]) -> list[dict]:
        tensors = self.model.graph.tensors
        return [{"name": n, "dtype": tensors[n].dtype,
                 "shape": None if tensors[n].shape is None else list(tensors[n].shape)} for n in names]

    def to_json(self) -> dict:
        m, g = self.model, self.model.graph
        return {
            "schema": SCHEMA,
            "model": {
                "name": m.name, "path": str(m.path) if m.path else None, "source": m.source,
                "sha256": m.fingerprint, "external_data": [p.name for p in m.external_files],
                "export": m.export.to_json() if m.export else None,
                "renamed_nodes": len(m.renamed_nodes),
            },
            "nodes": self.nodes,
            "nodes_total": self.nodes_total,
            "ir_version": self.inventory.ir_version,
            "producer": {"name": self.inventory.producer_name, "version": self.inventory.producer_version},
            "opset_imports": dict(self.inventory.opset_imports),
            "custom_domains": list(self.inventory.custom_domains),
            "deprecated_ops": self.inventory.deprecated_ops,
            "ops": [r.to_json() for r in self.inventory.ops],
            "inputs": self._io(g.inputs),
            "outputs": self._io(g.outputs),
            "params": {"count": g.param_count, "bytes": g.param_bytes},
            "subgraphs": [s.to_json() for s in g.subgraphs],
            "problems": [p.to_json() for p in self.problems],
            "compatibility": [_json(c) for c in self.compatibility],
            "probes": [_json(p) for p in self.probes],
        }


@checked()
def inspect_model(source: Any, *, targets: list[str] | None = None, probe: bool = True, **load_kwargs) -> Inspection:
    """Load ``source`` (see :func:`~workbench.model.load.load_model`) and inspect it.

    ``targets`` names runtimes to check the model against (see ``workbench.compat.tables``); ``probe``
    also builds a real ONNX Runtime session (and an OpenVINO model where installed) to name any node
    they reject.
    """
    model = load_model(source, **load_kwargs)
    from .compat.tables import check_model

    result = Inspection(model, inventory(model.proto), list(model.problems))
    result.compatibility = check_model(model.proto, targets)
    if probe:
        from .compat.probe import probe_onnxruntime

        result.probes.append(probe_onnxruntime(model.proto))
    return result
