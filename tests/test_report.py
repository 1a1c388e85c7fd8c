"""HTML report and plots: pure plot functions on real results; the report is self-contained and renders in a
real headless Chromium with the network off."""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.cli import main
from workbench.compare.api import compare
from workbench.compare.explain import gain_text
from workbench.plots import compare as plots
from workbench.report import capture_tensors, write_report

CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def clamp():
    result = compare(SAMPLES / "fp16_clamp_constant.onnx", "ort", "ort:fp16")
    return result, capture_tensors(result, "auto")


@pytest.fixture(scope="module")
def healthy():
    return compare(SAMPLES / "healthy_cnn.onnx", "ort", "ort:fp16")


FLOOR_TRACES = ["FP16 floor band edge", "FP16 floor (reference held in FP16)"]


def test_layer_error_curve(clamp, healthy):
    result, _ = clamp
    fig = plots.layer_error_curve(result)
    names = [t.name for t in fig.data]
    assert names == ["sqnr_db", *FLOOR_TRACES, "diverged", "graph output", "first divergent"]
    line = fig.data[0]
    assert list(line.x) == sorted(t.topo_index for t in result.tensors)
    first = result.first_divergent
    star = fig.data[names.index("first divergent")]
    assert list(star.x) == [first.topo_index]
    assert star.y[0] == pytest.approx(first.metrics["sqnr_db"])
    hline = [s for s in fig.layout.shapes if s.y0 == s.y1]
    assert hline and hline[0].y0 == result.criterion.threshold  # the tolerance line
    assert any("first divergent" in (a.text or "") for a in fig.layout.annotations)
    # exact matches (inf dB) are drawn at a cap, never as inf; no diverged trace on a healthy model
    exact = compare(SAMPLES / "healthy_cnn.onnx", "ort", "ort")
    ys = plots.layer_error_curve(exact).data[0].y
    assert all(math.isfinite(y) for y in ys)
    assert [t.name for t in plots.layer_error_curve(exact).data] == ["sqnr_db", "graph output"]  # fp32: no floor
    assert [t.name for t in plots.layer_error_curve(healthy).data] == ["sqnr_db", *FLOOR_TRACES, "graph output"]
    tb = compare(SAMPLES / "transformer_block.onnx", "ref", "ref:fp16", feeds=SAMPLES / "transformer_block_inputs.npz")
    odd = [t for t in plots.layer_error_curve(tb).data if t.name == "inf/NaN mismatch"]
    assert odd and tb.first_divergent.topo_index in list(odd[0].x)  # diverged by inf, not by SQNR
    log = plots.layer_error_curve(result, "max_abs")
    assert log.layout.yaxis.type == "log" and not [s for s in log.layout.shapes if s.y0 == s.y1]
    # an annotation on a log axis sits at log10 of its value
    note = next(a for a in log.layout.annotations if "first divergent" in (a.text or ""))
    assert note.y == pytest.approx(math.log10(first.metrics["max_abs"]))


def test_metric_histogram_and_culprit_bars(clamp):
    result, _ = clamp
    fig = plots.metric_histogram(result)
    counts = {t.name: int(sum(t.y)) for t in fig.data}
    assert counts == {"within tolerance": sum(not t.diverged for t in result.tensors),
                      "diverged": sum(t.diverged for t in result.tensors)}
    assert any(s.x0 == s.x1 == result.criterion.threshold for s in fig.layout.shapes)
    bars = plots.culprit_bars(result)
    assert bars.data[0].y[0] == "1. /bn_big_var/BatchNormalization (BatchNormalization)"  # harmful: no label
    assert bars.data[0].x[0] == pytest.approx(result.culprits[0].introduced["sqnr_db"])
    assert bars.data[1].x[0] == pytest.approx(result.culprits[0].received["sqnr_db"])


