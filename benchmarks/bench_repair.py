"""Repair of the real PP-OCR detector's FP16 conversion: `workbench repair` against an exhaustive sweep.

    python benchmarks/bench_repair.py [--full-feeds] [--sweep-limit N] [--verify ref|none] [--out results.json]

The model: ppocr-det (PP-OCRv4 det from the rapidocr-onnxruntime 1.4.4 wheel, scripts/fetch_models.py) converted
by ONNX Runtime's float16 converter (keep_io_types=True), whose clamp of one BatchNormalization variance (9.8e7 ->
65504) breaks the text mask. Feeds: rendered text pages preprocessed as rapidocr does (tests/ocr_truth.py): one
480x640 page by default, the three 736x992 pages with --full-feeds.

Ours, one process:
    workbench repair FP32 --ref ort --cand ort --cand-model FP16 --inputs FEEDS --out fixed.onnx --json r.json
(comparison with culprit ranking and impact, then grow/binary-search/shrink on one switchable model).
The anchor, one process: the same target judged by keeping ONE node at a time in FP32, for every compute node
of the candidate (a build and a run of every feed per node): how many single-node fixes meet the target, at
what cost. Wall time and peak RSS are measured per process (wait4); builds are candidate-engine sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def measure(argv: list[str]) -> dict:
    """Run ``argv``; wall seconds, peak RSS (MiB) of that child, exit code; stderr passes through (progress)."""
    start = time.perf_counter()
    from peak_rss import peak_mib, wrap  # here: this file is also imported alone (a --metric module)
    launch, rss_file = wrap(argv)  # the tool's own peak RSS (peak_rss.py)
    proc = subprocess.Popen(launch, cwd=REPO, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"wall_s": time.perf_counter() - start, "rss_mib": peak_mib(rss_file, usage.ru_maxrss),
            "rc": os.waitstatus_to_exitcode(status), "output": out}


def prepare(work: Path, full: bool) -> tuple[Path, Path, Path]:
    """(FP32 model, ORT-converted FP16 model, folder of feed .npz files)."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "scripts"))
    import ocr_truth
    from fetch_models import fetch

    fp32 = Path(fetch("ppocr-det"))
    fp16 = ocr_truth.make_fp16(fp32, "ort", work / "ppocr-det.ort.fp16.onnx")
    feeds = ocr_truth.save_feeds(ocr_truth.make_feeds("ppocr-det", small=not full), work / "feeds")
    return fp32, fp16, feeds


def task_truth(fp32: Path, fp16: Path, fixed: Path, feeds: Path) -> dict:
    """Worst-feed share of DB text-mask pixels that differ from FP32, for the FP16 and the repaired model."""
    import ocr_truth

    from workbench.inputs import feeds_from

    arrays = feeds_from(str(feeds))
    ref = ocr_truth.run_model(fp32, arrays)
    return {name: ocr_truth.task_truth("det", ref, ocr_truth.run_model(path, arrays))["detail"]["max_flip_fraction"]
            for name, path in (("fp16", fp16), ("repaired", fixed))}


