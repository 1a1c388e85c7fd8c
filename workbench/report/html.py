"""A self-contained HTML report of a comparison: one file, plotly.js inlined, no network access at all (a
Content-Security-Policy forbids every fetch), readable offline and attachable to a bug report.

Sections: summary (verdict with its reason, each side's inferred precision, specs, model sha256, versions,
criterion), the graph outputs against their precision floors, internal dips, culprits (harmful first, with the
error beyond their floor and what fixing each gains on the outputs) with explanations, at fused granularity each
culprit's engine group and the tensors not observable, FP16 clamps, per-layer error curve with the floor band,
metric histograms, selected tensors' value histograms, op inventory, notes, every tensor's metrics and floor, and
the result JSON itself (``<script id="workbench-result">``).
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..compare.result import CompareResult

log = logging.getLogger(__name__)

#: no request of any kind may leave the page; inline scripts/styles and data: images (plot downloads) only
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; connect-src 'none'; frame-src 'none'; form-action 'none'; "
       "base-uri 'none'")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
#: unobservable tensors listed in a fused-granularity report (the embedded JSON holds them all)
_MAX_UNOBSERVABLE = 500

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1rem 2rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem;
     margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .85rem; }
.verdict { font-weight: bold; padding: .1rem .5rem; border-radius: 3px; color: #fff; }
.bad { background: #d62728; } .good { background: #2ca02c; } .floor { background: #17becf; }
.harmless { background: #9e9e9e; } .dip { background: #ff7f0e; }
tr.row-bad td { background: #ffebee; } tr.row-floor td { background: #e0f7fa; }
.plot { margin: 1rem 0; } .muted { color: #777; } details { margin: .5rem 0; }
"""


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _num(value: Any, metric: str = "") -> str:
    from ..compare.text import fmt

    if isinstance(value, float) and math.isfinite(value) and metric != "sqnr_db":
        return _e(f"{value:.4g}")
    return _e(fmt(value, metric))


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] = frozenset(), raw: set[int] = frozenset(),
           classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for k, row in enumerate(rows):
        cells = []
        for i, v in enumerate(row):
            text = v if i in raw else _e(v)
            cells.append(f'<td class="num">{text}</td>' if i in numeric else f"<td>{text}</td>")
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        body.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv(rows: list[tuple[str, str]]) -> str:
    """Key/value table; values are already-escaped HTML."""
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _figure(fig) -> str:
    return '<div class="plot">' + fig.to_html(include_plotlyjs=False, full_html=False, default_height="440px",
                                              config=_PLOT_CONFIG) + "</div>"


def _engine_text(desc: Any) -> str:
    if not isinstance(desc, dict):
        return _e(desc)
    keep = {k: v for k, v in desc.items() if k not in ("distributions",) and v not in (None, [], {})}
    return "<br>".join(f"<span class='muted'>{_e(k)}</span> {_e(v)}" for k, v in keep.items())


def _inspection_json(result: CompareResult, inspection: Any) -> dict | None:
    if inspection is None:
        path = result.model.get("path")
        if not path or not Path(path).is_file():
            return None
        from ..inspection import inspect_model

        try:
            found = inspect_model(path, probe=False)
        except Exception as e:  # noqa: BLE001 - the inventory is an extra; a report must not fail over it
            log.info("op inventory left out: %s", e)
            return None
        if found.model.fingerprint != result.model.get("sha256"):
            log.info("op inventory left out: %s changed since the comparison", path)
            return None
        inspection = found
    return inspection if isinstance(inspection, dict) else inspection.to_json()


def _floor_cell(floor: dict | None, metric: str) -> str:
    """Escaped HTML: "FP16 73.2 dB", or "-" for a tensor held in float32 or wider."""
    if not floor:
        return "-"
    return f"{_e(str(floor.get('format', '')).upper())} {_num(floor.get(metric), metric)}"


def _state(result: CompareResult, t) -> str:
    """Escaped HTML badge of a tensor's state."""
    if t.diverged:
        if result.diverged:
            return '<span class="verdict bad">DIVERGED</span>'
        return '<span class="verdict dip">internal dip</span>'
    if t.at_floor:
        return '<span class="verdict floor">at its floor</span>'
    return "ok"


