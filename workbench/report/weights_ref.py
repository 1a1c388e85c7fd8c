"""Large weights in a bundle by reference: each external data file's sha256, size and original path, not a copy.

A bundle of a model whose external data passes the inline limit (:func:`workbench.model.mapped.inline_limit`)
keeps the .onnx graph file and, per weight file, ``{"location", "size", "sha256", "path"}``
(``bundle_weights="copy"`` copies them instead; ``"reference"`` references them at any size). A rerun looks for
the files, in order, in the folder the user names (``--weights DIR``), beside the bundled graph file, and where
the original model was; the first folder that holds every file at its recorded size is used, and a file whose
sha256 differs is refused with one line.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from ..errors import ExternalDataError
from ..model.external_data import confined_path
from .safety import BundleError, ModelMismatchError, sha256_file

MODES = ("auto", "copy", "reference")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise BundleError(f"bundle weights mode {mode!r} is unknown", f"use one of {', '.join(MODES)}")
    return mode


def by_reference(mode: str, external_files: list[Path]) -> bool:
    """Whether a model with these external data files has its weights referenced rather than copied."""
    from ..model.mapped import inline_limit

    check_mode(mode)
    if not external_files or mode == "copy":
        return False
    return mode == "reference" or sum(p.stat().st_size for p in external_files) > inline_limit()


def weight_entries(model_path: Path, external_files: list[Path]) -> list[dict]:
    """One entry per external data file of the model at ``model_path``: location (relative to the model's
    folder), size, sha256, absolute path."""
    base = model_path.resolve().parent
    out = []
    for ext in sorted(external_files):
        path = Path(ext).resolve()
        out.append({"location": path.relative_to(base).as_posix(), "size": path.stat().st_size,
                    "sha256": sha256_file(path), "path": str(path)})
    return out


def _original_base(entry: dict) -> Path | None:
    path, location = entry.get("path"), entry.get("location")
    if not isinstance(path, str) or not isinstance(location, str) or not os.path.isabs(path):
        return None
    depth = len(PurePosixPath(location).parts)
    p = Path(path)
    return p.parents[depth - 1] if 0 < depth <= len(p.parents) else None


def check_contents(entries: list, base: Path) -> None:
    """Refuse, naming it, the first weight file under ``base`` whose sha256 is not the recorded one."""
    for e in entries:
        f = confined_path(base, e["location"])
        found = sha256_file(f)
        if found != e["sha256"]:
            raise ModelMismatchError(f"weight file {f} has sha256 {found}, the bundle recorded {e['sha256']}",
                                     "use the exact weight files the comparison ran on")


def find_weights(entries: list, graph_dir: Path, given: str | os.PathLike | None, what: str) -> Path:
    """The folder holding every referenced weight file at its recorded size (see the module doc). Their content is
    the caller's to check: the model's fingerprint covers every weight file, so a rerun reads the weights once and
    calls :func:`check_contents` only to name the file when the fingerprint differs."""
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("location"), str) and isinstance(e.get("sha256"), str)
            and isinstance(e.get("size"), int) for e in entries):
        raise BundleError(f"{what}: manifest 'weights' is malformed")
    places = [Path(given).expanduser()] if given is not None else []
    places.append(graph_dir)
    original = {_original_base(e) for e in entries} - {None}
    places += sorted(original)
    tried = []
    for base in places:
        tried.append(str(base))
        try:
            files = [confined_path(base, e["location"]) for e in entries]
        except ExternalDataError as e:  # UnsafePathError is one
            raise BundleError(f"{what}: a referenced weight file is not a plain relative location ({e.message})")\
                from None
        if all(f.is_file() and f.stat().st_size == e["size"] for f, e in zip(files, entries)):
            return base
        if given is not None and base == places[0]:
            missing = [e["location"] for f, e in zip(files, entries) if not f.is_file()]
            wrong = [e["location"] for f, e in zip(files, entries) if f.is_file() and f.stat().st_size != e["size"]]
            raise BundleError(f"{what}: the weights folder {base} lacks {', '.join(missing) or 'nothing'}"
                              + (f" and holds {', '.join(wrong)} at another size" if wrong else ""),
                              "pass the folder holding the model's weight files as they were")
    names = ", ".join(e["location"] for e in entries)
    raise BundleError(f"{what}: its weights ({names}) are kept by reference and were not found (looked in "
                      f"{'; '.join(tried)})", "pass the folder holding them: `workbench rerun BUNDLE --weights DIR`")
