"""Repair: the smallest set of nodes to keep in reference precision (FP32 islands in an FP16 model, Q/DQ removed
around nodes of an INT8 one) so that the candidate meets a target. ``workbench.repair(...)`` calls
:func:`~workbench.repair.api.repair`; submodules are imported on first use."""

from __future__ import annotations

from .._lazy import callable_package, lazy_exports

_LAZY = {
    "repair": "workbench.repair.api",
    "save_model": "workbench.repair.api",
    "RepairResult": "workbench.repair.result",
    "RepairError": "workbench.repair.graph",
    "IslandBuilder": "workbench.repair.islands",
    "keep_fp32_islands": "workbench.repair.islands",
    "remove_qdq": "workbench.repair.islands",
    "precision_share": "workbench.repair.weights",
    "save_repair_bundle": "workbench.repair.bundle",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)


callable_package(__name__, "workbench.repair.api", "repair")