def _precision(result: CompareResult) -> list[tuple[str, str]]:
    rows = []
    for side in ("reference", "candidate"):
        p = (result.precision or {}).get(side)
        if p:
            rows.append((f"{side} precision", f"<b>{_e(p.get('precision'))}</b> <span class='muted'>inferred from "
                                               f"{_e(p.get('precision_source'))}</span>"))
    if not rows:
        rows.append(("precision", "<span class='muted'>not recorded (a result written before precision "
                                  "inference)</span>"))
    return rows


def _summary(result: CompareResult) -> str:
    from .env import package_versions

    first = result.first_divergent
    m = result.criterion.metric
    reason = result.verdict()["reason"]
    verdict = (f'<span class="verdict bad">DIVERGED</span> {_e(reason)}' if result.diverged
               else f'<span class="verdict good">OK</span> {_e(reason)}')
    dips = result.internal_dips
    if dips:
        on_floor = sum(t.at_floor for t in dips)
        verdict += (f"<br>{len(dips)} internal dip(s): internal tensors under the criterion while the outputs pass"
                    + (f" ({on_floor} at their format's floor)" if on_floor else "")
                    + ("; they fail this run (fail_on_internal_dips)" if result.fail_on_internal_dips else
                       "; not a divergence"))
    if first is not None:
        verdict += (f"<br>first divergent tensor <code>{_e(first.tensor)}</code> (node <code>{_e(first.node)}</code>, "
                    f"{_e(first.op_type)}, topological #{first.topo_index}; {_e(m)} {_num(first.metrics.get(m), m)}"
                    + (f", floor {_floor_cell(first.floor, m)}" if first.floor else "") + ")")
    feeds = result.feeds or {}
    engines = result.engines or {}
    rows = [
        ("verdict", verdict),
        *_precision(result),
        ("reference", f"<code>{_e(result.reference)}</code><br>{_engine_text(engines.get('reference'))}"),
        ("candidate", f"<code>{_e(result.candidate)}</code><br>{_engine_text(engines.get('candidate'))}"),
        ("model", f"{_e(result.model.get('name'))} ({_e(result.model.get('nodes'))} nodes)"),
        ("model sha256", f"<code>{_e(result.model.get('sha256'))}</code>"),
        ("criterion", _e(result.criterion.describe())),
        ("mode", _e(f"{result.mode}, {result.builds} candidate builds, {len(result.tensors)} tensors compared")),
        ("feeds", _e(", ".join(f"{k} {v}" for k, v in feeds.items() if v is not None))),
        ("variant", _e((result.variant or {}).get("variant", "-")) + " " + _e((result.variant or {}).get("converter",
                                                                                                        ""))),
        ("time", _e(f"{(result.timing or {}).get('total_s', 0):.2f} s")),
        ("workbench", _e(engines.get("workbench"))),
        ("report written with", _e(", ".join(f"{k} {v}" for k, v in package_versions().items()))),
    ]
    return _kv(rows)


def _outputs(result: CompareResult) -> str:
    """The graph outputs (what the verdict is about) against their precision floors, and the internal dips."""
    m = result.criterion.metric
    outs = result.output_results
    if not outs:
        return "<p class='muted'>No graph output was compared: the verdict is judged on every compared tensor.</p>"
    rows = [[f"<code>{_e(t.tensor)}</code>", _num(t.metrics.get(m), m), _floor_cell(t.floor, m),
             _num(t.metrics.get("cosine"), "cosine"), _num(t.metrics.get("max_abs"), "max_abs"),
             t.metrics.get("nonfinite_mismatch") or 0, _state(result, t)] for t in outs]
    text = ("<p>The verdict is about the graph outputs. The <em>floor</em> is the error of the reference values "
            "merely held in the candidate's number format: an output failing the criterion only because its format "
            "cannot hold the values is <em>at its floor</em>, not diverged.</p>"
            + _table(["output", m, "floor", "cosine", "max_abs", "inf/NaN mismatches", "state"], rows,
                     numeric={1, 2, 3, 4, 5}, raw={0, 1, 2, 3, 4, 6},
                     classes=["row-bad" if t.diverged else "row-floor" if t.at_floor else "" for t in outs]))
    dips = result.internal_dips
    if dips:
        rows = [[t.topo_index, f"<code>{_e(t.tensor)}</code>", _e(t.op_type), _num(t.metrics.get(m), m),
                 _floor_cell(t.floor, m), t.metrics.get("nonfinite_mismatch") or 0, _state(result, t)]
                for t in dips]
        text += (f"<h3>Internal dips ({len(dips)})</h3><p>Internal tensors under the criterion while every output "
                 "passes" + ("; this run fails on them (fail_on_internal_dips)." if result.fail_on_internal_dips
                             else ": not a divergence.") + "</p>"
                 + _table(["#", "tensor", "op_type", m, "floor", "inf/NaN mismatches", "state"], rows,
                          numeric={0, 3, 4, 5}, raw={1, 2, 3, 4, 6}))
    return text


