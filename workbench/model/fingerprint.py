"""Content fingerprints: sha256 over the model bytes and its external-data files.

Hashing a model's weights costs 0.8-2.7 s per GB here, pages in memory or read cold (``workbench inspect`` of a
freshly written 2.4 GB model: 6.4 s of its 6.6 s), and every command that loads the model pays it again. So a
fingerprint over at least :data:`REMEMBER_BYTES` of external data is remembered in the user's cache folder
(``$WORKBENCH_FINGERPRINTS_DIR``, else ``onnx-drift-workbench/fingerprints`` there; ``none`` turns it off), one
small file per state of the files: the key is the model bytes' own sha256 and, for each external file, its path,
size, inode, device and modification *and* status-change times (a file rewritten in place changes its ctime, which
no user call sets back), so any change to a file is a new key and a fresh hash. A missing, unreadable or malformed
entry is hashed again; entries are written atomically (several processes may share the folder)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from .._files import open_regular

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: external data from this many bytes on has its fingerprint remembered
REMEMBER_BYTES = 64 << 20
DIR_ENV = "WORKBENCH_FINGERPRINTS_DIR"
_HEX = re.compile(r"[0-9a-f]{64}")


def fingerprint(model_bytes: bytes, external_files: list[Path] = ()) -> str:
    """sha256 (hex) over the serialized model, then each external file's name and content, in name order."""
    files = sorted(external_files, key=lambda p: p.name)
    entry = _entry(model_bytes, files)
    if entry is not None:
        try:
            text = entry.read_text(encoding="ascii").strip()
            if _HEX.fullmatch(text):
                return text
        except (OSError, UnicodeDecodeError):
            pass
    h = hashlib.sha256(model_bytes)
    for path in files:
        h.update(b"\x00" + path.name.encode("utf-8") + b"\x00")
        with open_regular(path, "external data file") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    digest = h.hexdigest()
    if entry is not None:
        try:
            from .._atomic import atomic_write_text

            atomic_write_text(entry, digest + "\n")
        except OSError as e:  # a read-only or full cache folder: the next load hashes again
            log.debug("fingerprint not remembered in %s: %s", entry.parent, e)
    return digest


def _entry(model_bytes: bytes, files: list[Path]) -> Path | None:
    """The cache file for this state of the model and its files, or None (small data, no cache, a file that
    cannot be statted)."""
    folder = os.environ.get(DIR_ENV, "").strip()
    if folder.lower() == "none" or not files:
        return None
    key = hashlib.sha256(b"workbench.fingerprint/1\x00" + hashlib.sha256(model_bytes).digest())
    total = 0
    try:
        for path in files:
            st = os.stat(path)
            total += st.st_size
            key.update(f"\x00{path.name}\x00{Path(path).resolve()}\x00{st.st_size}\x00{st.st_ino}\x00{st.st_dev}"
                       f"\x00{st.st_mtime_ns}\x00{st.st_ctime_ns}".encode("utf-8", "surrogateescape"))
    except OSError:
        return None
    if total < REMEMBER_BYTES:
        return None
    if not folder:
        from .._user_cache import APP, user_cache_dir

        folder = str(user_cache_dir() / APP / "fingerprints")
    return Path(folder).expanduser() / f"{key.hexdigest()}.sha256"
