"""Judge the FP16 repair benchmark's models with real FP16 GPU kernels (the cases of scripts/gpu_task_cases.py).

    python scripts/gpu_task_check.py --cases DIR [--device cuda|cpu] [--out DIR] [--fp32-from DIR]
                                     [--models NAME ...] [--tools TOOL ...]

benchmarks/bench_repair_anchors.py judges "task met" with ONNX Runtime CPU, which computes most FP16 operators in
FP32 (it inserts Casts), so FP16 overflow never shows there. Here each tool's FP16 ONNX model is converted with
onnx2torch, keeping the file's own dtypes (FP16 weights stay float16, Casts run as written; checked per tensor
against onnx type inference on the first feed), and run on the device: FP16 cuDNN/cuBLAS kernels, TF32 off.
Outputs are judged exactly as the benchmark judges them (its ``task_met``: det < 0.5% of the DB mask pixels at
prob > 0.3 flipped on the worst feed, rec the same greedy CTC text, cls the same class) against the stored FP32
ONNX Runtime CPU outputs; per output also SQNR (dB) against them, max |x| and inf/NaN counts. A carried FP32
model (or one from ``--fp32-from``, a folder of ``NAME.onnx``) runs the same way in FP32 as a sanity row:
its outputs should match ONNX Runtime's to ~1e-5 relative.

Prints a table; writes ``gpu_task_check.json`` and ``gpu_task_check.txt`` to --out. Exit 0 when it ran (a
measurement, whatever it found), 2 when the device or the cases cannot be used. A model onnx2torch cannot
convert or torch cannot run is a row with its error.

``--device cpu`` is a dry run, labelled as such: PyTorch's CPU kernels (in FP16 where they exist; where one is
missing the whole model runs in FP32, labelled ``cpu-fp32-fallback``), never a GPU result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import types
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]

import bench_repair_anchors as bench  # noqa: E402  (stdlib + numpy; its task_met imports tests/ocr_truth.py)

TOOLS = ("ort-fp16", "autocast", "autocast+calib", "workbench")
FP32 = "fp32 (sanity)"


class CasesError(Exception):
    """The cases folder cannot be used."""


# ------------------------------------------------------------------------------------------------ cases
def load_cases(folder: str | Path) -> dict:
    """The manifest of a cases folder, its file paths made absolute; raises CasesError on a bad folder."""
    folder = Path(folder)
    path = folder / "cases.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CasesError(f"cannot read {path}: {e}") from e
    for case in manifest.get("cases", []):
        for key in ("feeds", "refs"):
            case[key] = [folder / f for f in case[key]]
        if case.get("fp32"):
            case["fp32"] = folder / case["fp32"]
        for tool in case["tools"].values():
            if tool.get("file"):
                tool["file"] = folder / tool["file"]
        missing = [p for p in [*case["feeds"], *case["refs"]] if not p.is_file()]
        if missing or len(case["feeds"]) != len(case["refs"]) or not case["feeds"]:
            raise CasesError(f"case {case['model']}: feeds/refs missing or unpaired ({len(missing)} missing)")
    if not manifest.get("cases"):
        raise CasesError(f"{path} lists no cases")
    return manifest


def load_arrays(paths: list[Path]) -> list[dict[str, np.ndarray]]:
    out = []
    for p in paths:
        with np.load(p) as z:
            out.append({k: z[k] for k in z.files})
    return out


# ------------------------------------------------------------------------------------------------ judging
def sqnr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    """10 log10(|ref|^2 / |cand - ref|^2); inf when equal, nan when cand is not finite."""
    r, c = ref.astype(np.float64).ravel(), cand.astype(np.float64).ravel()
    if not np.isfinite(c).all():
        return float("nan")
    return bench._sqnr_db(r, c)


def output_stats(refs: list[dict], got: list[dict]) -> dict:
    """Per output name, over all feeds: SQNR vs the reference, max |x|, non-finite count, max relative error."""
    stats = {}
    for name in refs[0]:
        r = np.concatenate([np.asarray(x[name], np.float64).ravel() for x in refs])
        c = np.concatenate([np.asarray(x[name], np.float64).ravel() for x in got])
        finite = np.isfinite(c)
        scale = float(np.max(np.abs(r))) or 1.0
        stats[name] = {"sqnr_db": sqnr_db(r, c), "max_abs": float(np.max(np.abs(c[finite]))) if finite.any() else None,
                       "nonfinite": int((~finite).sum()),
                       "max_rel_err": float(np.max(np.abs(c - r)) / scale) if finite.all() else float("inf")}
    return stats


def judge(model: str, kind: str, refs: list[dict], got: list[dict]) -> dict:
    """The benchmark's verdict (``task_met``), the worst-feed metric and per-output stats. Kind ``tensor`` (the
    transformer cases of scripts/gpu_transformer_cases.py) is judged per feed by the benchmark's transformer task."""
    if kind in ("bert", "tensor"):
        per = [bench.task_met("bert", [r], [g]) for r, g in zip(refs, got, strict=True)]
        met, detail = all(m for m, _ in per), "; ".join(d for _, d in per)
        return {"met": bool(met), "detail": detail, "worst": float(sum(not m for m, _ in per)),
                "worst_txt": detail, "outputs": output_stats(refs, got)}
    met, detail = bench.task_met(model, refs, got)
    if kind == "det":
        worst = min(bench.det_task(r, g) for r, g in zip(refs, got, strict=True))
        worst_txt = f"agree {worst:.5f} (>= 0.995)"
    elif kind == "rec":
        worst = sum(x != y for a, b in zip(refs, got, strict=True)
                    for x, y in zip(bench._ctc(bench._first(a)), bench._ctc(bench._first(b)), strict=True))
        worst_txt = f"{worst} text mismatch(es)"
    else:
        worst = sum(int(x != y) for a, b in zip(refs, got, strict=True)
                    for x, y in zip(bench._first(a).argmax(-1).ravel(), bench._first(b).argmax(-1).ravel(),
                                    strict=True))
        worst_txt = f"{worst} class change(s)"
    return {"met": bool(met), "detail": detail, "worst": float(worst), "worst_txt": worst_txt,
            "outputs": output_stats(refs, got)}


