"""Plain-text tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    """Left-aligned columns, numbers right-aligned, ``None`` shown as ``-``; control characters escaped."""
    cells = [[("-" if v is None else printable(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(headers))]

    def fmt(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([fmt(list(headers)), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


#: characters shown escaped in messages: C0 and C1 controls, DEL, line/paragraph separators and the bidi
#: overrides that reorder what a terminal shows
_UNSAFE = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_UNSAFE |= {c: f"\\u{c:04x}" for c in [0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}
_UNSAFE |= {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord("\x1b"): "\\x1b"}


def printable(text: object) -> str:
    """``text`` on one line with control characters escaped (``\\r``, ``\\n``, ``\\x1b``...): a name or path from a
    model can neither break a message in two nor forge terminal lines or escape sequences."""
    return str(text).translate(_UNSAFE)


def safe_name(text: object, limit: int | None = None) -> str:
    """A user-controlled string (model path or name, tensor, node, input, metric or sample name, engine spec) as
    text output shows it: on one line, control characters, line separators and escape sequences escaped (see
    :func:`printable`), cut to ``limit`` characters with an ellipsis. Every text renderer interpolates names
    through this, so no name can forge a line such as ``verdict: ok``."""
    shown = printable("" if text is None else text)
    if limit is not None and len(shown) > limit:
        shown = shown[:max(limit - 1, 0)] + "\u2026"
    return shown


def printable_lines(text: str) -> str:
    """Multi-line ``text`` with control characters other than its line breaks escaped (a carriage return or an
    escape sequence in a name can no longer overwrite what a terminal shows)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
