"""Q/DQ candidates: the repair pool ordered by what dequantizing each node alone does to the target.

A culprit's own error (the node run alone) says where INT8 error appears, not which Q/DQ pair the task needs
removed: after a poor calibration every node adds error, and the outputs may turn on a pair the culprit list
never names. So for a Q/DQ candidate the pool is widened to every compute node that touches a Q/DQ pair
(culprits first, up to :data:`QDQ_POOL`), each one's removal is measured alone against the repair target
(the task metric or the output criterion) in ONE switchable session (:meth:`IslandBuilder.switchable`: each
node's float twin beside it, a boolean input per node; one build), on the feeds that fail the target as the
candidate stands (the worst :data:`FEEDS`, chosen from the candidate's own evaluation: a run per node and such
feed), and the pool is ordered best first: a node whose removal alone meets the target on every feed (those meeting
it there are checked on the other feeds in rank order, up to :data:`CONFIRM` of them, each until a feed misses,
until one holds on every feed), then by failing feeds, by how bad the worst is, and by the outputs' error there
(nodes that help before those that do not). The search (:mod:`workbench.repair.search`) then grows prefixes of that
order and shrinks to a 1-minimal set, building each set as the deployed model computes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from ..core.floats import decode_float
from ..errors import EngineRunError
from .graph import QDQ_OPS
from .islands import IslandBuilder, holds_subgraphs

log = logging.getLogger(__name__)

#: most nodes measured alone for a Q/DQ candidate (culprits first, then the graph's other quantized nodes)
QDQ_POOL = 512
#: feeds each node is measured on: the worst of those failing the target with nothing removed (else the first
#: one). The worst one orders the pool as well as three or eight on the models measured (the BERT-like encoder:
#: the byte-identical repaired model, ordering 8.1 s -> 3.2 s; the classifier's bad calibrations fail one or two);
#: nodes meeting the target alone there are still checked on every feed (:data:`CONFIRM`)
FEEDS = 1
#: most nodes meeting the target alone on those feeds that are checked on the other feeds (the first that holds on
#: every feed goes first)
CONFIRM = 32


def quantized_nodes(builder: IslandBuilder) -> list[str]:
    """Named top-level compute nodes of the candidate that read a DequantizeLinear output or feed a
    QuantizeLinear, in graph order; the builder's own ``units`` where it has them (in TensorRT's placement, the
    readers of activation pairs: :func:`workbench.repair.qdq_placement.pair_readers`)."""
    if builder.units is not None:
        return list(builder.units)
    idx = builder.idx
    out = []
    for node in idx.nodes:
        if not node.name or node.op_type in QDQ_OPS or node.op_type == "Constant" or node.name in idx.sub_names \
                or holds_subgraphs(node):
            continue  # a Constant computes nothing to keep in float (its reader is the node to keep)
        reads = any((p := idx.producer.get(i)) is not None and p.op_type == "DequantizeLinear" for i in node.input)
        writes = any(c.op_type == "QuantizeLinear" for o in node.output if o for c in idx.consumers.get(o, []))
        if reads or writes:
            out.append(node.name)
    return out


def measured_pool_only(plan, notes: list[str]) -> bool:
    """For a Q/DQ candidate, skip the comparison's culprit isolation and impact (``plan.options.culprits`` off) and
    compare the outputs alone: :func:`order_pool` (or :mod:`workbench.repair.qdq_groups`) measures every quantized
    node's removal against the target itself. True when skipped."""
    if not plan.options.culprits or not any(n.op_type in QDQ_OPS for n in plan.cand_model.graph.node):
        return False
    plan.options = plan.options.replace(culprits=False)
    outputs = set(plan.ref_graph.outputs)
    plan.pairs = [p for p in plan.pairs if p.tensor in outputs]  # nothing reads the other tensors' errors
    notes.append("Q/DQ candidate: the pool is every quantized node, each one's Q/DQ removal measured against the "
                 "target (no culprit isolation)")
    return True