def sweep(fp32: str, fp16: str, feeds: str, limit: int | None, out: str) -> None:
    """The anchor (run in its own process): keep each compute node alone in FP32, build, run, judge."""
    import logging

    from workbench.compare.plan import ComparisonPlan
    from workbench.repair.evaluate import Evaluator
    from workbench.repair.islands import IslandBuilder
    from workbench.repair.target import Target

    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    plan = ComparisonPlan(fp32, "ort", "ort", cand_model=fp16, feeds=feeds)
    builder = IslandBuilder(plan.cand_model, plan.ref_model)
    ref_names = {n.name for n in plan.ref_model.graph.node}
    nodes = [n.name for n in plan.cand_model.graph.node if n.name in ref_names and n.op_type not in
             ("Constant", "QuantizeLinear", "DequantizeLinear")]
    total = len(nodes)
    nodes = nodes[:limit] if limit else nodes
    outputs = [(o, o) for o in plan.ref_graph.outputs]
    ev = Evaluator(plan, builder, Target(plan.criterion), outputs, max_builds=10**9, batch="build")
    fixes = []
    for i, node in enumerate(nodes, 1):
        if ev.evaluate([node]).met:
            fixes.append(node)
        if i % 10 == 0 or i == len(nodes):
            print(f"  sweep: {i}/{len(nodes)} nodes, {len(fixes)} single-node fixes, "
                  f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    doc = {"compute_nodes": total, "swept": len(nodes), "fixes": fixes, "builds": ev.total_builds,
           "evaluations": len(ev.evaluations), "seconds": time.perf_counter() - t0}
    Path(out).write_text(json.dumps(doc, indent=1))
    plan.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full-feeds", action="store_true", help="three 736x992 pages (default: one 480x640 page)")
    parser.add_argument("--sweep-limit", type=int, default=None, metavar="N", help="sweep only the first N compute "
                        "nodes (default: all)")
    parser.add_argument("--verify", default="ref", help="independent engine for repair's verification (default ref; "
                        "none: skip)")
    parser.add_argument("--memory-budget", metavar="SIZE", help="passed to workbench repair (its comparison)")
    parser.add_argument("--out", metavar="FILE", help="write the numbers as JSON")
    parser.add_argument("--worker", nargs=5, metavar=("FP32", "FP16", "FEEDS", "LIMIT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        fp32, fp16, feeds, limit, out = args.worker
        sweep(fp32, fp16, feeds, int(limit) or None, out)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        work = Path(tmp)
        fp32, fp16, feeds = prepare(work, args.full_feeds)
        n_feeds = len(list(feeds.glob("feed_*.npz")))
        print(f"ppocr-det, ORT FP16 converter, {n_feeds} rendered-text feed(s) "
              f"({'736x992' if args.full_feeds else '480x640'})", flush=True)
        print("running workbench repair ...", flush=True)
        ours = measure([str(BIN / "workbench"), "repair", str(fp32), "--ref", "ort", "--cand", "ort",
                        "--cand-model", str(fp16), "--inputs", str(feeds), "--out", str(work / "fixed.onnx"),
                        "--json", str(work / "repair.json"), "--verify", args.verify]
                       + (["--memory-budget", args.memory_budget] if args.memory_budget else []))
        if ours["rc"] != 0:
            print(ours["output"])
            print(f"workbench repair exited {ours['rc']}")
            return 1
        rep = json.loads((work / "repair.json").read_text())
        truth = task_truth(fp32, fp16, work / "fixed.onnx", feeds)
        print("running the exhaustive one-node sweep ...", flush=True)
        anchor = measure([sys.executable, __file__, "--worker", str(fp32), str(fp16), str(feeds),
                          str(args.sweep_limit or 0), str(work / "sweep.json")])
        if anchor["rc"] != 0:
            print(anchor["output"])
            return 1
        sw = json.loads((work / "sweep.json").read_text())
    comparison = rep["builds_detail"].get("comparison", 0)
    rows = [
        ("repairs / fixes found", ", ".join(f"{r['kind']} {r['node']}" for r in rep.get("repairs", [])) or "-",
         f"{len(sw['fixes'])} single-node fixes of "
         f"{sw['swept']} swept ({sw['compute_nodes']} compute nodes): {', '.join(sw['fixes'][:3])}"),
        ("candidate builds", f"{rep['builds']} (+{comparison} by its comparison)", str(sw["builds"])),
        ("evaluations (sets judged)", str(len(rep["evaluations"])), str(sw["evaluations"])),
        ("wall s (process)", f"{ours['wall_s']:.1f}", f"{anchor['wall_s']:.1f}"),
        ("peak RSS MiB", f"{ours['rss_mib']:.0f}", f"{anchor['rss_mib']:.0f}"),
    ]
    print(f"\n{'':28}{'workbench repair':<44}exhaustive one-node sweep")
    for label, a, b in rows:
        print(f"{label:28}{a:<44}{b}")
    t = rep["timing"]
    print(f"repair time split: comparison {t.get('compare_s', 0):.1f}s, search {t.get('search_s', 0):.1f}s, "
          f"verification {t.get('verify_s', 0):.1f}s (independent: {rep['verification']['independent'].get('engine')}"
          f", {'met' if rep['verification']['independent'].get('met') else 'not met/skipped'})")
    builds_all = rep["builds"] + comparison
    print(f"ratios (repair / sweep): builds {builds_all / max(sw['builds'], 1):.3f} (comparison included), "
          f"wall {ours['wall_s'] / max(anchor['wall_s'], 1e-9):.3f}, peak RSS "
          f"{ours['rss_mib'] / max(anchor['rss_mib'], 1e-9):.2f}")
    print(f"repair: target {'met' if rep['met'] else 'NOT met'} ({rep['target']['text']}); output "
          f"{json.dumps(rep['before']['outputs'])} -> {json.dumps(rep['after']['outputs'])}; FP16 weight share "
          f"{100 * rep['weights']['after']['share']:.3f}%")
    print(f"task truth (ocr_truth, onnxruntime directly): text-mask pixels flipped vs FP32, worst feed: FP16 "
          f"{100 * truth['fp16']:.3f}%, repaired {100 * truth['repaired']:.4f}% (healthy < 0.5%)")
    if args.sweep_limit:
        print(f"note: the sweep covered {sw['swept']} of {sw['compute_nodes']} compute nodes (--sweep-limit)")
    if args.out:
        strip = lambda m: {k: v for k, v in m.items() if k != "output"}  # noqa: E731
        doc = {"task_truth": truth, "repair": {**strip(ours), "json": rep}, "sweep": {**strip(anchor), **sw}}
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
