"""``calibrate()``: histograms over calibration data, ranges by several methods, their errors, sensitivity,
representativeness against evaluation data, and an optional sweep on the model's outputs."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..core.arguments import checked
from ..core.progress import Steps
from .collect import activation_tensors, collect
from .errors import rank_sensitivity, tensor_errors
from .exceptions import CalibrationError
from .feeds import FeedStream, as_feeds
from .histogram import check_num_bins
from .methods import DEFAULT_METHOD, METHODS, RULES, check_methods, check_percentile, compute_range, needs
from .ort_rules import ENTROPY_BINS, QUANTIZED_BINS
from .report import CalibrationReport, ModelRef
from .represent import compare_histograms
from .sweep import TOP_K, run_sweep

log = logging.getLogger(__name__)

#: evaluation feeds kept with the report (and used by the sweep and the QDQ check)
SAMPLE_FEEDS = 4


@checked()
def calibrate(
    model: Any,
    data: Any,
    *,
    preprocess: str | Callable | None = None,
    methods: Sequence[str] = METHODS,
    method: str | None = None,
    percentile: float | None = None,
    num_bins: int = 2048,
    ort_entropy_bins: int = ENTROPY_BINS,
    eval_data: Any = None,
    memory_budget: str | int | None = None,
    seed: int = 0,
    input_shapes: dict[str, list[int]] | Sequence[str] | None = None,
    sweep: bool = False,
    top_k: int = TOP_K,
    progress: Callable[[float, str], None] | None = None,
    cancel: threading.Event | None = None,
) -> CalibrationReport:
    """Calibrate ``model`` (path, bytes, ModelProto, LoadedModel) on ``data`` and report.

    ``data``/``eval_data``: a dict, a list of dicts, an .npz, a Polygraphy inputs JSON, an int N for N seeded
    random feeds (``seed``; evaluation feeds use ``seed + 1``; ``input_shapes`` fixes dynamic dims), or a dataset,
    streamed one sample at a time so that memory does not grow with its size: a folder of .npz, a folder of images
    with ``preprocess`` (``module:function`` or ``file.py:function`` taking an image path), a
    :class:`~workbench.dataset.source.Dataset`, a generator or a DataLoader (see :mod:`workbench.calibrate.feeds`;
    ``preprocess`` also applies to ``eval_data``). ``methods``: the rules computed (see
    methods.py: max, entropy, percentile, mse as TensorRT/ModelOpt compute them, ort-entropy, ort-percentile
    as ONNX Runtime's quantize_static does); ``percentile``: for both percentile rules (default: each rule's
    own, 99.99 and 99.999); ``num_bins``: TensorRT's and ORT percentile's bins (2048); ``ort_entropy_bins``:
    ORT entropy's (ORT's default 128). ``method``: the rule sensitivity, representativeness and the sweep use
    (default: entropy, TensorRT's). ``sweep``: run the top-``top_k`` sweep.
    """
    from ..core.budget import parse_size
    from ..model.load import load_model

    t_start = time.perf_counter()
    methods = check_methods(methods)
    chosen = check_methods(method)[0] if method else (DEFAULT_METHOD if DEFAULT_METHOD in methods else methods[0])
    if chosen not in methods:
        methods = (*methods, chosen)
    percentile = check_percentile(percentile)
    num_bins = check_num_bins(num_bins, 128)
    ort_entropy_bins = _check_ort_bins(ort_entropy_bins)
    budget = parse_size(memory_budget)
    loaded = load_model(model)
    shapes = _shapes(input_shapes)
    feeds = resolve_feeds(loaded, data, seed, shapes, "data", preprocess, cancel)
    eval_feeds = resolve_feeds(loaded, eval_data, seed + 1, shapes, "eval_data", preprocess, cancel) \
        if eval_data is not None else None
    tensors = activation_tensors(loaded)
    if not tensors:
        raise CalibrationError("the model has no float activation tensors to calibrate")
    spans = _spans(eval_feeds is not None, sweep)
    notes: list[str] = []
    timing: dict[str, float] = {}
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in loaded.proto.graph.node)
    if qdq:
        notes.append(f"the model is quantized already ({qdq} QuantizeLinear/DequantizeLinear nodes): these are the "
                     "ranges of its dequantized tensors; calibrate its FP32 model to choose INT8 ranges")

    reads = needs(methods)
    depthwise = _depthwise_inputs(loaded.proto)
    calib = collect(loaded, feeds, tensors, num_bins=num_bins, budget=budget, trt="trt" in reads,
                    ort="ort" in reads, ort_entropy_bins=ort_entropy_bins, progress=progress, cancel=cancel,
                    span=spans["calib"], channels=list(depthwise))
    timing["collect_s"] = calib.seconds
    if calib.chunks > 1:
        notes.append(f"{len(tensors)} tensors collected in {calib.chunks} chunks to stay under the memory budget")
    tensors = [t for t in tensors if t in calib.histograms]
    hists = calib.histograms
    nonfinite = [t for t in tensors if hists[t].nonfinite]
    bad_inputs = _broken_inputs(feeds, set(nonfinite))
    if bad_inputs:  # broken data (an additive mask holds -inf, never NaN or +inf): its tensors are non-finite too
        notes.append(f"the calibration data itself holds NaN or +inf in input(s) {', '.join(bad_inputs)}: every "
                     "tensor computed from them is left out of the ranges, and the exports (TensorRT cache, ORT "
                     "table, QDQ model) are refused -- drop or fix the samples that hold them")
    if nonfinite:
        notes.append(f"{len(nonfinite)} tensor(s) hold NaN/inf ({', '.join(nonfinite[:3])}); those values are "
                     "counted apart and left out of ranges and errors, and the TensorRT cache and ORT table leave "
                     "these tensors out (an INT8 scale would clip -inf to a finite value)")
    flat = [t for t in tensors if hists[t].only_zeros]
    if flat:
        notes.append(f"{len(flat)} tensor(s) hold only zeros on the calibration data ({', '.join(flat[:3])}): no "
                     "INT8 scale can be read from them; the TensorRT cache and ORT table leave them out and the QDQ "
                     "model gives them ONNX Runtime's default scale 1 -- calibrate on data where they vary")

    t0 = time.perf_counter()
    steps = Steps(progress, cancel, *spans["ranges"])

    def per_tensor(t: str):
        b = {}
        for m in methods:  # a rule over a large histogram (entropy) takes a while: cancel is checked before each
            steps.check()
            b[m] = compute_range(m, hists[t], trt=calib.trt.get(t), ort=calib.ort.get(t), percentile=percentile)
        steps.check()
        return b, tensor_errors(hists[t], {m: max(abs(lo), abs(hi)) for m, (lo, hi) in b.items()})

    done = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)))  # numpy releases the GIL
    try:
        steps(0.0, f"ranges by {len(methods)} method(s): tensor 0/{len(tensors)}")
        for k, (t, value) in enumerate(zip(tensors, pool.map(per_tensor, tensors)), 1):
            done[t] = value
            steps(k / len(tensors), f"ranges by {len(methods)} method(s): tensor {k}/{len(tensors)}")
    finally:  # cancelled: the tensors not started are dropped, not waited for
        pool.shutdown(cancel_futures=True)
    bounds = {m: {t: done[t][0][m] for t in tensors} for m in methods}
    ranges = {m: {t: max(abs(lo), abs(hi)) for t, (lo, hi) in b.items()} for m, b in bounds.items()}
    errors = {t: done[t][1] for t in tensors}
    sensitivity = rank_sensitivity(errors, chosen, tensors)
    summary = method_summary(errors, methods, tensors)
    note = chosen_note(summary, chosen)
    if note:
        notes.append(note)
    spread = channel_spread(calib.channel_absmax, depthwise, ranges[chosen])
    wide = [r for r in spread if r["spread"] >= SPREAD_NOTE]  # widest first
    if wide:
        notes.append(f"{len(wide)} depthwise Conv input(s) hold channels whose ranges differ {SPREAD_NOTE:g}x or more "
                     f"(up to {wide[0]['spread']:.0f}x, {wide[0]['tensor']}): one INT8 scale per tensor (TensorRT's) "
                     f"leaves the narrowest channel {wide[0]['narrowest_steps']:.2g} of its 127 steps; equalize "
                     "those channels before quantizing (workbench repair --cand ort:int8 does: equalize-depthwise)")
    timing["ranges_s"] = time.perf_counter() - t0

    report = CalibrationReport(
        model=ModelRef(loaded.name, loaded.fingerprint), method=chosen, tensors=tensors, histograms=hists,
        ranges=ranges, errors=errors, sensitivity=sensitivity, trt_histograms=calib.trt, ort_histograms=calib.ort,
        bounds={m: b for m, b in bounds.items() if RULES[m].reads == "ort"}, summary=summary,
        config={"methods": list(methods), "method": chosen, "percentile": percentile, "num_bins": num_bins,
                "ort_entropy_bins": ort_entropy_bins, "ort_quantized_bins": QUANTIZED_BINS,
                "feeds": len(feeds), "eval_feeds": len(eval_feeds) if eval_feeds else 0, "seed": seed,
                "memory_budget": budget, "chunks": calib.chunks, "input_shapes": shapes or None,
                "nonfinite_inputs": bad_inputs,
                **({"data": _provenance(feeds)} if isinstance(feeds, FeedStream) else {})},
        depthwise=spread, skipped=calib.skipped, notes=notes, timing=timing, source_model=loaded,
        sample_feeds=(eval_feeds or feeds)[:SAMPLE_FEEDS], used_feeds=feeds, used_eval_feeds=eval_feeds,
    )
    if eval_feeds is not None:
        reads = needs((chosen,))
        evaluation = collect(loaded, eval_feeds, tensors, num_bins=num_bins, budget=budget, trt="trt" in reads,
                             ort="ort" in reads, ort_entropy_bins=ort_entropy_bins, progress=progress,
                             cancel=cancel, span=spans["eval"])
        timing["eval_collect_s"] = evaluation.seconds
        report.eval_histograms = evaluation.histograms
        if isinstance(eval_feeds, FeedStream):
            report.config["eval_data"] = _provenance(eval_feeds)
        eval_amax = {}
        for t, e in evaluation.histograms.items():
            steps.check()
            lo, hi = compute_range(chosen, e, trt=evaluation.trt.get(t), ort=evaluation.ort.get(t),
                                   percentile=percentile)
            eval_amax[t] = max(abs(lo), abs(hi))
        report.representativeness = compare_histograms(hists, evaluation.histograms, ranges[chosen], eval_amax)
    if sweep:
        t0 = time.perf_counter()
        top = [e.tensor for e in sensitivity if hists[e.tensor].dtype == "float32"][:max(0, int(top_k))]
        amax = {t: a for t, a in report.usable_ranges(chosen).items() if hists[t].dtype == "float32"}
        report.sweep = run_sweep(loaded.proto, amax, top, report.sample_feeds, chosen, cancel=cancel,
                                 progress=_sub(progress, spans["sweep"]))
        timing["sweep_s"] = time.perf_counter() - t0
    timing["total_s"] = time.perf_counter() - t_start
    if progress is not None:
        progress(1.0, "done")
    return report


#: a depthwise Conv input whose channels' ranges differ this much is called out in the notes
SPREAD_NOTE = 16.0


def _depthwise_inputs(model) -> dict[str, list[str]]:
    """{tensor: the depthwise Convs reading it} (:func:`workbench.variants.equalize.depthwise_convs`)."""
    from ..variants.equalize import depthwise_convs

    out: dict[str, list[str]] = {}
    for conv in depthwise_convs(model):
        out.setdefault(conv.input[0], []).append(conv.name)
    return out


def channel_spread(absmax: dict, readers: dict[str, list[str]], amax: dict[str, float]) -> list[dict]:
    """Per depthwise Conv input, widest spread first: its channels, how far apart their largest magnitudes are
    (widest / narrowest channel that is not all zeros), and how many of the 127 INT8 steps of one per-tensor scale
    (``amax``: the ranking rule's) the narrowest channel spans."""
    from ..variants.equalize import live_channels

    rows = []
    for tensor, top in absmax.items():
        if top is None or tensor not in amax or not amax[tensor] > 0:
            continue
        live = top[live_channels(top)]
        if live.size < 2:
            continue
        rows.append({"tensor": tensor, "convs": readers.get(tensor, []), "channels": int(top.size),
                     "spread": float(live.max() / live.min()),
                     "narrowest_steps": float(127 * live.min() / amax[tensor])})
    return sorted(rows, key=lambda r: -r["spread"])


def method_summary(errors: dict, methods, tensors: list[str]) -> dict[str, dict]:
    """Per rule: its label, the median worst-case SQNR over tensors, and on how many tensors it does best."""
    best: dict[str, int] = dict.fromkeys(methods, 0)
    for t in tensors:
        by = errors.get(t, {})
        if by:
            best[max(by, key=lambda m: by[m].worst_sqnr_db)] += 1
    out = {}
    for m in methods:
        values = np.array([errors[t][m].worst_sqnr_db for t in tensors if m in errors.get(t, {})], dtype=float)
        values = values[np.isfinite(values)]
        out[m] = {"rule": RULES[m].label, "toolchain": RULES[m].toolchain,
                  "median_worst_sqnr_db": float(np.median(values)) if values.size else None,
                  "tensors_best": best[m]}
    return out


#: the chosen rule is called out when another keeps this many dB more SQNR at the median tensor
NOTE_DB = 6.0


def chosen_note(summary: dict[str, dict], chosen: str) -> str | None:
    """A note when another rule beats ``chosen`` by NOTE_DB or more at the median tensor."""
    scored = {m: s["median_worst_sqnr_db"] for m, s in summary.items() if s["median_worst_sqnr_db"] is not None}
    if chosen not in scored or len(scored) < 2:
        return None
    best = max(scored, key=scored.get)
    gap = scored[best] - scored[chosen]
    if gap < NOTE_DB:
        return None
    return (f"'{chosen}' ({RULES[chosen].label}) ranks the tensors, but '{best}' keeps {gap:.1f} dB more "
            f"worst-case SQNR at the median tensor ({scored[best]:.1f} vs {scored[chosen]:.1f} dB): "
            f"consider method='{best}' (--method {best}) if your toolchain can use its ranges")


def resolve_feeds(loaded, data: Any, seed: int, shapes: dict | None, what: str,
                  preprocess: str | Callable | None = None,
                  cancel: threading.Event | None = None) -> list[dict[str, np.ndarray]] | FeedStream:
    """Checked feeds from ``data`` (see :func:`calibrate`): a list, or a :class:`FeedStream` for datasets (whose
    passes ``cancel`` ends even while a sample's preprocessing blocks)."""
    from ..inputs import random_feeds

    if isinstance(data, bool) or data is None:
        raise CalibrationError(f"{what}: give feeds or a number of random feeds, not {data!r}")
    if isinstance(data, (int, np.integer)):
        if data < 1:
            raise CalibrationError(f"{what}: {data} random feeds is not a positive number", "give N >= 1")
        if preprocess is not None and what == "data":
            raise CalibrationError(f"preprocess applies to a dataset, not to {data} random feeds",
                                   "pass a folder of images (or an iterable) as data, or drop preprocess")
        return random_feeds(loaded.proto, seed=seed, count=int(data), shapes=shapes)
    return as_feeds(loaded, data, preprocess=preprocess, what=what, cancel=cancel)


def _provenance(stream: FeedStream) -> dict:
    """Where a streamed dataset came from and a hash of its samples' content hashes, in order."""
    return {**stream.describe, "count": len(stream), "sha256": stream.digest}


def _check_ort_bins(n) -> int:
    n = int(n)
    if not QUANTIZED_BINS <= n <= 1 << 16:
        raise CalibrationError(f"ort_entropy_bins {n} is outside [{QUANTIZED_BINS}, 65536]",
                               "use ORT's default 128, or e.g. 2048")
    return n


def _shapes(input_shapes) -> dict[str, list[int]] | None:
    if not input_shapes:
        return None
    if isinstance(input_shapes, dict):
        return {str(k): [int(d) for d in v] for k, v in input_shapes.items()}
    from ..inputs import parse_shape_overrides

    return parse_shape_overrides(input_shapes)


def _spans(has_eval: bool, has_sweep: bool) -> dict[str, tuple[float, float]]:
    # ranges: every method over every tensor's histogram (entropy rules search thresholds): a phase of its own
    weights = {"calib": 1.0, "ranges": 0.4, "eval": 0.6 if has_eval else 0.0, "sweep": 0.6 if has_sweep else 0.0}
    total, start, out = sum(weights.values()), 0.0, {}
    for name, w in weights.items():
        out[name] = (start / total, (start + w) / total)
        start += w
    return out


def _sub(progress, span: tuple[float, float]):
    if progress is None:
        return None
    return lambda fraction, message: progress(span[0] + (span[1] - span[0]) * fraction, message)


def _broken_inputs(feeds: Any, nonfinite: set[str]) -> list[str]:
    """Inputs (of those holding non-finite values) where a feed held NaN or +inf: broken data, unlike the -inf of
    an additive attention mask. Feeds streamed from a dataset are not read again: none."""
    if not isinstance(feeds, list) or not nonfinite:
        return []
    out: set[str] = set()
    for feed in feeds:
        for name, value in feed.items():
            a = np.asarray(value)
            if name in nonfinite and a.dtype.kind == "f" and (np.isnan(a).any() or np.isposinf(a).any()):
                out.add(name)
    return sorted(out)
