"""Walking a graph and its subgraphs (If/Loop/Scan bodies)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs_of(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """Yield ``(attribute_name, graph)`` for every graph-valued attribute of ``node``."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", g


def iter_nodes(graph: onnx.GraphProto, recursive: bool = True) -> Iterator[onnx.NodeProto]:
    """Yield the nodes of ``graph`` in file order, then (if ``recursive``) those of each subgraph."""
    for node in graph.node:
        yield node
        if recursive and node.attribute:  # most nodes have none: no walk of them
            for _, sub in subgraphs_of(node):
                yield from iter_nodes(sub, recursive=True)


def iter_all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Graph nodes (subgraphs included), then the nodes of model-local function bodies (and their subgraphs)."""
    yield from iter_nodes(model.graph, recursive=True)
    for func in model.functions:
        for node in func.node:
            yield node
            for _, sub in subgraphs_of(node):
                yield from iter_nodes(sub, recursive=True)


def opset_imports(model: onnx.ModelProto) -> dict[str, int]:
    """Map domain -> version, with the default domain spelled ``ai.onnx``."""
    return {(imp.domain or "ai.onnx"): int(imp.version) for imp in model.opset_import}
