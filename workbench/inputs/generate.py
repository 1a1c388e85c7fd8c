"""Random feeds shaped and typed after a model's graph inputs, with valid ranges for integer ids."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..errors import InputError
from .spec import InputSpec, as_proto, dtype_family, model_inputs

log = logging.getLogger(__name__)

#: Ops an index tensor may pass through unchanged in value on its way to a Gather.
_PASS_THROUGH = {"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def random_feeds(
    model: Any,
    *,
    seed: int = 0,
    count: int = 1,
    shapes: dict[str, list[int]] | None = None,
    ranges: dict[str, tuple[float, float]] | None = None,
    max_bytes: int | None = None,
    budget_hint: str | None = None,
) -> list[dict[str, np.ndarray]]:
    """``count`` feeds for ``model``'s graph inputs, deterministic per ``seed`` (numpy default_rng).

    Floats: standard normal, or uniform in ``ranges[name]``. Bools: random (all True for "mask" names).
    Integers: ``ranges[name]`` (inclusive), else ``[0, vocab)`` when the input indexes a Gather on a constant
    table, else ones for names containing "mask", zeros for "token_type", else ``[0, 10)``. Dynamic dims
    come from ``shapes``, else 1 for a leading (batch) dim; any other dynamic dim raises :class:`InputError`.
    Feeds over ``max_bytes`` in all (default: half the physical memory) are refused before anything is allocated
    (``budget_hint``: what to do then, where the caller has no --memory-budget).
    """
    proto = as_proto(model)
    specs = model_inputs(proto)
    _check_names(specs, shapes or {}, "shapes", "--input-shapes")
    _check_names(specs, ranges or {}, "ranges", "--val-range")
    plans = [(spec, resolve_shape(spec, (shapes or {}).get(spec.name))) for spec in specs]
    for spec, _ in plans:
        if (ranges or {}).get(spec.name) is not None:
            _check_range(spec, ranges[spec.name])
    check_feed_bytes(plans, count, max_bytes, budget_hint)
    bounds = gather_bounds(proto)
    rng = np.random.default_rng(seed)
    return [
        {spec.name: _values(spec, shape, rng, (ranges or {}).get(spec.name), bounds.get(spec.name)) for spec, shape
         in plans}
        for _ in range(count)
    ]


@dataclass(frozen=True)
class PlannedArray:
    """Shape and dtype of a feed array that is not allocated yet (``nbytes`` is its real size)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def planned_feed(model: Any, shapes: dict[str, list[int]] | None = None) -> dict[str, PlannedArray]:
    """What one random feed will look like, without allocating it: for sizing a run before its feeds exist."""
    specs = model_inputs(as_proto(model))
    _check_names(specs, shapes or {}, "shapes", "--input-shapes")
    return {spec.name: PlannedArray(resolve_shape(spec, (shapes or {}).get(spec.name)), spec.dtype)
            for spec in specs if spec.dtype is not None}


def _check_names(specs: list[InputSpec], given: dict, what: str, flag: str) -> None:
    unknown = sorted(set(given) - {s.name for s in specs})
    if unknown:
        raise InputError(
            f"{what} name unknown input(s) {', '.join(unknown)}",
            f"{flag} takes the model's input names: {', '.join(s.name for s in specs) or '(none)'}",
        )


def _check_range(spec: InputSpec, value_range: tuple[float, float]) -> None:
    """A range must hold values the input's dtype can represent (a float32 input cannot hold 1e39: it would be inf)."""
    if spec.dtype is None:
        return
    lo, hi = value_range
    family = dtype_family(spec.dtype)
    if family == "float":
        try:
            top = float(np.finfo(spec.dtype).max)
        except (TypeError, ValueError):
            return
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > top:
            raise InputError(f"--val-range {spec.name}: [{lo:g},{hi:g}] is not finite in {spec.dtype.name} "
                             f"(largest finite value {top:g})", f"keep both bounds within +-{top:g}")
    elif family == "int":
        info = np.iinfo(spec.dtype)
        if max(math.ceil(lo), info.min) > min(math.floor(hi), info.max):
            raise InputError(f"--val-range {spec.name}: [{lo:g},{hi:g}] holds no {spec.dtype.name} value "
                             f"(range [{info.min},{info.max}])",
                             f"give bounds that include a whole number in [{info.min},{info.max}]")


def feed_ceiling() -> int:
    """Default cap on all random feeds together: half the physical memory."""
    from ..core.budget import total_memory

    return total_memory() // 2


def check_feed_bytes(plans: list[tuple[InputSpec, tuple[int, ...]]], count: int, max_bytes: int | None,
                     hint: str | None = None) -> None:
    """Refuse ``count`` feeds of these shapes when they would take more than ``max_bytes``, before allocating."""
    from .._files import human_size

    limit = feed_ceiling() if max_bytes is None else int(max_bytes)
    sizes = [(spec, shape, math.prod(shape) * spec.dtype.itemsize) for spec, shape in plans if spec.dtype is not None]
    total = count * sum(size for *_, size in sizes)
    if total <= limit:
        return
    spec, shape, size = max(sizes, key=lambda s: s[2])
    what = "the memory budget" if max_bytes is not None else "half the physical memory"
    raise InputError(
        f"{count} random feed(s) would take {human_size(total)}, over {what} of {human_size(limit)} (input "
        f"'{spec.name}' {spec.dtype.name} {list(shape)} alone is {human_size(size)} per feed)",
        hint or "use smaller --input-shapes or fewer random feeds (the N of --feeds, --data or --calib), or raise "
        "--memory-budget",
    )


