"""A dataset comparison's result: per-sample rows, the worst samples, task-metric aggregates and per-layer error
statistics across samples. ``to_json()`` is the compare contract plus ``kind: "dataset"``, ``samples``, ``worst``,
``task``, ``layers`` and ``dataset``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compare.criterion import Criterion
from ..core.floats import encode_float, encode_metrics
from ..core.metric_info import HIGHER_IS_BETTER
from ..errors import WorkbenchError
from ..textfmt import safe_name
from .task_target import TaskTarget, number_text

SCHEMA = "workbench.compare/1"
KIND = "dataset"


@dataclass
class LayerInfo:
    tensor: str
    node: str
    op_type: str
    topo_index: int


@dataclass
class DatasetResult:
    """What :func:`~workbench.dataset.compare_dataset` found (see the module docstring)."""

    reference: str
    candidate: str
    criterion: Criterion
    samples: list[dict]
    task: dict[str, dict]
    layers: list[dict]
    outputs: list[str]
    worst_count: int = 5
    lower_is_better: set[str] = field(default_factory=set)
    dataset: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)
    variant: dict = field(default_factory=dict)
    precision: dict = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: judge the run by a task metric instead of the outputs' criterion (see :mod:`.task_target`)
    task_target: TaskTarget | None = None
    #: not serialised: what a bundle needs to rerun (dataset source, options)
    run_options: dict = field(default_factory=dict, repr=False, compare=False)

    # --- verdict ------------------------------------------------------------------------------------------
    @property
    def diverged_samples(self) -> list[dict]:
        return [s for s in self.samples if s["diverged"]]

    @property
    def diverged(self) -> bool:
        """Any sample whose graph outputs diverged under the criterion (beyond their precision floor)."""
        return bool(self.diverged_samples)

    @property
    def failed(self) -> bool:
        """The run's judgement: the task target missed when there is one, else any sample diverged."""
        if self.task_target is not None:
            return not self.task_target.judge(self.samples)["met"]
        return self.diverged

    def failing_indices(self) -> set[int]:
        """The samples that fail the run's judgement: under the task target when there is one, else diverged."""
        if self.task_target is not None:  # a mean target that holds: no sample fails the run
            judged = self.task_target.judge(self.samples)
            return set() if judged["met"] and self.task_target.aggregate == "mean" else set(judged["failing"])
        return {s["index"] for s in self.diverged_samples}

    def worst(self) -> list[dict]:
        """The ``worst_count`` worst samples: by the first task metric (worst value first; NaN, a metric that
        could not be measured, counts as worst), then by how far the worst output is past the criterion."""
        primary = next(iter(self.samples[0]["task"]), None) if self.samples else None

        def key(s: dict):
            badness = s.get("badness", 0.0)
            if primary is None:
                return (0.0, -badness, s["index"])
            v = s["task"].get(primary, math.nan)
            v = -math.inf if math.isnan(v) else (-v if primary in self.lower_is_better else v)
            return (v, -badness, s["index"])

        return sorted(self.samples, key=key)[: self.worst_count]

    def verdict(self) -> dict:
        """``diverged`` (the outputs), ``failed`` (the judgement: the task target when there is one), the counts,
        ``headline`` (DIVERGED / FAILED / ok) and ``reason``."""
        n, bad = len(self.samples), len(self.diverged_samples)
        outputs = (f"{bad} of {n} sample(s) have outputs failing {self.criterion.describe()}" if bad
                   else f"every output of all {n} sample(s) passes {self.criterion.describe()}")
        doc = {"diverged": self.diverged, "failed": self.failed, "diverged_samples": bad, "samples": n}
        t = self.task_target
        if t is None:
            return doc | {"headline": "DIVERGED" if bad else "ok", "reason": outputs}
        judged = t.judge(self.samples)
        k = len(judged["failing"])
        nan = f"; {judged['nan']} sample(s) gave no number (NaN)" if judged["nan"] else ""
        if t.aggregate == "mean":
            held = (f"the mean of {safe_name(t.name)} is {t.shown(judged['value'])}, {t.op} "
                    f"{number_text(t.threshold)} {'holds' if judged['met'] else 'is missed'} ({k} of {n} sample(s) "
                    f"fail it on their own{nan})")
        else:
            held = (f"{k} of {n} sample(s) miss {t.condition()}{nan}" if k
                    else f"{t.condition()} holds on all {n} sample(s)")
        tail = "; their drift does not break the task" if bad and judged["met"] else ""
        return doc | {"headline": "FAILED" if self.failed else "ok", "task_target": t.to_json(),
                      "task_failing_samples": judged["failing"], "reason": f"task target: {held}; {outputs}{tail}"}

    # --- JSON -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "kind": KIND, "reference": self.reference, "candidate": self.candidate,
            "criterion": self.criterion.to_json(), "diverged": self.diverged, "verdict": self.verdict(),
            "task_target": None if self.task_target is None else self.task_target.to_json(),
            "outputs": self.outputs, "metrics": self.metrics,
            "samples": [_sample_json(s) for s in self.samples],
            "worst": [_sample_json(s, full=True) for s in self.worst()],
            "task": {k: {kk: encode_float(vv) if isinstance(vv, float) else vv for kk, vv in v.items()}
                     for k, v in self.task.items()},
            "layers": [{k: encode_float(v) if isinstance(v, float) else v for k, v in row.items()}
                       for row in self.layers],
            "layer_metric": self.criterion.metric, "dataset": self.dataset, "executor": self.executor,
            "model": self.model, "engines": self.engines, "variant": self.variant, "precision": self.precision,
            "timing": self.timing, "notes": self.notes,
        }

    def save_json(self, path: str | Path) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    # --- tables and text ---------------------------------------------------------------------------------------
    def samples_frame(self):
        """One row per sample: index, source, diverged, first divergent tensor, task metrics, output metric."""
        import pandas as pd

        m = self.criterion.metric
        rows = []
        for s in self.samples:
            row = {"index": s["index"], "source": s["source"], "diverged": s["diverged"],
                   "first_divergent": (s.get("first_divergent") or {}).get("tensor")}
            row |= s["task"]
            row |= {f"{o}:{m}": (s["outputs"].get(o) or {}).get(m) for o in self.outputs}
            rows.append(row)
        return pd.DataFrame(rows)

    def layers_frame(self):
        """One row per compared tensor: its judged metric across samples (mean, p95, worst) and divergence counts."""
        import pandas as pd

        return pd.DataFrame(self.layers)

    def render(self) -> str:
        """The plain-text summary the CLI prints."""
        v = self.verdict()
        lines = [f"{safe_name(self.reference)} vs {safe_name(self.candidate)} on {len(self.samples)} sample(s) "
                 f"({self.executor.get('kind', 'serial')}"
                 + (f", {self.executor.get('workers')} workers" if self.executor.get("workers", 1) > 1 else "") + ")",
                 f"{v['headline']}: {v['reason']}"]
        for name, agg in self.task.items():
            lines.append(f"  {safe_name(name)}: mean {agg['mean']:.4g}, worst {agg['worst']:.4g} "
                         f"(sample {agg['worst_index']})")
        worst = self.worst()
        if worst:
            lines.append(f"worst {len(worst)} sample(s):")
            for s in worst:
                first = s.get("first_divergent")
                task = ", ".join(f"{safe_name(k)} {val:.4g}" for k, val in s["task"].items())
                lines.append(f"  #{s['index']} {safe_name(s['source'])}: " + (task + "; " if task else "")
                             + (f"first divergence at {safe_name(first['tensor'])} ({safe_name(first['op_type'])})"
                                if first
                                else "no layer diverged" if self.run_options.get("layers", True)
                                else "outputs pass (layers not compared: --no-layers)"))
        hot = sorted((row for row in self.layers if row["first_divergent_samples"]),
                     key=lambda r: -r["first_divergent_samples"])[:3]
        if hot:
            lines.append("where samples first diverge: " + ", ".join(
                f"{safe_name(r['tensor'])} ({safe_name(r['op_type'])}, {r['first_divergent_samples']} sample(s))"
                for r in hot))
        lines += [f"note: {safe_name(n)}" for n in self.notes]
        return "\n".join(lines)


