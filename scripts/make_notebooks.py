"""Write the notebooks in notebooks/ from their cell sources, then execute them in place (outputs saved).

    python scripts/make_notebooks.py [--no-execute]

The notebooks are generated so that their code stays reviewable here; tests execute them again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"

QUICKSTART = [
    ("md", """# onnx-drift-workbench: quick start

This notebook loads a bundled sample model and shows what the workbench knows about it: graph structure,
opset inventory, which runtimes can take it, and what onnx's checker says. Run it top to bottom
(*Run > Run All Cells*). Everything runs offline on the CPU."""),
    ("code", """from pathlib import Path

import pandas as pd

import workbench
from workbench import inspect_model

SAMPLES = Path("../sample_models").resolve()
model_path = SAMPLES / "cnn_fp16_overflow.onnx"
print("workbench", workbench.__version__)"""),
    ("md", "## Load and inspect\n`inspect_model` accepts a path, bytes, an `onnx.ModelProto` or a "
           "`torch.nn.Module` with example inputs."),
    ("code", """result = inspect_model(model_path)
doc = result.to_json()
print(f"{doc['model']['name']}: {doc['nodes']} nodes, {doc['params']['count']:,} parameters, "
      f"opsets {doc['opset_imports']}, sha256 {doc['model']['sha256'][:16]}")
kinds = ["input"] * len(doc["inputs"]) + ["output"] * len(doc["outputs"])
pd.DataFrame(doc["inputs"] + doc["outputs"], index=kinds)"""),
    ("md", "## Opset inventory\nEach operator type, how often it is used, and the opset version its schema "
           "dates from."),
    ("code", "result.inventory.to_frame()"),
    ("md", "## Graph in topological order\nThe order a layer-wise comparison walks."),
    ("code", """g = result.model.graph
pd.DataFrame([{"topo": n.topo_index, "node": n.name, "op_type": n.op_type,
               "output": n.outputs[0], "shape": g.tensors[n.outputs[0]].shape} for n in g.nodes])"""),
    ("md", "## Will my runtime take it?\nFrom the package's compatibility tables (each row names its source), "
           "and a real ONNX Runtime session built here."),
    ("code", """pd.DataFrame([{"target": c["target"], "model opset": c["model_opset"], "max opset": c["max_opset"],
               "ok": c["ok"], "unsupported": ", ".join(u["op_type"] for u in c["unsupported"])}
              for c in doc["compatibility"]])"""),
    ("code", "pd.DataFrame(doc[\"probes\"])"),
    ("md", "## The sample models and their planted faults\nLater panels find each of these."),
    ("code", """import json
manifest = json.loads((SAMPLES / "manifest.json").read_text())
pd.DataFrame([{"model": m["name"], "nodes": m["nodes"], "fault": (m["fault"] or {}).get("kind"),
               "node": (m["fault"] or {}).get("node")} for m in manifest["models"]])"""),
    ("md", "## Problems\nonnx's full checker and shape inference, reported as a list rather than raised."),
    ("code", "pd.DataFrame(doc[\"problems\"], columns=[\"severity\", \"code\", \"message\", \"node\"])"),
]

NOTEBOOKS = {"quickstart.ipynb": QUICKSTART}


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> nbformat.NotebookNode:
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-execute", action="store_true")
    args = parser.parse_args(argv)
    NB_DIR.mkdir(exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        nb = build(cells)
        if not args.no_execute:
            execute(nb, NB_DIR)
        nbformat.write(nb, NB_DIR / name)
        print(f"wrote notebooks/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
