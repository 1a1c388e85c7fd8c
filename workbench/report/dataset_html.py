"""Self-contained HTML report of a dataset comparison: the verdict, task metrics, the worst samples with where they
first diverge, each layer's error across samples and the per-sample table (same page shell as the comparison
report)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..compare.text import fmt
from ..core.floats import decode_float
from .html import _e, _figure, _kv, _num, _table, page, require_plotly

log = logging.getLogger(__name__)

MAX_ROWS = 500  # per-sample table rows shown (the JSON embedded in the page holds them all)


def render_dataset_report(result: Any, *, title: str | None = None) -> str:
    require_plotly()
    from ..plots.dataset import first_divergence_bars, layer_spread, sample_metric

    v = result.verdict()
    m = result.criterion.metric
    title = title or f"{result.model.get('name', 'model')}: {result.reference} vs {result.candidate} on " \
                     f"{len(result.samples)} samples"
    parts = [f"<h1>{_e(title)}</h1>",
             _kv([("verdict", f"<b>{_e(v['headline'])}</b>: {_e(v['reason'])}"),
                  ("dataset", _e(f"{result.dataset.get('kind')} {result.dataset.get('folder') or ''} "
                                 f"({len(result.samples)} samples)")),
                  ("executor", _e(f"{result.executor.get('kind')} x{result.executor.get('workers')}")),
                  ("metrics", _e(", ".join(result.metrics) or "none")),
                  ("task target", _e(result.task_target.describe() if result.task_target is not None
                                     else "none (judged by the outputs' criterion)"))])]
    if result.notes:
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in result.notes) + "</ul>")
    if result.task:
        parts += ["<h2>Task metrics</h2>",
                  _table(["metric", "mean", "min", "max", "worst sample"],
                         [[k, _num(a["mean"]), _num(a["min"]), _num(a["max"]), _e(f"#{a['worst_index']}")]
                          for k, a in result.task.items()], numeric={1, 2, 3}, raw={1, 2, 3, 4})]
    parts += ["<h2>Worst samples</h2>",
              _table(["sample", "source", *result.task.keys(), "diverged", "first divergence", "worst layers"],
                     [[f"#{s['index']}", s["source"], *(_num(s["task"].get(k)) for k in result.task),
                       "yes" if s["diverged"] else "", _first(s), _worst_layers(s, m)]
                      for s in result.worst()], raw=set(range(2, 2 + len(result.task)))
                     | {3 + len(result.task), 4 + len(result.task)})]
    parts += [_figure(sample_metric(result)), "<h2>Each layer across samples</h2>", _figure(layer_spread(result))]
    if any(r["first_divergent_samples"] for r in result.layers):
        parts.append(_figure(first_divergence_bars(result)))
    shown = result.samples[:MAX_ROWS]
    missed = result.failing_indices() if result.task_target is not None else None
    parts += [f"<h2>Samples ({len(shown)} of {len(result.samples)})</h2>",
              _table(["sample", "source", *result.task.keys(), *(f"{o} {m}" for o in result.outputs), "diverged",
                      *(["misses the task target"] if missed is not None else [])],
                     [[f"#{s['index']}", s["source"], *(_num(s["task"].get(k)) for k in result.task),
                       *(_num((s["outputs"].get(o) or {}).get(m), m) for o in result.outputs),
                       "yes" if s["diverged"] else "", *([("yes" if s["index"] in missed else "")]
                                                         if missed is not None else [])] for s in shown],
                     raw=set(range(2, 2 + len(result.task) + len(result.outputs))))]
    return page(title, parts, result.to_json())


def _worst_layers(sample: dict, metric: str) -> str:
    return _e(", ".join(f"{w['tensor']} ({fmt(decode_float(w['value']), metric)})"
                        for w in sample.get("worst_layers", [])[:3]))


def _first(sample: dict) -> str:
    f = sample.get("first_divergent")
    return _e(f"{f['tensor']} ({f['op_type']})") if f else "none"


def write_dataset_report(result: Any, path: str | os.PathLike) -> Path:
    """Write the report to ``path`` atomically; returns the path."""
    from .._atomic import atomic_write_text

    out = atomic_write_text(path, render_dataset_report(result))
    log.info("wrote dataset report %s", out)
    return out
