"""Reading files a user names: regular files only (a FIFO blocks for ever, a device reads without end), and
never more than a cap. Each caller raises its own error type, so the message fits what the file was for.

Every file the workbench reads goes through here: :func:`open_regular` (opened without blocking, the opened file
itself checked), :func:`read_capped` / :func:`read_text` / :func:`read_json` (whole files, refused past a cap
before anything is read). The caps of :data:`LIMITS` are per kind of file; ``WORKBENCH_MAX_<KIND>_BYTES`` (e.g.
``WORKBENCH_MAX_JSON_BYTES=2G``) raises one for a legitimately large file."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from .errors import WorkbenchError

#: the default cap of each kind of file read whole: JSON documents (results, TensorRT records, bundles'
#: manifests), calibration caches and tables, Python modules named by --preprocess/--metric, TensorRT engines
#: from the engine cache. Models (protobuf's 2 GiB), feeds and samples have their own fixed caps.
LIMITS = {"json": 256 * 1024**2, "calibration": 64 * 1024**2, "code": 16 * 1024**2, "engine": 16 * 1024**3}


def env_name(kind: str) -> str:
    """The environment variable that overrides the cap of ``kind``: WORKBENCH_MAX_JSON_BYTES, ..."""
    return f"WORKBENCH_MAX_{kind.upper()}_BYTES"


def limit(kind: str, default: int | None = None) -> int:
    """The cap for files of ``kind``: ``WORKBENCH_MAX_<KIND>_BYTES`` when set (512M, 2G, a byte count), else
    ``default`` or :data:`LIMITS`."""
    text = os.environ.get(env_name(kind))
    if text:
        from .core.budget import parse_size

        try:
            return parse_size(text)
        except WorkbenchError as e:
            raise WorkbenchError(f"{env_name(kind)}={text!r}: {e.message}", "write e.g. 512M or 2G") from None
    return default if default is not None else LIMITS[kind]


def _raise_hint(kind: str | None, hint: str | None) -> str | None:
    if kind is None:
        return hint
    how = f"set {env_name(kind)} to raise the limit"
    return f"{hint}; or {how}" if hint else f"if the file is right, {how}"


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


def check_size(fh, subject: str, max_bytes: int, error: type[WorkbenchError] = WorkbenchError,
               size_hint: str | None = None, kind: str | None = None) -> int:
    """The size of the open file ``fh``, or ``error`` naming ``subject`` (what and which file), its size and the
    cap when over it (``kind``: the override of its cap is named in the hint)."""
    size = os.fstat(fh.fileno()).st_size
    if size > max_bytes:
        raise error(f"{subject} is {human_size(size)}, over the {human_size(max_bytes)} limit",
                    _raise_hint(kind, size_hint))
    return size


def read_capped(path: str | os.PathLike, max_bytes: int | None, what: str,
                error: type[WorkbenchError] = WorkbenchError, size_hint: str | None = None,
                kind: str | None = None) -> bytes:
    """The bytes of ``path`` (see :func:`open_regular`) when at most ``max_bytes`` (None: the cap of ``kind``);
    otherwise ``error`` with one line naming ``what`` the file was meant to be, its size and the cap
    (``size_hint``: what to do about a file over the cap; ``kind``: its cap's override is named too)."""
    if max_bytes is None:
        max_bytes = limit(kind)
    elif kind is not None:
        max_bytes = limit(kind, max_bytes)
    size_hint = _raise_hint(kind, size_hint)
    with open_regular(path, what, error) as fh:
        size = check_size(fh, f"{what} {path}", max_bytes, error, size_hint)
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


def read_text(path: str | os.PathLike, what: str, error: type[WorkbenchError] = WorkbenchError, *,
              kind: str = "json", max_bytes: int | None = None, hint: str | None = None) -> str:
    """UTF-8 text of ``path`` (see :func:`read_capped`); binary junk gives one line naming the file."""
    data = read_capped(path, max_bytes, what, error, kind=kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text (byte {e.start})", hint) from None


def read_json(path: str | os.PathLike, what: str, error: type[WorkbenchError] = WorkbenchError, *,
              kind: str = "json", max_bytes: int | None = None, hint: str | None = None) -> Any:
    """The JSON document in ``path`` (see :func:`read_text`); invalid JSON gives one line naming the file."""
    text = read_text(path, what, error, kind=kind, max_bytes=max_bytes, hint=hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", hint) \
            from None
    except RecursionError:
        raise error(f"{what} {path} nests too deeply", hint) from None
