"""Self-contained HTML report of an INT8 calibration: its notes first (e.g. the ranking rule is far worse than
another), the rules (whose threshold each reproduces, how well each keeps the tensors), ranges per rule,
sensitivity, histograms with each rule's threshold, representativeness and the Q/DQ check (same page shell as the
comparison report)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .html import _e, _figure, _kv, _num, _table, page, require_plotly

log = logging.getLogger(__name__)

#: page-local style: the notes box and the ranking rule's row
_STYLE = ("<style>.notes { background: #fff8e1; border-left: 4px solid #ffb300; padding: .4rem 1rem; margin: 1rem 0; }"
          " tr.chosen td { background: #fff3e0; font-weight: 600; }</style>")


def render_calibration_report(report: Any, *, top: int = 6, title: str | None = None) -> str:
    """The report as one HTML string: the ``top`` most sensitive tensors get a histogram each."""
    require_plotly()
    from ..plots.calibration import calibration_histogram, rule_tag, sensitivity_bars

    title = title or f"{report.model.name}: INT8 calibration"
    cfg = report.config
    percentile = cfg.get("percentile")
    parts = [_STYLE, f"<h1>{_e(title)}</h1>"]
    if report.notes:
        parts.append('<div class="notes"><b>Notes</b><ul>' + "".join(f"<li>{_e(n)}</li>" for n in report.notes)
                     + "</ul></div>")
    parts += [
        "<h2>Summary</h2>",
        _kv([("model", f"{_e(report.model.name)} <code>{_e(report.model.sha256[:16])}</code>"),
             ("feeds", _e(f"{cfg.get('feeds')} calibration, {cfg.get('eval_feeds') or 0} evaluation")),
             ("rules", _e(", ".join(rule_tag(m) for m in report.methods))),
             ("ranking rule", f"<b>{_e(report.method)}</b>: {_e(report.rule(report.method))}"),
             ("percentile", _e("each rule's default" if percentile is None else percentile)),
             ("bins", _e(f"{cfg.get('num_bins')} (ONNX Runtime entropy: {cfg.get('ort_entropy_bins', '-')})")),
             ("tensors", _e(len(report.tensors)))]),
        "<h2>Rules</h2>", _rules(report),
        "<h2>Sensitivity</h2>", _figure(sensitivity_bars(report)),
    ]
    worst = report.worst(k=top)
    rows = []
    for entry in report.worst(k=max(top, 20)):
        t = entry.tensor
        rows.append([t] + [_amax(report, m, t) for m in report.methods]
                    + [_num(report.errors[t][report.method].worst_sqnr_db, "sqnr_db"),
                       _num(report.errors[t][report.method].clipped_fraction)])
    cells = set(range(1, len(report.methods) + 3))
    parts += ["<h2>Ranges (amax) of the most sensitive tensors</h2>",
              "<p class='muted'>Each column is one rule, named with the toolchain whose threshold it reproduces; the "
              "asymmetric ONNX Runtime rules also give their [lowest, highest].</p>",
              _table(["tensor", *(rule_tag(m) for m in report.methods), f"worst SQNR ({report.method})", "clipped"],
                     rows, numeric=cells, raw=cells)]
    parts.append("<h2>Histograms with each rule's threshold</h2>")
    parts += [_figure(calibration_histogram(report, e.tensor)) for e in worst]
    if report.representativeness:
        parts += ["<h2>Calibration data vs evaluation data</h2>",
                  _table(["tensor", "beyond threshold", "range drift", "JS distance", "flagged"],
                         [[r.tensor, _num(r.beyond_fraction), _num(r.range_drift), _num(r.js_distance),
                           "yes" if r.flagged else ""] for r in report.representativeness[:20]],
                         numeric={1, 2, 3}, raw={1, 2, 3})]
    if report.qdq:
        parts += ["<h2>Q/DQ model vs FP32 (outputs)</h2>",
                  "<pre>" + _e("\n".join(f"{m} ({report.rule(m)}): {v}" for m, v in report.qdq.items())) + "</pre>"]
    return page(title, parts, report.to_json())


def _amax(report: Any, method: str, tensor: str) -> str:
    """The amax cell; [lowest, highest] under it for a rule with its own bounds (the ONNX Runtime ones)."""
    cell = _num(report.ranges[method].get(tensor))
    bound = report.bounds.get(method, {}).get(tensor)
    if bound is not None:
        cell += f"<br><span class='muted'>[{_num(bound[0])}, {_num(bound[1])}]</span>"
    return cell


def _rules(report: Any) -> str:
    """``report.summary`` as a table: whose threshold each rule reproduces and how well it keeps the tensors."""
    if not report.summary:
        return "<p class='muted'>this report scores no rules (it was made before rules were named)</p>"
    rows = [[m, s.get("toolchain", ""), s.get("rule", report.rule(m)), _num(s.get("median_worst_sqnr_db"), "sqnr_db"),
             _e(s.get("tensors_best")), "ranks the tensors" if m == report.method else ""]
            for m, s in report.summary.items()]
    return _table(["rule", "toolchain", "whose threshold", "median worst-case SQNR", "tensors where best", ""], rows,
                  numeric={3, 4}, raw={3, 4}, classes=["chosen" if m == report.method else "" for m in report.summary])


def write_calibration_report(report: Any, path: str | os.PathLike, *, top: int = 6) -> Path:
    """Write the calibration report to ``path`` atomically; returns the path."""
    from .._atomic import atomic_write_text

    out = atomic_write_text(path, render_calibration_report(report, top=top))
    log.info("wrote calibration report %s", out)
    return out
