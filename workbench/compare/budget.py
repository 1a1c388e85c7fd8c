"""Memory budget: tensor size estimates and chunks of marked tensors that fit a budget."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import helper

from ..errors import WorkbenchError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_size(text: str | int | None) -> int:
    """``"512M"``, ``"2G"``, ``"1.5GiB"``, ``1048576`` -> bytes; None -> the default budget."""
    if text is None:
        return default_budget()
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise WorkbenchError(f"cannot read memory size {text!r}", "write e.g. 512M, 2G or 1.5GiB")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size <= 0:
        raise WorkbenchError(f"memory size {text!r} must be positive", "write e.g. 512M or 2G")
    return size


def default_budget() -> int:
    """A quarter of physical memory, at most 4 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return int(min(total // 4, 4 << 30))


def infer_for_feed(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A shape-inferred copy of ``model`` with its input shapes fixed to this feed's (estimates: best effort)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in feed and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in np.shape(feed[vi.name]):
                shape.dim.add().dim_value = int(d)
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - estimates only; unknown shapes fall back to what callers assume
        return m


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
