"""Building an ONNX Runtime CPU session on a ModelProto (used to validate variants and scan tensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.scratch import temporary_dir

_PROTO_LIMIT = 2**31 - 1 - 64 * 1024**2  # serialised protobuf limit, with headroom
#: initializers this large go beside the graph (:func:`weights_beside`)
BESIDE_BYTES = 1 << 16
_T = onnx.TensorProto
#: element types numpy and OrtValue hold as they are
_ARRAY_TYPES = {_T.FLOAT, _T.FLOAT16, _T.DOUBLE, _T.INT8, _T.UINT8, _T.INT16, _T.UINT16, _T.INT32, _T.UINT32,
                _T.INT64, _T.UINT64, _T.BOOL}


def ort_session(model: onnx.ModelProto, *, optimize: bool = False) -> Any:
    """A CPU InferenceSession; ``optimize=False`` disables all graph optimisations (every tensor stays).
    The graph goes to ONNX Runtime without its large initializers, which follow as arrays
    (``add_external_initializers``: not serialized into the protobuf and parsed back; 0.6 -> 0.25 s for a 150 MB
    encoder with every tensor marked). Models over the 2 GB protobuf limit even so go through a temporary folder
    with external data."""
    import onnxruntime as ort

    from ..model.mapped import has_mapped, ort_options, session_source

    if has_mapped(model):  # weights left in their files: ONNX Runtime reads them there
        source, folder = session_source(model)
        return ort.InferenceSession(source, ort_options(_options(optimize), folder), providers=["CPUExecutionProvider"])
    light, names, arrays = weights_beside(model)
    if light.ByteSize() < _PROTO_LIMIT:
        options = _options(optimize)
        if names:  # ONNX Runtime copies them into its graph: the arrays may go once the session exists (the
            # session keeps ``options``, whose arrays are then gone: never rebuild it, e.g. by set_providers)
            options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
        return ort.InferenceSession(light.SerializeToString(), options, providers=["CPUExecutionProvider"])
    del light, arrays
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with temporary_dir("workbench-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(copy, path, save_as_external_data=True, location="model.data")
        return ort.InferenceSession(str(path), _options(optimize), providers=["CPUExecutionProvider"])


def _options(optimize: bool) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are raised: none printed raw
    from ..engines.ort import env_threads

    if threads := env_threads():  # WORKBENCH_ORT_THREADS, as for the ort engine's sessions
        options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def weights_beside(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[np.ndarray]]:
    """(``model`` whose main-graph initializers of :data:`BESIDE_BYTES` or more, of the plain numeric types, are
    stubs -- same name, type and dims, data "external" -- , their names, their arrays). Only initializers some node
    reads (or a graph output is) and whose name nothing else defines go beside: ONNX Runtime drops unread ones before
    it would take their arrays (and then refuses the arrays), and keeps the last of duplicates. The copy costs the
    graph's size; the arrays are views of ONE buffer holding those weights once (one allocation, returned whole when
    it goes, where many would leave the heap fragmented for what follows), filled only when the weight-free graph
    fits a protobuf (else no arrays). Constant nodes and subgraphs keep their tensors inline."""
    import sys
    from collections import Counter

    from ..core.shapes import copy_fields, stub_tensor, tensor_nbytes
    from ..model.walk import iter_nodes

    graph = model.graph
    read = {i for n in iter_nodes(graph) for i in n.input} | {o.name for o in graph.output}
    defined = Counter(t.name for t in graph.initializer) + Counter(o for n in iter_nodes(graph) for o in n.output)
    light = onnx.ModelProto()
    copy_fields(model, light, {"graph"})
    copy_fields(graph, light.graph, {"initializer"})
    beside = []
    for t in graph.initializer:
        if (t.data_type in _ARRAY_TYPES and t.data_location != onnx.TensorProto.EXTERNAL and t.name in read
                and defined[t.name] == 1 and tensor_nbytes(t) >= BESIDE_BYTES):
            light.graph.initializer.add().CopyFrom(stub_tensor(t))
            beside.append(t)
        else:
            light.graph.initializer.add().CopyFrom(t)
    if not beside or light.ByteSize() >= _PROTO_LIMIT:
        return light, [], []
    sizes = [-(-tensor_nbytes(t) // 64) * 64 for t in beside]
    buffer = np.empty(sum(sizes), np.uint8)
    names, arrays, offset = [], [], 0
    for t, size in zip(beside, sizes):
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        view = buffer[offset:offset + tensor_nbytes(t)].view(dtype).reshape(tuple(t.dims))
        if t.HasField("raw_data") and sys.byteorder == "little":
            view.reshape(-1)[:] = np.frombuffer(t.raw_data, dtype)
        else:
            view[...] = numpy_helper.to_array(t)
        names.append(t.name)
        arrays.append(view)
        offset += size
    return light, names, arrays


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (ORT's messages run over many lines)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
