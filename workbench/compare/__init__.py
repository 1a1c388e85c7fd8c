"""Layer-by-layer comparison of two engines or precisions: ``compare(model, "ort", "ort:fp16")`` (also
``workbench.compare(...)``: calling the package runs :func:`~workbench.compare.api.compare`)."""

from __future__ import annotations

from .._lazy import callable_package, lazy_exports

_LAZY = {
    "compare": "workbench.compare.api",
    "CompareResult": "workbench.compare.result",
    "ComparisonPlan": "workbench.compare.plan",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
callable_package(__name__, "workbench.compare.api", "compare")
