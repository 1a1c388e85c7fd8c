"""Engine graphs as typed records with JSON in/out (``workbench.engine_graph/1``).

An :class:`EngineGraph` lists what an engine executes: one :class:`EngineNode` per executed node (an ONNX Runtime
kernel of the optimized graph, an OpenVINO executed node, a TensorRT layer), each with the ONNX nodes it computes,
where it ran (provider), in what precision and how long it took.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError

SCHEMA = "workbench.engine_graph/1"
#: largest engine graph JSON read (a 100k-node model's graph is well under this)
MAX_JSON_BYTES = 256 * 1024**2
#: roles: ``compute`` runs ONNX nodes; ``layout`` converts a tensor's layout or type (ORT's Reorder/Memcpy/inserted
#: Casts, OpenVINO's Reorder, TensorRT's Reformat) and maps to the node whose tensor it converts
ROLES = ("compute", "layout")


@dataclass
class EngineNode:
    """One executed node. ``latency_ms``: median per run (None when not profiled), ``latency_mean_ms``: mean (means
    add up to the run's total, medians do not on a busy machine); ``outputs``: the ONNX tensors it writes that
    leave it (the fused group's boundary, observable without changing fusion); ``mapped_by``: how its
    ONNX nodes were found (``tensors``, ``names``, ``metadata``, ``range``, ``topology``, ``neighbour``)."""

    name: str
    kind: str
    onnx_nodes: list[str]
    provider: str | None = None
    precision: str | None = None
    latency_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_mean_ms: float | None = None
    role: str = "compute"
    kernel: str | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    mapped_by: str = "names"
    order: int = 0
    #: median per run of the engine's time right before this node since the previous node ended (ONNX Runtime:
    #: allocation, scheduling, fences; None where the engine does not say)
    dispatch_ms: float | None = None

    @property
    def fused(self) -> bool:
        return self.role == "compute" and len(self.onnx_nodes) > 1

    def to_json(self) -> dict:
        doc = asdict(self)
        for key in ("latency_ms", "latency_p90_ms", "latency_mean_ms", "dispatch_ms"):
            doc[key] = _rounded(doc[key])
        return doc

    @classmethod
    def from_json(cls, d: dict) -> EngineNode:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class EngineGraph:
    """What an engine ran for a model. ``end_to_end_ms``: median per run (``end_to_end_mean_ms``: mean), measured as
    ``end_to_end_source`` says;
    ``unmapped``: ONNX compute nodes no executed node covers, with why (``{"node", "reason"}``); ``folded``: ONNX
    nodes the engine computed while building (constant folding)."""

    engine: str
    nodes: list[EngineNode]
    end_to_end_ms: float | None = None
    end_to_end_p90_ms: float | None = None
    end_to_end_mean_ms: float | None = None
    end_to_end_source: str = ""
    #: median over the profiled runs of (node times summed in the run / the run's end to end): how much of a run
    #: the per-node times account for (below 1: the engine's own overhead between nodes; above: nodes overlapped)
    latency_share: float | None = None
    #: like ``latency_share`` with each node's dispatch time added (where the engine gives node start times)
    accounted_share: float | None = None
    #: the run's time outside the node times, median per run: ``between_nodes_ms``, ``outside_nodes_ms``, ``source``
    #: (and their means, ``*_mean_ms``: with the nodes' mean latencies they add up to ``end_to_end_mean_ms``)
    overhead: dict = field(default_factory=dict)
    runs: int = 0
    model: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    unmapped: list[dict] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # --- views -------------------------------------------------------------------------------------------------
    @property
    def compute_nodes(self) -> list[EngineNode]:
        return [n for n in self.nodes if n.role == "compute"]

    @property
    def fused_nodes(self) -> list[EngineNode]:
        return [n for n in self.nodes if n.fused]

    @property
    def latency_sum_ms(self) -> float | None:
        """The per-node mean latencies summed: the share of ``end_to_end_mean_ms`` spent in kernels (None when not
        profiled)."""
        values = [n.latency_mean_ms for n in self.nodes if n.latency_mean_ms is not None]
        return sum(values) if values else None

    @property
    def primary_provider(self) -> str | None:
        """The provider that ran most compute nodes."""
        from collections import Counter

        counts = Counter(n.provider for n in self.compute_nodes if n.provider)
        return counts.most_common(1)[0][0] if counts else None

    def share_of(self, node: EngineNode) -> float | None:
        """``node``'s share of a run: its median ms per run over the run's median end to end, the two times shown
        next to it (None when either is not measured). Medians: the shares need not add up to 1."""
        if node.latency_ms is None or not self.end_to_end_ms:
            return None
        return node.latency_ms / self.end_to_end_ms

    def fallbacks(self) -> list[EngineNode]:
        """Compute nodes that ran on another provider than the primary one (ONNX Runtime falls back per node)."""
        primary = self.primary_provider
        wanted = self.details.get("requested_provider") or primary
        return [n for n in self.compute_nodes if n.provider and n.provider != wanted]

    def group_of(self, onnx_node: str) -> EngineNode | None:
        """The compute node that runs ``onnx_node`` (the first, when an engine duplicated it)."""
        return self._group_index().get(onnx_node)

    def _group_index(self) -> dict[str, EngineNode]:
        index: dict[str, EngineNode] = {}
        for n in self.compute_nodes:
            for o in n.onnx_nodes:
                index.setdefault(o, n)
        return index

    def observable_tensors(self) -> set[str]:
        """ONNX tensors that exist in the engine's graph: the outputs of its compute nodes (fused-group boundaries)."""
        return {t for n in self.compute_nodes for t in n.outputs}

    def covered(self) -> set[str]:
        """ONNX nodes some executed node runs, or the engine folded into constants."""
        return {o for n in self.nodes for o in n.onnx_nodes} | set(self.folded)

    def slowest(self, top: int = 10) -> list[EngineNode]:
        return sorted((n for n in self.nodes if n.latency_ms is not None), key=lambda n: -n.latency_ms)[:top]

    def frame(self):
        """One row per executed node (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([{**n.to_json(), "onnx_nodes": ", ".join(n.onnx_nodes), "n_onnx": len(n.onnx_nodes),
                              "inputs": ", ".join(n.inputs), "outputs": ", ".join(n.outputs)} for n in self.nodes])

    # --- JSON --------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"schema": SCHEMA, "engine": self.engine, "end_to_end_ms": _rounded(self.end_to_end_ms),
                "end_to_end_p90_ms": _rounded(self.end_to_end_p90_ms),
                "end_to_end_mean_ms": _rounded(self.end_to_end_mean_ms), "end_to_end_source": self.end_to_end_source,
                "latency_sum_ms": _rounded(self.latency_sum_ms), "latency_share": _rounded(self.latency_share),
                "accounted_share": _rounded(self.accounted_share),
                "overhead": {k: _rounded(v) if k.endswith("_ms") else v for k, v in self.overhead.items()},
                "runs": self.runs, "model": self.model,
                "details": self.details, "nodes": [n.to_json() for n in self.nodes], "unmapped": self.unmapped,
                "folded": self.folded, "notes": self.notes}

    @classmethod
    def from_json(cls, doc: dict) -> EngineGraph:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise WorkbenchError(f"not an engine graph (schema {found!r}, expected {SCHEMA!r})",
                                 "pass a file written by `workbench inspect MODEL --engine SPEC --json OUT`")
        _check_numbers(doc)
        try:
            return cls(engine=doc["engine"], nodes=[EngineNode.from_json(n) for n in doc["nodes"]],
                       end_to_end_ms=doc.get("end_to_end_ms"), end_to_end_p90_ms=doc.get("end_to_end_p90_ms"),
                       end_to_end_mean_ms=doc.get("end_to_end_mean_ms"), latency_share=doc.get("latency_share"),
                       end_to_end_source=doc.get("end_to_end_source", ""), runs=int(doc.get("runs", 0)),
                       accounted_share=doc.get("accounted_share"), overhead=dict(doc.get("overhead") or {}),
                       model=dict(doc.get("model") or {}), details=dict(doc.get("details") or {}),
                       unmapped=list(doc.get("unmapped") or []), folded=list(doc.get("folded") or []),
                       notes=list(doc.get("notes") or []))
        except (KeyError, TypeError, ValueError) as e:
            raise WorkbenchError(f"engine graph JSON is malformed ({type(e).__name__}: {e})",
                                 "rewrite it with `workbench inspect MODEL --engine SPEC --json OUT`") from None

    def save_json(self, path: str | Path) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load_json(cls, path: str | Path) -> EngineGraph:
        from .._files import read_capped

        data = read_capped(path, MAX_JSON_BYTES, "engine graph")
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise WorkbenchError(f"engine graph {path} is not valid JSON ({type(e).__name__})",
                                 "pass a file written by `workbench inspect MODEL --engine SPEC --json OUT`") from None
        return cls.from_json(doc)


_NUMBERS = ("end_to_end_ms", "end_to_end_p90_ms", "end_to_end_mean_ms", "latency_share", "accounted_share")
_NODE_NUMBERS = ("latency_ms", "latency_p90_ms", "latency_mean_ms", "dispatch_ms")


def _check_numbers(doc: dict) -> None:
    """Every timing in an engine graph JSON is a number or null (a file edited by hand says where it is not)."""
    def bad(where: str, value: Any) -> WorkbenchError:
        return WorkbenchError(f"engine graph JSON is malformed ({where} is {type(value).__name__} {value!r:.40}, not a "
                              "number or null)", "rewrite it with `workbench inspect MODEL --engine SPEC --json OUT`")

    def number(v: Any) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    for key in _NUMBERS:
        if not number(doc.get(key)):
            raise bad(key, doc.get(key))
    overhead = doc.get("overhead") or {}
    if not isinstance(overhead, dict):
        raise bad("overhead", overhead)
    for key, value in overhead.items():
        if str(key).endswith("_ms") and not number(value):
            raise bad(f"overhead.{key}", value)
    for k, node in enumerate(doc.get("nodes") or []):
        for key in _NODE_NUMBERS:
            if isinstance(node, dict) and not number(node.get(key)):
                raise bad(f"nodes[{k}].{key}", node.get(key))


def _rounded(value: Any) -> float | None:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), 6)


def stats(values: list[float]) -> dict:
    """``{"median", "p90", "mean"}`` of per-run values (None each when there are none)."""
    return {"median": percentile(values, 50), "p90": percentile(values, 90),
            "mean": sum(values) / len(values) if values else None}


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` (linear interpolation), None when empty."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))
