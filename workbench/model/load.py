"""Load a model from a path, bytes, a ModelProto or a torch.nn.Module into a :class:`LoadedModel`.

The loaded proto is always the workbench's own copy: the caller's ModelProto or module is never
changed, and nothing is written to the working directory.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
from google.protobuf.message import DecodeError

from .._files import read_capped
from ..core.arguments import checked
from ..errors import (
    ExternalDataError,
    ModelFormatError,
    ModelNotFoundError,
    NotAModelFileError,
    OpsetTooNewError,
)
from .element_types import check_element_types
from .external_data import check_external_files, external_refs, load_external
from .fingerprint import fingerprint
from .sniff import sniff
from .walk import opset_imports

if TYPE_CHECKING:
    from .graph import GraphInfo
    from .torch_export import ExportInfo
    from .validate import Problem

log = logging.getLogger(__name__)

#: largest single .onnx file read: protobuf cannot parse a message over 2 GiB (bigger models use external data)
MAX_MODEL_BYTES = 2**31 - 1


@dataclass
class LoadedModel:
    """A model the workbench owns: proto (external data loaded, every node named), origin and fingerprint."""

    proto: onnx.ModelProto
    fingerprint: str
    source: str  # "path" | "bytes" | "proto" | "torch"
    path: Path | None = None
    external_files: list[Path] = field(default_factory=list)
    renamed_nodes: dict[str, str] = field(default_factory=dict)  # "graph/index" -> assigned name
    export: ExportInfo | None = None

    @property
    def name(self) -> str:
        """A short display name."""
        if self.path is not None:
            return self.path.name
        return self.proto.graph.name or f"model-{self.fingerprint[:8]}"

    @property
    def base_dir(self) -> Path | None:
        return self.path.parent if self.path is not None else None

    @cached_property
    def checked(self) -> tuple[onnx.ModelProto, list[Problem]]:
        """(shape-inferred copy of the proto, problems found by onnx's checker and shape inference)."""
        from .validate import validate

        inferred, problems = validate(self.proto)
        for key, new in self.renamed_nodes.items():
            log.debug("unnamed or duplicate node %s named %s", key, new)
        return inferred, problems

    @property
    def problems(self) -> list[Problem]:
        return self.checked[1]

    @cached_property
    def graph(self) -> GraphInfo:
        """Structure: topological order, producers/consumers, tensor shapes and dtypes, parameters."""
        from .graph import GraphInfo

        return GraphInfo.build(self.checked[0])


@checked()
def load_model(
    source: Any,
    *,
    base_dir: str | os.PathLike | None = None,
    example_inputs: Any = None,
    opset: int = 17,
    dynamic_axes: dict | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    exporter: str = "legacy",
    allow_newer_opset: bool = False,
) -> LoadedModel:
    """Load ``source``: a path to an .onnx file, serialized bytes, an ``onnx.ModelProto``, a
    :class:`LoadedModel` (returned as is) or a ``torch.nn.Module`` (with ``example_inputs``; exported with
    ``exporter`` "legacy" (honours ``opset``) or "dynamo").

    ``base_dir`` is where external data is looked up for bytes/ModelProto sources (a path source uses
    its own folder). Raises a :class:`~workbench.errors.ModelLoadError` subclass on bad input.
    """
    if isinstance(source, LoadedModel):
        return source
    if is_torch_module(source):
        from .torch_export import export_module

        return export_module(
            source, example_inputs, opset=opset, dynamic_axes=dynamic_axes, input_names=input_names,
            output_names=output_names, exporter=exporter,
        )
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        return _finish(proto, source.SerializeToString(), "proto", None, base_dir, allow_newer_opset)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return _finish(_parse(data, "the given bytes"), data, "bytes", None, base_dir, allow_newer_opset)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        data = _read_model_file(path)
        proto = _parse(data, str(path))
        return _finish(proto, data, "path", path.absolute(), path.absolute().parent, allow_newer_opset)
    raise TypeError(
        f"cannot load a model from {type(source).__name__}: pass a path, bytes, an onnx.ModelProto "
        "or a torch.nn.Module with example_inputs"
    )


def is_torch_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # never import torch just to check
    return torch is not None and isinstance(obj, torch.nn.Module)


def _read_model_file(path: Path) -> bytes:
    if not path.exists():
        hint = "check the path"
        if path.parent.is_dir():
            near = sorted(p.name for p in path.parent.glob("*.onnx"))[:5]
            if near:
                hint += f"; .onnx files in {path.parent}: {', '.join(near)}"
        raise ModelNotFoundError(f"model file not found: {path}", hint)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.onnx"))[:5]
        hint = f"pass one of the .onnx files in it: {', '.join(found)}" if found else "pass the .onnx file"
        raise NotAModelFileError(f"{path} is a folder, not an ONNX model file", hint)
    data = read_capped(path, MAX_MODEL_BYTES, "model file", NotAModelFileError,
                       "a model over 2 GiB keeps its weights in external data files (onnx.save(..., "
                       "save_as_external_data=True))")
    if not data:
        raise NotAModelFileError(f"{path} is empty (0 bytes)", "the download or export did not finish; redo it")
    return data


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    reason = None
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        reason = f"protobuf could not decode it ({str(e).splitlines()[0] if str(e) else 'truncated or corrupt'})"
    if reason is None and not proto.HasField("graph"):
        reason = "it decodes to no graph"
    elif reason is None and not proto.opset_import and not proto.ir_version:
        reason = "it has neither an IR version nor opset imports"
    elif reason is None and not _text_is_valid(proto):
        reason = "names or op types in it are not valid UTF-8 text (the file is corrupt)"
    if reason is None:
        return proto
    known = sniff(data[:64])
    if known:
        raise NotAModelFileError(f"{what} is {known[0]}, not an ONNX model", known[1])
    raise ModelFormatError(f"{what} is not a valid ONNX model: {reason}")


def _text_is_valid(proto: onnx.ModelProto) -> bool:
    """protobuf hands back ``bytes`` for string fields that are not valid UTF-8: a sign of corruption."""
    from .walk import iter_nodes

    g = proto.graph
    texts = [d.domain for d in proto.opset_import]
    texts += [v.name for v in list(g.input) + list(g.output) + list(g.value_info)] + [t.name for t in g.initializer]
    for node in iter_nodes(g):
        texts += [node.name, node.op_type, node.domain, *node.input, *node.output]
        texts += [a.name for a in node.attribute]
    return all(isinstance(t, str) for t in texts)


def _check_versions(proto: onnx.ModelProto, allow_newer_opset: bool) -> None:
    known = {(d or "ai.onnx"): hi for d, (_, hi) in onnx.defs.C.schema_version_map().items()}
    if proto.ir_version > onnx.IR_VERSION and not allow_newer_opset:
        raise OpsetTooNewError(
            f"model has IR version {proto.ir_version}; the installed onnx {onnx.__version__} knows up to "
            f"{onnx.IR_VERSION}", "upgrade onnx (pip install -U onnx) or re-export with an older IR version",
        )
    for domain, version in opset_imports(proto).items():
        if domain in known and version > known[domain] and not allow_newer_opset:
            raise OpsetTooNewError(
                f"model imports opset {version} of domain '{domain}'; the installed onnx {onnx.__version__} "
                f"knows up to {known[domain]}",
                "upgrade onnx, or re-export the model with an older opset (opset_version=17 is widely supported)",
            )


def name_nodes(proto: onnx.ModelProto) -> dict[str, str]:
    """Give every unnamed or duplicate-named node (subgraphs too) a stable unique name; return the renames."""
    from .walk import iter_nodes

    taken = {n.name for n in iter_nodes(proto.graph) if n.name}
    seen: set[str] = set()
    renamed = {}
    for i, node in enumerate(iter_nodes(proto.graph)):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = node.name or f"{node.op_type}_{i}"
        new, k = base, 1
        while new in taken or new in seen:
            new, k = f"{base}__{k}", k + 1
        renamed[f"#{i}:{node.name}"] = new
        node.name = new
        seen.add(new)
        taken.add(new)
    return renamed


def read_external_data(proto: onnx.ModelProto, base_dir: str | os.PathLike) -> list[Path]:
    """``proto``'s external data read into it, or past the inline limit left in its (checked) files, mapped; the
    files. Nothing to do (an empty list) for a model without external data."""
    if not external_refs(proto):
        return []
    return _external(proto, Path(base_dir))


def _external(proto: onnx.ModelProto, base_dir: Path) -> list[Path]:
    """Read the external data into ``proto``, or past :func:`~workbench.model.mapped.inline_limit` leave the
    weights in their (checked) files, mapped (:mod:`workbench.model.mapped`)."""
    from ..core.shapes import tensor_nbytes
    from .external_data import all_tensors
    from .mapped import inline_limit, map_in_place

    files = check_external_files(external_refs(proto), base_dir)
    total = sum(tensor_nbytes(t) for t in all_tensors(proto) if t.data_location == onnx.TensorProto.EXTERNAL)
    if total <= inline_limit():
        return load_external(proto, base_dir)
    map_in_place(proto, base_dir)
    log.info("%.2f GB of external data left in its files (mapped, not read into memory)", total / 1e9)
    return files


def _finish(
    proto: onnx.ModelProto, data: bytes, source: str, path: Path | None,
    base_dir: str | os.PathLike | None, allow_newer_opset: bool,
) -> LoadedModel:
    _check_versions(proto, allow_newer_opset)
    check_element_types(proto)
    files: list[Path] = []
    if external_refs(proto):
        if base_dir is None:
            raise ExternalDataError(
                "the model keeps weights in external files but was given without a folder to read them from",
                "load it from its .onnx path, or pass base_dir= the folder holding its weight files",
            )
        files = _external(proto, Path(base_dir))
    renamed = name_nodes(proto)
    if renamed:
        log.info("named %d unnamed or duplicate nodes", len(renamed))
    return LoadedModel(
        proto=proto, fingerprint=fingerprint(data, files), source=source, path=path,
        external_files=files, renamed_nodes=renamed,
    )
