"""Engine graphs in HTML reports and bundles (issue 15, item 4): `workbench inspect --engine SPEC --report`, the
fused-granularity section of the comparison report, the engine graph a fused comparison's bundle carries, and the
rerun that says whether the fusions changed. Real engines (ONNX Runtime, OpenVINO) on the small model of
tests/test_engine_graph.py."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import onnx
import pytest
from test_engine_graph import trt_model

from workbench.cli import main
from workbench.compare.api import compare
from workbench.engine_graphs.api import engine_graph
from workbench.engine_graphs.result import EngineGraph
from workbench.report.bundle import load_bundle
from workbench.report.engine_graph_html import render_engine_graph_report
from workbench.report.html import write_report
from workbench.report.rerun import rerun_bundle
from workbench.report.safety import BundleError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(trt_model(), path)
    return path


@pytest.fixture(scope="module")
def bundle(tiny, tmp_path_factory) -> Path:
    """`workbench compare --granularity fused --bundle`: ONNX Runtime FP32 against its FP16 variant."""
    dest = tmp_path_factory.mktemp("bundles") / "fused"
    assert main(["compare", str(tiny), "--ref", "ort", "--cand", "ort:fp16", "--granularity", "fused",
                 "--impact", "0", "--bundle", str(dest)]) == 0
    return dest


def _section(text: str, title: str) -> str:
    """The HTML from ``<h2>title`` to the next ``<h2>``."""
    start = text.index(f"<h2>{title}")
    end = text.find("<h2>", start + 4)
    return text[start:end if end != -1 else len(text)]


def _rows(section: str) -> list[list[str]]:
    """Each body row's cells as plain text."""
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[-1], re.S)]


def _embedded(text: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="workbench-result">(.*?)</script>', text,
                                re.S).group(1))


def test_inspect_report_is_offline_and_shows_the_json_numbers(tiny, tmp_path, capsys):
    out, report = tmp_path / "g.json", tmp_path / "g.html"
    assert main(["inspect", str(tiny), "--engine", "ort", "--runs", "3", "--json", str(out), "--report",
                 str(report)]) == 0
    doc, text = json.loads(out.read_text()), report.read_text()
    # one file, nothing fetched: no script src, no stylesheet link, no http(s) reference in the body
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"<script[^>]+src=", text) and "<link" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text.split("</head>", 1)[1])
    assert text.count("Plotly.newPlot") >= 2  # slowest nodes, latency by provider
    assert _embedded(text) == doc
    # the slowest nodes: the JSON's names, numbers and ONNX nodes, slowest first
    slow = sorted((n for n in doc["nodes"] if n["latency_ms"] is not None), key=lambda n: -n["latency_ms"])[:10]
    rows = _rows(_section(text, "Slowest"))
    assert slow and [r[1] for r in rows] == [n["name"] for n in slow]
    for row, node in zip(rows, slow):
        assert row[3:7] == [node["provider"], node["precision"], f"{node['latency_ms']:.4g}",
                            f"{node['latency_p90_ms']:.4g}"]
        assert [s.strip() for s in row[8].split(",")] == node["onnx_nodes"]
        assert row[9] == f"{node['dispatch_ms']:.4g}"  # ORT: the dispatch time before the node, from its trace
    assert f"{doc['end_to_end_ms']:.4g} ms</b> median" in _section(text, "Summary")
    fused = [n for n in doc["nodes"] if n["role"] == "compute" and len(n["onnx_nodes"]) > 1]
    assert len(fused) >= 2 and [r[0] for r in _rows(_section(text, "Fused groups"))] == [n["name"] for n in fused]
    providers = _rows(_section(text, "Providers"))
    assert providers == [[doc["nodes"][0]["provider"], str(len(doc["nodes"])), *providers[0][2:]]]
    assert int(providers[0][3]) == len(fused)
    capsys.readouterr()
    # --report belongs to --engine; outputs must differ
    assert main(["inspect", str(tiny), "--report", str(tmp_path / "x.html")]) == 2
    assert "--report" in capsys.readouterr().err
    assert main(["inspect", str(tiny), "--engine", "ort", "--json", str(out), "--report", str(out)]) == 2
    assert "both name" in capsys.readouterr().err


