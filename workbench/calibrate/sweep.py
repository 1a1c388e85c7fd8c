"""Sweep: the effect of quantizing one tensor on the model's outputs, and of keeping one tensor in float.

Variants of the FP32 model (activations only; weights stay float; Q/DQ pairs from qdq.py with the chosen
method's amax): "all" (every calibrated float32 tensor quantized), "only t" and "all but t" for the top-K
tensors of the sensitivity ranking. Each runs on ONNX Runtime (CPU) over a few evaluation feeds; its graph
outputs are compared with the FP32 model's (sqnr_db and cosine of the worst output). Variants run on a
thread pool (ONNX Runtime releases the GIL while it runs), one intra-op thread each.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from ..core.metrics import ErrorStats, decode_float, encode_float
from .qdq import insert_qdq

log = logging.getLogger(__name__)

TOP_K = 16


@dataclass
class SweepEntry:
    """Output error with only ``tensor`` quantized, and with every tensor but it quantized."""

    tensor: str
    only_sqnr_db: float
    only_cosine: float
    all_but_sqnr_db: float
    all_but_cosine: float
    recovery_db: float  # all_but_sqnr_db - the all-quantized sqnr_db: what keeping it in float buys

    def to_json(self) -> dict:
        return {k: encode_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> SweepEntry:
        v = {k: decode_float(x) for k, x in d.items()}
        return cls(v["tensor"], *(float(v[k]) for k in ("only_sqnr_db", "only_cosine", "all_but_sqnr_db",
                                                        "all_but_cosine", "recovery_db")))


@dataclass
class SweepResult:
    """``entries`` ranked by harm when quantized alone (worst first); ``keep_float`` ranks the same tensors by
    what keeping each one in float recovers (most first)."""

    method: str
    feeds: int
    all_sqnr_db: float
    all_cosine: float
    quantized: int
    entries: list[SweepEntry] = field(default_factory=list)

    @property
    def keep_float(self) -> list[SweepEntry]:
        return sorted(self.entries, key=lambda e: -e.recovery_db)

    def to_json(self) -> dict:
        return {"method": self.method, "feeds": self.feeds, "all_sqnr_db": encode_float(self.all_sqnr_db),
                "all_cosine": encode_float(self.all_cosine), "quantized": self.quantized,
                "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, d: dict) -> SweepResult:
        return cls(d["method"], int(d["feeds"]), float(decode_float(d["all_sqnr_db"])),
                   float(decode_float(d["all_cosine"])), int(d.get("quantized", 0)),
                   [SweepEntry.from_json(e) for e in d.get("entries", [])])


def run_sweep(
    model: onnx.ModelProto, amax: dict[str, float], candidates: list[str], feeds: list[dict[str, np.ndarray]],
    method: str, *, workers: int | None = None, cancel: threading.Event | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> SweepResult:
    """Run the sweep over ``candidates`` (already ranked and cut to top-K) with ``amax`` for every tensor."""
    from ..core.progress import Cancelled
    from ..engines import get_engine

    engine = get_engine("ort", threads=1, graph_optimization="disable")  # fake quant as written: no QLinear fusion
    outputs = [o.name for o in model.graph.output]
    usable = {t: a for t, a in amax.items() if np.isfinite(a) and a > 0}
    with engine.prepare(model, outputs) as session:
        reference = [session.run(f) for f in feeds]

    def evaluate(quantized: dict[str, float]) -> tuple[float, float]:
        if cancel is not None and cancel.is_set():
            raise Cancelled("calibration cancelled")
        stats = {o: ErrorStats() for o in outputs}
        with engine.prepare(insert_qdq(model, quantized), outputs) as variant:
            for feed, ref in zip(feeds, reference):
                got = variant.run(feed)
                for o in outputs:
                    stats[o].update(ref[o], got[o])
        metrics = [s.metrics() for s in stats.values()]
        return _worst([m["sqnr_db"] for m in metrics]), _worst([m["cosine"] for m in metrics])

    jobs: list[tuple[tuple[str, str | None], dict[str, float]]] = [(("all", None), usable)]
    for t in candidates:
        if t in usable:
            jobs += [(("only", t), {t: usable[t]}), (("all_but", t), {k: v for k, v in usable.items() if k != t})]
    results: dict[tuple[str, str | None], tuple[float, float]] = {}
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="workbench-sweep") as pool:
        futures = [(label, pool.submit(evaluate, quantized)) for label, quantized in jobs]
        for done, (label, future) in enumerate(futures, 1):
            results[label] = future.result()
            if progress is not None:
                progress(done / len(futures), f"sweep: {done}/{len(futures)} variants")
    all_sqnr, all_cos = results[("all", None)]
    entries = []
    for t in candidates:
        if ("only", t) not in results:
            continue
        only, but = results[("only", t)], results[("all_but", t)]
        entries.append(SweepEntry(t, only[0], only[1], but[0], but[1], but[0] - all_sqnr))
    entries.sort(key=lambda e: (e.only_sqnr_db, e.only_cosine))
    return SweepResult(method, len(feeds), all_sqnr, all_cos, len(usable), entries)


def _worst(values: list) -> float:
    """The smallest value; NaN when any is unknown (a shape or non-finite mismatch)."""
    numbers = [float("nan") if v is None else float(v) for v in values]
    return float("nan") if any(np.isnan(numbers)) else min(numbers)
