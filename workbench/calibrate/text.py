"""Plain-text summary of a calibration report (the CLI's output): the rules computed (whose threshold each
reproduces) with their median worst-case SQNR, the notes (e.g. the ranking rule is far worse than another), then
the worst tensors per rule, representativeness, the sweep, the depthwise Convs' input channel spreads, the QDQ
check and imported thresholds."""

from __future__ import annotations

import math

from ..textfmt import safe_name
from .methods import DEFAULT_PERCENTILES, RULES, percentile_of
from .report import CalibrationReport


def _db(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return ("+inf" if value > 0 else "-inf") if math.isinf(value) else f"{value:.1f} dB"


def _pct(value: float) -> str:
    return f"{value:.3%}" if 0 < value < 0.001 else f"{value:.2%}"


def _tag(method: str) -> str:
    return f"{method} ({RULES[method].toolchain})" if method in RULES else method


def _setting(method: str, cfg: dict) -> str:
    if method in DEFAULT_PERCENTILES:
        return f"percentile {percentile_of(method, cfg.get('percentile')):g}"
    if method == "ort-entropy" and cfg.get("ort_entropy_bins"):
        return f"{cfg['ort_entropy_bins']} bins"
    return ""


def _rules(report: CalibrationReport) -> list[str]:
    """One line per rule: name, whose threshold, setting, median worst-case SQNR, tensors where best."""
    width = max(len(m) for m in report.methods)
    lines = []
    for m in report.methods:
        s = report.summary.get(m, {})
        setting = _setting(m, report.config)
        score = (f": median worst {_db(s.get('median_worst_sqnr_db'))}, best on {s.get('tensors_best')} tensor(s)"
                 if s else "")
        mark = "  <- ranks the tensors" if m == report.method else ""
        lines.append(f"  {m:<{width}}  {report.rule(m)}" + (f" [{setting}]" if setting else "") + score + mark)
    return lines


def render(report: CalibrationReport, top: int = 5) -> str:
    cfg = report.config
    lines = [
        f"{safe_name(report.model.name)} (sha256 {report.model.sha256[:12]}): {len(report.tensors)} activation "
        f"tensors, "
        f"{cfg.get('feeds')} calibration feeds, {cfg.get('chunks')} chunk(s), {cfg.get('num_bins')} bins",
        f"Rules (whose threshold each reproduces; the tensors are ranked under {_tag(report.method)}):",
        *_rules(report),
    ]
    if report.notes:
        lines += [f"note: {safe_name(n)}" for n in report.notes]
    lines += [
        "SQNR: int8 fake-quant, scale = amax/127; 'bulk' = values up to the 99.9th |x| percentile; "
        "worst = min(total, bulk)",
        "",
        "Worst tensors per rule:",
    ]
    for method in report.methods:
        lines.append(f"  {_tag(method)}:")
        for e in report.worst(method, top):
            lines.append(f"    {e.rank:>3}. {safe_name(e.tensor)}: worst {_db(e.worst_sqnr_db)} "
                         f"(total {_db(e.sqnr_db)}, bulk "
                         f"{_db(e.bulk_sqnr_db)}, clipped {_pct(e.clipped_fraction)}, amax {e.amax:.4g})")
    if "max" in report.ranges and len(report.methods) > 1:
        lines += ["", "What the other rules change on the tensors worst under max (bulk / total SQNR, clipped):"]
        for e in report.worst("max", top):
            by = report.errors[e.tensor]
            parts = [f"max {_db(by['max'].bulk_sqnr_db)} / {_db(by['max'].sqnr_db)}"]
            parts += [f"{m} {_db(q.bulk_sqnr_db)} / {_db(q.sqnr_db)}, {_pct(q.clipped_fraction)} (amax {q.amax:.4g})"
                      for m, q in by.items() if m != "max"]
            lines.append(f"  {safe_name(e.tensor)}: " + "; ".join(parts))
    if report.representativeness is not None:
        flagged = [r for r in report.representativeness if r.flagged]
        lines += ["", f"Representativeness ({cfg.get('eval_feeds')} evaluation feeds, {report.method} thresholds): "
                  f"{len(flagged)} of {len(report.representativeness)} tensors flagged"]
        for r in flagged[:top]:
            lines.append(f"  {safe_name(r.tensor)}: " + "; ".join(r.reasons) + f" (range drift x{r.range_drift:.2f})")
        if not flagged:
            worst = report.representativeness[0] if report.representativeness else None
            if worst is not None:
                lines.append(f"  closest to a flag: {safe_name(worst.tensor)} (JS distance {worst.js_distance:.2f}; "
                             f"{_pct(worst.beyond_fraction)} of evaluation values beyond amax, calibration "
                             f"{_pct(worst.calib_beyond_fraction)})")
    if report.sweep is not None:
        s = report.sweep
        lines += ["", f"Sweep ({s.method} ranges, {s.feeds} feeds, output SQNR vs FP32): all {s.quantized} tensors "
                  f"quantized {_db(s.all_sqnr_db)} (cosine {s.all_cosine:.4f})"]
        for e in s.entries[:top]:
            lines.append(f"  only {safe_name(e.tensor)}: {_db(e.only_sqnr_db)}; all but it: {_db(e.all_but_sqnr_db)} "
                         f"({e.recovery_db:+.1f} dB)")
    if report.depthwise:
        lines += ["", f"Depthwise Conv inputs ({len(report.depthwise)}; one INT8 scale per tensor, {report.method} "
                  "amax, shared by channels of different ranges):"]
        for r in report.depthwise[:top]:
            lines.append(f"  {safe_name(r['tensor'])} (read by {', '.join(map(safe_name, r['convs'])) or '?'}): "
                         f"{r['channels']} channels, {r['spread']:.3g}x apart; the narrowest spans "
                         f"{r['narrowest_steps']:.3g} of 127 INT8 steps")
    for method, q in report.qdq.items():
        lines += ["", f"QDQ model ({method} ranges: {report.rule(method)}; ORT quantize_static, "
                  f"{q.get('quantize_nodes')} QuantizeLinear): "
                  f"outputs vs FP32 over {q['feeds']} feeds: SQNR {_db(q['sqnr_db'])}, cosine {q['cosine']:.4f}"]
    if report.imported is not None:
        imp = report.imported
        lines += ["", f"Imported {imp.format} thresholds from {safe_name(imp.source)}: {len(imp.matched)} match "
                  "calibrated "
                  f"tensors, {len(imp.unmatched)} do not"]
        for t in imp.matched[:top]:
            ours = report.ranges[report.method][t]
            lines.append(f"  {safe_name(t)}: imported amax {imp.amax[t]:.4g} vs {report.method} {ours:.4g}")
    if report.skipped:
        lines += ["", f"note: {len(report.skipped)} tensor(s) not calibrated (e.g. "
                  f"{next(iter(report.skipped))}: {next(iter(report.skipped.values()))})"]
    return "\n".join(lines)