def test_engine_graph_report_unprofiled_fallbacks_and_hostile_names(tiny):
    graph = engine_graph(tiny, "openvino", runs=0)
    text = render_engine_graph_report(graph)
    assert "Not profiled" in text and 'class="warn"' not in text and "Plotly.newPlot" not in text
    assert {r[0] for r in _rows(_section(text, "Precisions"))} == {n.precision for n in graph.nodes}
    graph.compute_nodes[0].provider = "GPU"
    graph.compute_nodes[0].name = "<img src=x onerror=alert(1)>"
    text = render_engine_graph_report(graph)
    page = text.split('id="workbench-result"', 1)[0]
    assert '<div class="warn"><b>1 node(s) fell back</b>' in page and "(GPU)" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_compare_report_shows_fused_groups_and_unobservable_tensors(tiny, tmp_path):
    result = compare(tiny, "ort", "ort:fp16", granularity="fused", impact=0)
    g = result.granularity
    assert g["unobservable"] and any(c.group for c in result.culprits)
    section = _section(write_report(result, tmp_path / "r.html").read_text(), "Fused granularity")
    note = next(n for n in result.notes if n.startswith("granularity fused"))
    assert html.escape(note) in section
    groups = _rows(section.split("<h3>Culprit groups</h3>", 1)[1].split("<details>", 1)[0])
    assert [(r[1], r[2], int(r[4])) for r in groups] == [(c.node, c.group["engine_node"], len(c.group["onnx_nodes"]))
                                                         for c in result.culprits if c.group]
    hidden = _rows(section.split("<details>", 1)[1])
    assert [[r[0], r[3]] for r in hidden] == [[u["tensor"], u["reason"]] for u in g["unobservable"]]
    every = compare(tiny, "ort", "ort:fp16", impact=0, culprits=False)
    assert "Fused granularity" not in write_report(every, tmp_path / "all.html").read_text()


def test_fused_bundle_carries_its_engine_graph_and_reruns(bundle, tmp_path, capsys):
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["engine_graph"]
    assert entry["file"] == "engine_graph.json" and entry["file"] in manifest["files"]
    assert manifest["compare"]["options"]["granularity"] == "fused"
    graph = EngineGraph.load_json(bundle / entry["file"])
    assert graph.engine == "ort:fp16" and entry["fused"] == len(graph.fused_nodes) >= 2
    with load_bundle(bundle) as b:
        saved = b.result
        assert b.engine_graph().to_json() == graph.to_json()
    names = {n.name for n in graph.nodes}
    assert saved.granularity["groups"] and all(grp["engine_node"] in names for grp in saved.granularity["groups"]
                                               .values())
    capsys.readouterr()
    out = tmp_path / "rerun.json"
    assert main(["rerun", str(bundle), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["reproduced"] and doc["result"]["granularity"]["mode"] == "fused"  # same granularity
    assert doc["result"]["granularity"]["groups"] == saved.granularity["groups"]
    assert doc["fusions"] == {"changed": False, "source": "engine graphs", "before": len(graph.fused_nodes),
                              "after": len(graph.fused_nodes), "only_before": [], "only_after": []}
    text = capsys.readouterr().out
    assert "REPRODUCED" in text and f"fusions: unchanged ({len(graph.fused_nodes)} fused group" in text


def test_rerun_says_when_the_fusions_changed(bundle):
    """The same bundle rerun at ORT's basic optimization level (as a newer ORT fusing differently would): the
    Conv fusions are gone, and the rerun names them; without the engine graph it falls back to the compared
    groups."""
    with load_bundle(bundle) as b:
        b.manifest["compare"]["options"]["engine_options"] = {"ort": {"graph_optimization": "basic"}}
        report = rerun_bundle(b)
        fused = {frozenset(n.onnx_nodes) for n in b.engine_graph().fused_nodes}
        change = report.fusions
        assert change["changed"] and change["source"] == "engine graphs"
        assert {frozenset(g["onnx_nodes"]) for g in change["only_before"]} == fused
        assert "fusions CHANGED" in report.render() and report.to_json()["fusions"] == change
        b.manifest["engine_graph"] = None
        again = rerun_bundle(b).fusions
        assert again["changed"] and again["source"] == "compared groups"
        b.manifest["engine_graph"] = {"file": "results.json"}
        with pytest.raises(BundleError, match="schema"):
            b.engine_graph()


def test_tampered_engine_graph_is_refused(bundle, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    path = bad / "engine_graph.json"
    doc = json.loads(path.read_text())
    doc["nodes"][0]["onnx_nodes"] = doc["nodes"][0]["onnx_nodes"][:1]
    path.write_text(json.dumps(doc, indent=2) + "\n")
    with pytest.raises(BundleError, match="engine_graph.json changed since the bundle was written"):
        load_bundle(bad)
    capsys.readouterr()
    assert main(["rerun", str(bad)]) == 2
    assert "engine_graph.json changed since the bundle was written" in capsys.readouterr().err


@pytest.mark.browser
def test_inspect_report_renders_offline_in_chromium(tiny, tmp_path):
    from test_report import _render_offline

    report = tmp_path / "g.html"
    assert main(["inspect", str(tiny), "--engine", "ort", "--runs", "2", "--report", str(report)]) == 0

    def check(page):
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() == page.locator(".plotly-graph-div").count() >= 2
        assert page.locator(".js-plotly-plot .barlayer .point path").count() > 0
        assert page.evaluate("JSON.parse(document.getElementById('workbench-result').textContent).schema") == \
            "workbench.engine_graph/1"

    requests, errors = _render_offline(report, check)
    assert requests == [] and errors == [], (requests, errors)
