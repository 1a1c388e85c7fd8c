"""Culprit ranking: which node introduces the error, judged beyond its precision floor.

Every node was run alone on the candidate from the reference's inputs (:mod:`workbench.compare.isolate`); its
*introduced* error is what it adds by itself. In FP16/BF16 a node cannot do better than its output's floor (the
reference values held in the format), so nodes are ranked by the error they add beyond that floor: a ReLU whose
reference outputs all sit below FP16's smallest subnormal introduces "0 dB" yet adds nothing beyond its floor.
INT8/FP8 floors use the model's own scales, a calibration choice rather than a format limit, so quantized
tensors are ranked by their introduced error as is.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.metrics import ErrorStats
from .criterion import Criterion
from .result import Culprit

#: floors of these formats are format limits (subtracted before ranking); integer grids are choices (not)
FLOAT_FORMATS = ("fp16", "bf16")


def beyond_floor(metric: str, introduced: dict, floor: dict | None) -> float | None:
    """The introduced error with the floor's share taken out, in ``metric``'s own terms: for SQNR the SQNR of
    the noise power beyond the floor's; for error metrics the excess over the floor's value. None when there is
    no floating-point floor (the introduced value stands)."""
    value = introduced.get(metric)
    if floor is None or floor.get("format") not in FLOAT_FORMATS or not isinstance(value, (int, float)):
        return None
    f = floor.get(metric)
    if not isinstance(f, (int, float)) or math.isnan(f) or math.isnan(value):
        return None
    if metric == "sqnr_db":
        noise = 10 ** (-value / 10) if math.isfinite(value) else (0.0 if value > 0 else math.inf)
        floor_noise = 10 ** (-f / 10) if math.isfinite(f) else (0.0 if f > 0 else math.inf)
        if math.isinf(noise):
            return -math.inf
        extra = noise - floor_noise
        return math.inf if extra <= 0 else -10 * math.log10(extra)
    if metric == "cosine":
        return 1.0 - max((1.0 - value) - (1.0 - f), 0.0)
    return max(float(value) - float(f), 0.0)


def judged_metrics(c: Culprit, metric: str) -> dict:
    """The metrics a culprit is judged on: its own error, with the floor taken out where one applies."""
    own = own_error(c.introduced, c.received)
    if c.beyond_floor is not None:
        own = dict(own, **{metric: c.beyond_floor})
    return own


def received(node_inputs, full: dict[str, ErrorStats], crit: Criterion) -> dict:
    """The worst error among what the node reads (its inputs' full-run errors)."""
    worst = None
    for name in node_inputs:
        stats = full.get(name)
        if stats is None:
            continue
        m = stats.metrics()
        if worst is None or crit.badness(m) > crit.badness(worst):
            worst = m
    if worst is None:  # fed by graph inputs (or by nothing compared): the same feed reaches both sides
        worst = ErrorStats().update(np.zeros(1), np.zeros(1)).metrics()
    return worst


def own_error(introduced: dict, received_metrics: dict) -> dict:
    """Inf/NaN a node produces alone are its own only if its inputs were finite: an input the candidate
    precision cannot represent (reference 3e5 fed as FP16) is the producer's fault, already charged there."""
    if (received_metrics.get("nonfinite_mismatch") or 0) > 0 and (introduced.get("nonfinite_mismatch") or 0) > 0:
        return dict(introduced, nonfinite_mismatch=0)
    return introduced


def rank(culprits: list[Culprit], crit: Criterion) -> list[Culprit]:
    """Harmful first (impact measured and not harmless), then by error beyond the floor, then topological order."""
    def key(c: Culprit):
        harmless = c.harmless
        return (harmless, not c.introduces_divergence, -crit.badness(judged_metrics(c, crit.metric)), c.topo_index)

    return sorted(culprits, key=key)
