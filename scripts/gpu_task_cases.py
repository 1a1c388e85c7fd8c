"""Write the cases for the real-FP16 GPU check of the FP16 repair benchmark (scripts/gpu_task_check.py).

    python scripts/gpu_task_cases.py [--out /work/gpu-cases] [--models NAME ...] [--autocast-path DIR]
                                     [--budget-mib 45] [--fp32 auto|none|all] [--work DIR]

benchmarks/bench_repair_anchors.py judges "task met" with ONNX Runtime CPU, which runs most FP16 operators in
FP32 internally. This script keeps, per model, the FP16 models that benchmark judges, so that another machine can
run them with real FP16 GPU kernels: ``ort-fp16`` (the plain ``ort:fp16`` variant, :func:`workbench.variants.
make_variant`, which ``workbench repair`` starts from), ``autocast``, ``autocast+calib`` and ``workbench`` (the
repaired model), each made by the benchmark's own functions (``prepare``, ``run_fp16``: the same tools, flags and
feeds). Per model it stores the feeds and ONNX Runtime CPU's FP32 outputs on them (compressed .npz), and writes
``cases.json``: per model its kind (det/rec/cls), input and output names, files, and per tool the benchmark's CPU
verdict (task met, FP32 nodes and weight bytes kept, detail).

The folder must stay within ``--budget-mib`` (it is carried to the device): when the FP16 models are too large,
``autocast+calib`` of the recognizer goes first (recorded under ``dropped``; byte-identical models of one
case are stored once, ``same_as``); FP32 models are added, smallest first,
while they fit (``--fp32 auto``), for a sanity row on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests"), str(REPO / "scripts")]

import bench_repair_anchors as bench  # noqa: E402

log = logging.getLogger("gpu_task_cases")

MODELS = ("ppocr-det", "ppocrv3-det", "ppocrv5-det", "ppocr-cls", "ppocr-rec")
TOOLS = ("ort-fp16", "autocast", "autocast+calib", "workbench")
#: (model, tool) dropped in this order while the folder is over budget
DROP_ORDER = (("ppocr-rec", "autocast+calib"),)
MIB = 2**20


def plain_fp16(fp32: Path, out: Path) -> dict:
    """The ``ort:fp16`` variant of ``fp32`` (what ``workbench repair --cand ort:fp16`` starts from), written to
    ``out``; a run record shaped like :func:`bench.measure`'s."""
    import time

    from workbench.model.load import load_model
    from workbench.variants import make_variant

    start = time.perf_counter()
    made = make_variant(load_model(fp32).proto, "fp16")
    made.save(out)
    return {"wall_s": time.perf_counter() - start, "rss_mib": 0, "rc": 0, "output": "",
            "converter": made.converter, "clamped": len(made.clamped)}


def _save_npz(path: Path, arrays: dict) -> str:
    np.savez_compressed(path, **{k: np.asarray(v) for k, v in arrays.items()})
    return path.name


