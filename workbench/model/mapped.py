"""Weights left in their external data files: mapped, never copied into the proto.

A model whose external data passes :func:`inline_limit` (``WORKBENCH_INLINE_WEIGHTS_BYTES``, default 1 GiB; a
model over 2 GB can never be serialized whole) is loaded with its tensors still pointing to their files; the
loader checks each file (confined to the model's folder, long enough) and then rewrites each location to the
file's absolute path. Such a tensor is *mapped*: :func:`tensor_array` gives a read-only ``np.memmap`` view of it,
ONNX Runtime reads the same files itself (:func:`session_source`: the graph with locations relative to the
weights' folder, handed over with ``session.model_external_initializers_file_folder_path``), and writers copy
the bytes file to file in chunks (:func:`save_model`). Absolute locations exist only in the workbench's own
protos: a model given from outside with one is still refused by :mod:`workbench.model.external_data`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .external_data import all_tensors

log = logging.getLogger(__name__)

INLINE_ENV = "WORKBENCH_INLINE_WEIGHTS_BYTES"
#: external data up to this many bytes is read into the proto (today's path); more stays mapped
INLINE_DEFAULT = 1 << 30
#: written models whose weights pass this go to an external data file (protobuf's 2 GiB, with room for the graph)
SAVE_EXTERNAL_BYTES = (1 << 31) - (256 << 20)
#: tensors at least this big go to the external data file of a written model
SAVE_TENSOR_THRESHOLD = 1024
ORT_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
NO_PREPACK_KEY = "session.disable_prepacking"
_CHUNK = 64 << 20
_ALIGN = 4096


def inline_limit() -> int:
    """Bytes of external data read into memory at load; past this the weights stay mapped."""
    from ..core.budget import parse_size
    from ..errors import WorkbenchError

    text = os.environ.get(INLINE_ENV)
    if not text:
        return INLINE_DEFAULT
    try:
        return parse_size(text)
    except WorkbenchError as e:
        raise WorkbenchError(f"{INLINE_ENV}={text!r}: {e.message}", "write e.g. 512M or 2G") from None


def _info(t: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def is_mapped(t: TensorProto) -> bool:
    """The tensor's data is in an external file named by absolute path (a tensor the loader left mapped)."""
    if t.data_location != TensorProto.EXTERNAL:
        return False
    location = _info(t).get("location", "")
    return os.path.isabs(location)


def mapped_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    return (t for t in all_tensors(model) if is_mapped(t))


def has_mapped(model: onnx.ModelProto) -> bool:
    return any(True for _ in mapped_tensors(model))


def span(t: TensorProto) -> tuple[Path, int, int]:
    """(file, offset, length) of a mapped tensor."""
    from ..core.shapes import tensor_nbytes

    info = _info(t)
    length = int(info["length"]) if "length" in info else tensor_nbytes(t)
    return Path(info["location"]), int(info.get("offset", 0)), length


def map_in_place(model: onnx.ModelProto, base_dir: Path) -> None:
    """Point every external tensor of ``model`` at its file's absolute path (the files were checked already)."""
    from ..core.shapes import tensor_nbytes
    from ..errors import ExternalDataError
    from .external_data import confined_path

    for t in all_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        for e in t.external_data:
            if e.key == "location":
                e.value = str(confined_path(base_dir, e.value))
        path, offset, length = span(t)
        size = path.stat().st_size
        if length < tensor_nbytes(t) or offset + length > size:  # read later, piece by piece: refuse it now
            raise ExternalDataError(
                f"external-data file '{path.name}' is {size} bytes but tensor '{t.name}' needs bytes "
                f"{offset}..{offset + tensor_nbytes(t)}: the file is truncated or the tensor's length is wrong",
                "copy the complete weight file again")


def map_files(model: onnx.ModelProto, base_dir: Path) -> list[Path]:
    """Check the external data files of ``model`` (loaded without them) in ``base_dir`` and leave them mapped."""
    from .external_data import check_external_files, external_refs

    files = check_external_files(external_refs(model), base_dir)
    map_in_place(model, base_dir)
    return files


def tensor_array(t: TensorProto) -> np.ndarray:
    """The tensor's values: a read-only memory-mapped view for a mapped tensor of a plain numpy type, else
    :func:`onnx.numpy_helper.to_array`."""
    if not is_mapped(t):
        return numpy_helper.to_array(t)
    path, offset, length = span(t)
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    shape = tuple(int(d) for d in t.dims)
    if dtype is None or dtype.kind not in "biufc" or dtype.itemsize * int(np.prod(shape, dtype=np.int64)) != length:
        return numpy_helper.to_array(_loaded(t))  # a packed or custom type: read its bytes
    if length == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _loaded(t: TensorProto) -> TensorProto:
    path, offset, length = span(t)
    out = TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    out.ClearField("data_location")  # DEFAULT, left unset as in a tensor that never was external
    with open(path, "rb") as fh:
        fh.seek(offset)
        out.raw_data = fh.read(length)
    return out


