"""Self-contained HTML report of an INT8 calibration: ranges per method, sensitivity, histograms with each
method's threshold, representativeness and the Q/DQ check (same page shell as the comparison report)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .html import _e, _figure, _kv, _num, _table, page, require_plotly

log = logging.getLogger(__name__)


def render_calibration_report(report: Any, *, top: int = 6, title: str | None = None) -> str:
    """The report as one HTML string: the ``top`` most sensitive tensors get a histogram each."""
    require_plotly()
    from ..plots.calibration import calibration_histogram, sensitivity_bars

    title = title or f"{report.model.name}: INT8 calibration"
    cfg = report.config
    parts = [
        f"<h1>{_e(title)}</h1>", "<h2>Summary</h2>",
        _kv([("model", f"{_e(report.model.name)} <code>{_e(report.model.sha256[:16])}</code>"),
             ("feeds", _e(f"{cfg.get('feeds')} calibration, {cfg.get('eval_feeds') or 0} evaluation")),
             ("methods", _e(", ".join(report.methods)) + f" (used: <b>{_e(report.method)}</b>)"),
             ("percentile", _e(cfg.get("percentile"))), ("bins", _e(cfg.get("num_bins"))),
             ("tensors", _e(len(report.tensors)))]),
        "<h2>Sensitivity</h2>", _figure(sensitivity_bars(report)),
    ]
    worst = report.worst(k=top)
    rows = []
    for entry in report.worst(k=max(top, 20)):
        t = entry.tensor
        rows.append([t] + [_num(report.ranges[m].get(t)) for m in report.methods]
                    + [_num(report.errors[t][report.method].worst_sqnr_db, "sqnr_db"),
                       _num(report.errors[t][report.method].clipped_fraction)])
    parts += ["<h2>Ranges (amax) of the most sensitive tensors</h2>",
              _table(["tensor", *report.methods, f"worst SQNR ({report.method})", "clipped"], rows,
                     numeric=set(range(1, len(report.methods) + 3)), raw=set(range(1, len(report.methods) + 3)))]
    parts.append("<h2>Histograms with each method's threshold</h2>")
    parts += [_figure(calibration_histogram(report, e.tensor)) for e in worst]
    if report.representativeness:
        parts += ["<h2>Calibration data vs evaluation data</h2>",
                  _table(["tensor", "beyond threshold", "range drift", "JS distance", "flagged"],
                         [[r.tensor, _num(r.beyond_fraction), _num(r.range_drift), _num(r.js_distance),
                           "yes" if r.flagged else ""] for r in report.representativeness[:20]],
                         numeric={1, 2, 3}, raw={1, 2, 3})]
    if report.qdq:
        parts += ["<h2>Q/DQ model vs FP32 (outputs)</h2>",
                  "<pre>" + _e("\n".join(f"{m}: {v}" for m, v in report.qdq.items())) + "</pre>"]
    if report.notes:
        parts += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>"]
    return page(title, parts, report.to_json())


def write_calibration_report(report: Any, path: str | os.PathLike, *, top: int = 6) -> Path:
    """Write the calibration report to ``path`` atomically; returns the path."""
    from .._atomic import atomic_write_text

    out = atomic_write_text(path, render_calibration_report(report, top=top))
    log.info("wrote calibration report %s", out)
    return out
