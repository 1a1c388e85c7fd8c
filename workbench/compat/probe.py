"""Ask a real runtime whether it accepts a model, and name the node it rejects.

The runtimes are imported lazily: neither onnxruntime nor openvino is needed to import this module.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field

import onnx

from workbench.model.walk import iter_all_nodes

from ..core.scratch import temporary_dir

log = logging.getLogger(__name__)

MAX_INMEMORY_BYTES = 1_900_000_000
OPENVINO_MISSING = "openvino is not installed: pip install onnx-drift-workbench[openvino]"
ONNXRUNTIME_MISSING = "onnxruntime is not installed: pip install onnxruntime"

# ORT error texts, most specific first; named groups: name, op, domain.
_ORT_PATTERNS = (
    re.compile(
        r"Could not find an implementation for "
        r"(?P<op>[\w.]+)\(\d+\) node with name '(?P<name>[^']*)'"
    ),
    re.compile(r"In Node, \(\"(?P<name>[^\"]*)\", (?P<op>[\w.]+), \"(?P<domain>[^\"]*)\", -?\d+\)"),
    re.compile(r"Node \((?P<name>[^)]*)\) Op \((?P<op>[\w.]+)\)"),
    re.compile(r"Fatal error: (?P<domain>[\w.]*):(?P<op>[\w.]+)\(-?\d+\) is not a registered function/op"),
    re.compile(r"No Op registered for (?P<op>[\w.]+) with domain_version of \d+"),
)
_ORT_LOCATION = re.compile(r"^\S+\.(?:cc|h|cpp|hpp):\d+\s+.*?\)\s+(?=[A-Z])")
_OV_NOISE = (
    "Exception from",
    "Check '",
    "FrontEnd API failed",
    "Model wasn't fully converted",
    "Summary:",
    "To facilitate",
)


@dataclass
class ProbeResult:
    """Outcome of loading a model in a runtime; ``ok`` is None when the probe could not run."""

    runtime: str
    version: str | None
    ok: bool | None
    providers_used: list[str] = field(default_factory=list)
    error: str | None = None
    rejected_node: str | None = None
    rejected_op_type: str | None = None
    rejected_domain: str | None = None

    def to_json(self) -> dict:
        """Plain-dict form (JSON-serialisable)."""
        return asdict(self)


def _find_node(
    model: onnx.ModelProto,
    name: str | None = None,
    op_type: str | None = None,
    domain: str | None = None,
    output: str | None = None,
) -> onnx.NodeProto | None:
    """First node matching by name, else by an output name, else by op_type (and domain when given)."""
    nodes = list(iter_all_nodes(model))
    if name:
        for node in nodes:
            if node.name == name:
                return node
    if output:
        for node in nodes:
            if output in node.output and (op_type is None or node.op_type == op_type):
                return node
    if op_type:
        for node in nodes:
            if node.op_type == op_type and (domain is None or (node.domain or "ai.onnx") == domain):
                return node
    return None


def _fill_rejection(result: ProbeResult, model: onnx.ModelProto, **hints: str | None) -> None:
    node = _find_node(model, **hints)
    if node is not None:
        result.rejected_node = node.name or None
        result.rejected_op_type = node.op_type
        result.rejected_domain = node.domain or "ai.onnx"
    else:
        result.rejected_node = hints.get("name") or None
        result.rejected_op_type = hints.get("op_type")
        domain = hints.get("domain")
        result.rejected_domain = (domain or "ai.onnx") if result.rejected_op_type else None


def _one_line(text: str, limit: int = 600) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _clean_ort_error(text: str) -> str:
    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text.strip())
    msg = _ORT_LOCATION.sub("", msg)
    return _one_line(msg)


def _external_data_refs(model: onnx.ModelProto) -> bool:
    from ..model.mapped import is_mapped

    return any(t.data_location == onnx.TensorProto.EXTERNAL and not is_mapped(t) for t in model.graph.initializer)


def parse_ort_error(text: str) -> dict[str, str | None]:
    """Pull ``name``, ``op_type`` and ``domain`` (any may be None) out of an onnxruntime error message."""
    for pattern in _ORT_PATTERNS:
        m = pattern.search(text)
        if m:
            groups = m.groupdict()
            domain = groups.get("domain")
            return {"name": groups.get("name"), "op_type": groups.get("op"), "domain": domain or None}
    return {"name": None, "op_type": None, "domain": None}


def probe_onnxruntime(model: onnx.ModelProto, providers=("CPUExecutionProvider",)) -> ProbeResult:
    """Create a real ``onnxruntime.InferenceSession`` (optimisations off) and report what it rejects."""
    try:
        import onnxruntime as ort
    except ImportError:
        return ProbeResult("onnxruntime", None, None, error=ONNXRUNTIME_MISSING)
    result = ProbeResult("onnxruntime", ort.__version__, None)
    size = model.ByteSize()
    if size > MAX_INMEMORY_BYTES:
        result.error = (
            f"model is {size / 1e9:.2f} GB serialized, over the {MAX_INMEMORY_BYTES / 1e9:.1f} GB in-memory "
            "limit; probe skipped (save it with external data and load it in onnxruntime from the path)"
        )
        log.warning(result.error)
        return result
    if _external_data_refs(model):
        result.error = "model references external data files; load it with onnx.load(path) first"
        return result
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # its errors are raised, and reported as ours: none printed raw
    try:
        from ..model.mapped import ort_options, session_source

        source, folder = session_source(model)  # a mapped model's weights are read from their files
        session = ort.InferenceSession(source, ort_options(options, folder, prepack=False),  # never runs
                                       providers=list(providers))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises assorted pybind exception types
        text = str(exc)
        result.ok = False
        result.error = _clean_ort_error(text)
        hints = parse_ort_error(text)
        if hints["op_type"] or hints["name"]:
            _fill_rejection(result, model, **hints)
        log.debug("onnxruntime rejected the model: %s", result.error)
        return result
    result.ok = True
    result.providers_used = list(session.get_providers())
    return result


def _clean_ov_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln.lstrip("- ") for ln in lines if not ln.startswith(_OV_NOISE)]
    return _one_line("; ".join(useful) if useful else (lines[-1] if lines else text))


def _unconverted_ops(path: str) -> list[tuple[str, str, str]]:
    """(friendly_name, domain, op_type) of every op the ONNX frontend left unconverted."""
    from openvino.frontend import FrontEndManager

    # Keep the manager, frontend and input model referenced until the ops are read: dropping the
    # manager early unloads the frontend library under the converted model (segfault).
    manager = FrontEndManager()
    frontend = manager.load_by_framework("onnx")
    input_model = frontend.load(path)
    partial = frontend.convert_partially(input_model)
    found = []
    for op in partial.get_ordered_ops():
        type_name = op.get_type_name()
        if "FrameworkNode" in type_name or "NotSupported" in type_name:
            attrs = op.get_attributes()
            domain = str(attrs.get("ONNX_META_domain") or "ai.onnx")
            found.append((op.get_friendly_name(), domain, str(attrs.get("ONNX_META_type", ""))))
    del partial, input_model, frontend, manager
    return found


def _save_for_openvino(model: onnx.ModelProto, path: str) -> None:
    from ..model.mapped import has_mapped, save_model

    if has_mapped(model):  # weights left in their files: copied file to file beside the graph
        save_model(model, path)
    elif model.ByteSize() > MAX_INMEMORY_BYTES:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        onnx.save_model(copy, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    else:
        onnx.save_model(model, path)


def probe_openvino(model: onnx.ModelProto) -> ProbeResult:
    """Read the model with OpenVINO's ONNX frontend; on failure name the first unconverted node."""
    try:
        import openvino as ov
    except ImportError:
        return ProbeResult("openvino", None, None, error=OPENVINO_MISSING)
    result = ProbeResult("openvino", ov.__version__, None)
    if _external_data_refs(model):
        result.error = "model references external data files; load it with onnx.load(path) first"
        return result
    with temporary_dir("wb-ov-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        _save_for_openvino(model, path)
        try:
            ov.Core().read_model(path)
        except Exception as exc:  # noqa: BLE001 - openvino raises RuntimeError, OpConversionFailure, ...
            result.ok = False
            result.error = _clean_ov_error(str(exc))
            try:
                unconverted = _unconverted_ops(path)
            except Exception as inner:  # noqa: BLE001 - best effort: the partial conversion can fail too
                log.debug("openvino partial conversion failed: %s", inner)
                unconverted = []
            if unconverted:
                friendly, domain, op_type = unconverted[0]
                _fill_rejection(result, model, output=friendly, op_type=op_type or None, domain=domain)
            return result
    result.ok = True
    return result
