"""INT8 verdict, culprit ranking and repair judged against exhaustive truth on real PP-OCR models.

    python scripts/int8_truth.py [--models ppocr-rec ppocr-cls ppocr-det] [--methods MinMax Entropy Percentile]
        [--calibs text blank unnormalised] [--weights tensor channel] [--work DIR] [--out FILE]

Q/DQ models are made by ONNX Runtime's ``quantize_static`` itself (MinMax / Entropy / Percentile, per-tensor and
per-channel weights) on a representative calibration set (rendered text crops; det: 8 small text pages) and two
mismatched ones (blank images; the inputs left in [0, 1] instead of [-1, 1]). Everything judged here runs on 8
held-out rendered crops (det: 4 pages of 256x320) never used for calibration (scripts/int8_qdq_truth.py, which
imports nothing of the workbench):

* task truth: the greedy CTC decode (rec) / the class (cls) of the Q/DQ model against the FP32 model's; det: the
  DB text mask (probability > 0.3), healthy when fewer than 0.5% of its pixels flip on every page;
* culprit truth: the exhaustive one-node sweep -- every quantized node dequantized back to float alone, the task
  re-measured (character error rate, then the share of CTC frames whose argmax differs; cls: flipped classes,
  then the change of the FP32 class's probability; det: the share of flipped mask pixels, then the mean change
  of the probability map);
* needed Q/DQ removals: 1 when a single node's fix makes the task healthy, else the greedy upper bound (the
  shortest healthy prefix of the sweep's order, shrunk to 1-minimal).

Ours: ``workbench.compare`` (verdict; culprit #1) and ``workbench.repair`` with the task as its metric (the
decode, class or mask equal on every held-out input), both from the prepared FP32 model with the Q/DQ file as
``cand_model``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import int8_qdq_truth as Q  # noqa: E402

KINDS = {"ppocr-rec": "rec", "ppocr-cls": "cls", "ppocrv3-rec": "rec", "ppocr-det": "det"}
COLUMNS = ("model", "method", "weights", "calib", "truth", "ours", "top1", "sweep#", "top3", "repair", "needed",
           "removed", "sweep_s", "ours_s")


class TaskMetric:
    """The repair target: the held-out crop decodes (rec) / classifies (cls) as in FP32, the page's text mask
    flips fewer than 0.5% of its pixels (det) (a bool per feed)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.__qualname__ = f"task_equal_{kind}"

    def __call__(self, ref: dict, cand: dict) -> bool:
        name = next(iter(ref))
        return Q.task_score(self.kind, [ref[name]], [cand[name]])["healthy"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def ours(kind: str, fp32: Path, qdq: Path, feeds: list[dict]) -> dict:
    """Our verdict and culprit #1 (compare), then our repair with the task metric."""
    from workbench.compare.api import compare
    from workbench.repair.api import repair

    t0 = time.perf_counter()
    result = compare(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds)
    culprits = [c.node for c in result.culprits]
    t1 = time.perf_counter()
    rep = repair(str(fp32), "ort", "ort", cand_model=str(qdq), feeds=feeds, metric=TaskMetric(kind), verify=None,
                 max_builds=60)
    t2 = time.perf_counter()
    return {"diverged": bool(result.diverged), "culprits": culprits[:10], "compare_s": t1 - t0,
            "repair": {"met": bool(rep.met), "kept": list(rep.kept), "builds": rep.builds, "minimal": rep.minimal},
            "repair_s": t2 - t1}


def truth(kind: str, runner: Q.Runner, qdq_path: Path) -> dict:
    import onnx

    qdq = onnx.load(str(qdq_path))
    base = runner.score(qdq)
    doc = {"healthy": base["healthy"], "score": base}
    if base["healthy"]:
        return doc
    t0 = time.perf_counter()
    rows = Q.sweep(runner, qdq)
    doc["sweep"] = [(n, s) for n, s in rows]
    doc["single_fixes"] = [n for n, s in rows if s["healthy"]]
    if doc["single_fixes"]:
        doc["needed"], doc["needed_kind"] = 1, "exact"
    else:
        kept = Q.greedy(runner, qdq, [n for n, _ in rows])
        doc["needed"], doc["needed_kind"] = (len(kept), "greedy") if kept is not None else (None, "none")
        doc["greedy_set"] = kept
    doc["sweep_s"] = time.perf_counter() - t0
    return doc


def judge_repair(runner: Q.Runner, qdq_path: Path, kept: list[str]) -> bool:
    """Independent check of our repaired set: the task on the held-out crops with those nodes dequantized."""
    import onnx

    return runner.score(Q.remove_qdq(Q.name_unnamed(onnx.load(str(qdq_path))), runner.fp32, kept))["healthy"]


def case_row(model: str, method: str, per_channel: bool, calib: str, t: dict, o: dict, repaired_ok: bool | None
             ) -> dict:
    top1 = o["culprits"][0] if o["culprits"] else None
    rank = Q.rank_of(top1, [(n, s) for n, s in t["sweep"]]) if "sweep" in t else None
    kept = o["repair"]["kept"]
    needed = t.get("needed")
    return {"model": model, "method": method, "weights": "channel" if per_channel else "tensor", "calib": calib,
            "truth": "healthy" if t["healthy"] else "HARMFUL", "ours": "DIVERGED" if o["diverged"] else "ok",
            "agree": o["diverged"] == (not t["healthy"]), "top1": top1 or "-", "sweep#": rank,
            "top3": None if rank is None else rank <= 3, "repair": len(kept) if o["repair"]["met"] else "unmet",
            "repair_ok": repaired_ok, "needed": needed, "needed_kind": t.get("needed_kind"),
            "removed": f"{len(kept)} vs {needed} ({t.get('needed_kind')})" if needed else "-",
            "sweep_s": round(t.get("sweep_s", 0.0), 1), "ours_s": round(o["compare_s"] + o["repair_s"], 1)}


def render(rows: list[dict]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return str(v)

    cols = ("model", "method", "weights", "calib", "truth", "ours", "top1", "sweep#", "top3", "repair", "needed",
            "needed_kind", "repair_ok", "sweep_s", "ours_s")
    table = [cols] + [tuple(cell(r.get(c)) for c in cols) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    harmful = [r for r in rows if r["truth"] == "HARMFUL"]
    ranked = [r for r in harmful if r["sweep#"] is not None]
    sized = [r for r in harmful if isinstance(r["repair"], int) and r["needed"]]
    lines += ["",
              f"verdict agrees with task truth: {sum(r['agree'] for r in rows)} of {len(rows)}",
              f"harmful cases: {len(harmful)}; our culprit #1 in the sweep's top 3: "
              f"{sum(bool(r['top3']) for r in ranked)} of {len(ranked)}",
              f"repair met the task: {sum(isinstance(r['repair'], int) for r in harmful)} of {len(harmful)} "
              f"(independently re-checked: {sum(bool(r['repair_ok']) for r in harmful)}); removed no more Q/DQ pairs "
              f"than needed: {sum(r['repair'] <= r['needed'] for r in sized)} of {len(sized)} "
              "(needed: exact where one node suffices, else the greedy upper bound from the sweep's order)"]
    first: dict[str, str] = {}
    same = []
    for r in rows:
        name = " ".join((r["model"], r["method"], r["weights"], r["calib"]))
        if r.get("sha") in first:
            same.append(f"{name} = {first[r['sha']]}")
        first.setdefault(r.get("sha"), name)
    if same:
        lines.append(f"distinct Q/DQ models: {len(rows) - len(same)} of {len(rows)} (the others byte-identical to an "
                     f"earlier case, counted again above: {'; '.join(same)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ppocr-cls", "ppocr-rec"], choices=sorted(KINDS))
    p.add_argument("--methods", nargs="+", default=list(Q.METHODS), choices=Q.METHODS)
    p.add_argument("--calibs", nargs="+", default=list(Q.CALIBS), choices=Q.CALIBS)
    p.add_argument("--weights", nargs="+", default=["tensor", "channel"], choices=["tensor", "channel"])
    p.add_argument("--work", default=str(Path.home() / ".cache" / "workbench-int8-truth"),
                   help="models and per-case results are cached here")
    p.add_argument("--fresh-ours", action="store_true", help="recompute our side even where it is cached")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int8_truth.txt"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("root").setLevel(logging.ERROR)
    sys.path.insert(0, str(REPO))
    from fetch_models import fetch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models:
        kind = KINDS[model]
        fp32 = work / f"{model}.fp32.onnx"
        if not fp32.exists():
            Q.prepare(fetch(model), fp32)
        feeds = Q.heldout_feeds(kind)
        runner = Q.Runner(kind, fp32, feeds)
        for method in args.methods:
            for weights in args.weights:
                for calib in args.calibs:
                    per_channel = weights == "channel"
                    qdq = work / f"{model}.{method}.{weights}.{calib}.onnx"
                    if not qdq.exists():
                        Q.quantize(fp32, qdq, Q.calib_feeds(kind, calib), method, per_channel)
                    sha = _sha(qdq)
                    t_cache, o_cache = work / f"case.{sha}.json", work / f"ours.{sha}.json"
                    if t_cache.exists():
                        t = json.loads(t_cache.read_text())["truth"]
                    else:
                        t = truth(kind, runner, qdq)
                        t_cache.write_text(json.dumps({"truth": t}))
                    if o_cache.exists() and not args.fresh_ours:
                        doc = json.loads(o_cache.read_text())  # the independent re-check is cheap: always redone
                        doc["repair_ok"] = judge_repair(runner, qdq, doc["ours"]["repair"]["kept"]) \
                            if not t["healthy"] else None
                    else:
                        o = ours(kind, fp32, qdq, feeds)
                        ok = judge_repair(runner, qdq, o["repair"]["kept"]) if not t["healthy"] else None
                        doc = {"ours": o, "repair_ok": ok}
                        o_cache.write_text(json.dumps(doc))
                    row = case_row(model, method, per_channel, calib, t, doc["ours"], doc["repair_ok"])
                    row["sha"] = sha
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    text = render(rows)
    print(text)
    from workbench._atomic import atomic_write_text

    atomic_write_text(args.out, f"$ python scripts/int8_truth.py {' '.join(argv or sys.argv[1:])}\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
