"""Parsing the CLI's ``--input-shapes NAME:[d,...]`` and ``--val-range NAME:[lo,hi]`` arguments."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from ..errors import InputError

_ITEM = re.compile(r"^(?P<name>.+):\[(?P<body>[^\[\]]*)\]$")


def _split(items: str | Iterable[str], flag: str, example: str) -> list[tuple[str, list[str]]]:
    if isinstance(items, str):
        items = [items]
    out = []
    for raw in items:
        match = _ITEM.match(raw.strip())
        if not match:
            raise InputError(f"malformed {flag} value {raw!r}", f"write it as {example}")
        body = match.group("body").strip()
        out.append((match.group("name"), [p.strip() for p in body.split(",")] if body else []))
    return out


def parse_shape_overrides(items: str | Iterable[str]) -> dict[str, list[int]]:
    """``["x:[1,3,224,224]", "ids:[1,128]"]`` -> ``{"x": [1, 3, 224, 224], "ids": [1, 128]}``."""
    shapes: dict[str, list[int]] = {}
    for name, parts in _split(items, "--input-shapes", "NAME:[1,3,224,224] (dimensions as whole numbers)"):
        try:
            dims = [int(p) for p in parts]
        except ValueError:
            raise InputError(
                f"--input-shapes {name}: dimensions must be whole numbers, got [{','.join(parts)}]",
                f"write it as {name}:[1,3,224,224]",
            ) from None
        if any(d < 0 for d in dims):
            raise InputError(f"--input-shapes {name}: negative dimension in {dims}", "dimensions must be >= 0")
        shapes[name] = dims
    return shapes


def parse_range_overrides(items: str | Iterable[str]) -> dict[str, tuple[float, float]]:
    """``["x:[0,1]"]`` -> ``{"x": (0.0, 1.0)}``; finite, ``lo <= hi``."""
    ranges: dict[str, tuple[float, float]] = {}
    for name, parts in _split(items, "--val-range", "NAME:[lo,hi], e.g. x:[0,1]"):
        try:
            lo, hi = (float(p) for p in parts)
        except ValueError:
            raise InputError(
                f"--val-range {name}: expected two numbers [lo,hi], got [{','.join(parts)}]",
                f"write it as {name}:[0,1]",
            ) from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise InputError(f"--val-range {name}: invalid range [{lo},{hi}]", "give finite numbers with lo <= hi")
        ranges[name] = (lo, hi)
    return ranges