# ------------------------------------------------------------------------------------------------ onnx -> torch
def constants_to_initializers(model):
    """A copy of ``model`` whose Constant nodes (tensor or scalar/list values) are initializers of the same dtype:
    onnx2torch reads Conv/Gemm/BatchNormalization weights only from initializers."""
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    inits = []
    for node in out.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            keep.append(node)
            continue
        attr = node.attribute[0]
        if attr.name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(attr.t)
        elif attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            value = helper.get_attribute_value(attr)
            dtype = np.float32 if attr.name.startswith("value_float") else np.int64
            t = numpy_helper.from_array(np.asarray(value, dtype=dtype))
        else:
            keep.append(node)
            continue
        t.name = node.output[0]
        inits.append(t)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.graph.initializer.extend(inits)
    return out


def _onnx_float_types(model) -> dict[str, str]:
    """value name -> "float16"/"float32"/... for every typed value of ``model`` (onnx type inference)."""
    import onnx
    from onnx import helper

    typed = onnx.shape_inference.infer_shapes(model)
    out = {}
    for v in [*typed.graph.value_info, *typed.graph.input, *typed.graph.output]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            out[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)).name
    for t in typed.graph.initializer:
        out[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).name
    return out


def import_onnx2torch(device: str):
    """onnx2torch; on a CPU dry run without torchvision (onnx2torch imports it only for NonMaxSuppression and
    RoiAlign) a placeholder module stands in for it, and the returned note says so."""
    try:
        import onnx2torch

        return onnx2torch, None
    except ImportError as e:
        if device != "cpu" or "torchvision" not in str(e):
            raise
    tv = types.ModuleType("torchvision")
    tv.ops = types.ModuleType("torchvision.ops")

    def missing(*_a, **_k):
        raise NotImplementedError("torchvision is absent (CPU dry run placeholder)")

    tv.ops.nms = tv.ops.roi_align = tv.ops.box_convert = missing
    sys.modules.update({"torchvision": tv, "torchvision.ops": tv.ops})
    for mod in [m for m in sys.modules if m.startswith("onnx2torch")]:
        del sys.modules[mod]
    import onnx2torch

    return onnx2torch, "torchvision absent: placeholder (NonMaxSuppression/RoiAlign unusable; not in these models)"


