"""Memory budgets: sizes as users write them, the default budget, tensor size estimates and chunks of tensors
that fit a budget."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import helper

from ..errors import WorkbenchError
from .shapes import infer_shapes_lenient

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_size(text: str | int | None) -> int:
    """``"512M"``, ``"2G"``, ``"1.5GiB"``, ``1048576`` -> bytes; None -> the default budget."""
    if text is None:
        return default_budget()
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise WorkbenchError(f"memory size {text} must be positive", "write e.g. 512M or 2G")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise WorkbenchError(f"cannot read memory size {text!r}", "write e.g. 512M, 2G or 1.5GiB")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not value < 2**63:  # inf from hundreds of digits, too
        shown = str(text) if len(str(text)) <= 24 else f"{str(text)[:12]}...({len(str(text))} characters)"
        raise WorkbenchError(f"memory size {shown!r} is too large (over 8 EiB)", "write e.g. 512M, 2G or 1.5GiB")
    size = int(value)
    if size <= 0:
        raise WorkbenchError(f"memory size {text!r} must be positive", "write e.g. 512M or 2G")
    return size


def total_memory() -> int:
    """Physical memory in bytes (8 GiB when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget() -> int:
    """A quarter of physical memory, at most 4 GiB."""
    return int(min(total_memory() // 4, 4 << 30))


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
        sizes[vi.name] = math.prod(dims) * itemsize
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


def check_run_fits(model: onnx.ModelProto, feeds: Sequence[dict], budget: int, given: bool = True) -> None:
    """Refuse (:class:`~workbench.errors.InputError`, with the numbers) a comparison that cannot fit ``budget``:
    the feeds themselves, or its smallest step: the largest tensor of one run held once per feed by the reference
    plus once by the candidate and once while compared (what a chunk of one tensor needs)."""
    from .._files import human_size
    from ..errors import InputError

    what = f"the memory budget of {human_size(budget)}" + ("" if given else " (default: a quarter of RAM, at most 4G)")
    hint = "use smaller --input-shapes or fewer feeds, or raise --memory-budget"
    fed = sum(int(v.nbytes) for feed in feeds for v in feed.values())  # arrays or PlannedArray
    if fed > budget:
        raise InputError(f"{len(feeds)} feed(s) take {human_size(fed)}, over {what}", hint)
    if not feeds:
        return
    sizes = {k: v for k, v in tensor_bytes(model, feeds[0]).items() if v}
    if not sizes:
        return
    name = max(sizes, key=sizes.__getitem__)
    need = sizes[name] * (len(feeds) + 2)
    if need > budget:
        raise InputError(f"one run needs at least {human_size(need)}: tensor '{name}' is {human_size(sizes[name])}, "
                         f"held for {len(feeds)} feed(s) by the reference and twice for the candidate; over {what}",
                         hint)
