"""Write transformer cases for the real-FP16 GPU check (scripts/gpu_task_check.py reads them like
scripts/gpu_task_cases.py's): where FP16 *arithmetic* breaks a model, which verdict does a GPU agree with?

    python scripts/gpu_transformer_cases.py --hf-path DIR [--out /work/gpu-cases-tf] [--autocast-path DIR]

ONNX Runtime's CPU provider computes most FP16 operators in FP32, so an overflow inside a MatMul never shows there;
``ref:fp16`` (numpy FP16 arithmetic) and ``compare --mode all`` (FP16 storage of every marked tensor) claim to
predict a GPU. The cases, each judged on its task (argmax over the last axis on >= 99% of the rows and SQNR >= 30 dB
against the FP32 model on ONNX Runtime, the FP16 benchmark's transformer task):

- ``bert-hf``: a 2-layer BERT from Hugging Face transformers (``BertModel``, eager attention, random weights,
  hidden 256, 4 heads), exported by ``torch.onnx.export``; layer 1's query and key weights are scaled by 180 so
  ``Q @ K^T`` reaches ~1e5 before the exporter's ``Div`` by 8 (a planted defect, like the decoder benchmark's).
  Tools: the plain ``ort:fp16`` conversion, AutoCast (defaults; with calibration data), ``workbench repair
  --cand ort:fp16`` with the FP16 benchmark's flags (``--verify none``) and with its defaults
  (``workbench-default``: verified in FP16 arithmetic, searched again on ``ref:fp16`` when that fails), and
  ``--cand ref:fp16``.
- ``residual-ln``: the marking test's model (tests/test_compare_marking.py): a MatMul whose outputs pass 65504
  before a residual Add and a LayerNormalization; its FP16 file passes on ONNX Runtime CPU as deployed.
- ``attention`` and ``linear-scale``: the fold-scale tests' models (tests/test_repair_rewrites.py): scores or a
  Linear that pass 65504 before a constant scale brings them back.

Per tool it records the task on ONNX Runtime CPU (``cpu_met``) and the workbench's verdicts on that file
(``compare FP32 --ref ort --cand ENGINE --cand-model FILE``, ENGINE ``ort`` and ``ref:fp16``: the file in numpy
FP16 arithmetic).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests"), str(REPO / "scripts")]

import bench_repair_anchors as bench  # noqa: E402

log = logging.getLogger("gpu_transformer_cases")
MIB = 2**20
QK_SCALE = 180.0


def export_bert(out: Path, hf_path: str | None) -> tuple[Path, list[dict]]:
    """The planted HF BERT (module docstring) and one feed of 64 random token ids."""
    if hf_path:
        sys.path.insert(0, hf_path)
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=128, attn_implementation="eager")
    model = BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        att = model.encoder.layer[1].attention.self
        att.query.weight.mul_(QK_SCALE)
        att.key.weight.mul_(QK_SCALE)
    ids = torch.randint(0, 1000, (1, 64))
    torch.onnx.export(model, (ids,), str(out), input_names=["input_ids"], output_names=["last_hidden_state"],
                      opset_version=17, dynamo=False)
    return out, [{"input_ids": ids.numpy()}]


def synthetic(name: str, out: Path) -> tuple[Path, list[dict]]:
    import onnx
    from onnx import TensorProto

    if name == "residual-ln":
        from test_compare_marking import D, _residual_ln

        model = _residual_ln(TensorProto.FLOAT, np.float32)
        feeds = [{"x": np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)}]
    elif name == "attention":
        from test_repair_rewrites import _attention

        model, feed = _attention()
        feeds = [feed]
    else:
        from test_repair_rewrites import _linear_then_scale

        model, feed = _linear_then_scale("matmul+add")
        feeds = [feed]
    onnx.save(model, str(out))
    return out, feeds


def verdicts(fp32: Path, path: Path, feeds: list[dict]) -> dict:
    """The workbench's compare verdict on ``path`` with each engine: 'ok' or 'DIVERGED'."""
    from workbench.compare.api import compare

    out = {}
    for engine in ("ort", "ref:fp16"):
        try:
            res = compare(str(fp32), "ort", engine, cand_model=str(path), feeds=feeds)
            out[engine] = "DIVERGED" if res.diverged else "ok"
        except Exception as e:  # noqa: BLE001 - an engine refusing a file is a result
            out[engine] = f"error: {type(e).__name__}"
    return out


def repair_with(name: str, fp32: Path, out: Path, folder: Path, work: Path, cand: str, extra: list[str]) -> dict:
    """``workbench repair FP32 --cand CAND`` with the transformer task as its metric, and ``extra`` flags."""
    argv = [str(bench.BIN / "workbench"), "repair", str(fp32), "--ref", "ort", "--cand", cand, "--inputs",
            str(folder), "--metric", f"{REPO / 'benchmarks' / 'bench_repair_anchors.py'}:bert_task", "--out",
            str(out), "--json", str(work / f"{name}.{cand}.json"), *extra]
    run = bench.measure(argv)
    if run["rc"] in (0, 1):
        doc = json.loads((work / f"{name}.{cand}.json").read_text())
        run["repairs"] = [f"{r['kind']} {r['node']}" for r in doc.get("repairs", [])]
    return run


