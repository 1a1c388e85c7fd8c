"""Content fingerprints: sha256 over the model bytes and its external-data files."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .._files import open_regular

_CHUNK = 1 << 20


def fingerprint(model_bytes: bytes, external_files: list[Path] = ()) -> str:
    """sha256 (hex) over the serialized model, then each external file's name and content, in name order."""
    h = hashlib.sha256(model_bytes)
    for path in sorted(external_files, key=lambda p: p.name):
        h.update(b"\x00" + path.name.encode("utf-8") + b"\x00")
        with open_regular(path, "external data file") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()
