"""Write the notebooks in notebooks/ from their cell sources, then execute them in place (outputs and widget state
saved, so they render in viewers before anyone runs them).

    python scripts/make_notebooks.py [--no-execute] [NAME ...]

The notebooks are generated so that their code stays reviewable here; tests execute them again. Everything runs
offline on the CPU, on the bundled sample models; exports go to temporary folders, never into notebooks/.

Saved so that opening one before running it is clean: the kernelspec is the installed one (JupyterLab rewrites a
different display name on open, marking the notebook modified); each figure in a cell output carries a PNG of
itself (JupyterLab's plotly renderer shows it until the mouse enters the figure; without one it adds a PNG as it
draws, marking the notebook modified on open; drawn with Playwright and Chromium, see add_pictures); paths of
this machine (the repository, temporary folders) are written relative to the notebook or as "(a temporary
folder)".
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"

#: every notebook starts with this: plotly figures as plotly's JSON mimetype (JupyterLab and VS Code render it
#: offline; no plotly.js copy saved per notebook)
PLOTLY_SETUP = """import plotly.io as pio

pio.renderers.default = "plotly_mimetype"  # offline rendering in JupyterLab; keeps the saved notebook small"""

QUICKSTART = [
    ("md", """# onnx-drift-workbench: quick start

**Run the notebook** (*Run > Run All Cells*), then use the workbench right below: open **Compare**, press **Run**
and the workbench finds the layer where FP16 drifts from FP32 and the node that causes it. Click a culprit or a
point of the error curve to see that layer's values; the **Graph** tab shows where it sits in the model.
Everything runs offline on the CPU, on a bundled sample model with a planted fault."""),
    ("code", f"""{PLOTLY_SETUP}
from pathlib import Path

from workbench import Workbench

SAMPLES = Path("../sample_models").resolve()
wb = Workbench(SAMPLES / "fp16_clamp_constant.onnx")  # FP32 (ort) vs FP16 (ort:fp16) by default
wb"""),
    ("md", """The rest of this notebook does the same from code: each panel is a thin view over these functions.

## Load and inspect
`inspect_model` accepts a path, bytes, an `onnx.ModelProto` or a `torch.nn.Module` with example inputs."""),
    ("code", """import pandas as pd

import workbench
from workbench import inspect_model

model_path = SAMPLES / "fp16_clamp_constant.onnx"
result = inspect_model(model_path)
doc = result.to_json()
print(f"workbench {workbench.__version__}: {doc['model']['name']}: {doc['nodes']} nodes, "
      f"{doc['params']['count']:,} parameters, opsets {doc['opset_imports']}, sha256 {doc['model']['sha256'][:16]}")
kinds = ["input"] * len(doc["inputs"]) + ["output"] * len(doc["outputs"])
pd.DataFrame(doc["inputs"] + doc["outputs"], index=kinds)"""),
    ("md", "## Opset inventory\nEach operator type, how often it is used, and the opset version its schema "
           "dates from."),
    ("code", """from workbench.plots.inventory import inventory_bar

inventory_bar(result)"""),
    ("code", "result.inventory.to_frame()"),
    ("md", "## Will my runtime take it?\nFrom the package's compatibility tables (each row names its source), "
           "and a real ONNX Runtime session built here."),
    ("code", """pd.DataFrame([{"target": c["target"], "model opset": c["model_opset"], "max opset": c["max_opset"],
               "ok": c["ok"], "unsupported": ", ".join(u["op_type"] for u in c["unsupported"])}
              for c in doc["compatibility"]])"""),
    ("code", "pd.DataFrame(doc[\"probes\"])"),
    ("md", """## FP32 vs FP16: where and why
`compare` runs both sides layer by layer. *Where*: the first tensor over the tolerance. *Why*: every node also
runs alone on the candidate with the reference's inputs, and nodes are ranked by the error they **introduce**."""),
    ("code", """from workbench.compare.api import compare

cmp = compare(model_path, "ort", "ort:fp16", seed=0)
first = cmp.first_divergent
print(f"first divergent: {first.node} ({first.op_type}), SQNR {first.metrics['sqnr_db']:.1f} dB")
culprit = cmp.culprits[0]
print(f"culprit: {culprit.node}\\n  {culprit.explanation}")
cmp.culprits_frame()[["rank", "node", "op_type", "introduced_sqnr_db", "received_sqnr_db", "explanation"]]"""),
    ("md", "## Plots\nThe per-layer error curve with the tolerance and the first divergent layer marked:"),
    ("code", """from workbench.plots.compare import culprit_bars, layer_error_curve

layer_error_curve(cmp)"""),
    ("code", "culprit_bars(cmp)"),
    ("md", """The culprit's values on both sides (the comparison keeps statistics, not arrays: `tensor_values` runs both
engines once more with that one tensor marked):"""),
    ("code", """from workbench.inspect_tensor import tensor_values
from workbench.plots.compare import channel_error_heatmap, ref_vs_cand_scatter, value_histograms

ref, cand = tensor_values(model_path, "ort", "ort:fp16", culprit.tensor, cmp.used_feeds)
value_histograms(ref, cand, culprit.tensor)"""),
    ("code", "ref_vs_cand_scatter(ref, cand, name=culprit.tensor)"),
    ("code", "channel_error_heatmap(ref, cand, axis=1, name=culprit.tensor)  # one channel carries the error"),
    ("md", "## The graph, coloured by the error each node introduces"),
    ("code", """from workbench.plots.graph import GraphView, graph_figure

graph_figure(GraphView.from_graph(result.model.graph), overlay="introduced", result=cmp)"""),
    ("md", """## FP16 arithmetic overflow
ONNX Runtime's CPU provider computes most FP16 ops in FP32, so an activation overflow does not show on `ort:fp16`.
`ref:fp16` runs the FP16 model in numpy float16 arithmetic and shows it on a CPU:"""),
    ("code", """cnn = compare(SAMPLES / "cnn_fp16_overflow.onnx", "ort", "ref:fp16")
print(cnn.first_divergent.node, "|", cnn.culprits[0].explanation)"""),
    ("md", """## Drift over a dataset
One feed says little about your data. `compare_dataset` runs both engines on every sample of a dataset (here a
temporary folder of 16 `.npz` files, one feed each), with a task metric per sample (`top1`: does FP16 pick the
same class as FP32?), the worst samples and each layer's error across samples. The planted clamp breaks every
sample at the same layer. `task_target="top1>=1"` judges the run by the task (every sample keeps FP32's class)
instead of the outputs' tolerance; the reason still counts the samples whose outputs diverge. The **Dataset** tab
above holds the same folder and result: click a sample there to compare it layer by layer."""),
    ("code", """import tempfile

import numpy as np

from workbench import load_model
from workbench.dataset import compare_dataset
from workbench.inputs import random_feeds

data_dir = Path(tempfile.mkdtemp(prefix="workbench-dataset-"))
for i, feed in enumerate(random_feeds(load_model(model_path), seed=1, count=16)):
    np.savez(data_dir / f"sample_{i:02d}.npz", **feed)
drift = compare_dataset(model_path, "ort", "ort:fp16", data_dir, metrics=["top1"], task_target="top1>=1")
wb.dataset_panel.set_dataset(data_dir)  # the Dataset tab: this folder and this result
wb.dataset_panel.show_result(drift)
print(drift.render())"""),
    ("md", "Each layer's error across the samples (mean, p95, worst) with the tolerance:"),
    ("code", """from workbench.plots.dataset import layer_spread

layer_spread(drift)"""),
    ("md", """## Inside the engine
What did ONNX Runtime make of the model? `engine_graph` reads the session's optimized graph, maps each executed
node to the ONNX nodes it replaced (here one NCHWc convolution runs Conv, BatchNormalization and Relu) and
profiles 5 runs: where each node ran, in what precision, how long it took. `layer_rows` puts each executed node's
cost next to its error in the comparison above."""),
    ("code", """from workbench import engine_graph
from workbench.engine_graphs.layers import layer_rows

engine = engine_graph(model_path, "ort", runs=5)
print(f"{len(engine.nodes)} executed nodes ({len(engine.fused_nodes)} fused), "
      f"{engine.end_to_end_ms:.3f} ms per run (median of {engine.runs})")
slowest = pd.DataFrame(layer_rows(engine, cmp, top=5))
slowest[["name", "kind", "provider", "precision", "latency_ms", "share", "error", "onnx_nodes"]]"""),
    ("md", """The **Engine** tab above shows this engine graph too; the **Graph** tab then colours nodes by execution
provider, runtime precision or latency and boxes the fused groups. The same picture, static:"""),
    ("code", """wb.engine_panel.show(engine)
graph_figure(GraphView.from_graph(result.model.graph), overlay="latency", engine=engine, groups=True)"""),
    ("md", "## The sample models and their planted faults"),
    ("code", """import json

manifest = json.loads((SAMPLES / "manifest.json").read_text())
pd.DataFrame([{"model": m["name"], "nodes": m["nodes"], "fault": (m["fault"] or {}).get("kind"),
               "node": (m["fault"] or {}).get("node"), "pair": (m["fault"] or {}).get("pair")}
              for m in manifest["models"]])"""),
    ("md", "## Problems\nonnx's full checker and shape inference, reported as a list rather than raised."),
    ("code", "pd.DataFrame(doc[\"problems\"], columns=[\"severity\", \"code\", \"message\", \"node\"])"),
]

