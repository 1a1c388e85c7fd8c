"""Reading untrusted files (bundles, recorded runs) safely.

Never unpickles; every path named inside a bundle stays inside it (no absolute paths, no ``..``, no symlink
out, no zip-slip entry); only regular files are opened (never a FIFO or a device); array sizes are checked
from the .npy header before numpy allocates anything; bad JSON or a wrong schema gives one clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .. import _files
from .._files import check_size, file_kind, limit
from ..errors import WorkbenchError

#: largest JSON document read (manifest, results, Polygraphy files hold base64 arrays: larger)
MAX_JSON_BYTES = 256 * 1024**2
#: largest array (declared by its .npy header) and largest total of one .npz, uncompressed
MAX_ARRAY_BYTES = 2 * 1024**3
#: largest total uncompressed size and member count of a zipped bundle
MAX_ZIP_BYTES = 16 * 1024**3
MAX_ZIP_MEMBERS = 10_000

_DRIVE = re.compile(r"^[A-Za-z]:")


class BundleError(WorkbenchError):
    """A bundle or recorded-run file is malformed, incomplete or of another schema."""

    default_hint = "pass a folder or .zip written by workbench.report.save_bundle / `workbench compare --bundle`"


class UnsafeBundleError(BundleError):
    """A bundle tries to reach outside itself, or holds pickled data."""

    default_hint = ("refused for safety; re-create the file with the tool that writes it (`workbench compare "
                    "--bundle`, `polygraphy run --save-results`)")


class ModelMismatchError(BundleError):
    """The model found is not the model the bundle recorded (sha256 differs)."""

    default_hint = "use the bundle's own model copy, or the exact model file it was made from"


def relpath(name: Any, where: str) -> PurePosixPath:
    """A relative POSIX path with no ``..``, no absolute root or drive, no backslash and no NUL, or an error."""
    if not isinstance(name, str) or not name or name.strip() != name:
        raise UnsafeBundleError(f"{where}: {name!r} is not a relative file name")
    if "\x00" in name or "\\" in name or name.startswith("/") or _DRIVE.match(name):
        raise UnsafeBundleError(f"{where}: {name!r} is an absolute or platform-specific path; only relative paths "
                                "inside the bundle are allowed")
    parts = PurePosixPath(name).parts
    if any(p in ("..", "") for p in parts) or not parts:
        raise UnsafeBundleError(f"{where}: {name!r} leaves the bundle ('..'); only paths inside it are allowed")
    return PurePosixPath(*[p for p in parts if p != "."])


def confined(root: Path, name: Any, where: str, *, must_exist: bool = True) -> Path:
    """``root / name`` after :func:`relpath`, resolved; a symlink (anywhere on the way) may not lead outside."""
    rel = relpath(name, where)
    base = root.resolve()
    target = (base / rel).resolve()
    if not target.is_relative_to(base):
        raise UnsafeBundleError(f"{where}: {name!r} is a symlink leading outside the bundle ({target})")
    if must_exist:
        try:
            mode = os.stat(target).st_mode
        except OSError:
            raise BundleError(f"{where}: {name!r} is missing from the bundle",
                              "the bundle is incomplete; re-create it") from None
        if not stat.S_ISREG(mode):
            raise UnsafeBundleError(f"{where}: {name!r} is {file_kind(mode)}, not a regular file; refusing to open it")
    return target


def regular_file(path: Path, where: str, hint: str | None = None) -> os.stat_result:
    """``path``'s stat (symlinks followed) when it is a regular file: FIFOs, devices, sockets and folders are
    refused before anything opens them (a FIFO would block for ever, a device read without end)."""
    try:
        st = os.stat(path)
    except OSError:
        raise BundleError(f"{where} is missing ({Path(path).name})", hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeBundleError(f"{where} is {file_kind(st.st_mode)}, not a regular file; refusing to open it", hint)
    return st


def open_regular(path: Path, where: str):
    """A binary file object for ``path``, opened without blocking and refused unless a regular file (the
    workbench's one reader, :func:`workbench._files.open_regular`, after a missing file is named as such)."""
    regular_file(path, where)
    return _files.open_regular(path, where, UnsafeBundleError)


def read_json(path: Path, where: str, *, schema: str | None = None, max_bytes: int | None = None) -> dict:
    """A JSON object from ``path``; ``schema``: the exact ``schema`` field required (family/N). Refused past
    ``max_bytes`` (default :data:`MAX_JSON_BYTES`, or ``WORKBENCH_MAX_JSON_BYTES``) before anything is read."""
    cap = max_bytes if max_bytes is not None else limit("json", MAX_JSON_BYTES)
    with open_regular(path, where) as fh:
        size = check_size(fh, where, cap, BundleError, None if max_bytes is None else "this is not a file the "
                          "workbench wrote", kind=None if max_bytes is not None else "json")
        data = fh.read(size + 1)
    return parse_json(data, where, schema=schema, max_bytes=cap)


def parse_json(data: bytes, where: str, *, schema: str | None = None, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from ``data`` (see :func:`read_json`)."""
    if len(data) > max_bytes:
        raise BundleError(f"{where} is over the {max_bytes / 1024**2:.0f} MiB limit",
                          "this is not a file the workbench wrote")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BundleError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{where} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); the file is "
                          "truncated or damaged") from None
    except RecursionError:
        raise BundleError(f"{where} nests too deeply to be a workbench file") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{where} holds a JSON {type(doc).__name__}, not an object")
    if schema is not None:
        check_schema(doc, schema, where)
    return doc


def check_schema(doc: dict, schema: str, where: str) -> None:
    """Exact schema match, with a hint that tells a newer version from a foreign file."""
    found = doc.get("schema")
    if found == schema:
        return
    family = schema.rsplit("/", 1)[0]
    if isinstance(found, str) and found.startswith(family + "/"):
        raise BundleError(f"{where} has schema {found!r}; this workbench reads {schema!r}",
                          "open it with the workbench version that wrote it, or re-create it with this one")
    raise BundleError(f"{where} has schema {found!r}, expected {schema!r}")


#: manifest key holding the sha256 of the rest of the manifest (canonical JSON): the manifest covers itself
SEAL = "manifest_sha256"


def manifest_digest(doc: dict) -> str:
    """sha256 of ``doc`` without its :data:`SEAL`, as canonical JSON (sorted keys, no spaces, ASCII)."""
    body = {k: v for k, v in doc.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")).hexdigest()


def seal_manifest(doc: dict) -> dict:
    """A JSON-normalised copy of ``doc`` carrying its own digest; re-seal a manifest edited on purpose."""
    sealed = json.loads(json.dumps({k: v for k, v in doc.items() if k != SEAL}, allow_nan=False))
    sealed[SEAL] = manifest_digest(sealed)
    return sealed


def check_seal(doc: dict, where: str) -> bool:
    """True when the manifest is sealed and intact, False when it carries no seal (written before seals);
    a :class:`BundleError` when it was changed after writing."""
    found = doc.get(SEAL)
    if found is None:
        return False
    try:
        intact = found == manifest_digest(doc)
    except (RecursionError, ValueError):
        intact = False
    if not intact:
        raise BundleError(f"{where} changed since the bundle was written (its content no longer matches its "
                          f"recorded {SEAL})", "the bundle was edited or damaged; re-create it "
                          "(re-seal a deliberate edit with workbench.report.safety.seal_manifest)")
    return True


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path, str(path)) as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_member(fp, available: int, where: str, max_bytes: int) -> None:
    from numpy.lib import format as npy_format

    start = fp.tell()
    try:
        version = npy_format.read_magic(fp)
        reader = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, _, dtype = reader(fp)
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise UnsafeBundleError(f"{where} holds pickled (object) data; refusing to unpickle it",
                                    "store plain numeric or bool arrays") from None
        raise BundleError(f"{where} is not .npy data ({e})", "arrays are saved with np.save / np.savez") from None
    if dtype.hasobject:
        raise UnsafeBundleError(f"{where} holds pickled (object) data; refusing to unpickle it",
                                "store plain numeric or bool arrays")
    declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if declared > max_bytes:
        raise UnsafeBundleError(f"{where} declares shape {list(shape)} {dtype} ({declared:.3g} bytes), over the "
                                f"{max_bytes / 1024**3:.1f} GiB array limit; refusing to allocate it")
    present = available - (fp.tell() - start)
    if declared > present:
        raise UnsafeBundleError(f"{where} declares shape {list(shape)} {dtype} ({declared} bytes) but holds "
                                f"{present} bytes; the header is forged or the file truncated")


def check_npz(path: Path, where: str, *, max_bytes: int = MAX_ARRAY_BYTES) -> None:
    """Check every member header of an .npz (plain arrays, sizes within limits and present) without loading."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            total = sum(i.file_size for i in infos)
            if total > max_bytes:
                raise UnsafeBundleError(f"{where} unpacks to {total:.3g} bytes, over the "
                                        f"{max_bytes / 1024**3:.1f} GiB limit; refusing to load it")
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise BundleError(f"{where}: member {info.filename!r} is not an .npy array")
                with zf.open(info) as member:
                    _check_member(member, info.file_size, f"{where}:{info.filename}", max_bytes)
    except WorkbenchError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile, ValueError) as e:
        raise BundleError(f"{where} is not a readable .npz ({type(e).__name__}: {e})") from None


def load_npz(path: Path, where: str, *, max_bytes: int = MAX_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """Arrays of an .npz, every member's header checked first; ``np.load(allow_pickle=False)``."""
    check_npz(path, where, max_bytes=max_bytes)
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise UnsafeBundleError(f"{where} holds pickled (object) data; refusing to unpickle it") from None
        raise BundleError(f"{where} is not a readable .npz ({e})") from None
    except (OSError, EOFError, MemoryError, zipfile.BadZipFile, KeyError) as e:
        raise BundleError(f"{where} is not a readable .npz ({type(e).__name__}: {e})") from None


def check_npy_bytes(data: bytes, where: str, *, max_bytes: int = MAX_ARRAY_BYTES) -> None:
    """Header checks for in-memory .npy bytes (a Polygraphy base64 payload): not pickle, sane size."""
    import io

    if not data.startswith(b"\x93NUMPY"):
        kind = "a pickle" if data[:1] == b"\x80" else "not .npy data"
        raise UnsafeBundleError(f"{where} is {kind}; refusing to load it (only np.save payloads are read)",
                                "save arrays as numpy .npy (Polygraphy's own save does), never with pickle")
    _check_member(io.BytesIO(data), len(data), where, max_bytes)


def remove_tree(path: Path) -> None:
    """Best-effort removal of a folder the workbench created (temporary extraction, failed writes)."""
    shutil.rmtree(path, ignore_errors=True)


def is_within(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())
