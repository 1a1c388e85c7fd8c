"""Memory budget: tensor size estimates and chunks of marked tensors that fit a budget."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import helper

from ..core.budget import default_budget, parse_size  # noqa: F401 - re-exported
from ..core.shapes import infer_shapes_lenient


def infer_for_feed(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A shape-inferred, weight-free copy of ``model`` with its input shapes fixed to this feed's (estimates)."""
    shapes = {name: np.shape(v) for name, v in feed.items()}
    return infer_shapes_lenient(model, data_prop=True, input_shapes=shapes)


def tensor_bytes(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, int | None]:
    """Bytes of every value in ``model`` for this feed's input shapes, by shape inference (None if unknown)."""
    m = infer_for_feed(model, feed)
    sizes: dict[str, int | None] = {}
    for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if not tt.HasField("shape") or None in dims or not tt.elem_type:
            sizes[vi.name] = None
            continue
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 4
        sizes[vi.name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    return sizes


def chunks(names: Sequence[str], sizes: dict[str, int | None], budget: int) -> Iterator[list[str]]:
    """Consecutive groups of ``names`` whose estimated sizes sum to at most ``budget`` (at least one each)."""
    known = [s for s in sizes.values() if s]
    fallback = max(known) if known else 1 << 20
    group: list[str] = []
    used = 0
    for name in names:
        size = sizes.get(name) or fallback
        if group and used + size > budget:
            yield group
            group, used = [], 0
        group.append(name)
        used += size
    if group:
        yield group
