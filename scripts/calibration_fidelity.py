"""Calibration fidelity: our thresholds against the toolchains' own code, on a real model and rendered-text feeds.

    python scripts/calibration_fidelity.py [--model ppocr-cls] [--entropy-sample N] [--mse-sample N] [--json OUT]

Oracles (never our code): NVIDIA ModelOpt's HistogramCalibrator (collect, then compute_amax entropy / percentile /
mse) fed the same activations, and ModelOpt's ``_compute_amax_entropy`` fed OUR histogram from the report's JSON;
ONNX Runtime's ``create_calibrator(...).collect_data(); compute_data()`` (Entropy with its defaults and with
num_bins=2048, Percentile with its defaults) on the same model and feeds. Needs ``nvidia-modelopt`` (the
``oracles`` extra). Prints, per rule, how many tensors agree exactly and within one bin.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "scripts")]

#: tensors with fewer values are left out of the agreement figures (as the issue's criterion does)
MIN_VALUES = 1000


def activations(model_path: Path, feeds: list[dict], names: list[str]) -> list[dict[str, np.ndarray]]:
    """Every named tensor's value for each feed, from ONNX Runtime (graph as written, like the calibrators)."""
    from workbench.engines import get_engine
    from workbench.model.load import load_model

    loaded = load_model(model_path)
    inputs = set(loaded.graph.inputs)
    marked = [n for n in names if n not in inputs]
    out = []
    with get_engine("ort", graph_optimization="disable").prepare(loaded.proto, marked) as session:
        for feed in feeds:
            values = session.run(feed)
            out.append({n: (feed[n] if n in inputs else values[n]) for n in names})
    return out


def modelopt_oracle(values: list[dict[str, np.ndarray]], names: list[str], entropy: list[str], mse: list[str]):
    """{tensor: {"counts", "edges", "entropy", "percentile", "mse", "entropy_on_ours"?}} from ModelOpt."""
    import modelopt.torch.quantization.calib.histogram as mo_hist
    import torch
    from modelopt.torch.quantization.tensor_quant import FakeTensorQuantFunction

    # ModelOpt 0.47's _compute_amax_mse calls fake_tensor_quant(centers, amax, num_bits, unsigned), but the
    # function's third parameter is `bias`: every centre comes back as amax + 8 and the result is meaningless.
    # The oracle keeps ModelOpt's loop and criterion and binds the arguments by name, as intended.
    mo_hist.fake_tensor_quant = lambda x, amax, num_bits=8, unsigned=False: FakeTensorQuantFunction.apply(
        x, amax, None, num_bits, unsigned)
    HistogramCalibrator = mo_hist.HistogramCalibrator
    out = {}
    for n in names:
        cal = HistogramCalibrator(num_bits=8, unsigned=False, num_bins=2048)
        for feed in values:
            cal.collect(torch.from_numpy(np.ascontiguousarray(feed[n], dtype=np.float32)))
        row = {"counts": cal._calib_hist.numpy().copy(), "edges": cal._calib_bin_edges.numpy().copy(),
               "percentile": float(cal.compute_amax("percentile"))}
        if n in entropy:
            row["entropy"] = float(cal.compute_amax("entropy"))
        if n in mse:
            row["mse"] = float(cal.compute_amax("mse"))
        out[n] = row
    return out


def modelopt_entropy_on(counts: np.ndarray, edges: np.ndarray) -> float:
    """ModelOpt's entropy search on a given histogram (int counts, float32 edges)."""
    from modelopt.torch.quantization.calib.histogram import _compute_amax_entropy

    return float(_compute_amax_entropy(counts.astype(np.int32).copy(), edges, 8, False, 1, 128))


