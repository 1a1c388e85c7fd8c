"""Weights written once, sessions built from small graph files: what keeps a model's weights held once.

ONNX Runtime and OpenVINO copy every weight when handed serialized bytes, and the bytes themselves are another
copy; from a file whose weights sit in an external data file they map the weights instead (ONNX Runtime maps
page-aligned external data; OpenVINO reads it lazily). :class:`ModelFiles` writes a model's tensors once into
``weights.bin`` (page-aligned) in a private temporary folder and keeps a weight-free skeleton whose tensors point
there. Each session then costs one small graph file (the model with its marked outputs, an isolation model built
from the skeleton, a patched copy) written beside ``weights.bin``: :meth:`ModelFiles.graph_file`.

Engines find the files of a model through a registry keyed by the proto object (:func:`register`,
:func:`files_for`); whoever registers (the comparison plan) keeps the proto alive and unregisters it when done.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto

from ..core.scratch import scratch_dir
from ..core.shapes import KEEP_BYTES, STUB_FILE, map_model_tensors, tensor_nbytes
from .outputs import edit_lock, temporarily

log = logging.getLogger(__name__)

WEIGHTS = "weights.bin"
#: mapped weights copied for runtimes that read only beside the graph file (:meth:`ModelFiles.local_graph_file`)
LOCAL = "local.bin"
_ALIGN = 4096
_REGISTRY: dict[int, tuple[onnx.ModelProto, ModelFiles]] = {}
_REGISTRY_LOCK = threading.Lock()


def _ref(t: TensorProto, offset: int, length: int) -> TensorProto:
    out = TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
    out.data_location = TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS), ("offset", str(offset)), ("length", str(length))):
        entry = out.external_data.add()
        entry.key, entry.value = key, value
    return out


def _key(t: TensorProto, name: str) -> tuple:
    """Initializers by name, tensor attributes by node output and attribute (:func:`map_model_tensors`' key)."""
    return (name, t.data_type, tuple(t.dims))


def _heavy(t: TensorProto) -> bool:
    return tensor_nbytes(t) > KEEP_BYTES


def _points_to(t: TensorProto, location: str) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == location for e in t.external_data)


def _is_ours(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value in (WEIGHTS, STUB_FILE) for e in t.external_data)


