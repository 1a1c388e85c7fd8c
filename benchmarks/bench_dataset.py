"""Drift over a dataset: throughput and peak memory for 64 and 512 samples, serial vs local workers vs local Ray, and
Polygraphy's Comparator (the anchor) on the same samples, side by side in one run.

    python benchmarks/bench_dataset.py [--model ppocr-rec] [--cand ort:fp16] [--sizes 64 512] [--workers 2]
                                       [--layers] [--out results.json]

The dataset is rendered text lines (scripts/ocr_dataset.py, cached under .cache/datasets/) through the real PP-OCR
recognizer, preprocessed by ``scripts/ocr_dataset.py:rec_image``, with the CTC agreement metric. Each run is its
own process:
    ours:   workbench compare M --cand CAND --inputs DIR --preprocess ...:rec_image --metric ctc [--workers N |
            --executor ray] --no-layers --json OUT   (--layers: per-layer statistics too)
    anchor: polygraphy.comparator.Comparator.run([OnnxrtRunner(M), OnnxrtRunner(M16)], data_loader=the same
            samples) then Comparator.compare_accuracy: per-sample output comparison (FP16 file by onnxconverter-common,
            the conversion `ort:fp16` makes)
Peak RSS is the largest sum of the RSS of the process and all its descendants (workers, Ray's processes), polled
every 50 ms. Targets: our RSS at 512 samples within 1.2x of 64 samples (memory does not grow with the dataset).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREP = f"{REPO / 'scripts' / 'ocr_dataset.py'}:rec_image"

ANCHOR = r'''
import sys, glob, json
sys.path.insert(0, {scripts!r})
from ocr_dataset import rec_image
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.comparator import Comparator, CompareFunc
files = sorted(glob.glob({folder!r} + "/*.png"))
def loader():
    for f in files:
        yield {{"x": rec_image(f)}}
runners = [OnnxrtRunner(SessionFromOnnx({model!r}), name="fp32"), OnnxrtRunner(SessionFromOnnx({cand!r}), name="fp16")]
results = Comparator.run(runners, data_loader=loader())
acc = Comparator.compare_accuracy(results, compare_func=CompareFunc.simple(atol=1e-3, rtol=1e-3))
print(json.dumps({{"samples": len(files), "passed": bool(acc)}}))
'''


def tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def measure(argv: list[str]) -> dict:
    """Wall time and peak process-tree RSS of ``argv``."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def poll():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out, err = proc.communicate()
    t.join()
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv[:4])}... failed ({proc.returncode}): {err.strip()[-2000:]}")
    return {"wall_s": wall, "rss_mib": peak[0] / 2**20, "stdout": out}


def dataset(count: int) -> Path:
    folder = REPO / ".cache" / "datasets" / f"rec{count}"
    if len(list(folder.glob("*.png"))) != count:
        sys.path.insert(0, str(REPO / "scripts"))
        from ocr_dataset import render

        render(folder, count)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr-rec")
    ap.add_argument("--cand", default="ort:fp16")
    ap.add_argument("--sizes", nargs="+", type=int, default=[64, 512])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layers", action="store_true", help="per-layer statistics too (every tensor marked)")
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    model = fetch(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fp16 = Path(tmp) / "cand16.onnx"
        sys.path.insert(0, str(REPO / "tests"))
        from ocr_truth import make_fp16

        make_fp16(model, "occ", fp16)
        for n in args.sizes:
            folder = dataset(n)
            base = [sys.executable, "-m", "workbench", "compare", str(model), "--cand", args.cand, "--inputs",
                    str(folder), "--preprocess", PREP, "--metric", "ctc"] + ([] if args.layers else ["--no-layers"])
            runs = {"serial": [], f"workers {args.workers}": ["--workers", str(args.workers)],
                    f"ray {args.workers}": ["--executor", "ray", "--workers", str(args.workers)]}
            for label, extra in runs.items():
                out = Path(tmp) / f"{n}-{label.replace(' ', '')}.json"
                m = measure(base + extra + ["--json", str(out)])
                doc = json.loads(out.read_text())
                rows.append({"samples": n, "run": label, "wall_s": m["wall_s"], "rss_mib": m["rss_mib"],
                             "samples_per_s": n / m["wall_s"], "ctc_mean": doc["task"]["ctc"]["mean"],
                             "digest": hash(json.dumps(doc["samples"], sort_keys=True))})
                print(f"{n:>5} {label:<12} {m['wall_s']:7.1f} s {n / m['wall_s']:7.2f} samples/s "
                      f"{m['rss_mib']:8.0f} MiB", flush=True)
            if not args.no_anchor:
                code = ANCHOR.format(scripts=str(REPO / "scripts"), folder=str(folder), model=str(model),
                                     cand=str(fp16))
                m = measure([sys.executable, "-c", code])
                rows.append({"samples": n, "run": "polygraphy", "wall_s": m["wall_s"], "rss_mib": m["rss_mib"],
                             "samples_per_s": n / m["wall_s"]})
                print(f"{n:>5} {'polygraphy':<12} {m['wall_s']:7.1f} s {n / m['wall_s']:7.2f} samples/s "
                      f"{m['rss_mib']:8.0f} MiB", flush=True)
    print("\nsamples  run           samples/s   peak RSS   vs polygraphy (time, RSS)")
    for r in rows:
        anchor = next((a for a in rows if a["samples"] == r["samples"] and a["run"] == "polygraphy"), None)
        ratio = (f"{anchor['wall_s'] and r['wall_s'] / anchor['wall_s']:.2f}x, {r['rss_mib'] / anchor['rss_mib']:.2f}x"
                 if anchor and r is not anchor else "")
        print(f"{r['samples']:>7}  {r['run']:<12} {r['samples_per_s']:9.2f} {r['rss_mib']:8.0f} MiB   {ratio}")
    sizes = sorted(args.sizes)
    if len(sizes) >= 2:
        for label in {r["run"] for r in rows if r["run"] != "polygraphy"}:
            lo = next(r for r in rows if r["samples"] == sizes[0] and r["run"] == label)
            hi = next(r for r in rows if r["samples"] == sizes[-1] and r["run"] == label)
            print(f"RSS {sizes[-1]} vs {sizes[0]} samples, {label}: {hi['rss_mib'] / lo['rss_mib']:.2f}x "
                  f"(target <= 1.2x)")
    for n in args.sizes:
        digests = {r["digest"] for r in rows if r["samples"] == n and "digest" in r}
        print(f"{n} samples: per-sample results identical on every executor: {len(digests) == 1}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