def ort_oracle(model_path: Path, feeds: list[dict], method: str, **extra) -> dict[str, tuple[float, float]]:
    """{tensor: (lowest, highest)} from ONNX Runtime's own calibrator."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory(prefix="fidelity-ort-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        cal = create_calibrator(model_path, None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=getattr(CalibrationMethod, method), extra_options=extra)
        cal.collect_data(Reader())
        data = cal.compute_data()
    return {n: (float(np.ravel(td.range_value[0])[0]), float(np.ravel(td.range_value[1])[0]))
            for n, td in data.data.items()}


def agreement(ours: dict[str, float], theirs: dict[str, float], width: dict[str, float]) -> dict:
    """Exact and within-one-bin agreement counts, and the names that disagree."""
    names = [n for n in theirs if n in ours]
    exact = [n for n in names if np.float32(ours[n]) == np.float32(theirs[n])]
    close = [n for n in names if abs(ours[n] - theirs[n]) <= width[n] * 1.0001]
    return {"tensors": len(names), "exact": len(exact), "within_one_bin": len(close),
            "share_within_one_bin": len(close) / len(names) if names else 1.0,
            "off": {n: [ours[n], theirs[n], width[n]] for n in names if n not in close}}


def pad_to_common_shape(feeds: list[dict]) -> list[dict]:
    """Zero-pad every input to the largest shape among the feeds (ORT's calibrator stacks all feeds into one
    array; PP-OCR recognizer crops are zero-padded on the right anyway)."""
    out = [dict(f) for f in feeds]
    for name in feeds[0]:
        shape = np.max([f[name].shape for f in feeds], axis=0)
        for f in out:
            x = f[name]
            if tuple(x.shape) != tuple(shape):
                f[name] = np.pad(x, [(0, int(s) - d) for s, d in zip(shape, x.shape)])
    return out


def run(model: str, entropy_sample: int | None, mse_sample: int, ort_2048_sample: int) -> dict:
    from fetch_models import fetch
    from ocr_truth import make_feeds

    from workbench.calibrate import calibrate
    from workbench.calibrate.report import CalibrationReport

    path = fetch(model)
    feeds = pad_to_common_shape(make_feeds(model))
    t0 = time.perf_counter()
    report = calibrate(path, feeds)
    report = CalibrationReport.from_json(json.loads(json.dumps(report.to_json())))  # thresholds from the JSON
    ours_s = time.perf_counter() - t0
    big = [t for t in report.tensors if report.histograms[t].count >= MIN_VALUES and report.histograms[t].amax > 0]
    rng = np.random.default_rng(0)
    entropy = big if entropy_sample is None else sorted(rng.choice(big, min(entropy_sample, len(big)), False))
    mse = sorted(rng.choice(big, min(mse_sample, len(big)), False))
    values = activations(path, feeds, big)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mo = modelopt_oracle(values, big, entropy, mse)
    modelopt_s = time.perf_counter() - t0
    width = {n: float(mo[n]["edges"][1] - mo[n]["edges"][0]) for n in big}
    trt = report.trt_histograms
    result = {"model": model, "feeds": len(feeds), "tensors": len(report.tensors), "tensors_1000": len(big),
              "ours_s": ours_s, "modelopt_s": modelopt_s}
    result["histograms_identical"] = sum(np.array_equal(mo[n]["counts"], trt[n].counts) for n in big)
    result["entropy_on_our_histogram"] = agreement(
        report.ranges["entropy"], {n: modelopt_entropy_on(trt[n].int_counts(), trt[n].edges) for n in entropy}, width)
    for rule in ("entropy", "percentile", "mse"):
        theirs = {n: mo[n][rule] for n in big if rule in mo[n]}
        result[f"modelopt_{rule}"] = agreement(report.ranges[rule], theirs, width)
    for label, method, extra, rule in (("ort_entropy_default", "Entropy", {}, "ort-entropy"),
                                       ("ort_percentile_default", "Percentile", {}, "ort-percentile")):
        theirs = ort_oracle(path, feeds, method, **extra)
        bounds = report.bounds[rule]
        names = [n for n in big if n in theirs]
        same = [n for n in names if tuple(np.float32(v) for v in bounds[n]) == tuple(np.float32(v) for v in theirs[n])]
        result[label] = {"tensors": len(names), "identical": len(same),
                         "off": {n: [bounds[n], theirs[n]] for n in names if n not in same}}
    if ort_2048_sample:
        pick = sorted(rng.choice(big, min(ort_2048_sample, len(big)), False))
        r2048 = calibrate(path, feeds, methods=("ort-entropy",), ort_entropy_bins=2048)
        theirs = ort_oracle(path, feeds, "Entropy", num_bins=2048, num_quantized_bins=128)
        same = [n for n in pick if tuple(np.float32(v) for v in r2048.bounds["ort-entropy"][n])
                == tuple(np.float32(v) for v in theirs[n])]
        result["ort_entropy_2048"] = {"tensors": len(pick), "identical": len(same),
                                      "off": [n for n in pick if n not in same]}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ppocr-cls")
    parser.add_argument("--entropy-sample", type=int, default=None, help="tensors for ModelOpt's slow entropy "
                        "search (default: all with >= 1000 values)")
    parser.add_argument("--mse-sample", type=int, default=20)
    parser.add_argument("--ort-2048-sample", type=int, default=0, help="also check ORT entropy with 2048 bins "
                        "(ORT's calibrator runs on every tensor: slow)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(args.model, args.entropy_sample, args.mse_sample, args.ort_2048_sample)
    for key, value in result.items():
        if isinstance(value, dict):
            shown = {k: v for k, v in value.items() if k != "off"}
            print(f"{key:28} {shown}  off: {list(value.get('off', {}))[:5]}")
        else:
            print(f"{key:28} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