class ModelFiles:
    """A model's weights in ``folder/weights.bin`` and a weight-free ``skeleton`` pointing there."""

    def __init__(self, model: onnx.ModelProto, prefix: str = "workbench-weights-"):
        from ..model.mapped import folder_of, has_mapped

        self.folder = scratch_dir(prefix)  # in this run's scratch folder: gone with it even after a kill
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        self.refs: dict[tuple, TensorProto] = {}  # (name, dtype, dims) -> external reference
        self._count = 0
        self._lock = threading.Lock()
        #: where relative locations of the graph files resolve: ``folder``, or the folder of weights left mapped
        self.data_dir: str | None = None
        self.mapped = has_mapped(model)
        self._local: dict[tuple, TensorProto] = {}  # (file, offset, length) of a mapped tensor -> its local copy
        if self.mapped:  # weights already in files (a model over the inline limit): nothing to write
            self.data_dir = str(folder_of(model))
            self.skeleton = model
            log.info("weights of %s read from %s where they are (mapped)", model.graph.name or "the model",
                     self.data_dir)
            return
        with open(self.folder / WEIGHTS, "wb") as fh:
            self.skeleton = map_model_tensors(
                model, lambda t, key: self._external(t, key, fh) if _heavy(t) and not _is_ours(t) else None)
        log.info("weights of %s written once to %s (%.1f MB)", model.graph.name or "the model", self.folder,
                 (self.folder / WEIGHTS).stat().st_size / 1e6)

    # --- writing the weights once --------------------------------------------------------------------------
    def _external(self, t: TensorProto, name: str, fh) -> TensorProto:
        key = _key(t, name)
        if key in self.refs:
            return self.refs[key]
        data = _raw(t)
        offset = fh.tell()
        pad = (-offset) % _ALIGN
        if pad:
            fh.write(b"\0" * pad)
            offset += pad
        fh.write(data)
        ref = self.refs[key] = _ref(t, offset, len(data))
        return ref

    # --- sessions -----------------------------------------------------------------------------------------------
    def graph_file(self, model: onnx.ModelProto, outputs: Sequence[str] | None = None) -> Path:
        """Write ``model`` (this model, an edit of it, or a model built from its skeleton) as a graph file beside
        the weights, every heavy tensor the weights hold replaced by its reference; ``outputs``: the graph outputs
        to set. Tensors the weights do not hold (a patch's new constants) are embedded. The caller deletes the
        file once the engine has read it (:meth:`discard`). Weights left mapped are named relative to
        :attr:`data_dir`, where the engine is told to look."""
        with self._lock:
            self._count += 1
            path = self.folder / f"graph_{self._count:04d}.onnx"
        with edit_lock(model):
            if outputs is not None:
                with temporarily(model, outputs) as marked:
                    light = self._light(marked)
            else:
                light = self._light(model)
        path.write_bytes(light.SerializeToString())
        return path

    def _light(self, model: onnx.ModelProto) -> onnx.ModelProto:
        if self.mapped:
            from ..model.mapped import relative_to

            return relative_to(model, Path(self.data_dir))
        return map_model_tensors(model, self._swap)

    def _swap(self, t: TensorProto, name: str) -> TensorProto | None:
        if _points_to(t, WEIGHTS):  # already a reference into these weights (cut from the skeleton)
            return None
        if not _heavy(t) and not _is_ours(t):
            return None
        ref = self.refs.get(_key(t, name))
        if ref is not None:
            out = TensorProto()
            out.CopyFrom(ref)
            out.name = t.name
            return out
        if _is_ours(t):
            raise ValueError(f"tensor {t.name!r} points to weights this model's files do not hold")
        return None

    def local_graph_file(self, model: onnx.ModelProto, outputs: Sequence[str] | None = None) -> Path:
        """For a runtime that reads external data only beside its graph file (OpenVINO, worker processes): the
        mapped weights copied once, file to file, into ``folder/local.bin`` (on first use, each tensor once), and
        a graph file beside it naming them there. The caller deletes the file (:meth:`discard`)."""
        from ..model.mapped import WeightWriter, is_mapped, span

        def local(t: TensorProto, _key: str) -> TensorProto | None:
            if not is_mapped(t):
                return None
            where = span(t)
            ref = self._local.get(where)
            if ref is None:
                writer = WeightWriter(self.folder / LOCAL)
                try:
                    ref = self._local[where] = writer.copy(t, LOCAL)
                finally:
                    writer.close()
            out = TensorProto()
            out.CopyFrom(ref)
            out.name, out.data_type = t.name, t.data_type
            del out.dims[:]
            out.dims.extend(t.dims)
            return out

        with self._lock:
            self._count += 1
            path = self.folder / f"graph_{self._count:04d}.onnx"
            with edit_lock(model):
                if outputs is not None:
                    with temporarily(model, outputs) as marked:
                        light = map_model_tensors(marked, local)
                else:
                    light = map_model_tensors(model, local)
        path.write_bytes(light.SerializeToString())
        return path

    def discard(self, path: Path) -> None:
        """Delete a graph file once its engine has read it (the weights file stays)."""
        try:
            os.unlink(path)
        except OSError:
            pass

    def materialize(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A full copy of ``model`` with every reference to these weights loaded (for engines that need the
        values in memory, like onnx's reference evaluator)."""
        from onnx.external_data_helper import load_external_data_for_model

        if self.mapped:
            from ..model.mapped import materialized

            return materialized(model)
        copy = self._light(model)
        load_external_data_for_model(copy, str(self.folder))
        return copy

    def close(self) -> None:
        self._finalizer()


def _raw(t: TensorProto) -> bytes:
    from onnx import numpy_helper

    if t.HasField("raw_data"):
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def register(model: onnx.ModelProto, files: ModelFiles) -> None:
    """Sessions of ``model`` (this very proto object, kept alive while registered) are built from ``files``
    until :func:`unregister`."""
    with _REGISTRY_LOCK:
        _REGISTRY[id(model)] = (model, files)


def unregister(*models: onnx.ModelProto) -> None:
    with _REGISTRY_LOCK:
        for model in models:
            entry = _REGISTRY.get(id(model))
            if entry is not None and entry[0] is model:
                del _REGISTRY[id(model)]


def unregister_ids(ids: Sequence[int]) -> None:
    """Unregister by ``id()`` (for finalizers, which must not hold the protos)."""
    with _REGISTRY_LOCK:
        for i in ids:
            _REGISTRY.pop(i, None)


def files_for(model: onnx.ModelProto) -> ModelFiles | None:
    with _REGISTRY_LOCK:
        entry = _REGISTRY.get(id(model))
        return entry[1] if entry is not None and entry[0] is model else None