def fix_shapes(model, feed: dict[str, np.ndarray]):
    """``model`` with its graph inputs set to ``feed``'s shapes and, where onnx shape inference leaves a node
    output without a rank (onnx2torch picks BatchNorm1d/2d by rank), its shape as ONNX Runtime computes it on
    ``feed`` (CPU, graph optimizations off). Returns (model, number of shapes taken from ONNX Runtime)."""
    import onnx
    from onnx import helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for v in model.graph.input:
        if v.name in feed:
            dims = v.type.tensor_type.shape.dim
            for d, n in zip(dims, feed[v.name].shape, strict=True):
                d.Clear()
                d.dim_value = int(n)
    typed = onnx.shape_inference.infer_shapes(model, data_prop=True)
    ranked = {v.name for v in [*typed.graph.value_info, *typed.graph.input, *typed.graph.output, *[]]
              if v.type.tensor_type.HasField("shape")}
    ranked |= {t.name for t in typed.graph.initializer}
    missing = [o for n in typed.graph.node for o in n.output if o and o not in ranked]
    if not missing:
        return typed, 0
    import onnxruntime as ort

    probe = onnx.ModelProto.FromString(typed.SerializeToString())
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in missing)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1  # no spinning thread pool left to compete with torch's threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = session.run(missing, {k: v for k, v in feed.items() if k in {i.name for i in session.get_inputs()}})
    del session
    keep = [v for v in typed.graph.value_info if v.name not in set(missing)]
    del typed.graph.value_info[:]
    typed.graph.value_info.extend(keep)
    for name, arr in zip(missing, got, strict=True):
        arr = np.asarray(arr)
        typed.graph.value_info.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    return typed, len(missing)


