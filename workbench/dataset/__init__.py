"""Drift over a dataset: samples streamed from folders or Python iterables, task metrics per sample, the worst
samples and per-layer statistics across samples, on serial, local-process or Ray executors."""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "compare_dataset": "workbench.dataset.api",
    "DatasetResult": "workbench.dataset.result",
    "open_dataset": "workbench.dataset.source",
    "sample_at": "workbench.dataset.source",
    "Dataset": "workbench.dataset.source",
    "parse_metric": "workbench.dataset.metrics",
    "ExecutorSpec": "workbench.dataset.executors",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
