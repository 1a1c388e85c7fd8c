"""Handing a ModelProto to a runtime: serialized bytes, or a private file with external data past 2 GB.

The model is serialized once per session, with its outputs set in place for that moment (no copy of the
weights), and the size check reads tensor dims rather than serializing twice.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ..core.scratch import temporary_dir
from ..model.walk import iter_nodes
from .outputs import mark_outputs, temporarily

log = logging.getLogger(__name__)

#: protobuf cannot serialize a message of 2 GiB or more; models past this go through a file with external data.
PROTOBUF_LIMIT = 2**31 - 1
#: room left for the graph itself when the weights' size decides
_GRAPH_ROOM = 256 << 20


@dataclass
class ModelPayload:
    """``source`` is bytes or the path of a temporary .onnx file; ``close()`` drops the bytes and deletes that
    file (its folder, or only the graph file when the weights are shared: :mod:`workbench.engines.files`)."""

    source: bytes | str | None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    _on_close: Callable[[], None] | None = field(default=None, repr=False)
    #: where the model's relative external-data locations resolve when not beside ``source`` (weights left mapped
    #: in the user's folder: :mod:`workbench.model.mapped`); ONNX Runtime is told with a session config entry
    data_dir: str | None = None

    @property
    def is_file(self) -> bool:
        return isinstance(self.source, str)

    def close(self) -> None:
        self.source = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's tensor data (initializers and tensor attributes, subgraphs included), from dims."""
    from ..core.shapes import tensor_nbytes

    total = sum(tensor_nbytes(t) for t in model.graph.initializer)
    for node in iter_nodes(model.graph):
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                total += tensor_nbytes(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                total += sum(tensor_nbytes(t) for t in a.tensors)
            elif a.type == onnx.AttributeProto.GRAPH:
                total += sum(tensor_nbytes(t) for t in a.g.initializer)
            elif a.type == onnx.AttributeProto.GRAPHS:
                total += sum(tensor_nbytes(t) for g in a.graphs for t in g.initializer)
    return total


def model_payload(model: onnx.ModelProto, outputs: Sequence[str] | None = None,
                  limit: int | None = None, *, external_folder: bool = False) -> ModelPayload:
    """Serialize ``model`` (with ``outputs`` as its graph outputs when given); past ``limit`` (default
    :data:`PROTOBUF_LIMIT`) save it with external data into a private temporary folder (never the working
    directory) and return that path instead. Weights left in the user's files (:mod:`workbench.model.mapped`)
    stay there when the caller tells its runtime where (``external_folder``: ONNX Runtime, via ``data_dir``);
    otherwise they are copied file to file beside a private graph file."""
    from ..model.mapped import has_mapped, save_model, session_source
    from .files import files_for

    files = files_for(model)
    if files is not None and (external_folder or not files.mapped):  # weights on disk: a graph file beside them
        path = files.graph_file(model, outputs)
        return ModelPayload(str(path), data_dir=files.data_dir, _on_close=lambda: files.discard(path))
    if files is not None:  # weights left mapped, a runtime that reads beside its graph: one local copy, shared
        path = files.local_graph_file(model, outputs)
        return ModelPayload(str(path), _on_close=lambda: files.discard(path))
    if has_mapped(model):
        if external_folder:  # weights left in their files: the graph alone, the runtime told where they are
            with (temporarily(model, outputs) if outputs is not None else _same(model)) as marked:
                source, folder = session_source(marked)
            return ModelPayload(source, data_dir=str(folder))
        tmp = temporary_dir("workbench-model-")  # a runtime that reads only beside the graph: a private copy
        path = Path(tmp.name) / "model.onnx"
        with (temporarily(model, outputs) if outputs is not None else _same(model)) as marked:
            save_model(marked, path)
        return ModelPayload(str(path), tmp)
    limit = PROTOBUF_LIMIT if limit is None else limit
    if weight_bytes(model) + _GRAPH_ROOM < limit:
        if outputs is None:
            return ModelPayload(model.SerializeToString())
        with temporarily(model, outputs) as marked:
            return ModelPayload(marked.SerializeToString())
    tmp = temporary_dir("workbench-model-")
    path = Path(tmp.name) / "model.onnx"
    copy = mark_outputs(model, outputs) if outputs is not None else _copy(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=1024)
    log.info("model holds %.1f GB of weights: handing it to the runtime as %s with external data",
             weight_bytes(model) / 1e9, path)
    return ModelPayload(str(path), tmp)


@contextlib.contextmanager
def _same(model: onnx.ModelProto):
    yield model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
