"""Reference and candidate values of a few selected tensors, for bundles and report histograms."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..compare.result import CompareResult

log = logging.getLogger(__name__)

#: name -> (reference values, candidate values)
TensorValues = dict[str, tuple[np.ndarray, np.ndarray]]


def auto_selection(result: CompareResult, limit: int = 3) -> list[str]:
    """The tensors worth a look: the first divergent one, the worst culprit's output, the first graph output."""
    names: list[str] = []
    first = result.first_divergent
    if first is not None:
        names.append(first.tensor)
    if result.culprits:
        names.append(result.culprits[0].tensor)
    compared = {t.tensor for t in result.tensors}
    names += [o for o in result.outputs if o in compared][:1]
    return list(dict.fromkeys(names))[:limit]


def capture_tensors(result: CompareResult, names: Sequence[str] | str, model: Any = None, feeds: Any = None, *,
                    cand_model: Any = None, feed_index: int = 0) -> TensorValues:
    """Run both sides once more (feed ``feed_index``) and return the values of ``names`` ("auto": see
    :func:`auto_selection`), through the comparison's own plan (same variant, candidate naming, marked tensors).
    Tensors that cannot be produced (inside an inlined If branch, custom engines) are skipped with a log line."""
    from ..errors import WorkbenchError
    from ..inspect_tensor import TensorProbe, probe_for

    opts = result.run_options or {}
    names = auto_selection(result) if isinstance(names, str) and names == "auto" else list(names)
    if not names:
        return {}
    plan = getattr(result, "plan", None)
    if opts.get("custom_engines") and plan is None:
        log.info("tensor values not captured: the comparison used a custom engine instance")
        return {}
    by_name = {t.tensor: t for t in result.tensors}
    wanted = [n for n in names if n in by_name]
    for n in set(names) - set(wanted):
        log.info("tensor %s was not compared; not captured", n)
    try:
        if plan is not None and model is None and feeds is None and cand_model is None:
            probe = probe_for(result)
        else:
            from ..inputs import feeds_from

            model = model if model is not None else (opts.get("model") or result.model.get("path"))
            feed_list = feeds_from(feeds) if feeds is not None else (result.used_feeds or [])
            if model is None or not feed_list:
                log.info("tensor values not captured: the model or the feeds are unknown")
                return {}
            options = opts.get("options")
            extra = {"options": options} if options is not None else {
                k: opts[k] for k in ("keep_fp32", "calibration_feeds", "engine_options") if opts.get(k) is not None}
            probe = TensorProbe(model, result.reference, result.candidate, feeds=feed_list,
                                cand_model=cand_model if cand_model is not None else opts.get("cand_model"),
                                mark="one" if result.mode == "bisect" else "all", **extra)
    except WorkbenchError as e:
        log.warning("could not capture tensor values: %s", e)
        return {}
    out: TensorValues = {}
    index = min(feed_index, len(probe.feeds) - 1)
    for n in wanted:
        try:
            out[n] = probe.values(n, index)
        except WorkbenchError as e:
            log.info("tensor %s not produced by both engines (%s); not captured", n, e)
    return out


def normalize(tensors: Mapping[str, Any] | None) -> TensorValues:
    """Accept ``{name: (ref, cand)}`` or ``{name: {"reference": ref, "candidate": cand}}``."""
    out: TensorValues = {}
    for name, value in (tensors or {}).items():
        if isinstance(value, Mapping):
            out[str(name)] = (np.asarray(value["reference"]), np.asarray(value["candidate"]))
        else:
            ref, cand = value
            out[str(name)] = (np.asarray(ref), np.asarray(cand))
    return out