def convert(path: Path, onnx2torch, feed: dict[str, np.ndarray] | None = None):
    """(torch fx module from onnx2torch, onnx value types, graph input dtypes, output names, shapes from ORT);
    with ``feed``, the graph is made static for that feed's shapes first (:func:`fix_shapes`)."""
    import onnx

    model = constants_to_initializers(onnx.load(str(path)))
    from_ort = 0
    if feed is not None:
        model, from_ort = fix_shapes(model, feed)
    types_ = _onnx_float_types(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = onnx2torch.convert(model, attach_onnx_mapping=True)
    inits = {t.name for t in model.graph.initializer}
    inputs = [(v.name, types_.get(v.name, "float32")) for v in model.graph.input if v.name not in inits]
    return module.eval(), types_, inputs, [o.name for o in model.graph.output], from_ort


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def run_module(module, feeds: list[dict], inputs: list[tuple[str, str]], outputs: list[str], device, onnx_types=None,
               force_fp32: bool = False):
    """Outputs per feed (float32 numpy by output name) and, with ``onnx_types``, the dtype check of the first feed:
    every onnx2torch module's outputs against the ONNX value types ({"checked", "mismatched", "examples"})."""
    import torch

    check = {"checked": 0, "mismatched": 0, "examples": [], "torch_dtypes": Counter(), "fp16_max_abs": 0.0,
             "fp16_max_at": None, "fp16_nonfinite_tensors": 0, "fp16_first_nonfinite": None}
    hooks = []
    if onnx_types is not None:
        def hook(mod, _args, result):
            values = result if isinstance(result, (tuple, list)) else (result,)
            for name, v in zip(mod.onnx_mapping.outputs, values):
                if not isinstance(v, torch.Tensor) or name not in onnx_types:
                    continue
                got = _dtype_name(v)
                check["checked"] += 1
                check["torch_dtypes"][got] += 1
                if v.dtype == torch.float16 and v.numel():
                    bad = ~torch.isfinite(v)
                    if bool(bad.any()):
                        check["fp16_nonfinite_tensors"] += 1
                        check["fp16_first_nonfinite"] = check["fp16_first_nonfinite"] or name
                    peak = float(torch.where(bad, torch.zeros_like(v), v).abs().max())
                    if peak > check["fp16_max_abs"]:
                        check["fp16_max_abs"], check["fp16_max_at"] = peak, name
                if got != onnx_types[name]:
                    check["mismatched"] += 1
                    if len(check["examples"]) < 3:
                        check["examples"].append(f"{name}: onnx {onnx_types[name]}, torch {got}")

        hooks = [m.register_forward_hook(hook) for m in module.modules() if hasattr(m, "onnx_mapping")]
    results = []
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # onnx2torch's deprecation warnings at run time
            for i, feed in enumerate(feeds):
                args = []
                for name, dtype in inputs:
                    x = torch.from_numpy(np.ascontiguousarray(feed[name]).astype(dtype))
                    args.append((x.float() if force_fp32 and x.is_floating_point() else x).to(device))
                got = module(*args)
                got = got if isinstance(got, (tuple, list)) else (got,)
                results.append({n: t.detach().float().cpu().numpy() for n, t in zip(outputs, got, strict=True)})
                if i == 0:
                    for h in hooks:
                        h.remove()
                    hooks = []
    finally:
        for h in hooks:
            h.remove()
    check["torch_dtypes"] = dict(check["torch_dtypes"])
    return results, (check if onnx_types is not None else None)


def _fp32_everywhere(module) -> None:
    """CPU dry-run fallback: every float tensor and every Cast to float16 in FP32."""
    import torch

    module.float()
    for m in module.modules():
        if getattr(m, "torch_dtype", None) == torch.float16:
            m.torch_dtype = torch.float32


def _err(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _run_group(path: Path, feeds: list[dict], device, onnx2torch, fp32: bool, check_dtypes: bool) -> dict:
    """Convert ``path`` static for these feeds' shapes and run them: {"got", "check", "params", "from_ort", "mode"}
    or {"error"}. On a CPU dry run, a missing FP16 kernel reruns the model in FP32 (labelled)."""
    try:
        module, onnx_types, inputs, outputs, from_ort = convert(path, onnx2torch, feeds[0])
    except Exception as e:  # noqa: BLE001 - a model onnx2torch cannot convert is a result
        return {"error": f"onnx2torch: {_err(e)}"}
    out = {"params": dict(Counter(_dtype_name(t) for t in [*module.parameters(), *module.buffers()])),
           "from_ort": from_ort,
           "mode": ("cuda" if device.type == "cuda" else "cpu (dry run)") + (" fp32" if fp32 else " file dtypes")}
    try:
        module.to(device)
        out["got"], out["check"] = run_module(module, feeds, inputs, outputs, device,
                                              onnx_types if check_dtypes else None)
    except Exception as e:  # noqa: BLE001 - a missing CPU half kernel: the dry run falls back to FP32
        if device.type == "cuda" or fp32:
            return {"error": f"torch: {_err(e)}"}
        out.update(fallback_reason=_err(e)[:160], mode="cpu-fp32-fallback (dry run)")
        _fp32_everywhere(module)
        try:
            out["got"], out["check"] = run_module(module, feeds, inputs, outputs, device, None, force_fp32=True)
        except Exception as e2:  # noqa: BLE001
            return {"error": f"torch: {_err(e2)}"}
    return out


def one_row(case: dict, tool: str, path: Path, refs: list[dict], feeds: list[dict], device, onnx2torch,
            cpu_met=None, high_nodes=None, verdicts=None) -> dict:
    """Convert and run ``path`` on every feed (one static conversion per distinct input shape), judge it."""
    row = {"model": case["model"], "tool": tool, "high_nodes": high_nodes, "cpu_met": cpu_met, "file": path.name,
           "verdicts": verdicts}
    start = time.perf_counter()
    groups: dict[tuple, list[int]] = {}
    for i, feed in enumerate(feeds):
        groups.setdefault(tuple((k, feed[k].shape) for k in sorted(feed)), []).append(i)
    got: list = [None] * len(feeds)
    for n, idx in enumerate(groups.values()):
        res = _run_group(path, [feeds[i] for i in idx], device, onnx2torch, tool == FP32, n == 0)
        if "error" in res:
            return {**row, "error": res["error"]}
        for i, g in zip(idx, res["got"], strict=True):
            got[i] = g
        if n == 0:
            row.update(params=res["params"], mode=res["mode"], dtype_check=res["check"])
        row["shapes_from_ort"] = row.get("shapes_from_ort", 0) + res["from_ort"]
        if res.get("fallback_reason"):
            row.update(mode=res["mode"], fallback_reason=res["fallback_reason"])
    row.update(conversions=len(groups), seconds=round(time.perf_counter() - start, 2))
    row.update(judge(case["model"], case["kind"], refs, got))
    return row


# ------------------------------------------------------------------------------------------------ table
def _fmt_bool(v) -> str:
    return "-" if v is None else "yes" if v else "NO"


def _fmt_db(v) -> str:
    return "-" if v is None else "nan" if isinstance(v, float) and math.isnan(v) else "inf" if v == math.inf \
        else f"{v:.1f}"


def table(rows: list[dict], here: str = "task met here") -> str:
    head = ["model", "tool", "FP32 nodes kept", "task met CPU ORT", here, "worst metric", "SQNR dB",
            "max |x|", "non-finite", "fp16 max |x| inside", "fp16 inf/NaN tensors", "dtypes kept", "mode / error"]
    with_verdicts = any(r.get("verdicts") for r in rows)  # the workbench's compare verdicts on the file
    if with_verdicts:
        head[4:4] = ["workbench on ort", "workbench on ref:fp16"]
    cells = []
    for r in rows:
        outs = r.get("outputs") or {}
        first = next(iter(outs.values()), {})
        check = r.get("dtype_check")
        kept = "-" if not check else "yes" if not check["mismatched"] else f"NO ({check['mismatched']})"
        extra = r.get("error") or r.get("mode", "")
        if r.get("same_as"):
            extra += f" (same file as {r['same_as']})"
        if r.get("fallback_reason"):
            extra += f" [{r['fallback_reason'][:80]}]"
        if r["tool"] == FP32 and first:
            extra += f"; max rel err vs ORT {first['max_rel_err']:.1e}"
        cells.append([r["model"], r["tool"], "-" if r.get("high_nodes") is None else str(r["high_nodes"]),
                      _fmt_bool(r.get("cpu_met")), _fmt_bool(r.get("met")) if "met" in r else "-",
                      r.get("worst_txt", "-"), _fmt_db(first.get("sqnr_db")),
                      "-" if first.get("max_abs") is None else f"{first['max_abs']:.4g}",
                      str(sum(o["nonfinite"] for o in outs.values())) if outs else "-",
                      f"{check['fp16_max_abs']:.4g}" if check and check["fp16_max_abs"] else "-",
                      str(check["fp16_nonfinite_tensors"]) if check else "-", kept, extra])
        if with_verdicts:
            cells[-1][4:4] = [(r.get("verdicts") or {}).get(e, "-") for e in ("ort", "ref:fp16")]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    widths[-1] = 0
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    return "\n".join(lines)


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v


# ------------------------------------------------------------------------------------------------ main
def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def pick_device(name: str):
    """(torch.device, environment dict) or raise CasesError-like SystemExit(2) with one line."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    env = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "device": name,
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
           "fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction}
    if name == "cuda":
        if not torch.cuda.is_available():
            raise CasesError("CUDA is not available to torch (no GPU or no CUDA build)")
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cudnn"] = torch.backends.cudnn.version()
        torch.zeros(1, device="cuda").add_(1)  # the device answers
    else:
        env["note"] = "CPU DRY RUN: PyTorch CPU kernels, not a GPU result"
    return torch.device(name), env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", required=True, metavar="DIR", help="folder written by scripts/gpu_task_cases.py")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=os.environ.get("GPU_TASK_DEVICE", "cuda"),
                        help="default: $GPU_TASK_DEVICE or cuda; cpu is a labelled dry run")
    parser.add_argument("--out", metavar="DIR", help="write gpu_task_check.json and .txt here")
    parser.add_argument("--fp32-from", metavar="DIR", help="FP32 models NAME.onnx for the sanity rows of models "
                        "whose FP32 model was not carried")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="only these models")
    parser.add_argument("--tools", nargs="+", metavar="TOOL", help=f"only these tools (of {', '.join(TOOLS)}, fp32)")
    args = parser.parse_args(argv)
    try:
        manifest = load_cases(args.cases)
        device, env = pick_device(args.device)
        onnx2torch, note = import_onnx2torch(args.device)
    except CasesError as e:
        print(f"gpu_task_check: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"gpu_task_check: onnx2torch cannot be imported ({e}); install its wheel on PYTHONPATH", file=sys.stderr)
        return 2
    env["onnx2torch"] = _version("onnx2torch")
    if note:
        env["torchvision"] = note
    print(f"gpu_task_check: {json.dumps(env)}", flush=True)
    rows = []
    for case in manifest["cases"]:
        if args.models and case["model"] not in args.models:
            continue
        feeds, refs = load_arrays(case["feeds"]), load_arrays(case["refs"])
        jobs = [(tool, rec.get("file"), rec.get("cpu_met"), rec.get("high_nodes"), rec.get("dropped"),
                 rec.get("verdicts")) for tool, rec in case["tools"].items()]
        fp32 = case.get("fp32") or (Path(args.fp32_from) / f"{case['model']}.onnx" if args.fp32_from else None)
        if fp32 and Path(fp32).is_file():
            jobs.append((FP32, Path(fp32), None, None, None, None))
        done: dict[Path, dict] = {}  # a file shared by tools (byte-identical models) runs once
        for tool, path, cpu_met, high, dropped, said in jobs:
            if args.tools and tool.split(" ")[0] not in args.tools:
                continue
            if path is None:
                rows.append({"model": case["model"], "tool": tool, "high_nodes": high, "cpu_met": cpu_met,
                             "error": dropped or "no model (the tool failed in the benchmark)"})
            elif Path(path) in done:
                first = done[Path(path)]
                rows.append({**first, "tool": tool, "high_nodes": high, "cpu_met": cpu_met, "verdicts": said,
                             "same_as": first["tool"], "seconds": 0.0})
            else:
                rows.append(one_row(case, tool, Path(path), refs, feeds, device, onnx2torch, cpu_met, high, said))
                done[Path(path)] = rows[-1]
            r = rows[-1]
            print(f"  {r['model']} {r['tool']}: {r.get('error') or r.get('worst_txt')} ({r.get('seconds', '-')} s)",
                  flush=True)
    text = table(rows, "task met GPU FP16" if device.type == "cuda" else "task met CPU (DRY RUN)")
    header = f"# gpu_task_check on {env.get('gpu', 'CPU (DRY RUN, not a GPU result)')}; torch {env['torch']}, " \
             f"cuda {env['cuda_runtime']}, TF32 off; cases made {manifest.get('made')} (git {manifest.get('git')})"
    print(header)
    print(text)
    if args.out:
        from workbench._atomic import atomic_write_text

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "gpu_task_check.json",
                          json.dumps(_json_safe({"env": env, "rows": rows}), indent=1) + "\n")
        atomic_write_text(out / "gpu_task_check.txt", header + "\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
