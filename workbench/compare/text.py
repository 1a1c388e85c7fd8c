"""Readable CLI rendering of a :class:`~workbench.compare.result.CompareResult`."""

from __future__ import annotations

import math

from ..textfmt import safe_name, table
from .explain import impact_sentence
from .result import CompareResult, Culprit


def fmt(value, metric: str = "") -> str:
    """Compact number: dB with one decimal, others with 3 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "exact" if metric == "sqnr_db" and value > 0 else ("inf" if value > 0 else "-inf")
        if math.isnan(value):
            return "nan"
        return f"{value:.1f} dB" if metric == "sqnr_db" else f"{value:.3g}"
    return str(value)


def _floor(t, m: str) -> str:
    if not t.floor:
        return ""
    return f", {t.floor.get('format', '').upper()} floor {fmt(t.floor.get(m), m)}" + (" (at its floor)" if t.at_floor
                                                                                       else "")


def _impact(c: Culprit) -> str:
    said = impact_sentence(c.impact) if c.impact else ""
    if not said:
        return ""
    if c.impact.get("harmless"):
        return f"  HARMLESS: {said}"
    return f"  {'harmful: ' if c.introduces_divergence else ''}{said}"


def render(result: CompareResult, max_rows: int = 25) -> str:
    m = result.criterion.metric
    prec = result.precision or {}
    lines = [
        f"{safe_name(result.model.get('name', 'model'))}: {safe_name(result.reference)} (reference) vs "
        f"{safe_name(result.candidate)} (candidate); "
        f"mode {result.mode}, {len(result.tensors)} tensors compared, {result.builds} candidate builds, "
        f"{result.feeds.get('count', '?')} feed(s), {result.timing.get('total_s', 0):.2f} s",
    ]
    for side in ("reference", "candidate"):
        p = prec.get(side)
        if p:
            lines.append(f"{side} precision: {p['precision']} ({p.get('precision_source', '')})")
    lines.append(f"criterion: {result.criterion.describe()}")
    if result.granularity:  # fused: only the candidate engine's group boundaries were compared
        g = result.granularity
        lines.append(f"granularity: fused, the {g.get('engine')} engine's group boundaries ({g.get('compared')} "
                     f"tensors; {len(g.get('unobservable', []))} inside fused nodes or folded: JSON "
                     "granularity.unobservable)")
    verdict = result.verdict()
    lines.append(f"verdict: {'DIVERGED' if result.diverged else 'ok'} -- {verdict['reason']}")
    for t in result.output_results:
        bad = t.metrics.get("nonfinite_mismatch") or 0
        state = "DIVERGED" if t.diverged else ("ok, at its floor" if t.at_floor else "ok")
        if t.metrics.get("shape_mismatch"):
            lines.append(f"output {safe_name(t.tensor)}: shapes differ ({safe_name(t.metrics['shape_mismatch'])}): "
                         f"nothing compared -> {state}")
            continue
        lines.append(f"output {safe_name(t.tensor)}: {m} {fmt(t.metrics.get(m), m)}, "
                     f"cosine {fmt(t.metrics.get('cosine'))}, "
                     f"max_abs {fmt(t.metrics.get('max_abs'))}" + (f", {bad} inf/NaN where the reference is "
                                                                    "finite" if bad else "")
                     + _floor(t, m) + f" -> {state}")
    first = result.first_divergent
    if first is not None:
        lines.append(f"first divergent: {safe_name(first.tensor)}  (node {safe_name(first.node)}, "
                     f"{safe_name(first.op_type)}, topo #{first.topo_index}; "
                     f"{m} {fmt(first.metrics.get(m), m)}"
                     + (f", {first.metrics['nonfinite_mismatch']} non-finite mismatches" if
                        first.metrics.get("nonfinite_mismatch") else "") + _floor(first, m) + ")")
    dips = result.internal_dips
    if dips:
        at_floor = sum(t.at_floor for t in dips)
        lines.append(f"internal dips: {len(dips)} internal tensor(s) under the criterion while the outputs pass"
                     + (f" ({at_floor} at their format's floor)" if at_floor else "")
                     + ("; they fail this run (--fail-on-internal-dips)" if result.fail_on_internal_dips else
                        "; not a divergence"))
        for t in dips[:5]:
            lines.append(f"  #{t.topo_index} {safe_name(t.tensor)} ({safe_name(t.op_type)}): "
                         f"{m} {fmt(t.metrics.get(m), m)}{_floor(t, m)}")
    if result.culprits:
        lines += ["", "culprits (error each node introduces when run alone on the candidate with reference inputs; "
                  "harmful first):"]
        for i, c in enumerate(result.culprits, 1):
            flag = "" if c.introduces_divergence else "  (below the criterion)"
            beyond = f", beyond its floor {fmt(c.beyond_floor, m)}" if c.beyond_floor is not None else ""
            lines.append(f"  {i}. {safe_name(c.node)} ({safe_name(c.op_type)}): "
                         f"introduced {m} {fmt(c.introduced.get(m), m)}{beyond}, "
                         f"non-finite {c.introduced.get('nonfinite_mismatch')}; received {m} "
                         f"{fmt(c.received.get(m), m)}{flag}{_impact(c)}")
            if c.explanation:
                lines.append(f"     {c.explanation}")
    rows = [t for t in result.tensors if t.diverged][:max_rows] if first else []
    if rows:
        lines += ["", f"diverged tensors (first {len(rows)} of {sum(t.diverged for t in result.tensors)}):", table(
            ["#", "tensor", "op_type", m, "floor", "cosine", "max_abs", "non-finite"],
            [[t.topo_index, t.tensor, t.op_type, fmt(t.metrics.get(m), m), fmt((t.floor or {}).get(m), m),
              fmt(t.metrics.get("cosine")), fmt(t.metrics.get("max_abs")), t.metrics.get("nonfinite_mismatch")]
             for t in rows])]
    for note in result.notes:
        lines.append(f"note: {safe_name(note)}")
    return "\n".join(lines)
