"""Reading files a user names: regular files only (a FIFO blocks for ever, a device reads without end), and
never more than a cap. Each caller raises its own error type, so the message fits what the file was for."""

from __future__ import annotations

import os
import stat

from .errors import WorkbenchError


def file_kind(mode: int) -> str:
    """'a FIFO (named pipe)', 'a character device', ... for a stat mode."""
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return kind
    return "a special file"


def human_size(n: int) -> str:
    """1536 -> '1.5 KiB'; 2**80 -> '1.1e+09 TiB'."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 1e4 else f"{value:.3g} {unit}"
    return f"{n} B"


def open_regular(path: str | os.PathLike, what: str, error: type[WorkbenchError] = WorkbenchError):
    """A binary file object for ``path``, refused with ``error`` unless a regular file. Opened without blocking,
    and the opened file itself is checked (a path swapped for a FIFO after a check is still refused)."""
    def refuse(mode: int):
        return error(f"{what} {path} is {file_kind(mode)}, not a regular file; refusing to read it",
                     "pass a regular file (not a pipe, device or socket)")

    try:
        mode = os.stat(path).st_mode  # a socket cannot even be opened: name it before trying
        if not stat.S_ISREG(mode):
            raise refuse(mode)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}", "check the path and its permissions") from None
    mode = os.fstat(fd).st_mode  # swapped for a FIFO or a device after the stat: still refused
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise refuse(mode)
    return os.fdopen(fd, "rb")


def read_capped(path: str | os.PathLike, max_bytes: int, what: str, error: type[WorkbenchError] = WorkbenchError,
                size_hint: str | None = None) -> bytes:
    """The bytes of ``path`` (see :func:`open_regular`) when at most ``max_bytes``; otherwise ``error`` with one
    line naming ``what`` the file was meant to be (``size_hint``: what to do about a file over the cap)."""
    with open_regular(path, what, error) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise error(f"{what} {path} is {human_size(size)}, over the {human_size(max_bytes)} limit", size_hint)
        try:  # read what fstat says (+1 to see growth): read(max_bytes) would reserve the whole cap up front
            parts = [fh.read(size + 1)]
            total = len(parts[0])
            while total > size and total <= max_bytes:  # the file grew while being read: go on, up to the cap
                more = fh.read(min(1 << 20, max_bytes + 1 - total))
                if not more:
                    break
                parts.append(more)
                total += len(more)
            data = parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError as e:
            raise error(f"cannot read {what} {path}: {e.strerror}", "check the file") from None
    if len(data) > max_bytes:  # grew while being read
        raise error(f"{what} {path} is over the {human_size(max_bytes)} limit", size_hint)
    return data
