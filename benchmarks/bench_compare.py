"""FP32 vs FP16, layer by layer: `workbench compare` against Polygraphy's flow, side by side in one run.

    python benchmarks/bench_compare.py [--models ppocr-det sample:cnn_fp16_overflow ...] [--out results.json]

Ours, one process:
    workbench compare M --ref ort --cand ort:fp16 [--input-shapes ...] --json ours.json
Polygraphy (the anchor), three processes, as its users run it:
    python -c <ORT's float16 converter, keep_io_types>   (polygraphy convert --fp-to-fp16 uses onnxconverter-common,
                                                         whose model ORT rejects on PP-OCR-det; see notes)
    polygraphy run M      --onnxrt --onnx-outputs mark all --save-inputs in.json --save-results ref.json
    polygraphy run M_fp16 --onnxrt --onnx-outputs mark all --load-inputs in.json --load-outputs ref.json
Wall time is summed over the anchor's steps and peak RSS is the largest step's (each measured by wait4 on the
child). Ratios are ours / anchor: the targets are time <= 0.1x and peak RSS <= 0.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

MODELS = {
    "ppocr-det": {"fetch": "ppocr-det", "shapes": ["x:[1,3,320,320]"]},
    "ppocr-rec": {"fetch": "ppocr-rec", "shapes": ["x:[1,3,48,320]"]},
    "ppocr-cls": {"fetch": "ppocr-cls", "shapes": ["x:[1,3,48,192]"]},
}
for _name in ("cnn_fp16_overflow", "fp16_clamp_constant", "healthy_cnn", "transformer_block"):
    MODELS[f"sample:{_name}"] = {"path": REPO / "sample_models" / f"{_name}.onnx", "shapes": []}

CONVERT = (
    "import sys, onnx; from onnxruntime.transformers.float16 import convert_float_to_float16 as c; "
    "onnx.save(c(onnx.load(sys.argv[1]), keep_io_types=True), sys.argv[2])"
)


def measure(argv: list[str], cwd: Path) -> dict:
    """Run ``argv``; wall seconds, peak RSS (MiB) of that child, exit code, output."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": time.perf_counter() - start, "rss_mib": usage.ru_maxrss / 1024, "rc": proc.returncode,
            "output": out}


def model_path(spec: dict) -> Path:
    if "path" in spec:
        return spec["path"]
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    return fetch(spec["fetch"])


def run_ours(path: Path, shapes: list[str], work: Path) -> dict:
    argv = [str(BIN / "workbench"), "compare", str(path), "--ref", "ort", "--cand", "ort:fp16", "--json",
            str(work / "ours.json")]
    if shapes:
        argv += ["--input-shapes", *shapes]
    res = measure(argv, work)
    if res["rc"] not in (0, 1):
        raise RuntimeError(f"workbench compare failed: {res['output'][-2000:]}")
    doc = json.loads((work / "ours.json").read_text())
    res.update(builds=doc["builds"], tensors=len(doc["tensors"]),
               flagged=sum(t["diverged"] for t in doc["tensors"]),
               first_divergent=(doc["first_divergent"] or {}).get("tensor"),
               culprit=(doc["culprits"][0]["node"] if doc["culprits"] else None))
    return res


def run_polygraphy(path: Path, shapes: list[str], work: Path) -> dict:
    shape_args = ["--input-shapes", *shapes] if shapes else []
    fp16 = work / "model_fp16.onnx"
    steps = [
        measure([sys.executable, "-c", CONVERT, str(path), str(fp16)], work),
        measure([str(BIN / "polygraphy"), "run", str(path), "--onnxrt", "--onnx-outputs", "mark", "all",
                 *shape_args, "--save-inputs", "in.json", "--save-results", "ref.json"], work),
    ]
    steps.append(measure([str(BIN / "polygraphy"), "run", str(fp16), "--onnxrt", "--onnx-outputs", "mark", "all",
                          "--load-inputs", "in.json", "--load-outputs", "ref.json"], work))
    log = steps[-1]["output"]
    failed = len(re.findall(r"FAILED \| Output", log))
    passed = len(re.findall(r"PASSED \| Output", log))
    return {"wall_s": sum(s["wall_s"] for s in steps), "rss_mib": max(s["rss_mib"] for s in steps),
            "steps_s": [round(s["wall_s"], 2) for s in steps], "flagged": failed, "compared": failed + passed,
            "rc": [s["rc"] for s in steps], "ref_json_mib": (work / "ref.json").stat().st_size / 2**20
            if (work / "ref.json").exists() else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ppocr-det", "sample:cnn_fp16_overflow",
                                                        "sample:fp16_clamp_constant"], choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, help="write the measurements as JSON")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        spec = MODELS[name]
        path = model_path(spec)
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            work = Path(tmp)
            ours = run_ours(path, spec["shapes"], work)
            anchor = run_polygraphy(path, spec["shapes"], work)
        rows.append({"model": name, "ours": {k: v for k, v in ours.items() if k != "output"}, "polygraphy": anchor,
                     "time_ratio": ours["wall_s"] / anchor["wall_s"], "rss_ratio": ours["rss_mib"] / anchor["rss_mib"]})
        r = rows[-1]
        print(f"{name}: ours {ours['wall_s']:.2f} s / {ours['rss_mib']:.0f} MiB ({ours['builds']} builds, "
              f"{ours['flagged']} of {ours['tensors']} tensors flagged, first {ours['first_divergent']}, culprit "
              f"{ours['culprit']}) | polygraphy {anchor['wall_s']:.2f} s {anchor['steps_s']} / "
              f"{anchor['rss_mib']:.0f} MiB ({anchor['flagged']} of {anchor['compared']} outputs FAILED, "
              f"ref.json {anchor['ref_json_mib'] or 0:.0f} MiB) | time {r['time_ratio']:.3f}x  "
              f"peak RSS {r['rss_ratio']:.3f}x", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
