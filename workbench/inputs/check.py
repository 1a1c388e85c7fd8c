"""Checking feeds against a model's inputs: names, shapes, dtypes, NaN; exact casts applied."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import InputError
from .files import feeds_from
from .spec import InputSpec, as_proto, dtype_family, model_inputs

log = logging.getLogger(__name__)

_MAX_LISTED = 6


def check_feeds(model: Any, feeds: Any) -> list[dict[str, np.ndarray]]:
    """Return ``feeds`` cast to the model's input dtypes where the cast keeps the values (float64 -> float32
    is allowed with a logged note); otherwise raise ONE :class:`InputError` naming each bad input.

    Checked: unknown and missing names, rank and fixed dims, dtype family (float/int/bool), integer
    range, NaN in float inputs (+-inf is allowed: additive masks use it). ``feeds``: anything
    :func:`~workbench.inputs.feeds_from` accepts.
    """
    proto = as_proto(model)
    specs = model_inputs(proto)
    by_name = {s.name: s for s in specs}
    overridable = {vi.name for vi in proto.graph.input} - set(by_name)  # initializer-backed inputs
    expected = ", ".join(s.name for s in specs) or "(none)"
    feed_list = feeds_from(feeds)
    problems: list[tuple[str, str]] = []
    checked_feeds = []
    for index, feed in enumerate(feed_list):
        where = f"feed {index}: " if len(feed_list) > 1 else ""
        unknown = [n for n in feed if n not in by_name and n not in overridable]
        if unknown:
            problems.append((f"{where}unknown input(s) {', '.join(map(repr, unknown))} (the model's inputs: "
                             f"{expected})", "name each array after a model input"))
        missing = [s for s in specs if s.name not in feed]
        if missing:
            problems.append((f"{where}missing input(s) " + ", ".join(f"'{s.name}' ({s.describe()})" for s in missing),
                             "feed every model input"))
        checked = {}
        for name, value in feed.items():
            spec = by_name.get(name)
            if spec is None:
                checked[name] = value
                continue
            cast, errors = _check_one(spec, value)
            problems += [(where + msg, hint) for msg, hint in errors]
            checked[name] = cast
        checked_feeds.append(checked)
    if problems:
        shown = [msg for msg, _ in problems[:_MAX_LISTED]]
        if len(problems) > _MAX_LISTED:
            shown.append(f"and {len(problems) - _MAX_LISTED} more")
        hints = list(dict.fromkeys(hint for _, hint in problems))
        raise InputError("feeds do not fit the model: " + "; ".join(shown), "; ".join(hints))
    return checked_feeds


def _check_one(spec: InputSpec, value: np.ndarray) -> tuple[np.ndarray, list[tuple[str, str]]]:
    if spec.dtype is None:  # sequences, maps, optional: passed through unchecked
        return value, []
    errors = _shape_errors(spec, value)
    want, got = dtype_family(spec.dtype), dtype_family(value.dtype)
    if want != got:
        how = {"int": "integer ids/indices", "float": "real numbers", "bool": "true/false flags"}.get(want, want)
        errors.append((f"input '{spec.name}' is {value.dtype} but the model expects {spec.type_name} ({how})",
                       f"convert it, e.g. array.astype(np.{spec.dtype.name}), if the values are meant as {how}"))
        return value, errors
    if want == "other":
        return value, errors
    if want == "float":
        nan = int(np.count_nonzero(np.isnan(value)))
        if nan:
            errors.append((f"input '{spec.name}' contains {nan} NaN value(s) of {value.size}",
                           "replace NaN in the data (np.nan_to_num or fix its source); +-inf is allowed"))
        if value.dtype != spec.dtype:
            finite = value[np.isfinite(value)]
            if finite.size and np.abs(finite).max() > np.finfo(spec.dtype).max:
                errors.append((f"input '{spec.name}' has values up to {np.abs(finite).max():.3g}, beyond "
                               f"{spec.type_name}'s range", f"scale the data into {spec.type_name}'s range"))
            elif value.dtype.itemsize > spec.dtype.itemsize:
                log.info("input %s: casting %s to %s (the model's input type)", spec.name, value.dtype, spec.dtype)
    elif want == "int" and value.dtype != spec.dtype and value.size:
        info = np.iinfo(spec.dtype)
        lo, hi = int(value.min()), int(value.max())
        if lo < info.min or hi > info.max:
            errors.append((f"input '{spec.name}' has values in [{lo}, {hi}], outside {spec.type_name}",
                           f"give values that fit {spec.type_name}"))
    if errors:
        return value, errors
    return (value if value.dtype == spec.dtype else value.astype(spec.dtype)), []


def _shape_errors(spec: InputSpec, value: np.ndarray) -> list[tuple[str, str]]:
    if spec.shape is None:
        return []
    got = "[" + ",".join(map(str, value.shape)) + "]"
    hint = "give arrays of the model's shape (named or '?' dims may vary; --input-shapes sets them)"
    if value.ndim != len(spec.shape):
        return [(f"input '{spec.name}' has shape {got} (rank {value.ndim}) but the model expects "
                 f"{spec.shape_text} (rank {len(spec.shape)})", hint)]
    bad = [i for i, (m, d) in enumerate(zip(spec.shape, value.shape)) if isinstance(m, int) and m != d]
    if bad:
        return [(f"input '{spec.name}' has shape {got} but the model expects {spec.shape_text} "
                 f"(dim {', '.join(map(str, bad))} differs)", hint)]
    return []
