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
    :func:`auto_selection`). The candidate runs the same variant compare() made (same keep_fp32/calibration).
    Tensors that cannot be produced (inside an inlined If branch, custom engines) are skipped with a log line."""
    from ..compare.api import make_engine
    from ..engines.spec import EngineSpec
    from ..inputs import feeds_from
    from ..model.load import load_model
    from ..variants import make_variant

    opts = result.run_options or {}
    names = auto_selection(result) if isinstance(names, str) and names == "auto" else list(names)
    if not names:
        return {}
    if opts.get("custom_engines"):
        log.info("tensor values not captured: the comparison used a custom engine instance")
        return {}
    model = model if model is not None else (opts.get("model") or result.model.get("path"))
    feed_list = feeds_from(feeds) if feeds is not None else (result.used_feeds or [])
    if model is None or not feed_list:
        log.info("tensor values not captured: the model or the feeds are unknown")
        return {}
    loaded = load_model(model)
    feed = feed_list[min(feed_index, len(feed_list) - 1)]
    ref_spec, cand_spec = EngineSpec.parse(result.reference), EngineSpec.parse(result.candidate)
    calib = opts.get("calibration_feeds") or feed_list
    keep = opts.get("keep_fp32") or ()

    def variant_of(spec: EngineSpec):
        if spec.variant == "fp32":
            return loaded.proto
        return make_variant(loaded.proto, spec.variant, calibration_feeds=calib, keep_fp32=keep).model

    cand_source = cand_model if cand_model is not None else opts.get("cand_model")
    cand_proto = load_model(cand_source).proto if cand_source is not None else variant_of(cand_spec)
    ref_proto = variant_of(ref_spec)
    engine_options = opts.get("engine_options") or {}
    by_name = {t.tensor: t for t in result.tensors}
    wanted = [n for n in names if n in by_name]
    for n in set(names) - set(wanted):
        log.info("tensor %s was not compared; not captured", n)
    ref_values = _run(make_engine(ref_spec, options=engine_options.get(ref_spec.engine)), ref_proto, wanted, feed)
    cand_names = {n: by_name[n].candidate_tensor or n for n in wanted}
    cand_feed = _cast(cand_proto, feed)
    cand_values = _run(make_engine(cand_spec, options=engine_options.get(cand_spec.engine)), cand_proto,
                       list(cand_names.values()), cand_feed)
    out: TensorValues = {}
    for n in wanted:
        ref, cand = ref_values.get(n), cand_values.get(cand_names[n])
        if ref is None or cand is None:
            log.info("tensor %s not produced by both engines; not captured", n)
            continue
        out[n] = (np.asarray(ref), np.asarray(cand))
    return out


def _cast(proto, feed: dict) -> dict:
    from onnx import helper

    dtypes = {vi.name: np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
              for vi in proto.graph.input if vi.type.tensor_type.elem_type}
    return {k: (v.astype(dtypes[k]) if k in dtypes and v.dtype != dtypes[k] else v) for k, v in feed.items()
            if k in dtypes or not dtypes}


def _run(engine, proto, names: list[str], feed: dict) -> dict[str, np.ndarray]:
    from ..errors import WorkbenchError

    inputs = {vi.name for vi in proto.graph.input}
    values = {n: feed[n] for n in names if n in inputs and n in feed}
    marked = [n for n in names if n not in inputs]
    if not marked:
        return values
    produced = {o for node in proto.graph.node for o in node.output}
    marked = [n for n in marked if n in produced]
    if not marked:
        return values
    try:
        with engine.prepare(proto, marked) as session:
            values.update(session.run(feed))
    except WorkbenchError as e:
        log.warning("could not capture tensor values: %s", e)
    return values


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
