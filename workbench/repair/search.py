"""The search for a small set of nodes to keep in reference precision.

Pool: the culprits of the initial comparison, in their ranking (harmful first, by measured impact, then by the
error each introduces beyond its floor; harmless ones last). A culprit whose reference values exceed the
candidate format's range cannot be fixed alone -- its FP32 island would overflow when cast back -- so its
consumers follow it in the pool, as far as the values stay out of range.

Search: grow prefixes of the pool (1, 2, 4, 8, ... nodes) until the target holds, binary-search the shortest
passing prefix, then shrink it to a 1-minimal set (removing any kept node breaks the target), trying to drop
the latest-ranked nodes first and repeating until a whole pass removes nothing. A set of more than
:data:`CHUNKED` nodes is first shrunk as delta debugging does: halves, quarters, eighths, ... of it (latest-ranked
first) dropped while the target holds, so a set that is mostly superfluous costs a few builds rather than one per
node.

The search is sequential: each step depends on the last verdict. With workers it evaluates ahead, side by side,
the sets it may ask for next -- the next prefix sizes while growing, the next levels of the binary search, the next
removals of a shrink pass (assuming each fails, as most do) -- and then takes its steps exactly as serially,
reading those outcomes (:meth:`Evaluator.prefetch`). The chosen set, the evaluations and the build counts are the
serial ones; what parallelism buys is bounded by how often the lookahead guesses right.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .evaluate import BudgetExhausted, Evaluation, Evaluator

log = logging.getLogger(__name__)

#: sets larger than this are first shrunk chunk by chunk (:func:`_shrink_chunks`), then node by node
CHUNKED = 8


def candidate_pool(result, plan, known: set[str], limit: int = 64, notes: list[str] | None = None) -> list[str]:
    """Node names to try, best first (see the module docstring). ``known``: the candidate's node names."""
    notes = notes if notes is not None else []
    floors = {t.tensor: t.floor for t in result.tensors}
    pool: list[str] = []

    def add(name: str) -> None:
        if name in pool or len(pool) >= limit:
            return
        if name not in known:
            notes.append(f"culprit {name} has no node of that name in the candidate: not tried")
            return
        if name in holders:
            notes.append(f"culprit {name} ({holders[name]}) holds subgraphs: keeping it in reference "
                         "precision is not supported, so it was not tried (the repaired model keeps its control "
                         "flow; compare shows the nodes inside a branch every feed takes)")
            return
        pool.append(name)

    def overflowing(tensor: str) -> bool:
        return bool(((floors.get(tensor) or {}).get("share_over_max") or 0) > 0)

    graph = plan.ref_graph
    holders = {s.node: s.op_type for s in graph.subgraphs}  # If/Loop/Scan nodes (top level or nested)
    for c in result.culprits:
        add(c.node)
        frontier = [c.tensor] if overflowing(c.tensor) else []
        seen = set(frontier)
        while frontier and len(pool) < limit:  # keep consumers wide while the values stay out of range
            tensor = frontier.pop(0)
            for consumer in graph.consumers.get(tensor, []):
                node = graph.node(consumer)
                if node.op_type == "Constant":
                    continue
                add(consumer)
                for out in node.outputs:
                    if out and out not in seen and overflowing(out):
                        seen.add(out)
                        frontier.append(out)
    return pool


def search(ev: Evaluator, pool: Sequence[str], baseline: Evaluation, start: int = 1
           ) -> tuple[tuple[str, ...] | None, bool]:
    """(kept set, 1-minimal proven) -- the set is None when no evaluated set met the target. ``start``: the first
    prefix size grown (the pool's first nodes are known to matter only together, e.g. a block group testing kept
    whole)."""
    pool = list(pool)
    if baseline.met:
        return (), True
    if not pool:
        return None, False
    try:
        ev.use_switch(pool)
        lo, hi = 0, None  # pool[:lo] fails (or untried), pool[:hi] passes
        size = max(1, min(start, len(pool)))
        while True:
            k = min(size, len(pool))
            ev.prefetch([pool[:j] for j in _prefix_sizes(size, len(pool))][:ev.width])
            if ev.evaluate(pool[:k]).met:
                hi = k
                break
            lo = k
            if k == len(pool):
                return None, False
            size *= 2
        while hi - lo > 1:
            ev.prefetch([pool[:j] for j in _bisection(lo, hi, ev.width)])
            mid = (lo + hi) // 2
            if ev.evaluate(pool[:mid]).met:
                hi = mid
            else:
                lo = mid
        kept = list(pool[:hi])
    except BudgetExhausted:
        ev.notes.append(f"the build budget ({ev.max_builds}) ran out while growing the set")
        best = _best_met(ev)
        return (best.kept, False) if best else (None, False)
    return shrink(ev, kept, last_needed=True)


