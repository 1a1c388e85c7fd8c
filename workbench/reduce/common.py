"""What the reduction's modules share: its schema, file names, type tables and error."""

from __future__ import annotations

import re

import numpy as np
from onnx import TensorProto

from ..errors import WorkbenchError

SCHEMA = "workbench.reduce/1"
FILES = ("reference.onnx", "candidate.onnx", "inputs.npz", "expected.npz", "README.md")
#: ONNX Runtime spec engines -> the execution provider the README snippet names
ORT_PROVIDERS = {"ort": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider",
                 "ort-trt": "TensorrtExecutionProvider"}
#: input types the snippet casts inputs.npz to (other numpy-typed inputs are fed as stored)
_CASTS = {"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64}
#: element types numpy (and so an .npz and ORT's Python feed) holds natively; others get a Cast node
_NUMPY_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.INT16,
                TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                TensorProto.UINT64, TensorProto.BOOL}
#: engines whose own package's version the README records
_ENGINE_PACKAGES = {"openvino": "openvino", "torch": "torch", "torch-cuda": "torch", "trt": "tensorrt"}
_ISO_PREFIX = re.compile(r"^iso\d+::")  # build_isolation's segment prefix
_SHOWN = ("cosine", "max_abs", "nonfinite_mismatch")


class ReduceError(WorkbenchError):
    """The reduction cannot start or cannot build its models (bad --out, unknown node, nothing to reduce)."""


