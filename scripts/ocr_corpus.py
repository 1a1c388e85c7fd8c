"""Build the task-level truth corpus: real FP16 conversions of real OCR models, judged at the task level.

    python scripts/ocr_corpus.py [--out DIR] [--cache DIR] [--small] [--reuse] [--models NAME ...]

For each of ppocr-det, ppocr-rec, ppocr-cls, ppocrv3-det, ppocrv3-rec, the derived ppocr-det-folded and
ppocrv3-det-folded (the det models with every BatchNormalization variance folded into its scale: same FP32 outputs)
and each FP16 converter (ort: onnxruntime.transformers.float16, occ: onnxconverter_common.float16, both
keep_io_types=True), writes <out>/<model>/<model>.<converter>.fp16.onnx and the feeds
(<out>/<model>/feeds/<text|random>/feed_NN.npz, keys = input names), runs FP32 and FP16 with onnxruntime on CPU,
judges the FP16 outputs with tests/ocr_truth.py (det: mask flips at 0.3, rec: greedy CTC, cls: argmax), prints a
table and writes <out>/corpus.json. Det models also get "random" rows (uniform feeds over the normalised input
range), where layer-wise false alarms come from. The output defaults to <cache>/corpus (<cache>/corpus-small with
--small: the feeds tests/test_verdict_corpus.py uses); <cache> is $WORKBENCH_CACHE or <repo>/.cache.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

import fetch_models  # noqa: E402
import ocr_truth  # noqa: E402


def print_table(doc: dict) -> None:
    print(f"\n{'model':<18} {'conv':<4} {'input':<6} {'healthy':<7} {'cosine':>9} {'sqnr_db':>8}  detail")
    for r in doc["rows"]:
        head = f"{r['model']:<18} {r['converter']:<4} {r['input']:<6}"
        if r["error"]:
            print(f"{head} {'ERROR':<7} {'':>9} {'':>8}  {r['error'][:160]}")
            continue
        extra = ""
        if r.get("culprit_fix"):
            fix = r["culprit_fix"]
            extra = (f"; culprit {r['culprit_node'] or '?'}: folding it alone -> "
                     f"{'healthy' if fix['healthy'] else 'still harmful'} ({100 * fix['max_flip_fraction']:.3f}%)")
        print(f"{head} {str(r['healthy']):<7} {r['cosine']:>9.6f} {r['sqnr_db']:>8.2f}  {r['summary']}{extra}")
    print("\nFP32 readings:")
    for name, reading in doc["fp32"].items():
        print(f"  {name}: {reading}")
    if doc["fold_check"]:
        print("\nfolded FP32 vs original FP32, max |change| / max |output| (onnxruntime's own optimisations on vs "
              "off on the original, for scale):")
        for name, check in doc["fold_check"].items():
            print(f"  {name}: " + ", ".join(f"{label} {v['change']:.2e} ({v['fp32_noise']:.2e})"
                                            for label, v in check.items()))
    print("\nBatchNormalization parameters beyond FP16's range (clamped by both converters):")
    for name, found in doc["clamped"].items():
        if found:
            print(f"  {name}: " + ", ".join(f"{c['node']} {c['param']} {c['tensor']} max {c['max_abs']:.3g}"
                                            for c in found))
    if "build_s" in doc:
        print(f"\nbuilt in {doc['build_s']}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="corpus folder (default: <cache>/corpus or <cache>/corpus-small)")
    parser.add_argument("--cache", type=Path, help="model cache (default: $WORKBENCH_CACHE or <repo>/.cache)")
    parser.add_argument("--small", action="store_true", help="the test feeds: det 1 page at 1x3x480x640, random "
                        "1x3x320x320, rec 3 crops")
    parser.add_argument("--reuse", action="store_true", help="read a current corpus back instead of rebuilding")
    parser.add_argument("--models", nargs="*", default=ocr_truth.CORPUS_MODELS, choices=ocr_truth.CORPUS_MODELS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cache = args.cache or fetch_models.cache_dir()
    if args.out is None:
        doc = ocr_truth.load_corpus(cache, small=args.small, models=args.models, fetch=fetch_models.fetch,
                                    rebuild=not args.reuse)
        out = cache / ("corpus-small" if args.small else "corpus")
    else:
        out = args.out.resolve()
        doc = ocr_truth.build_corpus(out, cache, small=args.small, models=args.models, fetch=fetch_models.fetch)
    print_table(doc)
    print(f"wrote {out / 'corpus.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