def test_tensor_plots_are_pure_and_bounded():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 8, 32, 32)).astype(np.float32)
    cand = ref.astype(np.float16)
    cand[:, 3] += 5  # one bad channel
    cand[0, 0, 0, 0] = np.inf
    h = plots.value_histograms(ref, cand, "x")
    assert [t.name for t in h.data] == ["reference", "candidate", "error"]
    assert int(sum(h.data[0].y)) == ref.size and int(sum(h.data[1].y)) == ref.size - 1  # inf left out, counted
    assert "non-finite: reference 0, candidate 1" in h.layout.title.text
    s = plots.ref_vs_cand_scatter(ref, cand, max_points=500, seed=1)
    assert len(s.data[0].x) == 499 or len(s.data[0].x) == 500
    again = plots.ref_vs_cand_scatter(ref, cand, max_points=500, seed=1)
    np.testing.assert_array_equal(s.data[0].x, again.data[0].x)  # seeded sample
    hm = plots.channel_error_heatmap(ref, cand, axis=1)
    z = np.array(hm.data[0].z, dtype=float)
    assert z.shape == (8, 128)
    assert np.nanargmax(np.nanmean(z, axis=1)) == 3  # the bad channel stands out
    past = plots.channel_error_heatmap(ref, cand, axis=7)  # past the rank: said, and axis 1 drawn, not 7 % 4
    title = past.layout.title.text.replace("<br>", " ")  # fit_title wraps long titles
    assert "axis 7 is past its 4 dimensions" in title and np.array(past.data[0].z).shape[0] == 8
    flat = plots.channel_error_heatmap(ref[0, 0, 0], cand[0, 0, 0])
    assert np.array(flat.data[0].z, dtype=float).shape[0] == 1
    # pure: inputs untouched, no engine imported by the plots module itself
    assert np.isinf(cand[0, 0, 0, 0])
    source = Path(plots.__file__).read_text()
    assert "onnxruntime" not in source and "get_engine" not in source and "make_engine" not in source


def test_report_is_self_contained(clamp, tmp_path):
    result, values = clamp
    path = write_report(result, tmp_path / "r.html", tensors=values)
    text = path.read_text()
    for section in ("Summary", "Outputs", "Culprits", "Per-layer error", "Histograms", "Op inventory", "Tensors"):
        assert f"<h2>{section}</h2>" in text
    assert result.model["sha256"] in text and "DIVERGED" in text and "BatchNormalization" in text
    assert "clamped constant" in text  # the explanation
    body = _body(text)
    summary = _section(body, "Summary")
    assert 'DIVERGED</span> output(s) logits fail sqnr_db &lt; 30' in summary
    assert "<th>candidate precision</th><td><b>fp16</b>" in summary and "float16 holds 100%" in summary
    assert "<th>reference precision</th><td><b>fp32</b>" in summary
    outputs = _section(body, "Outputs")
    assert "<code>logits</code>" in outputs and "FP16 " in outputs and "DIVERGED" in outputs
    culprits = _section(body, "Culprits")
    assert '<span class="verdict bad">harmful</span>' in culprits
    gain = result.culprits[0].impact["best_gain_db"]
    assert html.escape(gain_text(gain), quote=True) in culprits
    assert "FP16 floor (reference held in FP16)" in body  # the per-layer curve carries the floor band
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    # no external resource: no src/href to anything, no stylesheet link, no CSS import or url()
    assert not re.search(r"<script[^>]+src=", text) and "<link" not in text
    assert not re.search(r"@import|url\(\s*['\"]?https?:", text)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text.split("</head>", 1)[1])
    assert text.count("Plotly.newPlot") >= 6
    embedded = re.search(r'<script type="application/json" id="workbench-result">(.*?)</script>', text, re.S)
    assert json.loads(embedded.group(1))["first_divergent"]["node"] == "/bn_big_var/BatchNormalization"
    assert "BatchNormalization" in text.split("<h2>Op inventory</h2>", 1)[1]