def build_case(name: str, out: Path, work: Path, hf_path: str | None, autocast_path: str | None) -> dict:
    from gpu_task_cases import _save_npz, plain_fp16

    fp32 = work / f"{name}.onnx"
    fp32, feeds = export_bert(fp32, hf_path) if name == "bert-hf" else synthetic(name, fp32)
    folder = work / f"{name}-feeds"
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed_{i:03d}.npz", **feed)
    ref = bench.run_ort(fp32, feeds)
    case_dir = out / name
    case_dir.mkdir(parents=True, exist_ok=True)
    entry = {"model": name, "kind": "tensor", "fp32_bytes": fp32.stat().st_size, "inputs": sorted(feeds[0]),
             "outputs": list(ref[0]), "feeds": [], "refs": [], "fp32": None, "tools": {}}
    for i, (feed, r) in enumerate(zip(feeds, ref, strict=True)):
        entry["feeds"].append(f"{name}/{_save_npz(case_dir / f'feed_{i:03d}.npz', feed)}")
        entry["refs"].append(f"{name}/{_save_npz(case_dir / f'ref_{i:03d}.npz', r)}")
    shutil.copyfile(fp32, case_dir / "fp32.onnx")
    entry["fp32"] = f"{name}/fp32.onnx"
    runs = {"ort-fp16": plain_fp16(fp32, work / f"{name}.ort-fp16.onnx")}
    tools = ["autocast", "autocast+calib", "workbench", "workbench-default", "workbench-ref16"] \
        if name == "bert-hf" else ["workbench-default", "workbench-ref16"]
    for tool in tools:
        dest = work / f"{name}.{tool}.onnx"
        log.info("%s: %s", name, tool)
        if tool == "workbench":
            runs[tool] = bench.ours("bert-hf", fp32, dest, folder, work)
        elif tool == "workbench-default":  # the default --verify ref: its second search on ref:fp16
            runs[tool] = repair_with(name, fp32, dest, folder, work, "ort:fp16", [])
        elif tool == "workbench-ref16":
            runs[tool] = repair_with(name, fp32, dest, folder, work, "ref:fp16", ["--verify", "ort"])
        else:
            runs[tool] = bench.autocast(fp32, dest, folder if tool.endswith("calib") else None, autocast_path)
    written: dict[str, str] = {}
    for tool, run in runs.items():
        src = work / f"{name}.{tool}.onnx"
        r = bench.row("bert-hf", tool, run, src, ref, feeds)  # the transformer task on ONNX Runtime CPU
        rec = {"cpu_met": r["met"], "high_nodes": r["high_nodes"], "high_weight_bytes": r["high_weight_bytes"],
               "note": r["note"], "wall_s": r["wall_s"], "file": None}
        if src.is_file() and r["met"] is not None:
            rec["verdicts"] = verdicts(fp32, src, feeds)
            digest = hashlib.sha256(src.read_bytes()).hexdigest()
            if digest in written:
                rec["same_as"] = written[digest]
            else:
                shutil.copyfile(src, case_dir / f"{tool}.onnx")
                written[digest] = tool
            rec["file"] = f"{name}/{written[digest]}.onnx"
        entry["tools"][tool] = rec
        log.info("%s %s: %s", name, tool, rec)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/work/gpu-cases-tf", help="the cases folder (replaced)")
    parser.add_argument("--hf-path", metavar="DIR", help="a folder with transformers (put first on sys.path)")
    parser.add_argument("--autocast-path", metavar="DIR", help="put on AutoCast's PYTHONPATH")
    parser.add_argument("--models", nargs="+", default=["bert-hf", "residual-ln", "attention", "linear-scale"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import onnxruntime
    from gpu_task_cases import _git_head, staged

    out = Path(args.out)
    with staged(out) as staging, tempfile.TemporaryDirectory(prefix="gpu-tf-cases-") as tmp:
        cases = [build_case(n, staging, Path(tmp), args.hf_path, args.autocast_path) for n in args.models]
        manifest = {"made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "git": _git_head(), "onnxruntime": onnxruntime.__version__,
                    "judge": "argmax over the last axis on >= 99% of rows and SQNR >= 30 dB (ONNX Runtime CPU)",
                    "cases": cases}
        (staging / "cases.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {size / MIB:.1f} MiB, {len(cases)} case(s)")
    for c in cases:
        for t, r in c["tools"].items():
            print(f"  {c['model']} {t}: ORT CPU task {'met' if r['cpu_met'] else 'NOT met'}, "
                  f"verdicts {r.get('verdicts')}, {r['high_nodes']} FP32 nodes; {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