CALIBRATION = [
    ("md", """# INT8 calibration debugging

An INT8 model is only as good as its activation ranges. This notebook calibrates a sample MLP whose
`/mlp/fc2/Add` output carries one outlier channel (~300x the rest) and compares the range rules on each tensor's
histogram. Each rule is named after the toolchain whose threshold it reproduces: `max`; `entropy` (TensorRT's
EntropyCalibration2 as NVIDIA's ModelOpt ports it, the default); ModelOpt's `percentile` and `mse`; ONNX Runtime's
`ort-entropy` and `ort-percentile`. It then checks that the calibration data represents the evaluation data, shows
the outlier fix, and exports a TensorRT calibration cache and a QDQ model that say which rule they carry. The panel
below does the same by clicking: **Calibrate**, then pick a tensor."""),
    ("code", f"""{PLOTLY_SETUP}
import tempfile
from pathlib import Path

from workbench.ui import CalibrationPanel

SAMPLES = Path("../sample_models").resolve()
model_path = SAMPLES / "int8_outlier.onnx"
panel = CalibrationPanel(model_path)
panel"""),
    ("md", "## Calibrate\n32 random calibration feeds, 8 evaluation feeds (another seed), every rule at its own "
           "default (ModelOpt's percentile 99.99, ONNX Runtime's 99.999 and 128 entropy bins). The tensors are "
           "ranked under TensorRT's `entropy`."),
    ("code", """from workbench.calibrate import calibrate

report = calibrate(model_path, 32, eval_data=8, seed=0)
report.sensitivity_frame()[["rank", "tensor", "method", "amax", "worst_sqnr_db", "clipped_fraction",
                            "best_method", "best_worst_sqnr_db"]]"""),
    ("md", """## The rules: whose threshold each is, and how well it keeps the tensors
`report.summary`: per rule, the median tensor's worst-case SQNR and on how many tensors the rule does best. When
another rule keeps 6 dB or more than the ranking rule at the median tensor, the report says so in a note."""),
    ("code", """import pandas as pd

for note in report.notes:
    print("note:", note)
rules = pd.DataFrame.from_dict(report.summary, orient="index")
rules["ranks the tensors"] = rules.index == report.method
rules"""),
    ("md", """## The most sensitive tensor's histogram
Log counts; each rule's threshold as a vertical line, its legend entry naming the rule and its toolchain with the
fraction of values it clips and the worst-case SQNR it leaves; the evaluation data overlaid."""),
    ("code", """from workbench.plots.calibration import calibration_histogram, sensitivity_bars

worst = report.sensitivity[0].tensor
calibration_histogram(report, worst)"""),
    ("code", "sensitivity_bars(report)"),
    ("code", """report.errors_frame().query("tensor == @worst")"""),
    ("md", """## Does the better rule help the INT8 model?
The note compares rules tensor by tensor (fake-quant SQNR). What counts is the model's outputs: when the note fires,
build the QDQ model (ONNX Runtime's `quantize_static` with the rule's ranges) under the ranking rule and under the
rule the note names, and compare each with FP32."""),
    ("code", """from workbench.calibrate.api import chosen_note

scores = {m: s["median_worst_sqnr_db"] for m, s in report.summary.items() if s["median_worst_sqnr_db"] is not None}
better = max(scores, key=scores.get)
checked = [report.method, better] if chosen_note(report.summary, report.method) else [report.method]
pd.DataFrame([{"rule": m, "whose threshold": report.rule(m), "median worst SQNR (dB)": scores.get(m),
               "QDQ outputs vs FP32: SQNR (dB)": report.check_qdq(m)["sqnr_db"],
               "cosine": report.qdq[m]["cosine"]} for m in checked])"""),
    ("md", """A better median tensor does not promise better outputs: the tensors that decide them may be the few where
every rule at its default fails (here, the outlier ones). Check the outputs before switching rules.

## The outlier fix
Column 7 of `/mlp/fc2/Add_output_0` sits at ~350 while the other 2,047 stay within ~5. At their defaults every rule
keeps the outlier in range (it clips almost nothing), so the ordinary values share a few INT8 levels. The outliers
are 0.05% of the values: a 99.9 percentile clips them and gives the bulk its levels back. The tensor's worst-case
SQNR counts the clipped outliers and drops; its bulk SQNR and the model's outputs are what improve."""),
    ("code", """from workbench.calibrate.methods import percentile_of

fixed = calibrate(model_path, 32, eval_data=8, seed=0, methods=("percentile", "ort-percentile"),
                  method="percentile", percentile=99.9)
outlier = "/mlp/fc2/Add_output_0"


def outcome(r, m):
    e = r.errors[outlier][m]
    return {"rule": m, "percentile": percentile_of(m, r.config["percentile"]) if "percentile" in m else None,
            "amax": e.amax, "clipped": e.clipped_fraction, "bulk SQNR (dB)": e.bulk_sqnr_db,
            "worst SQNR (dB)": e.worst_sqnr_db, "QDQ outputs vs FP32: SQNR (dB)": r.check_qdq(m)["sqnr_db"]}


pd.DataFrame([outcome(report, report.method), outcome(report, "percentile"), outcome(report, "ort-percentile"),
              outcome(fixed, "percentile"), outcome(fixed, "ort-percentile")])"""),
    ("code", "calibration_histogram(fixed, outlier)"),
    ("md", "## Is the calibration data representative?"),
    ("code", """report.representativeness_frame()[["tensor", "flagged", "calib_amax", "eval_amax", "beyond_fraction",
                                     "js_distance", "reasons"]]"""),
    ("md", "## Export\nA TensorRT calibration cache (TRT <= 10) and an explicit QDQ model (what TensorRT 11 takes) "
           "with the fix's thresholds, into a temporary folder. The QDQ model names its rule in its metadata."),
    ("code", """import onnx

out = Path(tempfile.mkdtemp(prefix="workbench-calib-"))
cache = fixed.write_trt_cache(out / "int8_outlier.cache", "percentile")
qdq = fixed.save_qdq(out / "int8_outlier.qdq.onnx", "percentile")
print(f"{cache.name}: {fixed.rule('percentile')} at {fixed.config['percentile']}")
print(cache.read_text().splitlines()[:3])
print(qdq.name, qdq.stat().st_size, "bytes;",
      {p.key: p.value for p in onnx.load(qdq).metadata_props if p.key.startswith("workbench.calibration")})"""),
    ("md", "## Where does the QDQ model drift from FP32?\nThe QDQ export is the candidate model; tensors are "
           "matched by name."),
    ("code", """from workbench.compare.api import compare

int8 = compare(model_path, "ort", "ort", cand_model=qdq, criterion="norm_mean_abs>0.1")
print("first divergent:", int8.first_divergent and int8.first_divergent.node)
int8.culprits_frame()[["rank", "node", "op_type", "introduced_norm_mean_abs", "explanation"]]"""),
    ("md", "The same check on ONNX Runtime's own INT8 variant (calibrated on the comparison's inputs):"),
    ("code", """ort_int8 = compare(model_path, "ort", "ort:int8")
print(ort_int8.culprits[0].node, "|", ort_int8.culprits[0].explanation)"""),
    ("md", "The panel above can show this report too, with its rules table and note:"),
    ("code", "CalibrationPanel(model_path, report=report)"),
]