def resolve_shape(spec: InputSpec, override: list[int] | None) -> tuple[int, ...]:
    """A concrete shape for ``spec``: the override (checked against static dims) or the model's dims."""
    if override is not None:
        if isinstance(override, (str, bytes)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in override):
            example = "input_shapes={'" + spec.name + "': [1, 3, 224, 224]}"
            raise InputError(f"the shape for input '{spec.name}' must be a list of whole numbers >= 0, not "
                             f"{override!r}", f"e.g. {example} (--input-shapes {spec.name}:[1,3,224,224])")
        dims = tuple(int(d) for d in override)
        if spec.shape is not None and (
            len(dims) != len(spec.shape) or any(isinstance(m, int) and m != d for m, d in zip(spec.shape, dims))
        ):
            raise InputError(
                f"shape override {list(dims)} for input '{spec.name}' does not fit the model's {spec.shape_text}",
                "keep the rank and every fixed dimension; only dynamic ('?' or named) dims may be chosen",
            )
        return dims
    if spec.shape is None:
        raise InputError(
            f"input '{spec.name}' has unknown rank", f"pass --input-shapes {spec.name}:[d,...] with its full shape"
        )
    dims = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, int):
            dims.append(d)
        elif i == 0:
            dims.append(1)
        else:
            example = ",".join(
                str(x) if isinstance(x, int) else ("1" if j == 0 else "N") for j, x in enumerate(spec.shape)
            )
            raise InputError(
                f"input '{spec.name}' has dynamic dimension {i} ({d or '?'}) in {spec.shape_text}",
                f"pass --input-shapes {spec.name}:[{example}] with N a number "
                f"(Python: input_shapes={{'{spec.name}': [...]}})",
            )
    return tuple(dims)


def gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs used as Gather indices into a constant table -> that table's size along the gather axis."""
    graph = model.graph
    tables = {t.name: tuple(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    tables[node.output[0]] = tuple(attr.t.dims)
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    bounds: dict[str, int] = {}
    for vi in graph.input:
        found = _gather_sizes(vi.name, consumers, tables, set())
        if found:
            bounds[vi.name] = min(found)
    return bounds


def _gather_sizes(name: str, consumers: dict, tables: dict, seen: set[str]) -> list[int]:
    """Sizes of the tables ``name`` indexes (Gather indices), through pass-through ops; iterative, so a chain of
    thousands of nodes does not exhaust Python's recursion limit."""
    sizes = []
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for node, idx in consumers.get(current, []):
            if node.op_type == "Gather" and idx == 1 and node.input[0] in tables:
                dims = tables[node.input[0]]
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    sizes.append(int(dims[axis]))
            elif node.op_type in _PASS_THROUGH and idx == 0:
                stack.extend(reversed(node.output))
    return sizes


def _values(
    spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, value_range: tuple[float, float] | None,
    vocab: int | None,
) -> np.ndarray:
    if spec.dtype is None or dtype_family(spec.dtype) == "other":
        raise InputError(
            f"cannot generate random values for input '{spec.name}' of type {spec.type_name}",
            "pass real feeds with --inputs/--data (.npz or Polygraphy JSON)",
        )
    family = dtype_family(spec.dtype)
    if family == "float":
        if value_range is not None:
            lo, hi = value_range
            if math.isinf(hi - lo):  # rng.uniform needs a finite width: mix the bounds instead
                u = rng.random(size=shape)
                return (lo * (1 - u) + hi * u).astype(spec.dtype)
            return rng.uniform(lo, hi, size=shape).astype(spec.dtype)
        return rng.standard_normal(size=shape).astype(spec.dtype)
    if family == "bool":
        if "mask" in spec.name.lower():
            return np.ones(shape, dtype=bool)
        return rng.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(spec.dtype)
    if value_range is not None:
        lo, hi = math.ceil(value_range[0]), math.floor(value_range[1])  # _check_range: a whole number in range
        return rng.integers(max(lo, info.min), min(hi, info.max), size=shape, endpoint=True).astype(spec.dtype)
    lowered = spec.name.lower()
    if vocab is not None:
        log.debug("input %s indexes a table of %d rows: ids in [0, %d)", spec.name, vocab, vocab)
        return rng.integers(0, min(vocab, int(info.max) + 1), size=shape).astype(spec.dtype)
    if "mask" in lowered:
        return np.ones(shape, dtype=spec.dtype)
    if "token_type" in lowered:
        return np.zeros(shape, dtype=spec.dtype)
    return rng.integers(0, min(10, int(info.max) + 1), size=shape).astype(spec.dtype)