def _impact(c) -> str:
    """Escaped HTML: what fixing culprit ``c`` gains on the outputs, as measured."""
    impact = c.impact
    if not impact:
        return "<span class='muted'>not measured</span>"
    from ..compare.explain import gain_text

    best = impact.get("best_gain_db")
    per = ", ".join(f"{_e(o)} {_gain_db(g)}" for o, g in (impact.get("gain") or {}).items())
    said = gain_text(best)
    if impact.get("harmless") and isinstance(best, (int, float)) and math.isfinite(best):
        said = said.replace("fixing it gains ", "fixing it gains at most ", 1)
    text = _e(said) + (f" ({per})" if per else "")
    if impact.get("nonfinite_fixed"):
        text += f"; removes {_e(impact['nonfinite_fixed'])} inf/NaN"
    if impact.get("note"):
        text += f"<br><span class='muted'>{_e(impact['note'])}</span>"
    return text


def _gain_db(gain: Any) -> str:
    """One output's gain: ``12.3 dB``, ``exact`` (infinite: fixed, the output matches the reference)."""
    if isinstance(gain, (int, float)) and math.isinf(gain):
        return "exact" if gain > 0 else "worse"
    return f"{_num(gain)} dB"


def _culprits(result: CompareResult) -> str:
    m = result.criterion.metric
    if not result.culprits:
        return "<p class='muted'>No culprit ranking (run with culprits on).</p>"

    def label(c) -> str:
        if c.harmless:
            return '<span class="verdict harmless">harmless</span>'
        if c.introduces_divergence:
            return '<span class="verdict bad">harmful</span>'
        return "below the criterion"

    rows = [[i, f"<code>{_e(c.node)}</code>", c.op_type, label(c), _num(c.introduced.get(m), m),
             _floor_cell(c.floor, m), _num(c.beyond_floor, m), _num(c.received.get(m), m),
             c.introduced.get("nonfinite_mismatch") or 0, _impact(c), c.explanation]
            for i, c in enumerate(result.culprits, 1)]
    return ("<p>Each node run alone on the candidate with the reference's inputs: the error it "
            "<em>introduces</em> (and beyond its output's precision floor), against what it <em>received</em>; "
            "ranked harmful first, by the error beyond the floor. <em>Impact</em>: what fixing the node (keeping it "
            "in the reference's precision) gains on the graph outputs; a harmless culprit gains almost nothing.</p>"
            + _table(["#", "node", "op_type", "verdict", f"introduced {m}", "floor", f"beyond floor ({m})",
                      f"received {m}", "non-finite", "impact", "explanation"], rows,
                     numeric={0, 4, 5, 6, 7, 8}, raw={1, 3, 4, 5, 6, 7, 9},
                     classes=["row-bad" if c.introduces_divergence and not c.harmless else ""
                              for c in result.culprits]))


