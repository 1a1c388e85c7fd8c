"""Streaming collection of activation histograms over calibration feeds, in chunks under a memory budget.

Activations are the model's float graph inputs and the float outputs of its main-graph nodes, in topological
order; outputs of Constant nodes and of nodes that read only constants (weights, folded at build time) are
left out, and so are integer tensors. The tensors are split into chunks whose estimated size for one feed fits
the memory budget (:func:`workbench.core.budget.chunks`); each chunk is one ONNX Runtime session marking
those tensors, and runs every feed. Sessions run the graph as written (no graph optimisation, like ORT's own
calibrator), so which tensors share a chunk cannot change fusions and values: results do not depend on the
budget. Each array updates its histogram and is dropped at once: memory is one
feed's worth of one chunk plus two small histograms per tensor, whatever the number of feeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..core.budget import chunks, tensor_bytes
from ..model.load import LoadedModel
from .histogram import TensorHistogram

log = logging.getLogger(__name__)

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})
Progress = Callable[[float, str], None]


@dataclass
class Collection:
    """Histograms by tensor (topological order), what was skipped and why, and how the work was split."""

    histograms: dict[str, TensorHistogram]
    skipped: dict[str, str] = field(default_factory=dict)
    chunks: int = 0
    feeds: int = 0
    seconds: float = 0.0


def activation_tensors(model: LoadedModel) -> list[str]:
    """Float graph inputs, then float node outputs in topological order (constants and weights left out)."""
    g = model.graph
    proto_nodes = model.proto.graph.node
    constant = {t.name for t in model.proto.graph.initializer}
    names = [i for i in g.inputs if _is_float(g.tensors.get(i))]
    for node in g.nodes:
        has_subgraph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                           for a in proto_nodes[node.index].attribute)
        reads = [i for i in node.inputs if i]
        if node.op_type == "Constant" or (not has_subgraph and all(i in constant for i in reads)):
            constant.update(o for o in node.outputs if o)
            continue
        names += [o for o in node.outputs if o and _is_float(g.tensors.get(o))]
    return list(dict.fromkeys(names))


def _is_float(info) -> bool:
    return info is None or info.dtype is None or info.dtype in FLOAT_DTYPES


def collect(
    model: LoadedModel,
    feeds: list[dict[str, np.ndarray]],
    tensors: list[str],
    *,
    num_bins: int = 2048,
    budget: int = 1 << 30,
    engine=None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    span: tuple[float, float] = (0.0, 1.0),
) -> Collection:
    """Histograms of ``tensors`` over ``feeds`` (see the module docstring). ``span``: the progress range used."""
    from ..core.progress import Cancelled
    from ..engines import get_engine

    start = time.perf_counter()
    engine = engine or get_engine("ort", graph_optimization="disable")
    hists = {t: TensorHistogram.empty(num_bins) for t in tensors}
    out = Collection(hists, feeds=len(feeds))
    graph_inputs = set(model.graph.inputs)
    for feed in feeds:
        for name in tensors:
            if name in graph_inputs and name in feed:
                _update(out, name, feed[name])
    marked = [t for t in tensors if t not in graph_inputs]
    # one feed's arrays of a chunk, plus the temporaries of one histogram update (~3 arrays of the largest)
    groups = list(chunks(marked, tensor_bytes(model.proto, feeds[0]), max(1, budget // 2))) if marked else []
    out.chunks = len(groups)
    if len(groups) > 1:
        log.info("%d tensors collected in %d chunks to stay under the memory budget", len(marked), len(groups))
    steps = max(1, len(groups) * len(feeds))
    done = 0
    for gi, group in enumerate(groups):
        with engine.prepare(model.proto, group) as session:
            for fi, feed in enumerate(feeds):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("calibration cancelled")
                if progress is not None:
                    progress(span[0] + (span[1] - span[0]) * done / steps,
                             f"chunk {gi + 1}/{len(groups)}: feed {fi + 1}/{len(feeds)}")
                values = session.run(feed)
                for name in group:
                    _update(out, name, values.pop(name, None))
                del values
                done += 1
    for name in out.skipped:
        hists.pop(name, None)
    out.seconds = time.perf_counter() - start
    return out


def _update(out: Collection, name: str, value) -> None:
    if name in out.skipped:
        return
    if not isinstance(value, np.ndarray):
        out.skipped[name] = "not returned as a tensor"
    elif value.dtype.kind != "f":
        out.skipped[name] = f"{value.dtype} (only float tensors are calibrated)"
    else:
        out.histograms[name].update(value)
