"""Target-runtime compatibility: static tables (ONNX Runtime, TensorRT, OpenVINO) and live probes."""

from workbench.compat.probe import ProbeResult, probe_onnxruntime, probe_openvino
from workbench.compat.tables import (
    OpRef,
    OpUsage,
    Target,
    TargetReport,
    check_model,
    default_targets,
    find_target,
    list_targets,
)

__all__ = [
    "OpRef",
    "OpUsage",
    "ProbeResult",
    "Target",
    "TargetReport",
    "check_model",
    "default_targets",
    "find_target",
    "list_targets",
    "probe_onnxruntime",
    "probe_openvino",
]
