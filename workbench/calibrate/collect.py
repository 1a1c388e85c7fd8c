"""Streaming collection of activation histograms over calibration feeds, in chunks under a memory budget.

Activations are the model's float graph inputs and the float outputs of its main-graph nodes, in topological
order; outputs of Constant nodes and of nodes that read only constants (weights, folded at build time) are
left out, and so are integer tensors. The tensors are split into chunks whose estimated size for one feed fits
the memory budget (:func:`workbench.core.budget.chunks`); each chunk is one ONNX Runtime session marking
those tensors, and runs every feed. Sessions run the graph as written (no graph optimisation, like ORT's own
calibrator), so which tensors share a chunk cannot change fusions and values: results do not depend on the
budget. Each array updates its histogram and is dropped at once: memory is one
feed's worth of one chunk plus two small histograms per tensor, whatever the number of feeds.

``feeds`` is read once per chunk (twice with ONNX Runtime's histograms: its second pass needs pass one's range),
never held: a list, or a :class:`~workbench.calibrate.feeds.FeedStream` that reads a dataset sample by sample on
every pass. The graph inputs' histograms ride along the first chunk's passes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..core.budget import chunks, tensor_bytes
from ..model.load import LoadedModel
from ..variants.equalize import channel_absmax
from .histogram import TensorHistogram
from .ort_rules import ENTROPY_BINS, OrtHistograms
from .trt_histogram import GrowingHistogram

log = logging.getLogger(__name__)

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})
Progress = Callable[[float, str], None]


@dataclass
class Collection:
    """Histograms by tensor (topological order), what was skipped and why, and how the work was split."""

    histograms: dict[str, TensorHistogram]
    trt: dict[str, GrowingHistogram] = field(default_factory=dict)
    ort: dict[str, OrtHistograms] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: the largest |x| of each channel (axis 1) of the tensors asked for (``channels=`` of :func:`collect`)
    channel_absmax: dict[str, np.ndarray | None] = field(default_factory=dict)
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
    feeds: Sequence[dict[str, np.ndarray]],
    tensors: list[str],
    *,
    num_bins: int = 2048,
    budget: int = 1 << 30,
    trt: bool = True,
    ort: bool = False,
    ort_entropy_bins: int = ENTROPY_BINS,
    engine=None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    span: tuple[float, float] = (0.0, 1.0),
    channels: Sequence[str] = (),
) -> Collection:
    """Histograms of ``tensors`` over ``feeds`` (see the module docstring). ``span``: the progress range used.
    ``channels``: tensors (of ``tensors``) whose per-channel largest magnitude is kept too (``channel_absmax``)."""
    from ..core.progress import Cancelled
    from ..engines import get_engine

    start = time.perf_counter()
    count = len(feeds)
    engine = engine or get_engine("ort", graph_optimization="disable")
    out = Collection({t: TensorHistogram.empty(num_bins) for t in tensors}, feeds=count,
                     channel_absmax=dict.fromkeys(c for c in channels if c in tensors))
    if trt or ort:
        out.trt = {t: GrowingHistogram(num_bins) for t in tensors}
    graph_inputs = set(model.graph.inputs)
    inputs = [t for t in tensors if t in graph_inputs]
    marked = [t for t in tensors if t not in graph_inputs]
    # one feed's arrays of a chunk, plus the temporaries of one histogram update (~3 arrays of the largest)
    sizes = tensor_bytes(model.proto, feeds[0]) if marked else {}
    groups = list(chunks(marked, sizes, max(1, budget // 2))) if marked else []
    out.chunks = len(groups)
    if len(groups) > 1:
        log.info("%d tensors collected in %d chunks to stay under the memory budget", len(marked), len(groups))
    passes = 2 if ort else 1
    rounds = max(1, len(groups))
    steps = max(1, rounds * count * passes)
    done = 0

    def tick(gi: int, fi: int, what: str) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("calibration cancelled")
        if progress is not None:
            progress(span[0] + (span[1] - span[0]) * done / steps,
                     f"chunk {gi + 1}/{rounds}: {what} feed {fi + 1}/{count}")

    # two workers: each update holds ~3 temporaries of its tensor, which the chunk budget leaves room for twice
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="calibrate")
    try:
        for gi, group in enumerate(groups or [[]]):
            riders = inputs if gi == 0 else []  # graph inputs ride along the first chunk's passes over the feeds
            names = riders + group
            with contextlib.ExitStack() as stack:
                session = stack.enter_context(engine.prepare(model.proto, group)) if group else None

                def values_of(feed, session=session, riders=riders) -> dict:
                    values = session.run(feed) if session is not None else {}
                    return {**{n: feed.get(n) for n in riders}, **values}

                for fi, feed in enumerate(feeds):
                    tick(gi, fi, "")
                    values = values_of(feed)
                    list(pool.map(lambda name, values=values: _update(out, name, values.get(name)), names))
                    del values
                    done += 1
                if ort:
                    def replay(gi=gi, values_of=values_of):
                        nonlocal done
                        for fi, feed in enumerate(feeds):
                            tick(gi, fi, "ONNX Runtime histograms,")
                            done += 1
                            yield values_of(feed)

                    _second_pass(out, names, replay(), num_bins, ort_entropy_bins, pool)
    finally:
        pool.shutdown(cancel_futures=True)
    for name in out.skipped:
        out.histograms.pop(name, None)
        out.trt.pop(name, None)
        out.ort.pop(name, None)
    out.seconds = time.perf_counter() - start
    return out


def _second_pass(out: Collection, names: list[str], batches, num_bins: int, entropy_bins: int,
                 pool: ThreadPoolExecutor | None = None) -> None:
    """Fill ORT's histograms of ``names`` from ``batches`` (dicts by name), their ranges known from pass one."""
    live = [n for n in names if n not in out.skipped and out.histograms[n].count]
    for n in live:
        h = out.histograms[n]
        low = out.trt[n].low  # min |x|: tracked by the TensorRT histogram
        out.ort[n] = OrtHistograms(np.float32(h.min), np.float32(h.max), np.float32(low), entropy_bins, num_bins)

    def update(n: str, values: dict) -> None:
        v = values.get(n)
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            out.ort[n].update(v, finite=not out.histograms[n].nonfinite)  # pass one saw every value

    for values in batches:
        if pool is None:
            for n in live:
                update(n, values)
        else:
            list(pool.map(lambda n, values=values: update(n, values), live))


def _update(out: Collection, name: str, value) -> None:
    if name in out.skipped:
        return
    if not isinstance(value, np.ndarray):
        out.skipped[name] = "not returned as a tensor"
    elif value.dtype.kind != "f":
        out.skipped[name] = f"{value.dtype} (only float tensors are calibrated)"
    else:
        h = out.histograms[name]
        before = h.nonfinite
        h.update(value)
        if out.trt:  # our histogram counted the non-finite values: filter only when this array held some
            out.trt[name].update(value[np.isfinite(value)] if h.nonfinite > before else value)
        if name in out.channel_absmax and value.ndim >= 2:  # one thread per tensor at a time: no race
            top = channel_absmax(value)
            seen = out.channel_absmax[name]
            out.channel_absmax[name] = top if seen is None else np.maximum(seen, top)