REPRODUCE = [
    ("md", """# Reproducing a shared investigation

A colleague found a culprit and sent you a **bundle**: the model (or its sha256), the exact feeds, the engine
specs and options, the results, and a few tensors' values. This notebook makes such a bundle, opens it, reruns it
here and says whether the conclusion holds (same verdict, same first divergent tensor, same top culprit)."""),
    ("code", f"""{PLOTLY_SETUP}
import tempfile
from pathlib import Path

from workbench.compare.api import compare
from workbench.report import diff_results, load_bundle, rerun_bundle, save_bundle

SAMPLES = Path("../sample_models").resolve()
model_path = SAMPLES / "transformer_block.onnx"
feeds = SAMPLES / "transformer_block_inputs.npz"  # the causal -inf mask the model expects
print(model_path.name, "with", feeds.name)"""),
    ("md", "## 1. The colleague's side: compare, then save a bundle"),
    ("code", """found = compare(model_path, "ort", "ref:fp16", feeds=feeds)
print("first divergent:", found.first_divergent.node, "| culprit:", found.culprits[0].node)
bundle_dir = Path(tempfile.mkdtemp(prefix="workbench-bundle-")) / "ln2-overflow"
save_bundle(found, dest=bundle_dir, tensors="auto")
sorted(p.name for p in bundle_dir.iterdir())"""),
    ("md", "## 2. Your side: open the bundle, look at what it says"),
    ("code", """bundle = load_bundle(bundle_dir)
saved = bundle.result
print(saved.reference, "vs", saved.candidate, "|", saved.criterion.describe())
saved.culprits_frame()[["rank", "node", "op_type", "introduced_sqnr_db", "explanation"]].head()"""),
    ("md", "The saved result in the Errors panel: click a layer to run both engines on the bundle's feeds."),
    ("code", """from workbench.ui import ErrorsPanel

ErrorsPanel(saved, model=model_path)"""),
    ("md", "## 3. Rerun it here"),
    ("code", """rerun = rerun_bundle(bundle_dir)
print(rerun.render())"""),
    ("code", """assert rerun.reproduced, "the conclusion changed: look at the diff above"
diff = diff_results(saved, rerun.result)
diff.to_json()["first_divergent"]"""),
    ("md", """## Without a bundle
A results JSON alone (`workbench compare --json`, `CompareResult.save_json`) is enough to rerun when the inputs
were random: the seed is recorded."""),
    ("code", """from workbench.compare.result import CompareResult

random_run = compare(model_path, "ort", "ort:fp16", seed=3)
path = random_run.save_json(Path(tempfile.mkdtemp(prefix="workbench-json-")) / "result.json")
loaded = CompareResult.load_json(path)
again = compare(model_path, loaded.reference, loaded.candidate, seed=loaded.feeds["seed"])
print("same first divergent tensor:", (loaded.first_divergent and loaded.first_divergent.tensor)
      == (again.first_divergent and again.first_divergent.tensor))"""),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "int8_calibration.ipynb": CALIBRATION,
    "reproduce_investigation.ipynb": REPRODUCE,
}


