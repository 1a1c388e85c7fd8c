"""Q/DQ candidates with many quantized nodes: the repair pool ordered by group testing instead of one node at a time.

Measuring every quantized node's removal alone (:func:`workbench.repair.qdq_order.order_pool`) costs a run per node
and failing feed: 411 nodes of a text recognizer took 234 s. Here the nodes, in graph order, are cut into
:data:`GROUPS` contiguous blocks; each block is dequantized as a whole (one build) and measured on the
:data:`PROBES` worst feeds; the block that helps most is split in two and its halves measured, and so on, best
first (a priority queue), until single nodes come out or :data:`BUDGET` builds are spent. Quantization error mostly
adds up along the graph, so a block that holds the nodes that matter helps more than one that does not, and the
descent costs about 2 log2(n / GROUPS) builds per node it isolates rather than one per node. It ends at the first
node (or whole unit) that meets the target alone, which the search then tries first (the common case of one
quantized node that breaks the task). The pool is: the nodes isolated, best first; then the blocks left when the
budget ran out, best first, each in graph order; then the blocks that did not help. A build before the descent
dequantizes every node: when even that misses the target no Q/DQ removal can meet it, and the search is told so
at once.

On ONNX Runtime's CPU provider blocks are measured :data:`WIDTH` at a time on worker threads, each session on one
thread, so both halves of a block cost one build's time; on other engines one after the other, and where a block
meets the target alone its second half is measured only when its first half does not.

A build here is the deployable model (the Q/DQ pairs of the block removed, as :meth:`IslandBuilder.build` makes it),
not a switchable model: on ONNX Runtime a switch between twins breaks the QLinear fusions and computes both twins,
~4x the cost of a plain INT8 run, while building a model of a few hundred nodes takes ~0.1 s.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import EngineRunError
from .graph import QDQ_OPS
from .islands import IslandBuilder
from .qdq_order import one_thread_copy, quantized_nodes
from .search import split_even

log = logging.getLogger(__name__)

#: pools up to this size are measured node by node (:func:`workbench.repair.qdq_order.order_pool`)
SMALL = 160
#: top-level blocks of the descent
GROUPS = 8
#: builds the descent may spend on the probe feeds
BUDGET = 32
#: feeds each block is measured on: the worst ones with nothing removed (a build costs more than a few runs)
PROBES = 8
#: blocks measured at once on ONNX Runtime's CPU provider, each session on one thread: a small model runs no
#: slower on one thread than on two, and one session's build (~0.1 s, single-threaded) overlaps the other's runs
#: (8 builds with their probe runs: 2.1 s one after the other, 1.0 s two at once, on the recognizer)
WIDTH = 2
#: the score of a block not measured (the second half of one whose first half meets the target alone): ranked with
#: the blocks that did not help
UNMEASURED = (True, float("inf"), float("inf"), float("inf"))


def order_by_groups(ev, builder: IslandBuilder, pool: Sequence[str], baseline, notes: list[str],
                    budget: int = BUDGET) -> tuple[list[str], dict]:
    """(pool ordered by group testing, a summary for the result), as :func:`qdq_order.order_pool` returns them.
    ``ev``: the repair's Evaluator; ``baseline``: its evaluation with nothing kept."""
    t0 = time.perf_counter()
    known = set(builder.idx.by_name)
    position = {n: builder.position[id(builder.idx.by_name[n])] for n in known}
    nodes = [n for n in dict.fromkeys([*quantized_nodes(builder), *pool]) if n in known]
    nodes = sorted((n for n in nodes if builder.idx.by_name[n].op_type not in QDQ_OPS), key=position.__getitem__)
    if not nodes:
        return list(pool), {}
    plan = ev.plan
    outs = [c for _, c in ev.outputs]

    def score(indices: list[int], results: list[dict]) -> tuple:
        """Met first, then fewer failing feeds, a better worst value, then the outputs' mean SQNR (higher first):
        a task metric is often a step (a crop decodes right or not), the SQNR says which way a block moves it."""
        e = ev.judge_feeds(dict(zip(indices, results)))
        j = e.judgement
        return (not j.met, j.failing, j.badness, -_mean_sqnr(e.per_feed))

    everything = ev.evaluate(nodes)  # a search build, cached: the search's longest prefix reuses it
    if not everything.met:
        notes.append(f"every one of the {len(nodes)} quantized node(s) dequantized still misses the target: "
                     "no Q/DQ removal can meet it")
        return nodes, {"measured": 0, "blocks": 0, "seconds": round(time.perf_counter() - t0, 3),
                       "all_float_met": False}
    feeds = plan.cand_feeds
    with plan.cand_engine.prepare(builder.candidate, outs) as session:
        base_runs = [session.run(f) for f in feeds]
    per_feed = [score([i], [r]) for i, r in enumerate(base_runs)]
    probes = sorted(range(len(feeds)), key=lambda i: per_feed[i], reverse=True)[:PROBES]
    probes.sort()
    base = score(probes, [base_runs[i] for i in probes])
    spent = 0
    refused: list[tuple[tuple[str, ...], str]] = []  # blocks the candidate engine could not build or run
    single = _one_thread_engine(plan.cand_engine)
    engine, width = (single, WIDTH) if single is not None else (plan.cand_engine, 1)
    workers = ThreadPoolExecutor(width, thread_name_prefix="workbench-groups") if width > 1 else None

    def probe_runs(model) -> list[dict] | str:
        """The candidate's outputs on the probe feeds (on a worker thread when ``workers``), or the engine's error."""
        try:
            with engine.prepare(model, outs) as s:
                return [s.run(feeds[i]) for i in probes]
        except EngineRunError as e:
            return str(e).splitlines()[0] if str(e) else type(e).__name__

    def measure(blocks: list[tuple[str, ...]]) -> list[tuple]:
        """Each block dequantized as a whole (one build each, WIDTH at once with workers), scored on the probes."""
        nonlocal spent
        runs: list = []
        for i in range(0, len(blocks), width):
            models = []
            for block in blocks[i:i + width]:
                spent += 1
                ev.builds_by_role["ranking"] = ev.builds_by_role.get("ranking", 0) + 1
                if ev.step is not None:
                    ev.step(0.0, f"Q/DQ removal measured by blocks: build {spent}/{budget}")
                models.append(builder.build(block))
            runs += list(workers.map(probe_runs, models)) if len(models) > 1 else [probe_runs(models[0])]
        scores = []
        for block, got in zip(blocks, runs):
            if isinstance(got, str):
                log.info("block %s... could not be measured: %s", block[:2], got)
                refused.append((block, got))
                scores.append((True, len(probes), float("inf"), float("inf")))
                continue
            scores.append(score(probes, got))
            log.debug("block of %d from %s: %s", len(block), block[0], scores[-1])
        return scores

    try:
        units, heap = _descend(measure, tuple(nodes), base, budget, lambda: spent, width > 1)
    finally:
        if workers is not None:
            workers.shutdown(wait=True, cancel_futures=True)
    isolated = [n for u in units for n in u]
    rest = [heapq.heappop(heap) for _ in range(len(heap))]
    helping = isolated + [n for s, _, b in rest if s < base for n in b]
    ordered = helping + [n for s, _, b in rest if not s < base for n in b]
    ordered += [n for n in pool if n not in set(ordered)]
    if refused:
        block, why = refused[0]
        notes.append(f"group testing: {plan.cand_engine.name} could not build or run {len(refused)} block(s) with "
                     f"their Q/DQ removed (first: {len(block)} node(s) from {block[0]}: {why[:200]}); they were ranked "
                     "last as not helping. The search still judges every set it keeps on a real build")
    summary = {"measured": spent, "refused": len(refused), "nodes": len(nodes), "blocks": GROUPS,
               "probes": len(probes), "at_once": width,
               "isolated": len(isolated), "units": len(units),
               "first_unit": len(units[0]) if units else 1, "helping": len(helping), "top": isolated[:5],
               "all_float_met": True, "seconds": round(time.perf_counter() - t0, 3)}
    log.info("Q/DQ pool by blocks: %d node(s), %d builds on %d probe feed(s) in %.1fs; %d unit(s) of %d node(s) "
             "isolated, %d help", len(nodes), spent, len(probes), summary["seconds"], len(units), len(isolated),
             len(helping))
    return ordered, summary


