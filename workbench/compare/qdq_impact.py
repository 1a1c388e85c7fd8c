"""Impact of culprits of a Q/DQ (INT8) candidate: what the outputs gain when that node's Q/DQ pairs are removed.

:mod:`workbench.compare.impact` patches a culprit's output with the reference's value, which for INT8 also
erases every error accumulated upstream: the later a node, the more its patch "gains", whoever caused the error.
For a Q/DQ candidate the fix a user can deploy is dequantizing that node (its inputs read in float, its float
weights restored, the pair on its output dropped: what ``workbench repair`` writes), so that is what is measured
here, for up to :data:`QDQ_IMPACT` culprits in ONE switchable session (each node's float twin beside it behind a
boolean input; :meth:`workbench.repair.islands.IslandBuilder.switchable`): a run per culprit and feed. Culprits
are then ranked by that gain (:func:`rank`).
"""

from __future__ import annotations

import logging

import numpy as np

from ..core.metrics import ErrorStats
from ..errors import EngineRunError
from .impact import impact_record, reference_groups

log = logging.getLogger(__name__)

#: most culprits whose Q/DQ removal is measured
QDQ_IMPACT = 256


def is_qdq(plan) -> bool:
    """The candidate model holds QuantizeLinear/DequantizeLinear nodes."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in plan.cand_model.graph.node)


def measure_qdq_impact(plan, culprits: list, notes: list[str], step=None, limit: int = QDQ_IMPACT) -> int:
    """Set ``impact`` on the culprits that are quantized nodes of the candidate (up to ``limit``, in order);
    returns the candidate builds used (0, or 1 per group of feeds :func:`reference_groups` makes)."""
    from ..repair.islands import IslandBuilder
    from ..repair.qdq_order import quantized_nodes

    outputs = [p for p in plan.pairs if p.tensor in set(plan.ref_graph.outputs)]
    if not outputs or not culprits:
        return 0
    builder = IslandBuilder(_in_memory(plan.cand_model), _in_memory(plan.ref_model), "qdq")
    quantized = set(quantized_nodes(builder))
    _to_producers(builder, culprits, quantized)
    chosen = [c for c in culprits if c.node in quantized][:limit]
    if not chosen:
        return 0
    names = list(dict.fromkeys(c.node for c in chosen))
    model, flags = builder.switchable(names)
    base = {o.tensor: ErrorStats() for o in outputs}
    fixed = {n: {o.tensor: ErrorStats() for o in outputs} for n in names}
    off = {f: np.array(False) for f in flags.values()}
    builds = 0
    label = f"Q/DQ removal of {len(names)} culprits"
    for group in reference_groups(plan, [o.tensor for o in outputs], step, label):
        try:  # the reference's session is closed by now: the two are never held together
            session = plan.cand_engine.prepare(model, [o.candidate for o in outputs])
        except EngineRunError as e:
            notes.append(f"Q/DQ impact not measured: the candidate engine refused the switchable model ({e})")
            log.warning("Q/DQ impact not measured: %s", e)
            return max(1, builds)
        builds += 1
        try:
            for fi, ref in group:
                cfeed = plan.cand_feeds[fi]
                got = session.run({**cfeed, **off})
                for o in outputs:
                    base[o.tensor].update(ref[o.tensor], got[o.candidate])
                for n in names:
                    got = session.run({**cfeed, **off, flags[n]: np.array(True)})
                    for o in outputs:
                        fixed[n][o.tensor].update(ref[o.tensor], got[o.candidate])
        finally:
            session.close()
    metric = plan.criterion.metric
    before = {o: s.metrics() for o, s in base.items()}
    for c in chosen:
        c.impact = impact_record(metric, before, {o: s.metrics() for o, s in fixed[c.node].items()})
        c.impact["fixed"] = "its Q/DQ pairs removed (float inputs, float weights, float output)"
    return builds


def _to_producers(builder, culprits: list, quantized: set[str]) -> None:
    """A culprit that is a Relu/Clip the quantizer folded into its QuantizeLinear's range is not a node of the
    candidate: the node producing its tensor there is (its output renamed to the activation's), and dequantizing
    that node is the fix. Such culprits are charged to that producer (renamed; the fold said in the explanation),
    unless the producer is a culprit already."""
    names = {c.node for c in culprits}
    for c in culprits:
        if c.node in quantized or c.tensor not in builder.folded:
            continue
        producer = builder.idx.producer.get(c.tensor)
        if producer is None or producer.name not in quantized or producer.name in names:
            continue
        folded = c.node
        names.add(producer.name)
        c.node, c.op_type = producer.name, producer.op_type
        note = f"its {builder.folded[c.tensor].op_type} ({folded}) was folded into the quantizer's range"
        c.explanation = f"{note}; {c.explanation}" if c.explanation else note


def _in_memory(model):
    """``model`` with its weights in memory (compare() keeps weight-free skeletons whose weights sit in files)."""
    from ..engines.files import files_for

    files = files_for(model)
    return files.materialize(model) if files is not None else model


def rank(culprits: list, crit) -> list:
    """Measured first (harmful before harmless), by what removing the node's Q/DQ gains on the outputs; then the
    unmeasured (nodes the quantizer removed and no quantized node stands for, see :func:`_to_producers`) in the
    error-introduced order of :func:`workbench.compare.culprits.rank`. A measured node the output metric calls
    harmless still goes before an unmeasured one: a small gain on the outputs can be the class that flips back (the
    classifier's Reshape whose removal heals every crop gains 0.6 dB)."""
    from . import culprits as ranking

    base = {id(c): i for i, c in enumerate(ranking.rank(culprits, crit))}

    def key(c):
        measured = c.impact is not None and "best_gain_db" in c.impact
        gain = c.impact["best_gain_db"] if measured else 0.0
        return (not measured, c.harmless, -gain, base[id(c)])

    return sorted(culprits, key=key)
