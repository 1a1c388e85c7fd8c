"""Quantize a model again with the candidate's own recipe and judge it on every feed: the step the INT8 rewrites
share (:mod:`.qdq_placement`, :mod:`.qdq_fold`)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def quantize_and_judge(ev, plan, model, kept: list[str], key: str, timing: dict, **options):
    """(the candidate's variant of ``model`` made with ``options``, its evaluation as ``kept``, None), or (None,
    None, the one-line reason) when it cannot be quantized or run. ``timing[key]``: the seconds it took."""
    t0 = time.perf_counter()
    try:
        variant = plan.variant_of(model, plan.cand_spec, validate=False, **options)  # run next, on every feed
        return variant, ev.evaluate(kept, model=variant.model, role="rewrite"), None
    except Exception as e:  # noqa: BLE001 - the quantizer's (assorted) or the engine's error on the new graph
        log.info("quantizing again (%s) failed", key, exc_info=True)
        return None, None, str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    finally:
        timing[key] = round(time.perf_counter() - t0, 3)
