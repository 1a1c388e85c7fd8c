"""Output paths, checked before any work starts.

An output may not resolve (symlinks followed, hard links compared) to an input (a model, its external-data
files, feeds, a bundle) or to another output, and must be writable: no folder where a file goes, no file in
its parent chain, a folder we may write in, and for bundles a destination that does not exist yet.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError

#: models larger than this are not parsed for their external-data file names (a protobuf cannot be larger)
_MAX_MODEL_PARSE = 2 * 1024**3
_KINDS = ("file", "new", "folder")
#: longest path the system takes (bytes, with its terminating NUL); longest path shown in a message
_PATH_MAX = 4096
_SHOWN = 160


@dataclass(frozen=True)
class Output:
    """One output: ``option`` names it in messages; ``kind``: "file" (replaced when it exists), "new" (must not
    exist: bundles, a file or a folder), "folder" (files are written into it; an input inside it is refused)."""

    option: str
    path: Any
    kind: str = "file"

    @classmethod
    def files_in(cls, option: str, folder: Any, names: Sequence[str]) -> list[Output]:
        """The files an option writes into ``folder`` under fixed ``names`` ([] when ``folder`` is None)."""
        return [cls(option, os.path.join(os.fspath(folder), n)) for n in names] if _is_path(folder) else []


@dataclass(frozen=True)
class _Input:
    label: str
    path: Path  # resolved
    is_dir: bool


def _show(path: Any) -> str:
    text = os.fspath(path)
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN // 2]}...{text[-_SHOWN // 3:]}"


def _check_length(given: Path, shown: str) -> None:
    """Refuse a path the file system cannot hold: a name over its NAME_MAX bytes, a path over PATH_MAX."""
    absolute = os.fsencode(os.path.abspath(given))
    if len(absolute) >= _PATH_MAX:
        _fail(f"{shown} is {len(absolute)} bytes long, over the system's limit of {_PATH_MAX - 1}",
              "use a shorter path")
    folder = Path(os.path.abspath(given))
    while not os.path.isdir(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in given.parts:
        if len(os.fsencode(part)) > name_max:
            what = "its name" if part == given.name else f"the folder name {_show(part)}"
            _fail(f"{shown}: {what} is {len(os.fsencode(part))} bytes long, over the file system's limit of "
                  f"{name_max}", "use a shorter name")


def _resolved(path: Any) -> Path:
    return Path(os.path.realpath(Path(os.fspath(path)).expanduser()))


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.fspath(value) not in ("", "-")


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    return path != folder and path.is_relative_to(folder)


def _fail(message: str, hint: str = "write the output somewhere else") -> None:
    raise WorkbenchError(message, hint)


def _check_destination(out: Output) -> None:
    """Exists (as what), parent chain made of folders, nearest existing folder writable."""
    given = Path(os.fspath(out.path)).expanduser()
    shown = f"{out.option} {_show(out.path)}"
    _check_length(given, shown)
    if out.kind == "new" and os.path.lexists(given):
        _fail(f"{shown} already exists", "pick a new destination (a bundle never replaces one)")
    try:
        mode = os.stat(given).st_mode
    except OSError:
        mode = None  # missing (or a dangling link, replaced like a missing file)
    if mode is not None:
        if out.kind == "file" and stat.S_ISDIR(mode):
            _fail(f"{shown} is a folder", "name a file (e.g. inside that folder)")
        if out.kind == "file" and not stat.S_ISREG(mode):
            _fail(f"{shown} is not a regular file", "name a regular file ('-' writes JSON to standard output)")
        if out.kind == "folder" and not stat.S_ISDIR(mode):
            _fail(f"{shown} is a file, not a folder", "name a new or empty folder")
    folder = given if (out.kind == "folder" and mode is not None) else given.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        _fail(f"{shown}: {_show(folder)} is a file, not a folder", "name a path whose parent is a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        _fail(f"{shown}: the folder {_show(folder)} is not writable", "choose a folder you can write to")


def _external_files(model: Path, folders: set[Path]) -> list[Path]:
    """The external-data files ``model`` names inside ``folders`` (resolved); [] when it cannot be read (the
    loader reports a bad model, or a location outside its folder, in its own words)."""
    import onnx

    from ..model.external_data import external_refs

    try:
        st = os.stat(model)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_MODEL_PARSE:
            return []
        locations = {ref.location for ref in external_refs(onnx.load(str(model), load_external_data=False))}
    except Exception:  # noqa: BLE001 - a bad model is the loader's to report, with its own message
        return []
    files = {(_resolved(folder / loc), folder) for folder in folders for loc in locations if loc and "\x00" not in loc}
    return [f for f, folder in files if _inside(f, folder)]


def _inputs(models: Mapping[str, Any], inputs: Mapping[str, Any], outputs: list[tuple[Output, Path]]) -> list[_Input]:
    found = []
    for label, value in [*models.items(), *inputs.items()]:
        if not _is_path(value):
            continue
        path = _resolved(value)
        found.append(_Input(label, path, path.is_dir()))
        # external data lies beside the model (beside the link, for a symlinked model): an output there that
        # exists already may be one of its files
        folders = {path.parent, _resolved(Path(os.fspath(value)).expanduser().absolute().parent)}
        if label in models and any(p.exists() and any(_inside(p, f) for f in folders) for _, p in outputs):
            found += [_Input(f"{label}'s external data", f, False) for f in _external_files(path, folders)]
    return found


def check_outputs(outputs: Sequence[Output], *, models: Mapping[str, Any] | None = None,
                  inputs: Mapping[str, Any] | None = None) -> None:
    """Refuse, with one :class:`WorkbenchError`, any output that cannot be written or would overwrite an input
    or another output. ``models``/``inputs``: option label -> path (None, numbers and '-' are skipped); a
    model's external-data files count as inputs. Call it before any work starts."""
    models, inputs = dict(models or {}), dict(inputs or {})
    outs = [(o, _resolved(o.path)) for o in outputs if _is_path(o.path)]
    for out, _ in outs:
        if out.kind not in _KINDS:
            raise ValueError(f"unknown output kind {out.kind!r}")
        _check_destination(out)
    for i, (a, pa) in enumerate(outs):
        for b, pb in outs[i + 1:]:
            if a.option == b.option:
                continue
            if _same(pa, pb):
                _fail(f"{a.option} and {b.option} both name {_show(a.path)}", "give each output its own path")
            for (x, px), (y, py) in (((a, pa), (b, pb)), ((b, pb), (a, pa))):
                if y.kind != "file" and _inside(px, py):
                    _fail(f"{x.option} {_show(x.path)} lies inside {y.option} {_show(y.path)}",
                          "give each output its own path")
    for inp in _inputs(models, inputs, outs):
        for out, path in outs:
            if _same(path, inp.path):
                _fail(f"{out.option} {_show(out.path)} is the input {inp.label} ({_show(inp.path)}); refusing to "
                      "overwrite it")
            if inp.is_dir and _inside(path, inp.path) and os.path.lexists(path):
                _fail(f"{out.option} {_show(out.path)} would overwrite a file of the input {inp.label} folder "
                      f"({_show(inp.path)})")
            if out.kind != "file" and _inside(inp.path, path):
                _fail(f"{out.option} {_show(out.path)} holds the input {inp.label} ({_show(inp.path)})")
