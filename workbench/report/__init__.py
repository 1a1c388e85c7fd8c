"""Reports: rerunnable bundles (save, load, rerun, diff), self-contained HTML, interop (Polygraphy RunResults,
Model Explorer node data, Netron). Submodules are imported on first use."""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "save_bundle": "workbench.report.bundle",
    "load_bundle": "workbench.report.bundle",
    "Bundle": "workbench.report.bundle",
    "BundleWriter": "workbench.report.bundle",
    "rerun_bundle": "workbench.report.rerun",
    "RerunReport": "workbench.report.rerun",
    "diff_results": "workbench.report.diff",
    "ResultDiff": "workbench.report.diff",
    "load_result": "workbench.report.diff",
    "write_report": "workbench.report.html",
    "render_report": "workbench.report.html",
    "capture_tensors": "workbench.report.tensors",
    "read_run_results": "workbench.report.interop",
    "write_run_results": "workbench.report.interop",
    "write_inputs_json": "workbench.report.interop",
    "record_run": "workbench.report.interop",
    "compare_with_recording": "workbench.report.interop",
    "model_explorer_node_data": "workbench.report.interop",
    "save_model_explorer_node_data": "workbench.report.interop",
    "netron_command": "workbench.report.interop",
    "open_in_netron": "workbench.report.interop",
    "RecordedEngine": "workbench.report.recorded",
    "BundleError": "workbench.report.safety",
    "UnsafeBundleError": "workbench.report.safety",
    "UnsealedBundleError": "workbench.report.bundle",
    "ModelMismatchError": "workbench.report.safety",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