def _sample_json(s: dict, full: bool = False) -> dict:
    doc = {"index": s["index"], "source": s["source"], "sha256": s["sha256"],
           "outputs": {k: encode_metrics(v) for k, v in s["outputs"].items()},
           "task": {k: encode_float(v) for k, v in s["task"].items()}, "diverged": s["diverged"],
           "first_divergent": s.get("first_divergent")}
    if full:
        doc["worst_layers"] = s.get("worst_layers", [])
    return doc


class LayerStats:
    """The judged metric of every compared tensor, sample after sample: mean, p95 and worst across samples."""

    def __init__(self, layers: list[LayerInfo], metric: str):
        self.layers, self.metric = layers, metric
        self.rows: list[np.ndarray] = []
        self.diverged = np.zeros(len(layers), dtype=np.int64)
        self.first = np.zeros(len(layers), dtype=np.int64)

    def add(self, values: np.ndarray, diverged: np.ndarray, first: int) -> None:
        self.rows.append(values.astype(np.float32))
        self.diverged += diverged
        if first >= 0:
            self.first[first] += 1

    def summary(self) -> list[dict]:
        if not self.rows:
            return []
        v = np.vstack(self.rows).astype(np.float64)  # samples x layers
        higher = self.metric in HIGHER_IS_BETTER
        out = []
        for j, info in enumerate(self.layers):
            col = v[:, j]
            col = col[~np.isnan(col)]
            finite = col[np.isfinite(col)]
            if col.size == 0:
                mean = p95 = worst = math.nan
            else:
                mean = float(finite.mean()) if finite.size else float(col[0])
                worst = float(col.min() if higher else col.max())
                p95 = float(np.percentile(col, 5 if higher else 95, method="lower" if higher else "higher"))
            out.append({"tensor": info.tensor, "node": info.node, "op_type": info.op_type,
                        "topo_index": info.topo_index, "mean": mean, "p95": p95, "worst": worst,
                        "exact_samples": int(np.count_nonzero(np.isinf(col) & (col > 0))) if higher else
                        int(np.count_nonzero(col == 0)),
                        "diverged_samples": int(self.diverged[j]), "first_divergent_samples": int(self.first[j])})
        return out


