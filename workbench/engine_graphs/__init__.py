"""Inside the engine: what it fused, where each node ran, in what precision, and how long it took.

    from workbench import engine_graph
    graph = engine_graph("model.onnx", "ort", input_shapes={"x": [1, 3, 320, 320]}, runs=20)
    graph.slowest(5), graph.fallbacks(), graph.to_json()   # workbench.engine_graph/1

One module per engine (:mod:`.ort_graph`, :mod:`.ort_trt_graph`, :mod:`.openvino_graph`, :mod:`.tensorrt_graph`),
the ONNX-side walks they share (:mod:`.onnx_side`, :mod:`.partition`), fusion-aware comparison
(:mod:`.granularity`) and diffs (:mod:`.diff`). Heavy imports happen on use.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "engine_graph": "workbench.engine_graphs.api",
    "EngineGraph": "workbench.engine_graphs.result",
    "EngineNode": "workbench.engine_graphs.result",
    "SCHEMA": "workbench.engine_graphs.result",
    "from_records": "workbench.engine_graphs.tensorrt_graph",
    "from_ort_trt_records": "workbench.engine_graphs.ort_trt_graph",
    "diff_graphs": "workbench.engine_graphs.diff",
    "render": "workbench.engine_graphs.text",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
