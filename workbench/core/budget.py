"""Memory sizes as users write them, and the default budget."""

from __future__ import annotations

import os
import re

from ..errors import WorkbenchError

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
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
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
