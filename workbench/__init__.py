"""onnx-drift-workbench: find where and why an ONNX model's answers drift between engines and precisions.

Heavy modules (onnx, onnxruntime, torch, openvino, tensorrt, ipywidgets) are imported lazily, on first use.
"""

from __future__ import annotations

import importlib
import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {
    "load_model": "workbench.model.load",
    "LoadedModel": "workbench.model.load",
    "inspect_model": "workbench.inspection",
    "Inspection": "workbench.inspection",
    "inventory": "workbench.model.inventory",
    "Workbench": "workbench.ui.workbench",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