def kernelspec() -> dict:
    """The installed python3 kernelspec, as JupyterLab writes it into a notebook it opens."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        spec = KernelSpecManager().get_kernel_spec("python3")
        return {"name": "python3", "display_name": spec.display_name, "language": spec.language}
    except Exception:  # noqa: BLE001 - no kernelspec found: ipykernel's default
        return {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = kernelspec()
    return nb


PLOTLY_MIME = "application/vnd.plotly.v1+json"


#: the static pictures of the figures: this wide (px), and drawn by this browser (headless)
PICTURE_WIDTH = 860
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")


def add_pictures(nb: nbformat.NotebookNode) -> int:
    """Give each figure a cell displays (plotly's JSON mimetype) a PNG of itself, drawn by the plotly.js plotly
    ships, in headless Chromium. JupyterLab's plotly renderer shows that picture until the mouse enters the figure
    (then the interactive figure); without one it draws the figure at once and adds a PNG to the cell, marking
    the notebook modified as it opens. Returns how many; 0 (with a warning) without Playwright or Chromium."""
    figures = [(cell, out) for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
               if PLOTLY_MIME in out.get("data", {})]
    if not figures:
        return 0
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("warning: playwright is not installed: figures saved without pictures (the notebook will be marked "
              "modified when opened)", file=sys.stderr)
        return 0
    if not Path(CHROMIUM).exists():
        print(f"warning: {CHROMIUM} not found: figures saved without pictures", file=sys.stderr)
        return 0
    import plotly

    script = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                    "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": PICTURE_WIDTH + 40, "height": 800})
            page.set_content(f'<div id="fig" style="width:{PICTURE_WIDTH}px"></div>')
            page.add_script_tag(path=str(script))
            for _cell, out in figures:
                fig = out["data"][PLOTLY_MIME]
                url = page.evaluate("""async ([fig, width]) => {
                    const layout = {...fig.layout, width, height: fig.layout.height || 360};
                    const gd = document.getElementById('fig');
                    await Plotly.newPlot(gd, fig.data, layout, {staticPlot: true});
                    const url = await Plotly.toImage(gd, {format: 'png', width, height: layout.height});
                    Plotly.purge(gd);
                    return url; }""", [fig, PICTURE_WIDTH])
                out["data"]["image/png"] = url.split(",", 1)[1]
        finally:
            browser.close()
    return len(figures)


def scrub_paths(nb: nbformat.NotebookNode, notebook_dir: Path) -> int:
    """Paths of the machine that ran the notebook, in outputs and saved widgets: the repository becomes the
    path relative to the notebook, a temporary folder "(a temporary folder)" (not in angle brackets: an HTML widget
    would read that as a tag and show nothing). Returns how many were replaced."""
    import json

    text = json.dumps(nb)
    count = 0
    here = str(notebook_dir.resolve())
    repo = str(REPO.resolve())
    for old, new in ((here + "/", ""), (repo + "/", "../")):
        count += text.count(old)
        text = text.replace(old, new)
    temp = re.escape(tempfile.gettempdir().rstrip("/"))
    text, n = re.subn(temp + r"/[A-Za-z0-9_.\-]+", "(a temporary folder)", text)
    count += n
    nb.clear()
    nb.update(nbformat.from_dict(json.loads(text)))
    return count


#: an anywidget module bigger than this (plotly's FigureWidget bundle: ~5 MB, saved again for every figure
#: widget) is replaced in the saved widget state by a placeholder that asks to run the notebook
MAX_SAVED_ESM = 200_000
PLACEHOLDER_ESM = """export default { render({ el }) {
  el.innerHTML = '<div style="padding:8px;color:#546e7a;border:1px dashed #b0bec5">Interactive figure: run the ' +
    'notebook to use it (its saved copy would add megabytes to the file).</div>';
} };"""


def slim_widget_state(nb: nbformat.NotebookNode) -> int:
    """Replace oversized anywidget modules in the saved widget state; returns how many were replaced."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    replaced = 0
    for model in state.values():
        esm = model.get("state", {}).get("_esm")
        if isinstance(esm, str) and len(esm) > MAX_SAVED_ESM:
            model["state"]["_esm"] = PLACEHOLDER_ESM
            replaced += 1
    return replaced


#: the recording's last cell (removed from the saved notebook)
SETTLE = "from workbench.ui.jobs import settle\n\nassert settle(), 'a panel job did not finish'"


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Run top to bottom in a fresh kernel; keep outputs and the widgets' state (rendered without a kernel)."""
    # panel jobs hand their widget updates to the kernel's thread; nbclient records only what is sent while a cell
    # runs, so the updates wait (WORKBENCH_UI_RECORD) for a last cell that lets every job finish and sends them
    nb.cells.append(nbformat.v4.new_code_cell(SETTLE))
    os.environ["WORKBENCH_UI_RECORD"] = "1"
    # runs saved while recording go to a folder of their own: the saved notebook lists none of this machine's runs
    runs = tempfile.TemporaryDirectory(prefix="workbench-nb-runs-")
    previous = os.environ.get("WORKBENCH_RUNS_DIR")
    os.environ["WORKBENCH_RUNS_DIR"] = runs.name
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        os.environ.pop("WORKBENCH_UI_RECORD", None)
        if previous is None:
            os.environ.pop("WORKBENCH_RUNS_DIR", None)
        else:
            os.environ["WORKBENCH_RUNS_DIR"] = previous
        runs.cleanup()
        nb.cells = [c for c in nb.cells if c.source != SETTLE]
    slim_widget_state(nb)
    scrub_paths(nb, cwd)
    add_pictures(nb)
    nb.metadata["kernelspec"] = kernelspec()
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("names", nargs="*", help="notebooks to write (default: all)")
    args = parser.parse_args(argv)
    NB_DIR.mkdir(exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        if args.names and name not in args.names and name.removesuffix(".ipynb") not in args.names:
            continue
        nb = build(cells)
        if not args.no_execute:
            execute(nb, NB_DIR)
        nbformat.write(nb, NB_DIR / name)
        print(f"wrote notebooks/{name} ({(NB_DIR / name).stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