def shrink(ev: Evaluator, kept: list[str], last_needed: bool = False) -> tuple[tuple[str, ...], bool]:
    """Drop nodes while the target holds, latest-ranked first, until a full pass drops nothing (1-minimal).
    ``last_needed``: the last node is known to be needed (the prefix without it failed)."""
    try:
        if len(kept) > CHUNKED:
            kept, exhausted = _shrink_chunks(ev, kept, kept[-1] if last_needed else None)
            if exhausted:
                ev.notes.append(f"the build budget ({ev.max_builds}) ran out while shrinking chunk by chunk: the set "
                                "may not be minimal")
                return tuple(kept), False
        changed = True
        first = True
        while changed and len(kept) > 1:
            changed = False
            order = list(reversed(kept))
            if first and last_needed:
                order = order[1:]
            first = False
            for j, node in enumerate(order):
                ev.prefetch([[n for n in kept if n != m] for m in order[j:j + ev.width]])
                trial = [n for n in kept if n != node]
                if ev.evaluate(trial).met:
                    kept = trial
                    changed = True
        return tuple(kept), True
    except BudgetExhausted:
        ev.notes.append(f"the build budget ({ev.max_builds}) ran out while shrinking: the set may not be minimal")
        return tuple(kept), False


def _shrink_chunks(ev: Evaluator, kept: list[str], needed: str | None) -> tuple[list[str], bool]:
    """Delta debugging's complement step over the ranked set: cut it into 2, 4, 8, ... contiguous chunks and drop
    each chunk (latest-ranked first) whose removal keeps the target, until chunks would be single nodes. ``needed``:
    a node known to be needed (chunks holding it are not tried). (the set left, whether the budget ran out)."""
    try:
        return _chunk_passes(ev, kept, needed), False
    except BudgetExhausted as e:
        return e.args[0] if e.args else kept, True


def _chunk_passes(ev: Evaluator, kept: list[str], needed: str | None) -> list[str]:
    parts = 2
    while len(kept) > 2 * parts - 1:
        chunks = [c for c in reversed(split_even(kept, parts)) if needed not in c]
        ahead = [[n for n in kept if n not in set(c)] for c in chunks]  # what prefetch guesses: every trial fails
        removed = False
        for j, chunk in enumerate(chunks):
            trial = [n for n in kept if n not in set(chunk)]  # from the set as it stands after this pass's drops
            if not trial:
                continue
            ev.prefetch(ahead[j:j + ev.width])
            try:
                met = ev.evaluate(trial).met
            except BudgetExhausted:
                raise BudgetExhausted(kept) from None
            if met:
                kept = trial
                removed = True
        if not removed:
            parts *= 2
    return kept


def split_even(items: Sequence[str], parts: int) -> list[list[str]]:
    """``items`` cut into ``parts`` contiguous, nearly equal, non-empty pieces (fewer when there are fewer items),
    in order."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


def _prefix_sizes(size: int, n: int) -> list[int]:
    """The prefix sizes growing tries from ``size`` on: size, 2*size, ... capped at (and ending with) ``n``."""
    out = []
    while True:
        out.append(min(size, n))
        if size >= n:
            return out
        size *= 2


def _bisection(lo: int, hi: int, width: int) -> list[int]:
    """The first ``width`` midpoints the binary search of (lo, hi) may try, level by level (passing side first)."""
    out, queue = [], [(lo, hi)]
    while queue and len(out) < width:
        a, b = queue.pop(0)
        if b - a <= 1:
            continue
        mid = (a + b) // 2
        out.append(mid)
        queue += [(a, mid), (mid, b)]
    return out


def _best_met(ev: Evaluator) -> Evaluation | None:
    met = [e for e in ev.evaluations if e.met and e.how != "rewrite"]
    return min(met, key=lambda e: len(e.kept)) if met else None


def best_unmet(ev: Evaluator) -> Evaluation | None:
    """The closest miss: fewest failing (feed, output) pairs, then the least bad worst value, then fewest nodes."""
    sets = [e for e in ev.evaluations if e.how != "rewrite"]  # rewrite sets are labels, not nodes
    if not sets:
        return None
    return min(sets, key=lambda e: (e.judgement.failing, e.judgement.badness, len(e.kept)))