def _descend(measure, nodes: tuple[str, ...], base: tuple, budget: int, spent, together: bool
             ) -> tuple[list[tuple[str, ...]], list]:
    """The best-first descent: (units isolated, best first; the heap of blocks left). ``measure(blocks)`` scores
    blocks (lower is better), ``spent()`` counts the builds so far; ``together``: blocks measured at once cost one
    build's time, so both halves of a block are measured together."""
    blocks = _split(nodes, GROUPS)
    heap: list = [(score, seq, block) for seq, (score, block) in enumerate(zip(measure(blocks), blocks))]
    heapq.heapify(heap)
    seq = len(heap)
    units: list[tuple[str, ...]] = []  # single nodes, or blocks whose effect needs all of them, best first
    while heap and spent() < budget:
        s, _, block = heap[0]
        if s >= base:  # the best block left does not help: nothing below it will
            break
        if len(block) > 1 and spent() + 2 > budget:  # no builds left to split it: it stays with the rest
            break
        heapq.heappop(heap)
        if len(block) == 1:
            units.append(block)
            if not s[0]:  # a node that meets the target alone on the probes: the search tries it first
                break
            continue
        halves = _split(block, 2)
        if together:
            scored = list(zip(measure(halves), halves))
        else:
            first = measure(halves[:1])[0]
            if not first[0]:  # the first half alone meets the target: descend into it, the second waits unmeasured
                scored = [(first, halves[0]), (UNMEASURED, halves[1])]
            else:
                scored = [(first, halves[0]), (measure(halves[1:])[0], halves[1])]
        if min(hs for hs, _ in scored)[:2] > s[:2]:  # each half alone fails feeds the block fixes: keep it whole
            units.append(block)
            if not s[0]:  # it meets the target on the probes as a whole: the search tries it first
                break
            continue
        for hs, half in scored:
            heapq.heappush(heap, (hs, seq, half))
            seq += 1
    return units, heap


def _one_thread_engine(engine):
    """A copy of ``engine`` whose sessions run on one thread, when blocks can be measured :data:`WIDTH` at once
    (ONNX Runtime on CPU, on a machine with as many cores), else None. ONNX Runtime's CPU results do not depend on
    its thread count here (checked on the recognizer's Q/DQ model: equal to the last bit), and group testing only
    orders the pool: every set the search keeps is judged on the engine as given."""
    return one_thread_copy(engine) if (os.cpu_count() or 1) >= WIDTH else None


def _split(block: tuple[str, ...], parts: int) -> list[tuple[str, ...]]:
    return [tuple(piece) for piece in split_even(block, parts)]


def _mean_sqnr(per_feed: list[dict[str, dict]]) -> float:
    """Mean SQNR (dB, capped at 200; NaN counts as -200) of every judged output over the feeds judged."""
    values = [m.get("sqnr_db") for metrics in per_feed for m in metrics.values()]
    values = [min(200.0, float(v)) if v is not None and not math.isnan(float(v)) else -200.0 for v in values]
    return sum(values) / len(values) if values else 0.0