def task_summary(values: dict[str, list[float]], indices: dict[str, list[int]],
                 lower_is_better: set[str]) -> dict[str, dict]:
    """Per task metric: mean, min and max over the samples where it is a number, how many gave NaN, and the
    worst sample (a NaN one first). ``indices[name]``: the sample of each value (a metric may skip samples)."""
    out = {}
    for name, vals in values.items():
        a = np.asarray(vals, dtype=np.float64)
        if a.size == 0:
            continue
        nan = np.isnan(a)
        if nan.any():
            worst_pos = int(np.argmax(nan))
        else:
            worst_pos = int(np.argmax(a) if name in lower_is_better else np.argmin(a))
        ok = a[~nan]
        with np.errstate(invalid="ignore"):  # inf and -inf average to NaN: said as such
            mean = float(ok.mean()) if ok.size else math.nan
        out[name] = {"mean": mean,
                     "min": float(ok.min()) if ok.size else math.nan,
                     "max": float(ok.max()) if ok.size else math.nan,
                     "worst": float(a[worst_pos]), "worst_index": indices[name][worst_pos],
                     "nan_samples": int(nan.sum()), "lower_is_better": name in lower_is_better}
    return out


def not_a_dataset_result(doc: dict) -> None:
    if doc.get("kind") == KIND:
        raise WorkbenchError("this is a dataset comparison (per-sample results), not a single comparison",
                             "open it with json, or compare two dataset runs sample by sample")
