"""Feeds from files (.npz, a folder of .npz, Polygraphy inputs JSON) or from Python objects."""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._files import open_regular, read_capped
from ..errors import InputError
from .npy import check_npy_header
from .polygraphy_json import decode_feeds

log = logging.getLogger(__name__)

#: Largest feed file (or decompressed .npz member total) read; bigger ones are refused, not loaded.
MAX_FEED_BYTES = 2 * 1024**3
_HINT = "pass an .npz (np.savez(path, NAME=array)), a folder of .npz files, or a `polygraphy run --save-inputs` JSON"


def load_feeds(path: str | os.PathLike, *, max_bytes: int = MAX_FEED_BYTES) -> list[dict[str, np.ndarray]]:
    """Feeds from ``path``: an .npz (one feed), a folder of .npz (one feed each, sorted by file name; or
    of Polygraphy per-iteration .json files) or a Polygraphy inputs JSON (a list of feeds). Never unpickles."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"feed file not found: {p}", "check the path")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".npz" and f.is_file())
        if files:
            return [_load_npz(f, max_bytes) for f in files]
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".json" and f.is_file())
        if files:
            return [feed for f in files for feed in _load_json(f, max_bytes)]
        raise InputError(f"{p} holds no .npz or .json feed files", _HINT)
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return [_load_npz(p, max_bytes)]
    if suffix == ".json":
        return _load_json(p, max_bytes)
    if suffix == ".npy":
        raise InputError(f"{p} is a single unnamed array (.npy)", "name it: np.savez('feeds.npz', INPUT_NAME=array)")
    raise InputError(f"{p}: unsupported feed file type '{p.suffix or '(none)'}'", _HINT)


def _check_size(path: Path, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise InputError(f"{path} is {size / 1024**2:.0f} MiB, over the {max_bytes / 1024**2:.0f} MiB feed limit",
                         "use fewer or smaller feeds (or raise max_bytes)")


def _load_npz(path: Path, max_bytes: int) -> dict[str, np.ndarray]:
    with open_regular(path, "feed file", InputError) as fh:
        return _read_npz(fh, path, max_bytes)


def _read_npz(fh, path: Path, max_bytes: int) -> dict[str, np.ndarray]:
    _check_size(path, os.fstat(fh.fileno()).st_size, max_bytes)
    try:
        with zipfile.ZipFile(fh) as zf:
            _check_size(path, sum(info.file_size for info in zf.infolist()), max_bytes)
            for info in zf.infolist():
                with zf.open(info) as member:
                    check_npy_header(member, info.file_size, f"{path}:{info.filename}")
        fh.seek(0)
        with np.load(fh, allow_pickle=False) as npz:
            feed = {name: npz[name] for name in npz.files}
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise InputError(f"{path} holds pickled (object) arrays; refusing to unpickle them",
                             "store plain numeric or bool arrays") from None
        raise InputError(f"{path} is not a readable .npz ({e})", _HINT) from None
    except (OSError, EOFError, MemoryError, zipfile.BadZipFile) as e:
        raise InputError(f"{path} is not a readable .npz ({type(e).__name__}: {e})", _HINT) from None
    if not feed:
        raise InputError(f"{path} holds no arrays", "save one array per model input: np.savez(path, NAME=array)")
    return feed


def _load_json(path: Path, max_bytes: int) -> list[dict[str, np.ndarray]]:
    data = read_capped(path, max_bytes, "feed file", InputError, "use fewer or smaller feeds (or raise max_bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cannot read {path} as text ({e})", _HINT) from None
    return decode_feeds(text, str(path))


def feeds_from(obj: Any) -> list[dict[str, np.ndarray]]:
    """Normalise feeds: a dict (one feed), a list/iterable of dicts, or a path (see :func:`load_feeds`)."""
    if isinstance(obj, (str, os.PathLike)):
        return load_feeds(obj)
    if isinstance(obj, Mapping):
        return [_feed(obj, 0)]
    if isinstance(obj, Iterable) and not isinstance(obj, (bytes, np.ndarray)):
        feeds = [_feed(item, i) for i, item in enumerate(obj)]
        if not feeds:
            raise InputError("no feeds given (an empty list)", "pass at least one feed dict {input name: array}")
        return feeds
    raise InputError(f"cannot use a {type(obj).__name__} as feeds",
                     "pass a dict {input name: array}, a list of such dicts, or a path to .npz/.json feeds")


def _feed(item: Any, index: int) -> dict[str, np.ndarray]:
    if not isinstance(item, Mapping):
        raise InputError(f"feed {index} is a {type(item).__name__}, not a dict",
                         "each feed is a dict {input name: numpy array}")
    feed = {}
    for name, value in item.items():
        try:
            feed[str(name)] = value if isinstance(value, np.ndarray) else np.asarray(value)
        except (ValueError, TypeError) as e:
            raise InputError(f"feed {index}: input '{name}' is not array-like ({e})",
                             "give a numpy array of one dtype and a regular shape") from None
    return feed