def build_model(name: str, out: Path, work: Path, autocast_path: str | None) -> dict:
    """Make and judge every tool's FP16 model of ``name`` (the benchmark's functions); write the case files."""
    fp32, folder, feeds = bench.prepare(name, work)
    ref = bench.run_ort(fp32, feeds)
    case_dir = out / name
    case_dir.mkdir(parents=True, exist_ok=True)
    entry = {"model": name, "kind": bench.kind_of(name), "fp32_source": str(fp32), "fp32_bytes": fp32.stat().st_size,
             "inputs": sorted(feeds[0]), "outputs": list(ref[0]), "feeds": [], "refs": [], "fp32": None,
             "tools": {}}
    for i, (feed, r) in enumerate(zip(feeds, ref, strict=True)):
        entry["feeds"].append(f"{name}/{_save_npz(case_dir / f'feed_{i:03d}.npz', feed)}")
        entry["refs"].append(f"{name}/{_save_npz(case_dir / f'ref_{i:03d}.npz', r)}")
    # ort-fp16: the plain conversion, judged by the benchmark's own row()
    plain = work / f"{name}.ort-fp16.onnx"
    log.info("%s: ort-fp16", name)
    run = plain_fp16(fp32, plain)
    rows = [bench.row(name, "ort-fp16", run, plain, ref, feeds)]
    rows[0]["note"] += f"; converter {run['converter']}, {run['clamped']} clamp record(s)"
    args = argparse.Namespace(models=[name], prepared={name: (fp32, folder, feeds)}, work=work,
                              autocast_path=autocast_path)
    rows += bench.run_fp16(args)  # autocast, autocast+calib, workbench: the benchmark's tools and flags
    written: dict[str, str] = {}  # sha256 -> tool: byte-identical models are stored once
    for r in rows:
        src = work / f"{name}.{r['tool']}.onnx"
        tool = {k: r.get(k) for k in ("met", "high_nodes", "high_weight_bytes", "note", "wall_s")}
        tool["cpu_met"] = tool.pop("met")
        tool["file"] = None
        if src.is_file() and r.get("met") is not None:
            digest = hashlib.sha256(src.read_bytes()).hexdigest()
            if digest in written:
                tool["same_as"] = written[digest]
            else:
                shutil.copyfile(src, case_dir / f"{r['tool']}.onnx")
                written[digest] = r["tool"]
            tool["file"] = f"{name}/{written[digest]}.onnx"
            tool["sha256"] = digest
        entry["tools"][r["tool"]] = tool
    return entry


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def fit_budget(out: Path, cases: list[dict], budget: int, fp32_mode: str) -> list[dict]:
    """Drop tools per DROP_ORDER while over ``budget``; then add FP32 models, smallest first, while they fit."""
    dropped = []
    for model, tool in DROP_ORDER:
        if folder_bytes(out) <= budget:
            break
        case = next((c for c in cases if c["model"] == model), None)
        rec = case and case["tools"].get(tool)
        shared = case and any(t.get("same_as") == tool for t in case["tools"].values())
        if rec and rec.get("file") and not rec.get("same_as") and not shared:
            size = (out / rec["file"]).stat().st_size
            (out / rec["file"]).unlink()
            rec["file"] = None
            rec["dropped"] = f"folder over {budget / MIB:.0f} MiB: not carried ({size / MIB:.1f} MiB)"
            dropped.append({"model": model, "tool": tool, "bytes": size})
    if folder_bytes(out) > budget:
        raise SystemExit(f"cases folder is {folder_bytes(out) / MIB:.1f} MiB, over the {budget / MIB:.0f} MiB budget "
                         "after the drops in DROP_ORDER")
    if fp32_mode != "none":
        for case in sorted(cases, key=lambda c: c["fp32_bytes"]):
            if fp32_mode == "auto" and folder_bytes(out) + case["fp32_bytes"] > budget:
                continue
            dest = out / case["model"] / "fp32.onnx"
            shutil.copyfile(case["fp32_source"], dest)
            case["fp32"] = f"{case['model']}/fp32.onnx"
    return dropped


@contextlib.contextmanager
def staged(out: Path):
    """A fresh ``OUT.partial`` folder to write the cases into; it replaces ``out`` when the block ends cleanly."""
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    yield staging
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def _git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/work/gpu-cases", help="the cases folder (replaced)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=bench.OCR_MODELS, metavar="NAME")
    parser.add_argument("--autocast-path", metavar="DIR", default=None,
                        help="put on AutoCast's PYTHONPATH (ModelOpt's ONNX extras; see the benchmark's docstring)")
    parser.add_argument("--budget-mib", type=float, default=45.0)
    parser.add_argument("--fp32", choices=["auto", "none", "all"], default="auto",
                        help="carry FP32 models: those that fit the budget (auto), none, or all (ignores the budget)")
    parser.add_argument("--work", metavar="DIR", help="keep the benchmark's scratch folder here (default: removed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import onnxruntime

    out = Path(args.out)
    with staged(out) as staging, tempfile.TemporaryDirectory(prefix="gpu-task-cases-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        cases = [build_model(name, staging, work, args.autocast_path) for name in args.models]
        budget = int(args.budget_mib * MIB)
        dropped = fit_budget(staging, cases, budget, args.fp32)
        manifest = {"made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "git": _git_head(), "onnxruntime": onnxruntime.__version__,
                    "judge": "benchmarks/bench_repair_anchors.py task_met (ONNX Runtime CPU)",
                    "det_target": bench.TARGETS["det"], "budget_mib": args.budget_mib, "dropped": dropped,
                    "cases": [{k: v for k, v in c.items() if k != "fp32_source"} for c in cases]}
        (staging / "cases.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = folder_bytes(out)
    print(f"{out}: {total / MIB:.1f} MiB, {len(cases)} model(s)")
    for c in cases:
        tools = ", ".join(f"{t} {'met' if r['cpu_met'] else 'NOT met' if r['cpu_met'] is False else 'failed'}"
                          f"{'' if r['file'] else ' (no file)'}" for t, r in c["tools"].items())
        print(f"  {c['model']} ({c['kind']}): {tools}; fp32 {'carried' if c['fp32'] else 'not carried'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