def materialized(model: onnx.ModelProto, under: Path | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with every mapped tensor's data read in (for engines that need the values in memory);
    ``under``: only the tensors whose file is in that folder (what :func:`spilled` wrote)."""
    from ..core.shapes import map_model_tensors

    if not has_mapped(model):
        return model

    def read(t: TensorProto, _key: str) -> TensorProto | None:
        if not is_mapped(t) or (under is not None and span(t)[0].parent != Path(under).resolve()):
            return None
        return _loaded(t)

    return map_model_tensors(model, read)


def spilled(tensors: Iterator[tuple[str, TensorProto]], path: Path, min_bytes: int) -> dict[str, TensorProto]:
    """Mapped references (by key) to copies of those of ``tensors`` ((key, tensor) pairs) holding at least
    ``min_bytes`` as raw data in their proto, written to the new file ``path`` (page-aligned): a proto whose big
    weights are such references is cheap to copy and to hand to an engine, which reads the bytes from the file."""
    from ..core.shapes import tensor_nbytes

    out: dict[str, TensorProto] = {}
    writer = WeightWriter(path)
    try:
        for key, t in tensors:
            if (t.data_location != TensorProto.EXTERNAL and t.HasField("raw_data") and key not in out
                    and tensor_nbytes(t) >= min_bytes):  # raw bytes: read back, the same tensor proto
                out[key] = writer.copy(t)
    finally:
        writer.close()
    return out


def folder_of(model: onnx.ModelProto) -> Path | None:
    """The deepest folder holding every mapped tensor's file (their common ancestor: a model mixing the user's
    weights with ones this run wrote, like a repaired FP16 model with restored FP32 constants, spans two), or None
    when there are none. Every location is an absolute path the workbench resolved and checked itself."""
    folders = {str(span(t)[0].parent) for t in mapped_tensors(model)}
    return Path(os.path.commonpath(sorted(folders))) if folders else None


def relative_to(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """A copy of ``model`` whose mapped tensors name their files relative to ``folder`` (what ONNX Runtime reads)."""
    from ..core.shapes import map_model_tensors

    def rebase(t: TensorProto, _key: str) -> TensorProto | None:
        if not is_mapped(t):
            return None
        out = TensorProto()
        out.CopyFrom(t)
        for e in out.external_data:
            if e.key == "location":
                e.value = os.path.relpath(e.value, folder)
        return out

    return map_model_tensors(model, rebase)


def reloadable(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """(model, base_dir) to hand to :func:`~workbench.model.load.load_model` again for a proto the workbench
    derived from a loaded one (an inlined graph): mapped locations made relative to their common folder, which
    the loader then checks and maps again. A model without mapped tensors is returned as is (base_dir None)."""
    folder = folder_of(model)
    return (model, None) if folder is None else (relative_to(model, folder), folder)


def session_source(model: onnx.ModelProto) -> tuple[bytes, Path | None]:
    """(serialized graph, folder of its weights or None) for an ONNX Runtime session of ``model``: set the folder
    as :data:`ORT_FOLDER_KEY` in the session options (:func:`ort_options`)."""
    folder = folder_of(model)
    if folder is None:
        return model.SerializeToString(), None
    return relative_to(model, folder).SerializeToString(), folder


def ort_options(options, folder: Path | None, *, prepack: bool = True):
    """``options`` with ONNX Runtime told where a mapped model's weights are. ``prepack=False``: for a session that
    never runs (the compatibility probe): prepacking copies every MatMul/Gemm weight into a new buffer, a second
    copy of the weights in memory (sessions that run keep it: it changes the last bits of MatMul results)."""
    if folder is not None:
        options.add_session_config_entry(ORT_FOLDER_KEY, str(folder))
        if not prepack:
            options.add_session_config_entry(NO_PREPACK_KEY, "1")
    return options


def copy_span(src: Path, offset: int, length: int, dst) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src`` to the open file ``dst``, in chunks (nothing held whole)."""
    with open(src, "rb") as fh:
        fh.seek(offset)
        left = length
        while left:
            chunk = fh.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"{src} ended {left} bytes early")
            dst.write(chunk)
            left -= len(chunk)