def test_report_says_an_infinite_gain_in_words(clamp, tmp_path):
    """A culprit whose fix makes the outputs exact (gain inf dB) is said in words, never printed as a number."""
    result = clamp[0]
    culprit = result.culprits[0]
    kept = culprit.impact
    culprit.impact = {**kept, "best_gain_db": math.inf, "gain": {o: math.inf for o in (kept.get("gain") or {"y": 0})}}
    try:
        culprits = _section(_body(write_report(result, tmp_path / "r.html").read_text()), "Culprits")
    finally:
        culprit.impact = kept
    said = html.escape(gain_text(math.inf), quote=True)
    assert said in culprits
    assert not re.search(r"\binf\b|infinity", culprits.replace(said, ""), re.I)
    assert "exact" in culprits


def test_cli_compare_writes_report_and_bundle(tmp_path, capsys):
    report, bundle = tmp_path / "out" / "r.html", tmp_path / "out" / "b"
    code = main(["compare", str(SAMPLES / "fp16_clamp_constant.onnx"), "--report", str(report),
                 "--bundle", str(bundle), "--json", str(tmp_path / "r.json")])
    assert code == 1
    err = capsys.readouterr().err
    assert "report written" in err and "bundle written" in err
    assert report.stat().st_size > 1_000_000 and (bundle / "manifest.json").is_file()
    assert "value distributions" in report.read_text()  # selected tensors captured for the histograms


def _body(text: str) -> str:
    """The report's body without plotly.js and the embedded result JSON."""
    return text.split("</head>", 1)[1].split('<script type="application/json" id="workbench-result">')[0]


def _section(body: str, name: str) -> str:
    return body.split(f"<h2>{name}</h2>", 1)[1].split("<h2>", 1)[0]


def test_report_of_a_passing_run_with_internal_dips(tmp_path):
    result = compare(SAMPLES / "transformer_block.onnx", "ort", "ort:fp16",
                     feeds=SAMPLES / "transformer_block_inputs.npz")
    assert not result.diverged
    body = _body(write_report(result, tmp_path / "r.html").read_text())
    summary = _section(body, "Summary")
    assert '<span class="verdict good">OK</span> every output passes sqnr_db &lt; 30' in summary
    assert "3 internal dip(s)" in summary and "not a divergence" in summary and "first divergent" not in summary
    outputs = _section(body, "Outputs")
    assert "Internal dips (3)" in outputs and "/block/ln2/Pow_output_0" in outputs
    assert outputs.count('<span class="verdict dip">internal dip</span>') == 3
    assert "DIVERGED" not in body.split("<h2>Per-layer error</h2>")[0]
    assert '"name":"internal dip (outputs pass)"' in body and '"name":"first divergent"' not in body


def test_report_of_an_output_at_its_floor(tmp_path):
    from test_ui_plots import at_floor_result

    result = at_floor_result(tmp_path)
    body = _body(write_report(result, tmp_path / "r.html").read_text())
    assert "1 at the candidate format&#x27;s floor" in _section(body, "Summary")
    outputs = _section(body, "Outputs")
    assert '<tr class="row-floor">' in outputs and '<span class="verdict floor">at its floor</span>' in outputs
    culprits = _section(body, "Culprits")
    assert '<span class="verdict harmless">harmless</span>' in culprits and "gains at most" in culprits


def test_report_plots_hold_no_out_of_range_floats(tmp_path):
    """inf/NaN metrics (FP16 overflow) reach neither the figures nor the embedded JSON."""
    result = compare(SAMPLES / "cnn_fp16_overflow.onnx", "ref", "ref:fp16")
    assert result.tensor("logits").metrics["nonfinite_mismatch"] > 0
    text = write_report(result, tmp_path / "r.html").read_text()
    body = _body(text)
    assert not re.search(r"[:\[,]\s*-?(NaN|Infinity)\b", body), "a bare NaN/Infinity in the plots' JSON"
    blob = re.search(r'<script type="application/json" id="workbench-result">(.*?)</script>', text, re.S).group(1)
    json.loads(blob, parse_constant=lambda c: pytest.fail(f"{c} in the embedded result"))
    assert "inf\\u002fNaN values drawn at" in body  # plotly escapes "/" in its JSON