def _granularity(result: CompareResult) -> str:
    """Escaped HTML of a fused-granularity comparison: what was compared, each culprit's group and the tensors left
    out with why ("" at granularity all)."""
    g = result.granularity
    if not g:
        return ""
    note = next((n for n in result.notes if n.startswith("granularity fused")),
                "only the tensors at the candidate engine's fused-group boundaries were compared")
    hidden = g.get("unobservable") or []
    text = ("<h2>Fused granularity</h2>" + f"<p>{_e(note)}</p>"
            + _kv([("engine", f"<code>{_e(g.get('engine'))}</code>, {_e(g.get('engine_nodes'))} executed nodes"),
                   ("compared", _e(f"{g.get('compared')} tensors (group boundaries)")),
                   ("not observable", _e(f"{len(hidden)} tensors (inside fused nodes, or folded)")),
                   ("fusion check", _e(g.get("fusion_check") or "-"))]))
    grouped = [c for c in result.culprits if c.group]
    if grouped:
        rows = [[i, f"<code>{_e(c.node)}</code>", f"<code>{_e(c.group.get('engine_node'))}</code>",
                 c.group.get("kind"), len(c.group.get("onnx_nodes") or []),
                 ", ".join(f"<code>{_e(n)}</code>" for n in (c.group.get("onnx_nodes") or [])[:12])
                 + (" ..." if len(c.group.get("onnx_nodes") or []) > 12 else "")]
                for i, c in enumerate(grouped, 1)]
        text += ("<h3>Culprit groups</h3><p>Each culprit ran as the whole group the engine fused it into.</p>"
                 + _table(["#", "culprit node", "engine node", "kind", "ONNX nodes", "which"], rows,
                          numeric={0, 4}, raw={1, 2, 5}))
    if hidden:
        shown = hidden[:_MAX_UNOBSERVABLE]
        text += (f"<details><summary>{len(hidden)} tensors not observable"
                 + (f" (the first {len(shown)}; the JSON holds all)" if len(shown) < len(hidden) else "")
                 + "</summary>" + _table(["tensor", "node", "op_type", "why not compared"],
                                         [[u.get("tensor"), u.get("node"), u.get("op_type"), u.get("reason")]
                                          for u in shown]) + "</details>")
    return text


def _clamps(result: CompareResult) -> str:
    clamped = (result.variant or {}).get("clamped") or []
    if not clamped:
        return ""
    rows = [[c.get("name"), c.get("kind"), f"{c.get('count')} of {c.get('size')}",
             ", ".join(f"{a:.4g} -> {b:.4g}" for a, b in zip(c.get("original") or [], c.get("converted") or [])),
             ", ".join(c.get("consumers") or [])] for c in clamped]
    return ("<h2>Constants the converter changed</h2>"
            + _table(["constant", "kind", "values changed", "original -> converted", "used by"], rows))


def _tensors_table(result: CompareResult) -> str:
    m = result.criterion.metric
    metrics = [m] + [k for k in ("cosine", "max_abs", "norm_max_abs", "nonfinite_mismatch") if k != m]
    outputs = set(result.outputs)
    tensors = sorted(result.tensors, key=lambda t: t.topo_index)
    rows = [[t.topo_index, t.tensor + (" (output)" if t.tensor in outputs else ""), t.op_type,
             *[_num(t.metrics.get(k), k) for k in metrics], _floor_cell(t.floor, m), _state(result, t)]
            for t in tensors]
    n = len(metrics)
    return (f"<details><summary>all {len(rows)} compared tensors</summary>"
            + _table(["#", "tensor", "op_type", *metrics, f"floor ({m})", "state"], rows,
                     numeric=set(range(3, 4 + n)) | {0}, raw=set(range(3, 5 + n)),
                     classes=["row-bad" if t.diverged else "row-floor" if t.at_floor else "" for t in tensors])
            + "</details>")


def _inventory(doc: dict | None) -> str:
    if doc is None:
        return "<p class='muted'>Not available (pass inspection=inspect_model(model)).</p>"
    ops = doc.get("ops") or []
    rows = [[o.get("op_type"), o.get("domain") or "ai.onnx", o.get("count"), o.get("since_version")] for o in ops]
    opsets = ", ".join(f"{k or 'ai.onnx'} {v}" for k, v in (doc.get("opset_imports") or {}).items())
    problems = doc.get("problems") or []
    return (f"<p>opset imports: {_e(opsets)}; IR version {_e(doc.get('ir_version'))}; {_e(doc.get('nodes'))} nodes; "
            f"{len(problems)} problem(s) found by onnx's checker.</p>"
            + _table(["op_type", "domain", "count", "since_version"], rows, numeric={2, 3}))


