"""Building an ONNX Runtime CPU session on a ModelProto (used to validate variants and scan tensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from ..core.scratch import temporary_dir

_PROTO_LIMIT = 2**31 - 1 - 64 * 1024**2  # serialised protobuf limit, with headroom


def ort_session(model: onnx.ModelProto, *, optimize: bool = False) -> Any:
    """A CPU InferenceSession; ``optimize=False`` disables all graph optimisations (every tensor stays).
    Models over the 2 GB protobuf limit go through a temporary folder with external data."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are raised: none printed raw
    from ..engines.ort import env_threads

    if threads := env_threads():  # WORKBENCH_ORT_THREADS, as for the ort engine's sessions
        options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    from ..model.mapped import has_mapped, ort_options, session_source

    if has_mapped(model):  # weights left in their files: ONNX Runtime reads them there
        source, folder = session_source(model)
        return ort.InferenceSession(source, ort_options(options, folder), providers=["CPUExecutionProvider"])
    if model.ByteSize() < _PROTO_LIMIT:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with temporary_dir("workbench-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(copy, path, save_as_external_data=True, location="model.data")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (ORT's messages run over many lines)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
