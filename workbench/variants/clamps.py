"""Finding the float constants an FP16 converter clamped, by diffing them against the original float32 values."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper

from ..model.walk import iter_nodes, subgraphs_of
from .graph_names import node_names, original_consumers
from .result import ClampRecord

log = logging.getLogger(__name__)

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
_SHOWN = 3  # extreme values listed per record


def float_constants(model: onnx.ModelProto, only_float32: bool = False) -> dict[str, tuple[onnx.TensorProto, str]]:
    """Key -> (tensor, source) for initializers and tensor-valued attributes, subgraphs included.

    Keys: an initializer's name, a Constant node's output name, else ``node:attribute``."""
    wanted = {onnx.TensorProto.FLOAT} if only_float32 else _FLOAT_TYPES
    found: dict[str, tuple[onnx.TensorProto, str]] = {}
    graphs = [model.graph] + [g for n in iter_nodes(model.graph) for _, g in subgraphs_of(n)]
    for graph in graphs:
        for t in graph.initializer:
            if t.data_type in wanted:
                found.setdefault(t.name, (t, "initializer"))
        for node in graph.node:
            for attr in node.attribute:
                tensors = [attr.t] if attr.type == onnx.AttributeProto.TENSOR else (
                    list(attr.tensors) if attr.type == onnx.AttributeProto.TENSORS else [])
                for k, t in enumerate(tensors):
                    if t.data_type not in wanted:
                        continue
                    if node.op_type == "Constant" and node.output and attr.name == "value":
                        found.setdefault(node.output[0], (t, "constant"))
                    else:
                        suffix = f"[{k}]" if attr.type == onnx.AttributeProto.TENSORS else ""
                        found.setdefault(f"{node.name}:{attr.name}{suffix}", (t, "attribute"))
    return found


def find_clamps(
    original: onnx.ModelProto, converted: onnx.ModelProto, *, max_finite: float, min_positive: float
) -> list[ClampRecord]:
    """ClampRecords for every float32 constant of ``original`` whose counterpart in ``converted`` (cast back to
    float32) lost values above ``max_finite`` or nonzero values below ``min_positive``. Overflows come first,
    then by largest absolute change."""
    before = float_constants(original, only_float32=True)
    after = float_constants(converted)
    originals = set(node_names(original))
    records: list[ClampRecord] = []
    for key, (tensor, source) in before.items():
        if key not in after:
            continue
        try:
            a = numpy_helper.to_array(tensor).astype(np.float32, copy=False)
            b = numpy_helper.to_array(after[key][0]).astype(np.float32)
        except (ValueError, TypeError, OSError) as e:  # external data not loaded, odd encodings
            log.debug("cannot compare constant %s: %s", key, e)
            continue
        if a.shape != b.shape:
            continue
        records += _records(key, source, a.ravel(), b.ravel(), max_finite, min_positive, converted, originals)
    records.sort(key=lambda r: (r.kind != "overflow", -r.max_abs_change))
    return records


def _records(
    key: str, source: str, a: np.ndarray, b: np.ndarray, max_finite: float, min_positive: float,
    converted: onnx.ModelProto, originals: set[str],
) -> list[ClampRecord]:
    finite = np.isfinite(a)
    changed = finite & (a != b)
    masks = {
        "overflow": changed & (np.abs(a) > max_finite),
        "underflow": changed & (a != 0) & ((np.abs(a) < min_positive) | (b == 0)),
    }
    out = []
    for kind, mask in masks.items():
        idx = np.flatnonzero(mask)
        if not idx.size:
            continue
        mag = np.abs(a[idx])
        order = idx[np.argsort(-mag if kind == "overflow" else mag, kind="stable")][:_SHOWN]
        abs_change = np.abs(b[idx].astype(np.float64) - a[idx])
        if source == "attribute":
            consumers = [key.split(":", 1)[0]]
        else:
            consumers = original_consumers(key, converted, originals)
        out.append(ClampRecord(
            name=key, source=source, kind=kind, count=int(idx.size), size=int(a.size),
            original=[float(a[i]) for i in order], converted=[float(b[i]) for i in order],
            max_rel_change=float((abs_change / np.abs(a[idx])).max()), max_abs_change=float(abs_change.max()),
            consumers=consumers, indices=[int(i) for i in idx[:5]],
        ))
    return out
