"""Atomic file writes: write a temporary file beside the target, then rename it into place.

Temporaries are named ``.NAME.wbtmp-HOST-PID-RANDOM.tmp`` (:func:`temp_prefix`), so that a later write in the
same folder can remove the ones a killed writer left behind (:func:`clean_stale`). :func:`place_new` renames
into a destination only when nothing is there, never replacing what another process wrote. :func:`staged` holds a
temporary while it is written, so that an error, Ctrl-C or SIGTERM removes it (:mod:`workbench.core.scratch`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: a temporary of this host whose writer is dead counts as stale after this long (pid namespaces, clock skew)
STALE_AFTER_S = 600
#: a temporary written by another host (a shared folder) counts as stale only after this long
FOREIGN_STALE_AFTER_S = 24 * 3600
_HOST = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:6]
_TAGGED = re.compile(r"\.wbtmp-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[a-z0-9_]+\.tmp$")


def umask() -> int:
    """The process umask (read without changing it for good)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tag() -> str:
    """``wbtmp-HOST-PID-``: what marks a temporary as ours, and who wrote it."""
    return f"wbtmp-{_HOST}-{os.getpid()}-"


def temp_prefix(name: str) -> str:
    """The prefix of our temporaries for ``name`` (pass ``suffix=".tmp"`` to mkstemp/mkdtemp)."""
    return f".{name[:64]}.{tag()}"  # a long name (up to NAME_MAX) still leaves room for the tag


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as an error shows it: one of our temporaries (:func:`temp_prefix`) is shown as the output it stands
    for (its folder and name), not as the temporary."""
    text = os.fspath(path)
    name = os.path.basename(text)
    if name.startswith(".") and ".wbtmp-" in name:
        return os.path.join(os.path.dirname(text), name[1:name.index(".wbtmp-")])
    return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    return True


def _is_stale(name: str, age: float, legacy_name: str | None) -> bool:
    match = _TAGGED.search(name)
    if match and (name.startswith(".") or name.startswith("workbench-bundle")):
        pid = int(match["pid"])
        if match["host"] != _HOST:
            return age > FOREIGN_STALE_AFTER_S
        return pid != os.getpid() and age > STALE_AFTER_S and not _alive(pid)
    if legacy_name is not None:  # written before the tag: `.NAME.XXXXXXXX.tmp` of this very destination
        legacy = re.fullmatch(rf"\.{re.escape(legacy_name)}\.[a-z0-9_]{{8}}\.tmp", name)
        return legacy is not None and age > FOREIGN_STALE_AFTER_S
    return False


def clean_stale(folder: str | os.PathLike, *, legacy_name: str | None = None) -> list[Path]:
    """Remove our temporaries in ``folder`` whose writer died (SIGKILL, power loss) and return them: this host's
    once their pid is gone and they are older than :data:`STALE_AFTER_S`, another host's after a day.
    ``legacy_name``: also the untagged ``.NAME.XXXXXXXX.tmp`` older versions left for that name, after a day."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.endswith(".tmp"):
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if not _is_stale(entry.name, age, legacy_name):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError as e:
            log.debug("stale temporary %s not removed: %s", entry.path, e)
            continue
        log.info("removed stale temporary %s (its writer is gone)", entry.path)
        removed.append(Path(entry.path))
    return removed


@functools.lru_cache(maxsize=1)
def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _rename_noreplace(src: Path, dest: Path) -> bool:
    """renameat2(RENAME_NOREPLACE): True when done, False when this system or file system lacks it."""
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, noreplace = -100, 1
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dest), noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dest))


def place_new(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Rename ``src`` (a file or folder) to ``dest`` only if nothing is there; else :class:`FileExistsError`, with
    ``dest`` untouched. Exclusive even against a concurrent writer: renameat2(RENAME_NOREPLACE) where the system
    has it, else a hard link (files) or an exclusive mkdir claim that only our own empty folder can lose."""
    src, dest = Path(src), Path(dest)
    if _rename_noreplace(src, dest):
        return
    if src.is_dir() and not src.is_symlink():
        os.mkdir(dest)  # FileExistsError: taken
        try:
            os.rename(src, dest)  # replaces our empty claim; fails (ENOTEMPTY) if another process wrote into it
        except OSError as e:
            try:
                os.rmdir(dest)  # only while still empty: never removes what someone else put there
            except OSError:
                pass
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise FileExistsError(errno.EEXIST, "written meanwhile by another process", str(dest)) from None
            raise
        return
    try:
        os.link(src, dest)  # FileExistsError: taken
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some network/FAT file systems): claim the name, then replace the claim
        os.close(os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.replace(src, dest)
        return
    os.unlink(src)


@contextlib.contextmanager
def staged(made: T) -> Iterator[T]:
    """Hold a temporary beside an output while it is being written: ``made`` is what ``mkdtemp`` (a path) or
    ``mkstemp`` (fd, path) returned. On an error or an interrupt it is removed; and while inside it is registered
    with the run's scratch (:func:`workbench.core.scratch.track`), so that the CLI's Ctrl-C/SIGTERM exit removes it
    even if this frame never unwinds. Leave it renamed into place (or removed) by the end of the block."""
    from .core import scratch

    path = made[1] if isinstance(made, tuple) else made
    scratch.track(path)
    try:
        yield made
    except BaseException:
        remove_path(path)
        raise
    finally:
        scratch.untrack(path)


def remove_path(path: str | os.PathLike) -> None:
    """Remove a temporary file or folder if it is there (a link itself, never its target); never raises."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("temporary %s not removed: %s", path, e)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged(tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent)) as (fd, tmp):
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; outputs get ordinary permissions
        os.replace(tmp, target)
    clean_stale(target.parent, legacy_name=target.name)
    return target


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))
