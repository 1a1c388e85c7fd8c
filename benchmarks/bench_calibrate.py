"""INT8 calibration: `workbench calibrate` against ONNX Runtime's entropy calibrator, side by side in one run.

    python benchmarks/bench_calibrate.py [--model ppocr-rec] [--feeds 16] [--out results.json]

Both sides get the same feeds (seeded standard normal, saved once as a folder of .npz), each in its own process:
    ours:   workbench calibrate M --data FEEDS/ --input-shapes x:[1,3,48,320] --ort-entropy-bins 2048 --json ours.json
            (streaming histograms, all six rules: max, TensorRT/ModelOpt entropy, percentile, mse, ONNX Runtime's
            entropy and percentile, with their errors)
    anchor: create_calibrator(M, calibrate_method=CalibrationMethod.Entropy,
                              extra_options=dict(num_bins=2048, num_quantized_bins=128)); collect_data; compute_data
Wall time and peak RSS (os.wait4's ru_maxrss of each child) are measured side by side; ratios are ours / ORT.
Targets: time <= 0.05x, peak RSS <= 0.25x. Our ort-entropy ranges must be ORT's, bit for bit (printed: how many
of the common tensors are identical); TensorRT's entropy is a different rule (ratios printed for reference).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODELS = {"ppocr-rec": ["x:[1,3,48,320]"], "ppocr-det": ["x:[1,3,320,320]"], "ppocr-cls": ["x:[1,3,48,192]"]}

ANCHOR = """
import json, sys, time
from pathlib import Path
import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator


model, feeds_dir, out, work = sys.argv[1:5]
feeds = [dict(np.load(f)) for f in sorted(Path(feeds_dir).glob("*.npz"))]

class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(feeds)
    def get_next(self):
        return next(self.it, None)

calibrator = create_calibrator(Path(model), None, augmented_model_path=str(Path(work) / "augmented.onnx"),
                               calibrate_method=CalibrationMethod.Entropy,
                               extra_options=dict(num_bins=2048, num_quantized_bins=128))
calibrator.collect_data(Reader())
data = calibrator.compute_data()
bounds = {}
for name, td in data.data.items():
    lo, hi = td.range_value
    bounds[name] = [float(np.ravel(lo)[0]), float(np.ravel(hi)[0])]
Path(out).write_text(json.dumps(bounds))
"""


def measure(argv: list[str], cwd: Path) -> dict:
    """Run ``argv``; wall seconds, peak RSS (MiB) of that child, exit code, output."""
    start = time.perf_counter()
    from peak_rss import peak_mib, wrap  # here: this file is also imported alone (a --metric module)
    launch, rss_file = wrap(argv)  # the tool's own peak RSS (peak_rss.py)
    proc = subprocess.Popen(launch, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"wall_s": time.perf_counter() - start, "rss_mib": peak_mib(rss_file, usage.ru_maxrss),
            "rc": os.waitstatus_to_exitcode(status), "output": out}


def make_feeds(model: Path, shapes: list[str], count: int, folder: Path) -> None:
    sys.path.insert(0, str(REPO))
    from workbench.inputs import parse_shape_overrides, random_feeds
    from workbench.model.load import load_model

    feeds = random_feeds(load_model(model).proto, seed=0, count=count, shapes=parse_shape_overrides(shapes))
    folder.mkdir(parents=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed_{i:04d}.npz", **feed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ppocr-rec", choices=sorted(MODELS))
    parser.add_argument("--feeds", type=int, default=16)
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    model = fetch(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as tmp:
        work = Path(tmp)
        make_feeds(model, MODELS[args.model], args.feeds, work / "feeds")
        ours_argv = [str(BIN / "workbench"), "calibrate", str(model), "--data", str(work / "feeds"),
                     "--input-shapes", *MODELS[args.model], "--ort-entropy-bins", "2048",
                     "--json", str(work / "ours.json")]
        ours = measure(ours_argv, work)
        if ours["rc"] != 0:
            raise RuntimeError(f"workbench calibrate failed: {ours['output'][-2000:]}")
        anchor = measure([sys.executable, "-c", ANCHOR, str(model), str(work / "feeds"), str(work / "ort.json"),
                          str(work)], work)
        if anchor["rc"] != 0:
            raise RuntimeError(f"ORT's calibrator failed: {anchor['output'][-2000:]}")
        doc = json.loads((work / "ours.json").read_text())
        ort = json.loads((work / "ort.json").read_text())
    ours_ort = doc["bounds"]["ort-entropy"]
    common = [t for t in ours_ort if t in ort]
    identical = sum(np.float32(ours_ort[t][0]) == np.float32(ort[t][0]) and np.float32(ours_ort[t][1])
                    == np.float32(ort[t][1]) for t in common)
    entropy = doc["ranges"]["entropy"]
    ort_amax = {t: max(abs(lo), abs(hi)) for t, (lo, hi) in ort.items()}
    dense = [t for t in common if ort_amax[t] > 0 and float(entropy[t]) > 0]
    log_ratios = np.array([abs(math.log(float(entropy[t]) / ort_amax[t])) for t in dense])
    result = {
        "model": args.model, "feeds": args.feeds, "tensors": len(doc["tensors"]), "ort_tensors": len(ort),
        "ours": {k: ours[k] for k in ("wall_s", "rss_mib")}, "ort": {k: anchor[k] for k in ("wall_s", "rss_mib")},
        "time_ratio": ours["wall_s"] / anchor["wall_s"], "rss_ratio": ours["rss_mib"] / anchor["rss_mib"],
        "ort_entropy_identical": {"tensors": len(common), "identical": int(identical)},
        "tensorrt_vs_ort_entropy": {"tensors": len(dense), "median_abs_log_ratio": float(np.median(log_ratios)),
                                    "within_1.5x": float(np.mean(log_ratios < math.log(1.5)))},
    }
    print(f"{args.model}, {args.feeds} feeds of {' '.join(MODELS[args.model])}: {result['tensors']} activation "
          f"tensors (ORT calibrates {result['ort_tensors']} tensors, Constant-node weights included)")
    print(f"{'':24}{'wall s':>10}{'peak RSS MiB':>14}")
    print(f"{'workbench calibrate':24}{ours['wall_s']:>10.1f}{ours['rss_mib']:>14.0f}")
    print(f"{'ORT entropy calibrator':24}{anchor['wall_s']:>10.1f}{anchor['rss_mib']:>14.0f}")
    print(f"{'ratio (ours / ORT)':24}{result['time_ratio']:>10.3f}{result['rss_ratio']:>14.3f}"
          "   (targets: time <= 0.05, RSS <= 0.25)")
    same = result["ort_entropy_identical"]
    print(f"ort-entropy ranges identical to ORT's on {same['identical']} of {same['tensors']} common tensors")
    agree = result["tensorrt_vs_ort_entropy"]
    print(f"TensorRT's entropy vs ORT's (different rules) on {agree['tensors']} tensors: median |log ratio| "
          f"{agree['median_abs_log_ratio']:.3f}, {agree['within_1.5x']:.0%} within 1.5x")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
