"""onnx-drift-workbench: find where and why an ONNX model's answers drift between engines and precisions.

Heavy modules (onnx, onnxruntime, torch, openvino, tensorrt, ipywidgets) are imported lazily, on first use.
"""

from __future__ import annotations

import logging

from ._lazy import lazy_exports

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {
    "load_model": "workbench.model.load",
    "LoadedModel": "workbench.model.load",
    "inspect_model": "workbench.inspection",
    "Inspection": "workbench.inspection",
    "inventory": "workbench.model.inventory",
    "Workbench": "workbench.ui.workbench",
    "compare": "workbench.compare",
    "calibrate": "workbench.calibrate",
    "repair": "workbench.repair",
    "reduce": "workbench.reduce",
    "compare_dataset": "workbench.dataset.api",
    "engine_graph": "workbench.engine_graphs.api",
    "save_bundle": "workbench.report.bundle",
    "load_bundle": "workbench.report.bundle",
    "rerun_bundle": "workbench.report.rerun",
    "diff_results": "workbench.report.diff",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, extra=("__version__",))
