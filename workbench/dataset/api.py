"""``compare_dataset()``: drift over a dataset, sample by sample, judged by task metrics, on any executor.

The setup is the single comparison's :class:`~workbench.compare.plan.ComparisonPlan` (variant, pairs, criterion,
floors), built on the first sample (and the first ``calibration_count`` samples as INT8 calibration data unless
``calibration`` is given). Samples then stream through :func:`~workbench.dataset.executors.run_samples`; the
caller's process computes the task metrics and the aggregates, so workers only run engines.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..compare.plan import ComparisonPlan
from ..core import arguments
from ..core.progress import Progress, Steps
from ..core.scratch import temporary_dir
from ..errors import InputError
from .evaluate import Evaluator, Job, ModelRef
from .executors import ExecutorSpec, run_samples, worker_threads
from .metrics import TaskMetric, parse_metric
from .result import DatasetResult, LayerInfo, LayerStats, task_summary
from .source import Dataset, Prefetch, Sample, checked, open_dataset
from .task_target import TaskTarget, number_text

log = logging.getLogger(__name__)

CHUNK = 4  # samples per task sent to a worker
#: built-in metrics whose value 1 means the candidate gave the reference's answer (the class, the decoded text)
ANSWERS = ("top1", "ctc")
WORST_LAYERS = 5  # per worst sample: its worst layers


@arguments.checked()
def compare_dataset(
    model: Any,
    reference: str = "ort",
    candidate: str = "ort:fp16",
    inputs: Any = None,
    *,
    preprocess: str | Callable | None = None,
    metrics: Any = (),
    workers: int = 1,
    executor: str | None = None,
    cand_model: Any = None,
    calibration: Any = None,
    calibration_count: int = 16,
    worst: int = 5,
    layers: bool = True,
    task_target: str | TaskTarget | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    **options: Any,
) -> DatasetResult:
    """Compare ``reference`` and ``candidate`` on every sample of ``inputs`` (a folder of .npz, a folder of images
    with ``preprocess``, or a Python iterable / generator / DataLoader of feeds).

    ``metrics``: task metrics (``top1``, ``topk:K``, ``ctc``, ``mask_iou:T``, ``module:function``, or a
    callable ``fn(ref_outputs, cand_outputs) -> {name: number}``). ``workers``/``executor``: serial (default),
    ``workers=N`` local processes, ``executor="ray"`` (local Ray) or ``"ray://HOST:PORT"``; every executor gives
    the same per-sample results in the same order. ``layers``: also compare every paired layer per sample (per-layer
    statistics, first divergence); False compares the graph outputs only. ``task_target``: judge the run by a task
    metric (``"ctc>=1"``: every sample; ``"mean top1>=0.95"``: the mean; see :mod:`.task_target`) instead of the
    outputs' criterion. ``options``: comparison options
    (``criterion``, ``memory_budget``, ``keep_fp32``, ``engine_options``, ...).
    """
    t0 = time.perf_counter()
    steps = Steps(progress, cancel)
    spec = ExecutorSpec.parse(executor, workers)
    listed = metrics if isinstance(metrics, (list, tuple)) else [metrics]
    task_metrics = [_metric(m) for m in (dict.fromkeys(listed) if all(isinstance(m, str) for m in listed)
                                         else listed)]  # the same name twice counts once
    target = task_target if isinstance(task_target, TaskTarget) or task_target is None \
        else TaskTarget.parse(task_target)
    if target is not None and not task_metrics:
        raise InputError("a task target needs a task metric", "pass --metric (e.g. ctc, top1, mask_iou) with "
                         "--target, or drop --target to judge the outputs")
    if isinstance(worst, bool) or not isinstance(worst, int) or worst < 0:
        raise InputError(f"worst must be a whole number >= 0, not {worst!r}")
    if isinstance(calibration_count, bool) or not isinstance(calibration_count, int) or calibration_count < 1:
        raise InputError(f"calibration_count must be a whole number >= 1, not {calibration_count!r}")
    if inputs is None:
        raise InputError("no dataset given", "pass a folder of .npz, a folder of images with a preprocess "
                         "function, or an iterable of feed dicts")
    from ..model.load import LoadedModel, load_model

    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    names = [i.name for i in loaded.proto.graph.input
             if i.name not in {t.name for t in loaded.proto.graph.initializer}]
    dataset = open_dataset(inputs, preprocess=preprocess, input_names=names)
    overrides = {k: v for k, v in options.items() if v is not None}
    overrides.update(culprits=False, impact=0)
    calibrates = calibration is None and "calibration_feeds" not in overrides and \
        (_int8(reference) or (cand_model is None and _int8(candidate)))
    reader = Prefetch(dataset, steps.check)  # reads ahead; Cancel works while a sample's preprocessing blocks
    try:
        stream = iter(reader)
        head = _head(stream, loaded.proto, calibration_count if calibrates else 1, overrides.get("memory_budget"))
        steps(0.0, f"preparing {reference} and {candidate}")
        if calibrates:
            overrides["calibration_feeds"] = [s.feed for s in head]
        elif calibration is not None:
            overrides["calibration_feeds"] = calibration
        notes: list[str] = [spec.note] if spec.note else []
        return _compare(loaded, reference, candidate, head, stream, dataset, cand_model, calibration, overrides,
                        spec, task_metrics, target, notes, steps, layers, worst, t0, run_options={
                            "dataset": dataset, "inputs": inputs, "preprocess": preprocess, "model": model,
                            "metrics": [m.spec for m in task_metrics], "cand_model": cand_model, "layers": layers,
                            "worst": worst, "calibration_count": calibration_count,
                            "explicit_calibration": calibration is not None,
                            "task_target": None if target is None else target.to_json()})
    finally:
        reader.close()


def _compare(loaded, reference, candidate, head, stream, dataset, cand_model, calibration, overrides, spec,
             task_metrics, target, notes, steps, layers, worst, t0, run_options) -> DatasetResult:
    plan = ComparisonPlan(loaded, reference, candidate, feeds=[head[0].feed], cand_model=cand_model, **overrides)
    try:
        if plan.cand_spec.variant == "int8" and calibration is None and cand_model is None:
            notes.append(f"INT8 calibrated on the first {len(head)} sample(s) of the dataset (pass calibration= / "
                         "--calib for separate calibration data)")
        notes += plan.notes
        if layers and getattr(plan.cand_engine, "marks_all_cheaply", True):
            notes.append("the outputs' metrics are those of the runs that mark every tensor (ONNX Runtime then fuses "
                         "less than as deployed, which can move an output's last bits): --no-layers compares the "
                         "outputs as deployed")
        job, layer_infos = _job(plan, head[0].feed, layers, spec, notes)
        with temporary_dir("workbench-dataset-") as tmp:
            if spec.kind != "serial":
                job = _with_files(job, plan, tmp)
            local = None
            if spec.kind == "serial":
                ev = Evaluator(job, engines=(plan.ref_engine, plan.cand_engine),
                               models=(plan.ref_model, plan.cand_model))
                local = lambda chunk: [ev.evaluate(i, f) for i, f in chunk]  # noqa: E731
            else:
                ev = None
            try:
                result = _collect(plan, job, layer_infos, dataset, head, stream, loaded, spec, steps, local,
                                  task_metrics, target, notes, worst)
            finally:
                if ev is not None:
                    ev.close()
        result.timing = {"total_s": round(time.perf_counter() - t0, 4),
                         "samples_per_s": round(len(result.samples) / max(time.perf_counter() - t0, 1e-9), 3)}
        result.run_options = dict(run_options, options=plan.options)
        steps(1.0, "done")
        return result
    finally:
        plan.close()


def _int8(spec: Any) -> bool:
    """Whether ``spec`` is an INT8 variant (calibrated on the dataset's first samples)."""
    from ..engines.spec import EngineSpec
    from ..errors import WorkbenchError

    try:
        return EngineSpec.parse(str(spec)).variant == "int8"
    except WorkbenchError:
        return False  # the plan says what is wrong with the spec


def _head(stream: Iterator[Sample], proto, count: int, memory_budget: Any) -> list[Sample]:
    """The first ``count`` samples, checked, held in memory together (INT8 calibration): refused once they need
    more than the memory budget."""
    from ..core.budget import default_budget, parse_size

    budget = parse_size(memory_budget) if memory_budget is not None else default_budget()
    head: list[Sample] = []
    held = 0
    for s in itertools.islice(stream, count):
        s.feed = checked(proto, s)
        head.append(s)
        held += sum(a.nbytes for a in s.feed.values())
        if held > budget:
            raise InputError(f"INT8 calibration on the first {count} samples holds them in memory: {len(head)} "
                             f"already need {held / 2**20:.0f} MiB, over the {budget / 2**20:.0f} MiB memory budget",
                             "calibrate on fewer samples (calibration_count=...), pass calibration=... data, or "
                             "raise --memory-budget")
    if not head:
        raise InputError("the dataset holds no samples", "check the folder or the iterable")
    return head


def _metric(m: Any) -> TaskMetric:
    if isinstance(m, TaskMetric):
        return m
    if isinstance(m, str):
        return parse_metric(m)
    if callable(m):
        name = getattr(m, "__name__", "metric")
        return TaskMetric(name, m, set(getattr(m, "lower_is_better", ()) or ()), builtin=False)
    raise InputError(f"cannot use a {type(m).__name__} as a metric", "pass a name (top1, ctc, ...), "
                     "module:function or a function")


def _job(plan: ComparisonPlan, feed: dict, layers: bool, spec: ExecutorSpec, notes: list[str]):
    from ..core.budget import default_budget, parse_size, tensor_bytes

    outputs = [o for o in plan.ref_graph.outputs if o in plan.pair_by_tensor]
    pairs = list(plan.pairs) if layers else [plan.pair_by_tensor[o] for o in outputs]
    if layers:
        budget = parse_size(plan.options.memory_budget) if plan.options.memory_budget is not None \
            else default_budget()
        sizes = tensor_bytes(plan.ref_model, feed)
        held = sum(sizes.get(p.tensor) or 0 for p in pairs) * 3 * max(1, spec.workers)
        if held > budget:
            pairs = [plan.pair_by_tensor[o] for o in outputs]
            notes.append(f"every layer of one sample needs ~{held / 2**20:.0f} MiB (both sides, all workers), over "
                         "the memory budget: compared the graph outputs only (raise --memory-budget for layers)")
    threads = {}
    if spec.kind != "serial":
        threads = {"threads": worker_threads(spec.workers)}
    ref_opts = _plain(plan.engine_options.get(plan.ref_spec.engine)) | (threads if plan.ref_spec.engine == "ort"
                                                                         else {})
    cand_opts = _plain(plan.engine_options.get(plan.cand_spec.engine)) | (threads if plan.cand_spec.engine == "ort"
                                                                           else {})
    if plan.ref_spec.engine == "ref" and plan.ref_spec.variant != "fp32":
        ref_opts.setdefault("precision", "native")
    if plan.cand_spec.engine == "ref" and plan.cand_spec.variant != "fp32":
        cand_opts.setdefault("precision", "native")
    job = Job(key=uuid.uuid4().hex, ref_engine=plan.ref_spec.engine, cand_engine=plan.cand_spec.engine,
              ref_model=ModelRef(), cand_model=ModelRef(), tensors=[p.tensor for p in pairs],
              cand_names=[p.candidate for p in pairs], outputs=outputs, criterion=plan.criterion,
              formats={p.tensor: plan.formats[p.tensor] for p in pairs if p.tensor in plan.formats},
              ref_options=ref_opts, cand_options=cand_opts)
    infos = [LayerInfo(p.tensor, p.node, p.op_type, p.topo_index) for p in pairs]
    return job, infos


def _plain(options: dict | None) -> dict:
    """Engine options a worker process can receive (JSON-like values only)."""
    import json

    out = {}
    for k, v in (options or {}).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def _with_files(job: Job, plan: ComparisonPlan, folder: str) -> Job:
    """The job with each side's model written once to ``folder`` for the workers to load."""
    from dataclasses import replace

    import onnx

    from ..model.mapped import has_mapped, save_model

    refs = {}
    for side, model in (("ref", plan.ref_model), ("cand", plan.cand_model)):
        files = plan._files.get("reference" if side == "ref" else "candidate")
        path = os.path.join(folder, f"{side}.onnx")
        if has_mapped(model):  # weights left in their files: copied file to file beside the graph
            save_model(model, path)
            refs[side] = ModelRef(path=path)
            continue
        full = files.materialize(model) if files is not None and model is files.skeleton else model
        large = full.ByteSize() > 1_900_000_000
        onnx.save(full, path, save_as_external_data=large, location=f"{side}.weights" if large else None)
        refs[side] = ModelRef(path=path)
    return replace(job, ref_model=refs["ref"], cand_model=refs["cand"])


def chunk_size(total: int | None, workers: int) -> int:
    """Samples per task: ``CHUNK``, fewer where a known-size dataset would otherwise leave workers idle (4 samples
    on 2 workers: 2 each, not one chunk of 4 on one worker)."""
    if not total or workers <= 1:
        return CHUNK
    return max(1, min(CHUNK, -(-total // workers)))


def _chunks(samples: Iterator[Sample], keep: dict[int, Sample], size: int = CHUNK) -> Iterator[list]:
    chunk: list = []
    for s in samples:
        keep[s.index] = Sample(s.index, s.source, {}, s.sha256)  # the driver keeps who it was, not its arrays
        chunk.append((s.index, s.feed))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _collect(plan, job: Job, infos, dataset: Dataset, head, stream, loaded, spec, steps: Steps, local,
             task_metrics: list[TaskMetric], target: TaskTarget | None, notes: list[str],
             worst: int) -> DatasetResult:

    crit = plan.criterion
    stats = LayerStats(infos, crit.metric)
    samples: list[dict] = []
    task_values: dict[str, list[float]] = {}
    task_indices: dict[str, list[int]] = {}
    lower: set[str] = set()
    for m in task_metrics:
        lower |= m.lower_is_better
    who: dict[int, Sample] = {}
    total = dataset.size
    seen = {id(s) for s in head}

    def checked_stream():
        for s in itertools.chain(head, stream):
            if id(s) not in seen:
                s.feed = checked(loaded.proto, s)
            yield s

    records = run_samples(job, _chunks(checked_stream(), who, chunk_size(total, spec.workers)), spec,
                          steps.span(0.02, 0.98), local=local, notes=notes)
    for rec in records:
        s = who.pop(rec.index)
        for arrays in (rec.ref, rec.cand):  # one metric cannot change what the next one reads
            for a in (arrays or {}).values():
                a.flags.writeable = False
        task: dict[str, float] = {}
        by: dict[str, str] = {}
        for m in task_metrics:
            for k, v in m(rec.ref, rec.cand).items():
                if k in by:  # one would silently replace the other
                    raise InputError(f"metrics {by[k]!r} and {m.spec!r} both report {k!r}",
                                     "drop one of them, or rename what the custom metric returns")
                task[k], by[k] = v, m.spec
        if target is not None and not samples:  # the first sample's results name it (or show it is not there)
            target = target.resolved(list(task), fixed=all(m.builtin for m in task_metrics))
            wrong_way = _wrong_way(target, lower)
            if wrong_way:
                notes.append(wrong_way)  # the first sample's results name it, or show it is not there
        for k, v in task.items():
            task_values.setdefault(k, []).append(v)
            task_indices.setdefault(k, []).append(rec.index)
        stats.add(rec.values, rec.diverged_layers, rec.first)
        badness = max((crit.badness(m) for m in rec.outputs.values()), default=0.0)
        row = {"index": rec.index, "source": s.source, "sha256": s.sha256, "outputs": rec.outputs, "task": task,
               "diverged": rec.diverged, "badness": badness,
               "first_divergent": _layer(infos[rec.first], rec.values[rec.first]) if rec.first >= 0 else None,
               "worst_layers": _worst_layers(infos, rec.values, crit.metric)}
        samples.append(row)
        done = len(samples)
        steps.span(0.02, 0.98)(done / total if total else 0.0, f"{done}{'/' + str(total) if total else ''} samples")
    if target is not None and samples:
        target.check_reported(set(task_values))
    result = DatasetResult(
        reference=str(plan.ref_spec), candidate=str(plan.cand_spec), criterion=crit, samples=samples,
        task=task_summary(task_values, task_indices, lower), layers=stats.summary(), outputs=job.outputs,
        worst_count=worst, lower_is_better=lower, dataset=dict(dataset.describe, count=len(samples)),
        executor=spec.describe(), model={"name": plan.original.name, "sha256": plan.original.fingerprint,
                                         "nodes": len(plan.original.proto.graph.node)},
        engines=plan.describe_engines(), variant=plan.variant_info, precision=plan.precision_json(),
        metrics=[m.spec for m in task_metrics], notes=notes, task_target=target)
    if target is None:
        note = _task_disagrees(result, task_metrics)
        if note:
            notes.append(note)
    return result


def _wrong_way(target: TaskTarget, lower: set[str]) -> str | None:
    """A note where the target's comparison points against its metric's better direction (``ctc_cer>=0.05``)."""
    if target.op == "==":
        return None
    low = target.name in lower
    if low == (target.op in ("<=", "<")):
        return None
    better = "lower" if low else "higher"
    return (f"{target.name} is {better}-is-better, and the task target {target.text()!r} passes where it is "
            f"{'at least' if target.op in ('>=', '>') else 'at most'} {number_text(target.threshold)}: check the "
            "comparison")


def _task_disagrees(result: DatasetResult, task_metrics: list[TaskMetric]) -> str | None:
    """Where no task target was given and the first built-in agreement metric (1: the reference's answer) and the
    outputs' verdict disagree, a note saying so and the --target that judges by the task."""
    builtin = next((m for m in task_metrics if m.builtin and m.spec.partition(":")[0] in ANSWERS), None)
    if builtin is None or not result.samples:  # mask IoU and top-k overlap are degrees, not one answer
        return None
    name = builtin.spec.partition(":")[0]  # top1 and ctc report under their own names
    changed = [s["index"] for s in result.samples if not s["task"].get(name, math.nan) >= 1]
    n = len(result.samples)
    if result.diverged and not changed:
        return (f"judged by the task the run passes: all {n} sample(s) keep {name} = 1 (the reference's answer) "
                f"while {len(result.diverged_samples)} sample(s)' outputs fail the criterion; --target '{name}>=1' "
                "makes the task the verdict")
    if not result.diverged and changed:
        return (f"judged by the task the run fails: {len(changed)} of {n} sample(s) have {name} < 1 (the answer "
                f"changed) while every output passes the criterion; --target '{name}>=1' makes the task the verdict")
    return None


def _layer(info: LayerInfo, value: float) -> dict:
    return {"tensor": info.tensor, "node": info.node, "op_type": info.op_type, "topo_index": info.topo_index,
            "value": None if np.isnan(value) else _enc(value)}


def _enc(value: float):
    from ..core.floats import encode_float

    return encode_float(float(value))


def _worst_layers(infos, values: np.ndarray, metric: str) -> list[dict]:
    from ..core.metric_info import HIGHER_IS_BETTER

    ok = ~np.isnan(values)
    if not ok.any():
        return []
    order = np.argsort(values if metric in HIGHER_IS_BETTER else -values, kind="stable")
    return [_layer(infos[j], values[j]) for j in order if ok[j]][:WORST_LAYERS]
