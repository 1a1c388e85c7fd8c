"""Standard output kept for the JSON while a command writes ``--json -``.

User code (a ``--preprocess`` or ``--metric`` function, in this process or in a worker), a native library or a
stray ``print`` would otherwise write into the JSON document and corrupt it. While :func:`reserved` is active,
``sys.stdout`` and file descriptor 1 lead to standard error (worker processes inherit that), and
:func:`json_stream` is the real standard output."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

_reserved: list[io.TextIOBase] = []


def json_stream():
    """Where ``--json -`` writes: the real standard output (reserved or not)."""
    return _reserved[-1] if _reserved else sys.stdout


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@contextlib.contextmanager
def reserved(enabled: bool = True) -> Iterator[None]:
    """Within the block, anything written to standard output (Python's ``sys.stdout`` and, when it is file
    descriptor 1, the descriptor itself: native code, child processes) goes to standard error; the JSON goes to
    :func:`json_stream`."""
    if not enabled:
        yield
        return
    real = sys.stdout
    fd = _fd(real)
    saved = None
    with contextlib.suppress(Exception):
        real.flush()
    if fd == 1 and _fd(sys.stderr) is not None:
        saved = os.dup(1)
        os.dup2(_fd(sys.stderr), 1)
        target = open(saved, "w", encoding=getattr(real, "encoding", None) or "utf-8",  # noqa: SIM115
                      errors=getattr(real, "errors", None) or "strict", closefd=False)
    else:  # a captured or replaced stdout (tests, notebooks): Python-level only
        target = real
    _reserved.append(target)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        _reserved.pop()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        sys.stdout = real
        if saved is not None:
            with contextlib.suppress(Exception):
                target.flush()
            os.dup2(saved, 1)
            os.close(saved)
