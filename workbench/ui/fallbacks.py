"""Did a node of the comparison run on another execution provider than the one asked for? Said only on evidence:

1. the state's engine graph (the Engine tab) of the same model on the same engine and variant as a side of the
   comparison: its compute nodes whose provider is not the requested one (:meth:`EngineGraph.fallbacks`, from ORT's
   profiler: per node);
2. the engine's own description recorded in the result (``result.engines[side]["providers"]``: the providers
   ONNX Runtime's session registered): a session whose first provider is not the requested one fell back whole.

A GPU session that also registered the CPU provider may have placed some nodes on it; that is said as a hint to
inspect the engine, never as a fallback.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: at most this many fallen-back nodes are named
NAMED = 5


def _same_spec(a: str, b: str) -> bool:
    from ..engines.spec import EngineSpec

    try:
        x, y = EngineSpec.parse(a), EngineSpec.parse(b)
    except Exception:  # noqa: BLE001 - an unreadable spec is not evidence
        return False
    return (x.engine, x.variant) == (y.engine, y.variant)


def _same_model(graph: Any, fingerprint: str | None) -> bool:
    sha = (getattr(graph, "model", None) or {}).get("sha256")
    return not (sha and fingerprint and sha != fingerprint)


def fallback_notes(sides: dict[str, str], *, engine_graph: Any = None, engines: dict | None = None,
                   fingerprint: str | None = None) -> list[tuple[str, str]]:
    """``[(level, text)]`` for the comparison's ``sides`` (``{"reference"|"candidate": spec}``): "warn" for a
    fallback shown by the evidence, "info" for a hint. ``engine_graph``: the latest engine graph inspected (used
    for the side whose engine and variant it has, when it is of the model with ``fingerprint``); ``engines``: the
    result's recorded engine descriptions."""
    notes: list[tuple[str, str]] = []
    for side, spec in sides.items():
        graph = engine_graph if engine_graph is not None and _same_spec(engine_graph.engine, spec) \
            and _same_model(engine_graph, fingerprint) else None
        if graph is not None:
            falls = graph.fallbacks()
            if falls:
                wanted = graph.details.get("requested_provider") or graph.primary_provider
                went = sorted({n.provider for n in falls})
                named = ", ".join(f"{n.name} ({n.provider})" for n in falls[:NAMED]) + (
                    f" and {len(falls) - NAMED} more" if len(falls) > NAMED else "")
                notes.append(("warn", f"{side} {spec}: {len(falls)} node(s) fell back from {wanted} to "
                                      f"{', '.join(went)} in the engine graph inspected in the Engine tab: {named}. "
                                      "Their numbers (and their share of any divergence) are that provider's."))
            continue
        desc = (engines or {}).get(side) or {}
        note = _session_note(side, spec, desc)
        if note is not None:
            notes.append(note)
    return notes


def _session_note(side: str, spec: str, desc: dict) -> tuple[str, str] | None:
    """What an ONNX Runtime engine's recorded description shows (None: nothing, or not ONNX Runtime)."""
    from ..engines.ort import ENGINE_NAMES, PROVIDERS

    providers = desc.get("providers")
    if not isinstance(providers, list) or not providers or "onnxruntime" not in desc:
        return None
    requested = {name: PROVIDERS[p] for p, name in ENGINE_NAMES.items()}.get(str(desc.get("engine")))
    if requested is None:
        return None
    first = providers[0] if isinstance(providers[0], str) else str(providers[0])
    if first != requested:
        return ("warn", f"{side} {spec}: the session ran on {', '.join(map(str, providers))}, not {requested}: "
                        "every node fell back")
    others = [p for p in providers[1:] if p != requested]
    if others:
        return ("info", f"{side} {spec}: the session also registered {', '.join(map(str, others))}; nodes "
                        f"{requested} cannot run go there, one by one. Inspect {spec} in the Engine tab to see "
                        "which (none is known to have fallen back).")
    return None
