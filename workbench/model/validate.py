"""onnx's checker and shape inference, reported as a list of problems instead of exceptions."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import onnx

from .walk import iter_nodes, opset_imports

log = logging.getLogger(__name__)

_PROTO_LIMIT = 2**31 - 1  # protobuf's 2 GB limit: the in-memory checker cannot take larger models
STANDARD_DOMAINS = {"ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training", "ai.onnx.preview"}


@dataclass(frozen=True)
class Problem:
    """One finding about a model. severity: "error" (runtimes will reject it), "warning", "info"."""

    severity: str
    code: str
    message: str
    node: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def validate(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[Problem]]:
    """Run the full checker and shape inference; return (shape-inferred copy, problems)."""
    problems: list[Problem] = []
    too_big = model.ByteSize() > _PROTO_LIMIT
    if too_big:
        problems.append(Problem("info", "too-large-to-check",
                                "model is over 2 GB in memory: onnx's checker and shape inference skipped"))
        return model, problems
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        problems.append(Problem("error", "checker", _first_line(e)))
    except Exception as e:  # noqa: BLE001 - the checker raises assorted C++ errors; report, don't crash
        problems.append(Problem("error", "checker", f"{type(e).__name__}: {_first_line(e)}"))
    inferred = model
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001
        problems.append(Problem("warning", "shape-inference", f"shape inference failed: {_first_line(e)}"))
    problems += _lint(inferred)
    return inferred, problems


def _lint(model: onnx.ModelProto) -> list[Problem]:
    problems = []
    imports = opset_imports(model)
    used = {(n.domain or "ai.onnx") for n in iter_nodes(model.graph)}
    for domain in sorted(used - set(imports)):
        problems.append(Problem("error", "missing-opset-import", f"ops of domain '{domain}' are used but the "
                                "model does not import that domain"))
    for domain in sorted(used - STANDARD_DOMAINS):
        problems.append(Problem("info", "custom-domain", f"ops of custom domain '{domain}': only runtimes "
                                "with matching kernels or plugins can run them"))
    for node in iter_nodes(model.graph):
        domain = node.domain or "ai.onnx"
        if domain not in imports or domain not in STANDARD_DOMAINS:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, imports[domain], node.domain)
        except onnx.defs.SchemaError:
            problems.append(Problem("error", "unknown-op", f"{node.op_type} does not exist in {domain} opset "
                                    f"{imports[domain]}", node.name))
            continue
        if schema.deprecated:
            problems.append(Problem("warning", "deprecated-op", f"{node.op_type} is deprecated in {domain} opset "
                                    f"{imports[domain]}", node.name))
    return problems
