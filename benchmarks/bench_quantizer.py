"""The INT8 variant's quantization with and without the faster quantizer helpers, side by side.

    python benchmarks/bench_quantizer.py [--models ppocr-rec ppocr-det ppocrv3-rec ...] [--out FILE]

For each real model (PyPI wheels, scripts/fetch_models.py; calibrated on 8 rendered inputs of its task,
scripts/int8_qdq_truth.py) it runs ``workbench.variants.int8.to_int8`` in both Q/DQ placements, once with
:func:`workbench.variants.quantizer_speed.fast_quantizer` (the default) and once with ONNX Runtime's own helpers, each
in a child process of its own (wall seconds, the child's peak RSS), and prints the ratio and whether the two
quantized models are byte-identical (their sha256).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))
from anchors_int8 import KINDS as ANCHOR_KINDS  # noqa: E402 - after the path it is found on

#: the INT8 anchors' models from PyPI wheels (the encoder is built by benchmarks/bert_model.py, not fetched)
KINDS = {model: kind for model, kind in ANCHOR_KINDS.items() if kind != "bert"}

CHILD = """
import contextlib, hashlib, json, sys, time
sys.path.insert(0, {scripts!r})
import onnx
import int8_qdq_truth as Q
import workbench.variants.int8 as I
model_path, kind, placement, own = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "ort"
if own:
    I.fast_quantizer = contextlib.nullcontext
model = onnx.load(model_path)
feeds = Q.calib_feeds(kind, "text")
t0 = time.perf_counter()
result = I.to_int8(model, feeds, placement=placement)
seconds = time.perf_counter() - t0
print(json.dumps({{"seconds": seconds, "sha256": hashlib.sha256(result.model.SerializeToString()).hexdigest()}}))
"""


def _child(model: Path, kind: str, placement: str, helpers: str) -> dict:
    from peak_rss import peak_mib, wrap

    code = CHILD.format(scripts=str(REPO / "scripts"))
    launch, rss_file = wrap([sys.executable, "-c", code, str(model), kind, placement, helpers])
    proc = subprocess.run(launch, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{model.name} {placement} {helpers}: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["rss_mib"] = peak_mib(rss_file, 0)
    return out


def run(models: list[str], work: Path) -> list[dict]:
    import int8_qdq_truth as Q
    from fetch_models import fetch

    rows = []
    for name in models:
        fp32 = work / f"{name}.fp32.onnx"
        if not fp32.exists():
            Q.prepare(fetch(name), fp32)
        for placement in ("all", "weighted"):
            fast, own = (_child(fp32, KINDS[name], placement, h) for h in ("fast", "ort"))
            rows.append({"model": name, "placement": placement, "fast_s": fast["seconds"], "ort_s": own["seconds"],
                         "fast_rss": fast["rss_mib"], "ort_rss": own["rss_mib"],
                         "identical": fast["sha256"] == own["sha256"]})
    return rows


def render(rows: list[dict]) -> str:
    lines = ["model              placement  ours(s)  ORT's helpers(s)  ratio  peak RSS ours/ORT's (MiB)  identical"]
    for r in rows:
        lines.append(f"{r['model']:<18} {r['placement']:<9}  {r['fast_s']:7.2f}  {r['ort_s']:16.2f}  "
                     f"{r['ort_s'] / r['fast_s']:5.2f}  {r['fast_rss']:>12.0f} / {r['ort_rss']:<12.0f} "
                     f"{'yes' if r['identical'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ppocr-rec", "ppocr-det", "ppocrv3-rec", "ppocrv5-rec"],
                   choices=list(KINDS))
    p.add_argument("--work", default=str(Path.home() / ".cache" / "workbench-bench-quantizer"))
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench_quantizer.txt"))
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = run(args.models, work)
    text = render(rows)
    print(text)
    from workbench._atomic import atomic_write_text

    atomic_write_text(args.out, f"$ python benchmarks/bench_quantizer.py {' '.join(argv or sys.argv[1:])}\n{text}\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