def test_report_of_a_result_from_before_precision_floors(clamp, tmp_path):
    """A results JSON without "precision", "verdict" or floors renders; the report says what is missing."""
    from workbench.compare.result import CompareResult

    result, _ = clamp
    doc = json.loads(json.dumps(result.to_json()))
    del doc["precision"], doc["verdict"]
    for t in doc["tensors"]:
        t.pop("floor", None), t.pop("at_floor", None)
    for c in doc["culprits"]:
        for key in ("floor", "beyond_floor", "impact"):
            c.pop(key, None)
    old = CompareResult.from_json(doc)
    body = _body(write_report(old, tmp_path / "r.html").read_text())
    assert "not recorded" in _section(body, "Summary") and "DIVERGED" in _section(body, "Summary")
    assert "not measured" in _section(body, "Culprits")
    assert "floor (reference held" not in body


def _chromium_or_skip():
    if not Path(CHROMIUM).exists():
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER"):
            pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs it: apt-get install chromium)")
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium chromium-driver")
    return pytest.importorskip("playwright.sync_api")


def _render_offline(path: Path, check) -> tuple[list[str], list[str]]:
    """Open ``path`` in headless Chromium with the network off (offline context, every non-file request aborted
    and recorded); run ``check(page)``; return (requests that tried to leave, page errors)."""
    sync_api = _chromium_or_skip()
    requests, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.set_offline(True)

            def route(r):
                if r.request.url.startswith("file:"):
                    return r.continue_()
                requests.append(r.request.url)
                return r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:")) or r.url in requests
                    else requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(path.as_uri())
            check(page)
        finally:
            browser.close()
    return requests, errors


@pytest.mark.browser
def test_report_renders_offline_in_chromium(clamp, tmp_path):
    result, values = clamp
    path = write_report(result, tmp_path / "report.html", tensors=values)

    def check(page):
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        drawn = page.locator(".js-plotly-plot").count()
        assert drawn == page.locator(".plotly-graph-div").count() >= 6
        assert page.locator(".js-plotly-plot .main-svg").count() >= drawn
        assert page.locator(".js-plotly-plot .scatterlayer .trace path").count() > 0  # line traces drawn
        assert page.locator(".js-plotly-plot .barlayer .point path").count() > 0  # histogram bars drawn
        assert page.locator(".js-plotly-plot .heatmaplayer image").count() > 0  # heatmap drawn
        assert "first divergent" in page.locator(".js-plotly-plot .legendtext").all_text_contents()
        assert page.evaluate("JSON.parse(document.getElementById('workbench-result').textContent).diverged")

    requests, errors = _render_offline(path, check)
    assert requests == [], f"the report tried to reach the network: {requests}"
    assert errors == [], errors


@pytest.mark.browser
def test_offline_harness_sees_requests(tmp_path):
    """Negative control: the same harness does catch a page that reaches for the network."""
    page_file = tmp_path / "leaky.html"
    page_file.write_text('<!DOCTYPE html><html><body><img src="https://cdn.example.invalid/x.png">'
                         '<script src="https://cdn.plot.ly/plotly-2.0.0.min.js"></script></body></html>')
    requests, _ = _render_offline(page_file, lambda page: page.wait_for_load_state("load"))
    assert any("cdn.example.invalid" in u for u in requests) and any("cdn.plot.ly" in u for u in requests)


def test_report_for_a_result_without_model_file(clamp, tmp_path):
    """A result read back from JSON whose model is gone: the report still renders, inventory marked missing."""
    from workbench.compare.result import CompareResult

    result, _ = clamp
    doc = result.to_json()
    doc["model"]["path"] = str(tmp_path / "gone.onnx")
    text = write_report(CompareResult.from_json(doc), tmp_path / "r.html").read_text()
    assert "Not available" in text.split("<h2>Op inventory</h2>", 1)[1][:300]


