"""External data: find every reference, confine it to the model's folder, then load it.

Nothing outside the model's folder is ever opened: locations are checked (no absolute paths, no
``..``, no symlink that resolves outside) before onnx reads a byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
from onnx import external_data_helper

from ..errors import ExternalDataError, UnsafePathError
from .walk import iter_nodes


@dataclass(frozen=True)
class ExternalRef:
    """One tensor's reference into an external file."""

    tensor: str
    location: str
    offset: int
    length: int | None


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor in ``model``: initializers (sparse ones too) and tensor attributes, subgraphs included."""
    single, multi = [], []  # subgraphs: GRAPH attributes first, then GRAPHS ones (one walk)
    for n in iter_nodes(model.graph):
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                single.append(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                multi.extend(a.graphs)
    for g in [model.graph, *single, *multi]:
        yield from g.initializer
        for sp in g.sparse_initializer:
            yield sp.values
            yield sp.indices
        for node in g.node:
            if not node.attribute:
                continue
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors


def external_refs(model: onnx.ModelProto) -> list[ExternalRef]:
    """Every tensor in ``model`` (subgraphs included) whose data lives in an external file."""
    refs = []
    for t in all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        if "location" not in info:
            raise ExternalDataError(
                f"tensor '{t.name}' is marked as external data but names no file",
                "the model is damaged; re-save it with onnx.save(..., save_as_external_data=True)",
            )
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError as e:
            raise ExternalDataError(f"tensor '{t.name}' has a malformed external-data offset/length ({e})",
                                    "the model is damaged; re-save it") from None
        refs.append(ExternalRef(t.name, info["location"], offset, length))
    return refs


def confined_path(base_dir: Path, location: str) -> Path:
    """Resolve ``location`` inside ``base_dir`` or raise :class:`UnsafePathError`."""
    if not location or "\x00" in location:
        raise UnsafePathError(f"external-data location {location!r} is empty or malformed")
    posix, win = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or win.is_absolute() or win.drive:
        raise UnsafePathError(f"external-data location {location!r} is an absolute path")
    if ".." in posix.parts or ".." in win.parts:
        raise UnsafePathError(f"external-data location {location!r} climbs out of the model folder ('..')")
    root = base_dir.resolve()
    target = (root / location).resolve()
    if target != root and root not in target.parents:
        raise UnsafePathError(f"external-data location {location!r} resolves outside the model folder {root}")
    return target


def check_external_files(refs: list[ExternalRef], base_dir: Path) -> list[Path]:
    """Check that every referenced file is confined, present and long enough; return the files."""
    files: dict[str, Path] = {}
    for ref in refs:
        path = files.get(ref.location) or confined_path(base_dir, ref.location)
        files[ref.location] = path
        if not path.is_file():
            if os.path.lexists(path):  # there, but a folder, a FIFO, a device...: never opened
                from .._files import file_kind

                raise ExternalDataError(
                    f"external-data location '{ref.location}' (for tensor '{ref.tensor}') is "
                    f"{file_kind(os.stat(path).st_mode)}, not a file", "the model is damaged, or a file was "
                    "replaced: copy the weight files the model was saved with next to the .onnx file")
            raise ExternalDataError(
                f"external-data file '{ref.location}' (for tensor '{ref.tensor}') is missing from {base_dir}",
                "copy the weight files the model was saved with next to the .onnx file",
            )
        if ref.offset < 0 or (ref.length is not None and ref.length < 0):
            raise ExternalDataError(f"tensor '{ref.tensor}' has a negative external-data offset or length "
                                    f"({ref.offset}, {ref.length})", "the model is damaged; re-save it")
        size = path.stat().st_size
        end = ref.offset + (ref.length or 0)
        if end > size:
            raise ExternalDataError(
                f"external-data file '{ref.location}' is {size} bytes but tensor '{ref.tensor}' needs "
                f"bytes {ref.offset}..{end}: the file is truncated",
                "copy the complete weight file again",
            )
    return sorted(set(files.values()))


def load_external(model: onnx.ModelProto, base_dir: Path) -> list[Path]:
    """Load all external data of ``model`` (in place) from ``base_dir``; return the files read."""
    refs = external_refs(model)
    if not refs:
        return []
    files = check_external_files(refs, base_dir)
    try:
        external_data_helper.load_external_data_for_model(model, os.fspath(base_dir))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        raise ExternalDataError(f"could not read external data from {base_dir}: {e}",
                                "check the weight files next to the model") from None
    return files