def render_report(result: CompareResult, *, inspection: Any = None, tensors: Mapping[str, Any] | None = None,
                  title: str | None = None, metric: str | None = None, bands: Any = None) -> str:
    """The report as one HTML string (see :func:`write_report`)."""
    require_plotly()
    from ..plots import compare as plots
    from ..plots.thresholds import Bands
    from .tensors import normalize

    if bands is None or bands.metric != (metric or result.criterion.metric):
        bands = Bands.from_criterion(result.criterion)  # the notebook's default colouring
    values = normalize(tensors)
    title = title or f"{result.model.get('name', 'model')}: {result.reference} vs {result.candidate}"
    parts = [
        f"<h1>{_e(title)}</h1>",
        "<h2>Summary</h2>", _summary(result),
        "<h2>Outputs</h2>", _outputs(result),
        "<h2>Culprits</h2>", _culprits(result), _granularity(result), _clamps(result),
        "<h2>Per-layer error</h2>", _bands_note(bands, metric or result.criterion.metric),
        _figure(plots.layer_error_curve(result, metric, bands=bands)),
        "<h2>Histograms</h2>", _figure(plots.metric_histogram(result, metric, bands=bands)),
    ]
    if result.culprits:
        parts.append(_figure(plots.culprit_bars(result, metric, bands=bands)))
    for name, (ref, cand) in values.items():
        parts += [f"<h2>Tensor <code>{_e(name)}</code></h2>",
                  f"<p class='muted'>shape {list(ref.shape)}, reference {ref.dtype}, candidate {cand.dtype} "
                  "(first feed)</p>",
                  _figure(plots.value_histograms(ref, cand, name)), _figure(plots.ref_vs_cand_scatter(ref, cand,
                                                                                                    name=name))]
        if ref.ndim >= 2:
            parts.append(_figure(plots.channel_error_heatmap(ref, cand, axis=1, name=name)))
    parts += ["<h2>Op inventory</h2>", _inventory(_inspection_json(result, inspection))]
    if result.notes:
        parts += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in result.notes) + "</ul>"]
    parts += ["<h2>Tensors</h2>", _tensors_table(result)]
    return page(title, parts, result.to_json())


def _bands_note(bands: Any, metric: str) -> str:
    """One line: the colour bands the figures shade, and whose they are."""
    if bands.metric != metric:
        return ""
    whose = "set by the user" if bands.source == "user" else "the criterion's defaults (bad: its tolerance)"
    return f"<p class='muted'>colour bands ({_e(whose)}): {_e('; '.join(label for label, _ in bands.legend()))}</p>"


def require_plotly() -> None:
    """Reports draw with plotly: say how to get it when it is missing."""
    try:
        import plotly.offline  # noqa: F401
    except ImportError:
        from ..errors import WorkbenchError

        raise WorkbenchError("the HTML report needs plotly",
                             "pip install plotly (or onnx-drift-workbench[ui])") from None


def page(title: str, parts: list[str], data: dict) -> str:
    """The self-contained HTML page: CSP, style, plotly.js inline, ``parts`` (HTML), and ``data`` as embedded
    JSON (``<script id="workbench-result">``) so the numbers travel with the pictures."""
    import plotly.offline

    doc = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>\n<body>\n'
        + "\n".join(parts)
        + f'\n<script type="application/json" id="workbench-result">{doc}</script>\n</body></html>\n'
    )


def write_report(result: CompareResult, path: str | os.PathLike, inspection: Any = None, *,
                 tensors: Mapping[str, Any] | None = None, title: str | None = None,
                 metric: str | None = None, bands: Any = None) -> Path:
    """Write the self-contained HTML report of ``result`` to ``path`` (atomically).

    ``inspection``: an :class:`~workbench.inspection.Inspection` or its JSON for the op inventory (default:
    inspect the model file the result names, if it is still there and unchanged). ``tensors``:
    ``{name: (reference, candidate)}`` values for value histograms (see :func:`workbench.report.capture_tensors`,
    or ``Bundle.tensors()``). ``metric``: the metric plotted (default: the criterion's). ``bands``
    (:class:`~workbench.plots.thresholds.Bands` of that metric): the colour thresholds the figures shade (default:
    the criterion's, as the notebook colours a run until the user sets their own)."""
    from .._atomic import atomic_write_text

    text = render_report(result, inspection=inspection, tensors=tensors, title=title, metric=metric, bands=bands)
    out = atomic_write_text(path, text)
    log.info("wrote report %s (%.1f MiB)", out, len(text) / 1024**2)
    return out
