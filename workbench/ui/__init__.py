"""Notebook front end: ipywidgets panels, each a thin view over the core; :class:`Workbench` composes them.

    from workbench import Workbench
    Workbench("model.onnx")    # Model | Compare | Errors | Graph | Calibration | Repair | Dataset | Engine

Every panel also works alone (``ModelPanel(model)``, ``ComparePanel(model)``, ...). Panels hold no numerics:
they call the core (inspect, compare, calibrate, inspect_tensor, repair, reduce) and the plots. Long work runs on a
thread with a progress bar and Cancel, so the kernel stays responsive; what it finds reaches the widgets and the
shared state on the kernel's thread (:mod:`workbench.ui.kernel_thread`).
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "Workbench": "workbench.ui.workbench",
    "WorkbenchState": "workbench.ui.state",
    "ModelPanel": "workbench.ui.model_panel",
    "ComparePanel": "workbench.ui.compare_panel",
    "ErrorsPanel": "workbench.ui.errors_panel",
    "GraphPanel": "workbench.ui.graph_panel",
    "GraphWidget": "workbench.ui.graph_widget",
    "CalibrationPanel": "workbench.ui.calibration_panel",
    "RepairPanel": "workbench.ui.repair_panel",
    "DatasetPanel": "workbench.ui.dataset_panel",
    "EnginePanel": "workbench.ui.engine_panel",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