def test_report_escapes_hostile_names(tmp_path):
    """Node and tensor names come from the model file: markup in them must stay text."""
    import onnx
    from conftest import tiny_model

    model = tiny_model()
    evil = '</script><img src=x onerror="alert(1)">'
    model.graph.node[0].name = evil
    model.graph.node[0].output[0] = evil + "_out"
    model.graph.node[1].input[0] = evil + "_out"
    onnx.save(model, tmp_path / "evil.onnx")
    result = compare(tmp_path / "evil.onnx", "ort", "ort:fp16")
    text = write_report(result, tmp_path / "r.html").read_text()
    assert evil not in text
    body, blob = text.split('<script type="application/json" id="workbench-result">')
    assert "<img src=x" not in body  # outside the JSON blob: escaped markup
    assert "</script" not in blob.split("</script>")[0]  # inside it: "</" escaped, so it cannot close the script
    assert "&lt;/script&gt;&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text


@pytest.fixture(scope="module")
def outlier_calibration():
    from workbench.calibrate import calibrate

    return calibrate(SAMPLES / "int8_outlier.onnx", 16, eval_data=4)


def test_calibration_report_names_each_rule_and_puts_the_notes_first(outlier_calibration, tmp_path):
    import html

    from workbench.calibrate.methods import RULES
    from workbench.report.calibration_html import write_calibration_report

    report = outlier_calibration
    assert any("ranks the tensors, but" in n for n in report.notes)  # entropy is far worse here: a note says so
    body = _body(write_calibration_report(report, tmp_path / "cal.html", top=2).read_text())
    top = body.split("<h2>Summary</h2>", 1)[0]
    assert 'class="notes"' in top and all(html.escape(n) in top for n in report.notes)
    summary = _section(body, "Summary")
    assert "<th>ranking rule</th><td><b>entropy</b>: " + html.escape(RULES["entropy"].label) in summary
    assert "each rule&#x27;s default" in summary  # percentile=None: each rule's own
    rules = _section(body, "Rules")
    assert rules.count("<tr") == 1 + len(report.methods)
    for m, s in report.summary.items():
        assert f"<td>{html.escape(m)}</td><td>{html.escape(s['toolchain'])}</td>" in rules
        assert html.escape(s["rule"]) in rules
    assert rules.count('class="chosen"') == 1 and "ranks the tensors" in rules
    ranges = _section(body, "Ranges (amax) of the most sensitive tensors")
    head = ranges.split("</thead>", 1)[0]
    assert all(f"<th>{html.escape(f'{m} ({RULES[m].toolchain})')}</th>" in head for m in report.methods)
    lo, hi = report.bounds["ort-entropy"][report.sensitivity[0].tensor]
    assert f"[{lo:.4g}, {hi:.4g}]" in ranges  # the asymmetric ONNX Runtime bounds
    assert "entropy (TensorRT)" in body and "ort-percentile (ONNX Runtime)" in body  # the plots' legends


def test_calibration_text_lists_the_rules_their_scores_and_the_notes(outlier_calibration):
    from workbench.calibrate.methods import RULES
    from workbench.calibrate.text import render

    report = outlier_calibration
    text = render(report, top=2)
    rules = text.split("Rules (", 1)[1].split("\nSQNR:", 1)[0].splitlines()
    assert rules[0].endswith("ranked under entropy (TensorRT)):")
    by_rule = {line.split()[0]: line for line in rules[1:1 + len(report.methods)]}
    assert list(by_rule) == report.methods
    for m, line in by_rule.items():
        median = report.summary[m]["median_worst_sqnr_db"]
        assert RULES[m].label in line and f"median worst {median:.1f} dB" in line
        assert f"best on {report.summary[m]['tensors_best']} tensor(s)" in line
        assert line.endswith("<- ranks the tensors") == (m == "entropy")
    assert "[percentile 99.99]" in by_rule["percentile"] and "[percentile 99.999]" in by_rule["ort-percentile"]
    assert all(f"note: {n}" in text for n in report.notes)
    assert text.index("note: ") < text.index("Worst tensors per rule")  # the notes come before the details
    assert "  ort-entropy (ONNX Runtime):" in text
