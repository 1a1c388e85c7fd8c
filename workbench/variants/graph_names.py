"""Name-level facts a variant needs: node names, tensor types, consumers, and the original -> variant tensor map."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import onnx

from ..errors import VariantError
from ..model.walk import iter_nodes, subgraphs_of

log = logging.getLogger(__name__)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def node_names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in iter_nodes(model.graph) if n.name]


def check_node_names(model: onnx.ModelProto, wanted: Iterable[str], what: str) -> list[str]:
    """``wanted`` as a list, or a VariantError naming those the model lacks."""
    wanted = list(dict.fromkeys(wanted))
    known = set(node_names(model))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        sample = ", ".join(node_names(model)[:5])
        raise VariantError(
            f"{what} names node(s) the model lacks: {', '.join(unknown)}",
            f"use node names as the model spells them (e.g. {sample}); `workbench inspect` lists them",
        )
    return wanted


def opset_version(model: onnx.ModelProto) -> int | None:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type, from shape inference where it works, plus io and initializers (inferred on
    a weight-free copy: the types are the same, and a model's weights are not serialized for it)."""
    from ..core.shapes import strip_weights

    try:
        inferred = onnx.shape_inference.infer_shapes(strip_weights(model))
    except Exception as e:  # noqa: BLE001 - inference raises assorted C++ errors; fall back to declared types
        log.debug("shape inference failed (%s); using declared types only", e)
        inferred = model
    types: dict[str, int] = {}
    graphs = [inferred.graph] + [g for n in iter_nodes(inferred.graph) for _, g in subgraphs_of(n)]
    for g in graphs:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
    return types


def original_consumers(name: str, variant: onnx.ModelProto, original_nodes: set[str]) -> list[str]:
    """Nodes of the original graph reading ``name`` in ``variant``, looking through nodes the converter
    inserted (Casts) to the original nodes behind them."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in iter_nodes(variant.graph):
        for inp in node.input:
            if inp:
                readers.setdefault(inp, []).append(node)
    found: list[str] = []
    seen: set[str] = set()
    stack = [name]
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in readers.get(tensor, []):
            if node.name in original_nodes:
                if node.name not in found:
                    found.append(node.name)
            else:
                stack.extend(o for o in node.output if o)
    return found


def map_tensors(original: onnx.ModelProto, variant: onnx.ModelProto) -> dict[str, str | None]:
    """Original node outputs absent (by name) from ``variant`` -> the output at the same position of the
    same-named node in ``variant``, or None when there is none. Names present in both are left out."""
    present = {o for n in iter_nodes(variant.graph) for o in n.output if o}
    present |= {i.name for i in variant.graph.input}
    by_name = {n.name: n for n in iter_nodes(variant.graph) if n.name}
    mapping: dict[str, str | None] = {}
    for node in iter_nodes(original.graph):
        for i, out in enumerate(node.output):
            if not out or out in present:
                continue
            twin = by_name.get(node.name)
            mapping[out] = twin.output[i] if twin is not None and i < len(twin.output) and twin.output[i] else None
    return mapping