def order_pool(ev, builder: IslandBuilder, pool: Sequence[str], baseline, notes: list[str],
               limit: int = QDQ_POOL) -> tuple[list[str], dict]:
    """(pool ordered by single-node effect, a summary for the result). ``ev``: the repair's Evaluator (its
    feeds, reference outputs, target and judge); ``baseline``: its evaluation with nothing kept."""
    known = set(builder.idx.by_name)
    nodes = [n for n in dict.fromkeys([*pool, *quantized_nodes(builder)]) if n in known]
    nodes = [n for n in nodes if builder.idx.by_name[n].op_type not in QDQ_OPS][:limit]
    if not nodes:
        return list(pool), {}
    t0 = time.perf_counter()
    plan = ev.plan
    try:
        model, flags = builder.switchable(nodes)
        session, width = _measuring_session(plan.cand_engine, model, [c for _, c in ev.outputs])
    except EngineRunError as e:
        notes.append(f"Q/DQ pool not measured node by node: the candidate engine refused the switchable model ({e})")
        log.warning("Q/DQ single-node ordering skipped: %s", e)
        return list(pool), {}
    ev.builds_by_role["ranking"] = ev.builds_by_role.get("ranking", 0) + 1
    off = {f: np.array(False) for f in flags.values()}
    feeds = plan.cand_feeds
    judged = {}
    runs = checks = None  # the runs side by side: ended before their session
    try:
        crit = ev.target.criterion

        def outputs_badness(j) -> float:
            return max((crit.badness({crit.metric: decode_float(o.get(crit.metric))}) for o in j.outputs.values()),
                       default=0.0)

        alone = _per_feed(ev, baseline, len(feeds))  # the candidate as it stands, judged feed by feed
        if alone is None:  # not judged on every feed: run them here
            alone = [_judge(ev, [i], [session.run({**cfeed, **off})]) for i, cfeed in enumerate(feeds)]
        worst_first = sorted((i for i, j in enumerate(alone) if not j.met),
                             key=lambda i: (-alone[i].badness, -outputs_badness(alone[i])))
        chosen = sorted((worst_first or list(range(len(feeds))))[:FEEDS])
        base = _judge(ev, chosen, [session.run({**feeds[i], **off}) for i in chosen])

        def alone_on(node: str, i: int) -> dict:  # the outputs of feed i with only ``node`` dequantized
            return session.run({**feeds[i], **off, flags[node]: np.array(True)})

        runs = _in_order(width, [(node, i) for node in nodes for i in chosen], alone_on)
        for k, node in enumerate(nodes):
            if ev.step is not None and k % 16 == 0:
                ev.step(0.0, f"Q/DQ removal measured alone: node {k + 1}/{len(nodes)}")
            judged[node] = _judge(ev, chosen, [next(runs) for _ in chosen])

        def score(j):  # met first, then fewer failing feeds, a better worst value, better outputs
            return (not j.met, j.failing, j.badness, outputs_badness(j))

        ranked = sorted(nodes, key=lambda n: score(judged[n]))
        # meeting the target there alone: checked on the other feeds (a fix may break another feed), those failing
        # as the candidate stands first, each node until a feed misses; the first that holds on every feed leads
        others = [i for i in worst_first if i not in chosen] + \
            [i for i in range(len(feeds)) if i not in chosen and i not in worst_first]
        confirmed = []
        for node in [n for n in ranked if judged[n].met][:CONFIRM]:
            checks = _in_order(width, [(node, i) for i in others], alone_on)  # up to the first feed missed
            if all(_judge(ev, [i], [next(checks)]).met for i in others):
                confirmed.append(node)
                break
            checks.close()  # the feeds past the first missed: not run
    finally:
        for pending in (runs, checks):
            if pending is not None:
                pending.close()
        session.close()
    ranked = confirmed + [n for n in ranked if n not in set(confirmed)]
    helping = [n for n in ranked if score(judged[n]) < score(base)]
    ordered = helping + [n for n in ranked if n not in set(helping)]
    summary = {"feeds": len(chosen), "measured": len(nodes), "helping": len(helping),
               "met_there": sum(judged[n].met for n in nodes), "holds": confirmed[0] if confirmed else None,
               "seconds": round(time.perf_counter() - t0, 3),
               "top": helping[:5]}
    log.info("Q/DQ pool: %d node(s) measured alone in %.1fs; %d help, %d meet the target alone there (%s holds on "
             "every feed)", len(nodes), summary["seconds"], len(helping), summary["met_there"], summary["holds"])
    return ordered, summary


#: most runs of the switchable model side by side (ONNX Runtime on CPU, one intra-op thread each)
MEASURE_WIDTH = 4


def _measuring_session(engine, model, outputs: list[str]):
    """(a session of the switchable ``model``, how many of its runs may go side by side). ONNX Runtime on CPU, with
    cores to spare: a session of one intra-op thread run from several threads at once, as many as the engine's
    threads (all cores when not set; never more than :data:`MEASURE_WIDTH`): ONNX Runtime's own thread pool spends
    more than it gains on one small model's runs (PP-OCRv5 recognizer's switchable model on 2 cores: 16.5 ms a run
    with two intra-op threads, 13.7 ms two single-threaded runs at a time). Else the engine's own session, one run at
    a time."""
    from ..dataset.executors import usable_cores

    single = one_thread_copy(engine)
    width = min(MEASURE_WIDTH, engine.threads or usable_cores()) if single is not None else 1
    if width >= 2:
        return single.prepare(model, outputs), width
    return engine.prepare(model, outputs), 1


def one_thread_copy(engine):
    """A copy of ``engine`` whose sessions run on one intra-op thread, for ONNX Runtime on CPU (else None): what
    measures runs side by side here and in :mod:`workbench.repair.qdq_groups`."""
    import copy

    from ..engines.ort import OrtEngine

    if not isinstance(engine, OrtEngine) or engine.provider != "cpu":
        return None
    single = copy.copy(engine)
    single.threads = 1
    return single


def _in_order(width: int, items: list, fn):
    """``fn(*item)`` for each of ``items``, in order: run ``width`` at a time on threads (at most ``2 * width``
    results waiting), or one by one here when ``width`` is 1. Closing the generator stops what has not started."""
    if width < 2:
        yield from (fn(*item) for item in items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="workbench-qdq-order")
    pending, todo = deque(), iter(items)
    try:
        for item in todo:
            pending.append(pool.submit(fn, *item))
            if len(pending) >= 2 * width:
                break
        while pending:
            result = pending.popleft().result()
            for item in todo:  # one more started for each one taken
                pending.append(pool.submit(fn, *item))
                break
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _per_feed(ev, evaluation, count: int):
    """``evaluation``'s judgement of each feed alone (from its per-feed metrics and task values), or None when it did
    not run every one of ``count`` feeds."""
    if sorted(evaluation.feed_met) != list(range(count)):
        return None
    values = evaluation.values or [None] * count
    return [ev.target.judge([metrics], None if ev.target.metric is None else [value])
            for metrics, value in zip(evaluation.per_feed, values)]


def _judge(ev, indices: list[int], results: list[dict]):
    """The target's judgement of ``results`` (candidate outputs of the feeds at ``indices``), as the Evaluator
    judges a set on those feeds."""
    return ev.judge_feeds(dict(zip(indices, results))).judgement