class WeightWriter:
    """Appends tensors to one external data file (page-aligned) and returns mapped references to them."""

    def __init__(self, path: Path):
        self.path = Path(path).resolve()  # the absolute, resolved path ONNX Runtime checks locations against
        self._fh = open(self.path, "ab")  # noqa: SIM115 - closed by close()

    def _start(self) -> int:
        offset = self._fh.tell()
        pad = (-offset) % _ALIGN
        if pad:
            self._fh.write(b"\0" * pad)
        return offset + pad

    def _ref(self, t: TensorProto, offset: int, length: int, location: str | None = None) -> TensorProto:
        from ..core.shapes import copy_fields

        out = TensorProto()
        copy_fields(t, out, {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                             "uint64_data", "external_data", "data_location", "segment"})
        out.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location or str(self.path)), ("offset", str(offset)),
                           ("length", str(length))):
            entry = out.external_data.add()
            entry.key, entry.value = key, value
        return out

    def write_array(self, t: TensorProto, chunks: Iterator[np.ndarray]) -> TensorProto:
        """Write the arrays ``chunks`` (the tensor's data in C order, piece by piece) for ``t`` (name, type, dims)."""
        offset = self._start()
        for chunk in chunks:
            self._fh.write(np.ascontiguousarray(chunk).tobytes())
        return self._ref(t, offset, self._fh.tell() - offset)

    def copy(self, t: TensorProto, location: str | None = None) -> TensorProto:
        """Write ``t``'s data (mapped: copied from its file in chunks; else its bytes)."""
        offset = self._start()
        if is_mapped(t):
            src, start, length = span(t)
            copy_span(src, start, length, self._fh)
        else:
            data = t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
            self._fh.write(data)
            length = len(data)
        return self._ref(t, offset, length, location)

    def close(self) -> None:
        self._fh.flush()
        self._fh.close()


def flat_chunks(t: TensorProto, chunk_bytes: int = _CHUNK) -> Iterator[np.ndarray]:
    """A tensor's values, flat, in pieces of about ``chunk_bytes``: a mapped tensor is read from its file piece by
    piece (plain reads, not a mapping: its pages never count toward this process's memory)."""
    array = tensor_array(t)
    if not isinstance(array, np.memmap):
        yield np.asarray(array).reshape(-1)
        return
    path, offset, length = span(t)
    step = max(array.dtype.itemsize, chunk_bytes - chunk_bytes % array.dtype.itemsize)
    del array
    with open(path, "rb") as fh:
        fh.seek(offset)
        left = length
        while left > 0:
            data = fh.read(min(step, left))
            if not data:
                raise OSError(f"{path} ended {left} bytes early")
            left -= len(data)
            yield np.frombuffer(data, dtype=np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)))


def needs_external(model: onnx.ModelProto) -> bool:
    """Whether a written ``model`` must keep its weights in an external data file: it has mapped tensors, or its
    weights pass :data:`SAVE_EXTERNAL_BYTES` (``WORKBENCH_SAVE_EXTERNAL_BYTES`` lowers it)."""
    from ..engines.serialize import weight_bytes

    if has_mapped(model):
        return True
    text = os.environ.get("WORKBENCH_SAVE_EXTERNAL_BYTES")
    if text:
        from ..core.budget import parse_size

        return weight_bytes(model) > parse_size(text)
    return weight_bytes(model) > SAVE_EXTERNAL_BYTES


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> list[Path]:
    """Write ``model`` to ``path`` atomically; a model that :func:`needs_external` gets its tensors of at least
    :data:`SAVE_TENSOR_THRESHOLD` bytes in ``NAME.data`` beside it (mapped tensors copied file to file in chunks,
    never held in memory), written and renamed into place before the graph file. Returns the files written."""
    from .._atomic import atomic_write_bytes, staged, temp_prefix, umask
    from ..core.shapes import map_model_tensors, tensor_nbytes

    target = Path(path)
    if not needs_external(model):
        return [atomic_write_bytes(target, model.SerializeToString())]
    data_name = f"{target.name}.data"
    data_path = target.parent / data_name
    sources = {span(t)[0] for t in mapped_tensors(model)}
    if data_path.resolve() in sources or target.resolve() in sources:
        from ..errors import WorkbenchError

        raise WorkbenchError(f"writing {target} would replace {data_path.name}, a weight file the model reads",
                             "write the model to another name or folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged(tempfile.mkstemp(prefix=temp_prefix(data_name), suffix=".tmp", dir=target.parent)) as (fd, tmp):
        os.close(fd)
        writer = WeightWriter(Path(tmp))
        try:
            def out(t: TensorProto, _key: str) -> TensorProto | None:
                if not is_mapped(t) and (t.data_location == TensorProto.EXTERNAL
                                         or tensor_nbytes(t) < SAVE_TENSOR_THRESHOLD):
                    return None
                return writer.copy(t, data_name)

            light = map_model_tensors(model, out)
        finally:
            writer.close()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600: the user's usual permissions
        os.replace(tmp, data_path)
    atomic_write_bytes(target, light.SerializeToString())
    log.info("wrote %s with its weights in %s (%.1f MB)", target, data_path, data_path.stat().st_size / 1e6)
    return [target, data_path]
