"""Readable CLI rendering of a :class:`~workbench.compare.result.CompareResult`."""

from __future__ import annotations

import math

from ..textfmt import table
from .result import CompareResult


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


def render(result: CompareResult, max_rows: int = 25) -> str:
    m = result.criterion.metric
    lines = [
        f"{result.model.get('name', 'model')}: {result.reference} (reference) vs {result.candidate} (candidate); "
        f"mode {result.mode}, {len(result.tensors)} tensors compared, {result.builds} candidate builds, "
        f"{result.feeds.get('count', '?')} feed(s), {result.timing.get('total_s', 0):.2f} s",
        f"criterion: {result.criterion.describe()}",
    ]
    first = result.first_divergent
    if first is None:
        lines.append("first divergent: none -- every compared tensor is within the criterion")
    else:
        lines.append(f"first divergent: {first.tensor}  (node {first.node}, {first.op_type}, topo #{first.topo_index}; "
                     f"{m} {fmt(first.metrics.get(m), m)}"
                     + (f", {first.metrics['nonfinite_mismatch']} non-finite mismatches" if
                        first.metrics.get("nonfinite_mismatch") else "") + ")")
    outs = {t.tensor: t for t in result.tensors if t.tensor in result.outputs}
    for name in result.outputs:
        t = outs.get(name)
        if t is not None:
            bad = t.metrics.get("nonfinite_mismatch") or 0
            lines.append(f"output {name}: {m} {fmt(t.metrics.get(m), m)}, cosine {fmt(t.metrics.get('cosine'))}, "
                         f"max_abs {fmt(t.metrics.get('max_abs'))}" + (f", {bad} inf/NaN where the reference is "
                                                                        "finite" if bad else "")
                         + f" -> {'DIVERGED' if t.diverged else 'ok'}")
    if result.culprits:
        lines += ["", "culprits (error each node introduces when run alone on the candidate with reference inputs):"]
        for i, c in enumerate(result.culprits, 1):
            flag = "" if c.introduces_divergence else "  (below the criterion)"
            lines.append(f"  {i}. {c.node} ({c.op_type}): introduced {m} {fmt(c.introduced.get(m), m)}, "
                         f"non-finite {c.introduced.get('nonfinite_mismatch')}; received {m} "
                         f"{fmt(c.received.get(m), m)}{flag}")
            if c.explanation:
                lines.append(f"     {c.explanation}")
    rows = [t for t in result.tensors if t.diverged][:max_rows] if first else []
    if rows:
        lines += ["", f"diverged tensors (first {len(rows)} of {sum(t.diverged for t in result.tensors)}):", table(
            ["#", "tensor", "op_type", m, "cosine", "max_abs", "non-finite"],
            [[t.topo_index, t.tensor, t.op_type, fmt(t.metrics.get(m), m), fmt(t.metrics.get("cosine")),
              fmt(t.metrics.get("max_abs")), t.metrics.get("nonfinite_mismatch")] for t in rows])]
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
