"""Opening a zipped bundle without trusting it.

Every entry is checked before one byte is extracted (names, symlinks, duplicates, a file that is also a folder,
entry count, total size, compression ratio, free disk); then the manifest is read from the zip and checked, and
only the files it lists are extracted, each held to the size its header declares.
"""

from __future__ import annotations

import logging
import shutil
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from .._atomic import clean_stale
from ..core.scratch import scratch_dir
from .safety import MAX_ZIP_BYTES, MAX_ZIP_MEMBERS, BundleError, UnsafeBundleError, relpath, remove_tree

log = logging.getLogger(__name__)

#: largest manifest.json read from a zip
MAX_MANIFEST_BYTES = 16 * 1024**2
#: entries (and zips) that unpack to more than RATIO_FLOOR bytes may not expand more than MAX_RATIO times
MAX_RATIO = 200
RATIO_FLOOR = 16 * 1024**2
#: free disk kept after an extraction
DISK_MARGIN = 256 * 1024**2
TEMP_PREFIX = "workbench-bundle"


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def check_entries(zf: zipfile.ZipFile, name: str, *, max_bytes: int = MAX_ZIP_BYTES,
                  max_members: int = MAX_ZIP_MEMBERS) -> dict[str, zipfile.ZipInfo]:
    """Normalised relative name -> entry of every file in the zip, after checking every entry; nothing is read."""
    infos = zf.infolist()
    if len(infos) > max_members:
        raise UnsafeBundleError(f"{name} holds {len(infos)} entries, over the {max_members} limit")
    files: dict[str, zipfile.ZipInfo] = {}
    dirs: set[str] = set()
    for info in infos:
        rel = relpath(info.filename.rstrip("/") or info.filename, f"{name}: entry").as_posix()
        if _is_symlink(info):
            raise UnsafeBundleError(f"{name}: entry {info.filename!r} is a symlink; refusing it")
        if info.flag_bits & 0x1:
            raise UnsafeBundleError(f"{name}: entry {info.filename!r} is encrypted; bundles never are")
        if rel in files or (not info.is_dir() and rel in dirs):
            raise UnsafeBundleError(f"{name}: entry {rel!r} appears twice")
        if info.is_dir():
            dirs.add(rel)
            continue
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise UnsafeBundleError(f"{name}: entry {rel!r} unpacks {info.compress_size} bytes to "
                                    f"{_gib(info.file_size)} (compression ratio over {MAX_RATIO}); refusing a "
                                    "zip bomb")
        files[rel] = info
    for rel in [*files, *dirs]:
        for parent in PurePosixPath(rel).parents:
            if parent.as_posix() in files:
                raise UnsafeBundleError(f"{name}: entry {parent.as_posix()!r} is a file and also a folder "
                                        f"(holding {rel!r})")
    total = sum(i.file_size for i in files.values())
    packed = sum(i.compress_size for i in files.values())
    if total > max_bytes:
        raise UnsafeBundleError(f"{name} unpacks to {_gib(total)}, over the {_gib(max_bytes)} limit")
    if total > RATIO_FLOOR and total > MAX_RATIO * max(packed, 1):
        raise UnsafeBundleError(f"{name} unpacks {packed} bytes to {_gib(total)} (compression ratio over "
                                f"{MAX_RATIO}); refusing a zip bomb")
    return files


def manifest_entry(files: dict[str, zipfile.ZipInfo], name: str, manifest: str) -> str:
    """The folder prefix ('' or 'TOP/') under which the zip holds ``manifest``."""
    if manifest in files:
        return ""
    tops = {rel.split("/", 1)[0] for rel in files}
    if len(tops) == 1 and f"{next(iter(tops))}/{manifest}" in files:
        return f"{next(iter(tops))}/"
    raise BundleError(f"{name} holds no {manifest}: it is not a bundle")


def read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, limit: int) -> bytes:
    """The bytes of one entry, at most ``limit`` and never more than its header declares."""
    if info.file_size > limit:
        raise UnsafeBundleError(f"{where} is {_gib(info.file_size)}, over the {_gib(limit)} limit")
    try:
        with zf.open(info) as fh:
            data = fh.read(info.file_size + 1)
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:
        raise BundleError(f"{where} is unreadable ({e})") from None
    if len(data) > info.file_size:
        raise UnsafeBundleError(f"{where} unpacks to more than its header says")
    return data


def extract(zf: zipfile.ZipFile, entries: dict[str, zipfile.ZipInfo], dest: Path, name: str) -> None:
    """Extract ``entries`` (relative target name -> entry checked by :func:`check_entries`) into ``dest``; each
    entry may not write more than its header declares, and the whole must fit on the disk."""
    need = sum(i.file_size for i in entries.values())
    free = shutil.disk_usage(dest).free
    if need + DISK_MARGIN > free:
        raise BundleError(f"{name} unpacks to {_gib(need)} and needs {_gib(DISK_MARGIN)} spare, but only "
                          f"{_gib(free)} is free in {dest.parent}",
                          "free some space, or unzip the bundle yourself and pass the folder")
    base = dest.resolve()
    for rel, info in entries.items():
        target = base / relpath(rel, f"{name}: entry")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(base):
            raise UnsafeBundleError(f"{name}: entry {info.filename!r} leads outside the bundle")
        written = 0
        try:
            with zf.open(info) as src, open(target, "xb") as out:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > info.file_size:
                        raise UnsafeBundleError(f"{name}: entry {rel!r} unpacks to more than its header says")
                    out.write(chunk)
        except FileExistsError:
            raise UnsafeBundleError(f"{name}: entry {info.filename!r} appears twice") from None
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:
            raise BundleError(f"{name}: entry {info.filename!r} is unreadable ({e})") from None


def open_zip(src: Path, manifest: str, parse) -> tuple[Path, dict]:
    """Check ``src``'s entries, read and ``parse`` its manifest (``parse(bytes) -> dict``, raising on a bad one),
    then extract only the files that manifest lists into a new temporary folder: (folder, manifest)."""
    try:
        zf = zipfile.ZipFile(src)
    except (OSError, zipfile.BadZipFile) as e:
        raise BundleError(f"{src.name} is not a readable zip ({e})") from None
    with zf:
        files = check_entries(zf, src.name)
        prefix = manifest_entry(files, src.name, manifest)
        doc = parse(read_entry(zf, files[prefix + manifest], f"{src.name}: {manifest}", MAX_MANIFEST_BYTES))
        listed = doc.get("files")
        if isinstance(listed, dict):
            wanted = [manifest, *(relpath(rel, "manifest 'files'").as_posix() for rel in listed)]
            skipped = len(files) - len(wanted)
            if skipped > 0:
                log.info("%s: %d entries the manifest does not list are not extracted", src.name, skipped)
        else:
            wanted = [rel[len(prefix):] for rel in files if rel.startswith(prefix)]
        entries = {rel: files[prefix + rel] for rel in wanted if prefix + rel in files}
        clean_stale(tempfile.gettempdir())  # extractions that killed reruns of earlier versions left behind
        tmp = scratch_dir(f"{TEMP_PREFIX}.")  # inside this run's scratch folder: removed with it on any exit
        try:
            extract(zf, entries, tmp, src.name)
        except BaseException:
            remove_tree(tmp)
            raise
    return tmp, doc
