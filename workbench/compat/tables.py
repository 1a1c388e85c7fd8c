"""Target-runtime compatibility tables (package data) and a static model check against them.

The tables live in ``workbench/compat/data/*.json`` (schema ``workbench.compat/1``), one file per runtime
family; every target row records where its facts came from (``source``, ``source_version``, ``notes``).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources

import onnx

from workbench.errors import WorkbenchError
from workbench.model.walk import iter_all_nodes, opset_imports

log = logging.getLogger(__name__)

SCHEMA = "workbench.compat/1"
DATA_FILES = ("onnxruntime.json", "tensorrt.json", "openvino.json")
NODE_SAMPLE = 5

_FAMILY_ALIASES = {
    "onnxruntime": "onnxruntime",
    "ort": "onnxruntime",
    "tensorrt": "tensorrt",
    "trt": "tensorrt",
    "openvino": "openvino",
    "ov": "openvino",
}
_VERSION = re.compile(r"^\d+(?:\.\d+)*$")


@dataclass(frozen=True)
class OpRef:
    """One operator named by a table: ``domain`` is spelled ``ai.onnx`` for the default domain."""

    domain: str
    op_type: str
    note: str = ""


@dataclass(frozen=True)
class Target:
    """One runtime release (or release line) and what it accepts."""

    name: str
    runtime: str
    version: str
    max_opset: dict[str, int]
    unsupported_ops: tuple[OpRef, ...]
    supported_ops: tuple[OpRef, ...]
    source: str
    source_version: str
    min_opset: dict[str, int] = field(default_factory=dict)
    max_ir_version: int | None = None
    builtin_domains: tuple[str, ...] = ("ai.onnx",)
    default: bool = False
    notes: str = ""

    @property
    def is_allow_list(self) -> bool:
        """True when ``supported_ops`` is exhaustive: anything not listed is unsupported."""
        return bool(self.supported_ops)


@dataclass
class OpUsage:
    """An operator the model uses that a target does not support."""

    domain: str
    op_type: str
    count: int
    nodes: list[str]
    reason: str


@dataclass
class TargetReport:
    """Result of :func:`check_model` for one target."""

    target: str
    runtime: str
    version: str
    ok: bool
    opset_ok: bool | None
    model_opset: int | None
    max_opset: int | None
    opset_problems: list[str]
    ir_ok: bool | None
    unsupported: list[OpUsage]
    source: str

    def to_json(self) -> dict:
        """Plain-dict form (JSON-serialisable)."""
        return asdict(self)


def _op_refs(rows: list[dict]) -> tuple[OpRef, ...]:
    return tuple(OpRef(r.get("domain") or "ai.onnx", r["op_type"], r.get("note", "")) for r in rows)


def _parse_target(runtime: str, row: dict) -> Target:
    return Target(
        name=row["name"],
        runtime=runtime,
        version=str(row["version"]),
        max_opset={k: int(v) for k, v in row.get("max_opset", {}).items()},
        min_opset={k: int(v) for k, v in row.get("min_opset", {}).items()},
        max_ir_version=row.get("max_ir_version"),
        unsupported_ops=_op_refs(row.get("unsupported_ops", [])),
        supported_ops=_op_refs(row.get("supported_ops", [])),
        builtin_domains=tuple(row.get("builtin_domains", ["ai.onnx"])),
        default=bool(row.get("default", False)),
        source=row["source"],
        source_version=row.get("source_version", ""),
        notes=row.get("notes", ""),
    )


@lru_cache(maxsize=1)
def _load() -> tuple[Target, ...]:
    targets: list[Target] = []
    data_dir = resources.files("workbench.compat") / "data"
    for fname in DATA_FILES:
        doc = json.loads((data_dir / fname).read_text(encoding="utf-8"))
        if doc.get("schema") != SCHEMA:
            raise WorkbenchError(f"{fname}: unexpected schema {doc.get('schema')!r}", "reinstall the package")
        targets.extend(_parse_target(doc["runtime"], row) for row in doc["targets"])
    return tuple(targets)


def list_targets() -> list[Target]:
    """Every known target, in data-file order (ONNX Runtime, TensorRT, OpenVINO; oldest first)."""
    return list(_load())


def default_targets() -> list[Target]:
    """The handful :func:`check_model` uses when no targets are named."""
    return [t for t in _load() if t.default]


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 10**6 for p in version.split("."))


def _version_matches(target_version: str, wanted: str) -> bool:
    """``10.x`` matches 10 and 10.15; ``1.18`` matches 1.18 and 1.18.1; ``1`` matches 1.18."""
    base = target_version.removesuffix(".x")
    return wanted == base or wanted.startswith(base + ".") or base.startswith(wanted + ".")


def _split_query(wanted: str) -> tuple[str, str | None] | None:
    """``trt10.x`` -> ("tensorrt", "10"); ``openvino`` -> ("openvino", None); None if not understood."""
    for alias in sorted(_FAMILY_ALIASES, key=len, reverse=True):
        if wanted.startswith(alias):
            rest = wanted[len(alias) :].lstrip("v").removesuffix("x").rstrip(".")
            if not rest:
                return _FAMILY_ALIASES[alias], None
            if _VERSION.match(rest):
                return _FAMILY_ALIASES[alias], rest
            return None
    return None


def find_target(name: str) -> Target:
    """Resolve a forgiving name: ``trt10``, ``tensorrt-10``, ``TensorRT 10.x``, ``ort-1.18``, ``openvino``.

    A family without a version picks its newest row. Raises :class:`WorkbenchError` naming the known
    targets when nothing matches.
    """
    targets = _load()
    wanted = _norm(name)
    for t in targets:
        if _norm(t.name) == wanted:
            return t
    query = _split_query(wanted)
    if query is not None:
        family, version = query
        pool = [t for t in targets if t.runtime == family]
        if version:
            pool = [t for t in pool if _version_matches(t.version, version)]
        if pool:
            return max(pool, key=lambda t: _version_key(t.version))
        rows = [t for t in targets if t.runtime == family]
        if version and rows:
            versions = ", ".join(t.version for t in sorted(rows, key=lambda t: _version_key(t.version)))
            raise WorkbenchError(f"no table row for {rows[0].name.rsplit(' ', 1)[0]} {version} (the package's tables "
                                 f"hold {versions})", "name one of those, or read the 'probe:' line of inspect: it "
                                 "builds a session on the onnxruntime installed here")
    known = ", ".join(_typed(t) for t in targets)
    raise WorkbenchError(f"unknown target {name!r}", f"known targets (as typed): {known}")


def _typed(target: Target) -> str:
    """How a user types ``target``: ort-1.18, trt-10, openvino."""
    short = {"onnxruntime": "ort", "tensorrt": "trt"}.get(target.runtime, target.runtime)
    version = target.version.removesuffix(".x") if target.version else ""
    return f"{short}-{version}" if version and target.runtime != "openvino" else short


def _collect_ops(model: onnx.ModelProto) -> dict[tuple[str, str], list[str]]:
    """Map (domain, op_type) -> node labels, skipping calls to model-local functions (their bodies count)."""
    local = {(f.domain or "ai.onnx", f.name) for f in model.functions}
    ops: dict[tuple[str, str], list[str]] = {}
    for index, node in enumerate(iter_all_nodes(model)):
        key = (node.domain or "ai.onnx", node.op_type)
        if key in local:
            continue
        ops.setdefault(key, []).append(node.name or f"<unnamed {node.op_type} #{index}>")
    return ops


def _unsupported_reason(target: Target, domain: str, op_type: str) -> str | None:
    for ref in target.unsupported_ops:
        if ref.domain == domain and ref.op_type == op_type:
            return ref.note or "listed as unsupported"
    if target.is_allow_list:
        if any(r.domain == domain and r.op_type == op_type for r in target.supported_ops):
            return None
        if domain not in target.builtin_domains and not any(r.domain == domain for r in target.supported_ops):
            return f"{_domain_label(domain)}: not in the operator table (needs a plugin/extension)"
        return "not in the target's supported-operator table"
    if domain not in target.builtin_domains:
        return f"{_domain_label(domain)}: needs a custom-op library/plugin registered with the runtime"
    return None


def _domain_label(domain: str) -> str:
    if domain == "ai.onnx" or domain.startswith("ai.onnx."):
        return f"domain {domain!r} not supported by this target"
    return f"custom domain {domain!r}"


def _check_opsets(target: Target, model: onnx.ModelProto) -> tuple[bool | None, list[str]]:
    imports = opset_imports(model)
    problems: list[str] = []
    checked = False
    for domain, limit in target.max_opset.items():
        if domain in imports:
            checked = True
            if imports[domain] > limit:
                problems.append(f"{domain} opset {imports[domain]} > max {limit}")
    for domain, floor in target.min_opset.items():
        if domain in imports:
            checked = True
            if imports[domain] < floor:
                problems.append(f"{domain} opset {imports[domain]} < min {floor}")
    if problems:
        return False, problems
    return (True if checked else None), problems


def _check_one(target: Target, model: onnx.ModelProto, ops: dict[tuple[str, str], list[str]]) -> TargetReport:
    opset_ok, problems = _check_opsets(target, model)
    ir_ok: bool | None = None
    if target.max_ir_version is not None:
        ir_ok = model.ir_version <= target.max_ir_version
        if not ir_ok:
            problems.append(f"IR version {model.ir_version} > max {target.max_ir_version}")
    unsupported = []
    for (domain, op_type), nodes in sorted(ops.items()):
        reason = _unsupported_reason(target, domain, op_type)
        if reason is not None:
            unsupported.append(OpUsage(domain, op_type, len(nodes), nodes[:NODE_SAMPLE], reason))
    ok = opset_ok is not False and ir_ok is not False and not unsupported
    return TargetReport(
        target=target.name,
        runtime=target.runtime,
        version=target.version,
        ok=ok,
        opset_ok=opset_ok,
        model_opset=opset_imports(model).get("ai.onnx"),
        max_opset=target.max_opset.get("ai.onnx"),
        opset_problems=problems,
        ir_ok=ir_ok,
        unsupported=unsupported,
        source=target.source,
    )


def check_model(model: onnx.ModelProto, targets: list[str] | None = None) -> list[TargetReport]:
    """Check ``model`` statically against each target (default: :func:`default_targets`).

    Looks at opset imports, the IR version and every node, including If/Loop/Scan bodies and
    model-local function bodies. Per-op restrictions (types, attributes) are not modelled.
    """
    chosen = default_targets() if targets is None else [find_target(name) for name in targets]
    ops = _collect_ops(model)
    reports = [_check_one(t, model, ops) for t in chosen]
    for report in reports:
        log.debug("compat %s: ok=%s unsupported=%d", report.target, report.ok, len(report.unsupported))
    return reports
