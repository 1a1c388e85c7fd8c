"""onnx's checker and shape inference, reported as a list of problems instead of exceptions."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import onnx

from .external_data import all_tensors
from .walk import iter_nodes, opset_imports

log = logging.getLogger(__name__)

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
    """Run the full checker and shape inference on a weight-free copy (the weights are never copied); return
    (shape-inferred weight-free copy, problems). Models of any size are checked this way."""
    from ..core.shapes import strip_weights

    problems: list[Problem] = []
    skeleton = strip_weights(model)
    try:
        check_skeleton(skeleton)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        problems.append(Problem("error", "checker", _first_line(e)))
    except Exception as e:  # noqa: BLE001 - the checker raises assorted C++ errors; report, don't crash
        problems.append(Problem("error", "checker", f"{type(e).__name__}: {_first_line(e)}"))
    inferred = skeleton
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001
        problems.append(Problem("warning", "shape-inference", f"shape inference failed: {_first_line(e)}"))
    problems += _lint(inferred)
    return inferred, problems


def check_skeleton(skeleton: onnx.ModelProto) -> None:
    """onnx's full checker on a weight-free copy: its stubs point to one sparse file as large as the largest
    stripped tensor, so the checker's external-data checks pass without a byte of weights on disk."""
    from pathlib import Path

    from ..core.scratch import temporary_dir
    from ..core.shapes import STUB_FILE, is_stub

    stubs = [t for t in all_tensors(skeleton) if is_stub(t)]
    if not stubs:
        onnx.checker.check_model(skeleton, full_check=True)
        return
    size = max(int(next(e.value for e in t.external_data if e.key == "length")) for t in stubs)
    with temporary_dir("workbench-check-") as tmp:
        with open(Path(tmp) / STUB_FILE, "wb") as fh:
            fh.truncate(size)
        path = Path(tmp) / "model.onnx"
        path.write_bytes(skeleton.SerializeToString())
        onnx.checker.check_model(str(path), full_check=True)


def structure_problems(graph: onnx.GraphProto) -> list[Problem]:
    """What makes ``graph`` (not its subgraphs) impossible to run or compare on any engine: no graph output, an
    output listed twice, a tensor produced twice (by two nodes, or by a node and a graph input or initializer) and a
    cycle, each naming the nodes and tensors."""
    problems = []
    if not graph.output:
        problems.append(Problem("error", "no-outputs", "the graph has no output: nothing can be run or compared"))
    listed: set[str] = set()
    for out in graph.output:
        if out.name in listed:
            problems.append(Problem("error", "duplicate-graph-output", f"graph output '{out.name}' is listed twice: "
                                    "remove the duplicate from graph.output"))
        listed.add(out.name)
    producer = {i.name: f"graph input '{i.name}'" for i in graph.input}
    producer |= {t.name: f"initializer '{t.name}'" for t in graph.initializer}
    for i, node in enumerate(graph.node):
        label = f"node '{node.name or f'#{i}'}' ({node.op_type})"
        for out in node.output:
            if out and out in producer:
                problems.append(Problem("error", "duplicate-output", f"tensor '{out}' is produced twice: by "
                                        f"{producer[out]} and by {label}", node.name or None))
            elif out:
                producer[out] = label
    if not problems:
        cycle = _cycle(graph)
        if cycle:
            names = [graph.node[i].name or f"#{i}" for i in cycle]
            problems.append(Problem("error", "cycle", "the graph has a cycle through nodes "
                                    + " -> ".join(f"'{n}'" for n in [*names, names[0]]), names[0]))
    return problems


def _cycle(graph: onnx.GraphProto) -> list[int]:
    """Indices of the nodes on one cycle of ``graph``, or [] when it has none."""
    from .graph import _node_reads, topological_order

    if not topological_order(graph)[1]:
        return []
    import networkx as nx

    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    g = nx.DiGraph((producer[name], i) for i, node in enumerate(graph.node) for name in _node_reads(node)
                   if name in producer)
    try:
        return [a for a, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return []


def check_structure(model: onnx.ModelProto) -> None:
    """Raise :class:`~workbench.errors.ModelStructureError` for the first :func:`structure_problems` finding,
    before anything (a precision variant, an engine) gets the graph and fails less clearly."""
    from ..errors import ModelStructureError

    found = structure_problems(model.graph)
    if found:
        raise ModelStructureError(f"the model is invalid: {found[0].message}")


def _lint(model: onnx.ModelProto) -> list[Problem]:
    problems = structure_problems(model.graph)
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
