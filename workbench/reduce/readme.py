"""The README.md of a reduction folder: versions, the command, the measured divergence and a snippet."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from ..textfmt import safe_name  # names from the model: on one line, reordering characters escaped
from .common import _ENGINE_PACKAGES, _SHOWN, ORT_PROVIDERS

if TYPE_CHECKING:
    from .api import ReduceResult


_METRIC_CODE = {
    "sqnr_db": "10 * np.log10(np.sum(e ** 2) / np.sum(d ** 2))",
    "cosine": "np.sum(e * g) / np.sqrt(np.sum(e ** 2) * np.sum(g ** 2))",
    "max_abs": "np.abs(d).max(initial=0)",
    "mean_abs": "np.abs(d).mean()",
    "norm_max_abs": "np.abs(d).max(initial=0) / np.abs(e).max(initial=0)",
    "norm_mean_abs": "np.abs(d).sum() / np.abs(e).sum()",
    "max_rel": "(np.abs(d)[e != 0] / np.abs(e[e != 0])).max(initial=0)",
}


def snippet(metric: str = "sqnr_db", provider: str = "CPUExecutionProvider") -> str:
    """Python that runs the folder's pair with onnxruntime and prints the metric (run it in the folder)."""
    code = _METRIC_CODE.get(metric, _METRIC_CODE["sqnr_db"])
    providers = f'["{provider}"]' if provider == "CPUExecutionProvider" else f'["{provider}", "CPUExecutionProvider"]'
    return f'''import numpy as np
import onnxruntime as ort

inputs, expected = np.load("inputs.npz"), np.load("expected.npz")
CASTS = {{"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64}}

def run(path):
    s = ort.InferenceSession(path, providers={providers})
    feed = {{i.name: inputs[i.name].astype(CASTS.get(i.type, inputs[i.name].dtype)) for i in s.get_inputs()}}
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))

outs = {{"reference": run("reference.onnx"), "candidate": run("candidate.onnx")}}
with np.errstate(all="ignore"):
    for name in expected.files:
        for side, out in outs.items():
            e, g = expected[name].astype(np.float64), out[name].astype(np.float64)
            ok = np.isfinite(e) & np.isfinite(g)
            bad = np.count_nonzero(~ok & ~((e == g) | (np.isnan(e) & np.isnan(g))))
            e, g = e[ok], g[ok]
            d = g - e
            print(f"{{side}} vs expected {{name}}: {metric} {{{code}:.4g}}, "
                  f"max_abs {{np.abs(d).max(initial=0):.4g}}, non-finite mismatches {{bad}}")
'''


def _engine_snippet(plan) -> str:
    spec = plan.cand_spec
    opts = {"precision": "native"} if spec.engine == "ref" and spec.variant != "fp32" else {}
    args = "".join(f", {k}={v!r}" for k, v in opts.items())
    return f'''import numpy as np
import onnx
from workbench.core.feeds import input_dtypes
from workbench.engines import get_engine

inputs = np.load("inputs.npz")
model = onnx.load("candidate.onnx")
feed = {{k: inputs[k].astype(t) for k, t in input_dtypes(model).items()}}
with get_engine({spec.engine!r}{args}).prepare(model, [o.name for o in model.graph.output]) as session:
    candidate = session.run(feed)  # compare with np.load("expected.npz") as above
'''


def readme(result: ReduceResult, plan) -> str:
    """The bug report's README.md."""
    from ..report.env import package_versions

    crit = result.criterion
    wanted = {"workbench", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy", "onnxconverter-common",
              _ENGINE_PACKAGES.get(plan.cand_spec.engine), _ENGINE_PACKAGES.get(plan.ref_spec.engine)}
    versions = {"python": platform.python_version(),
                **{k: v for k, v in package_versions().items() if k in wanted}}
    model = plan.original
    status = ("reproduces the divergence on its own" if result.reproduced else
              f"does NOT reproduce the divergence on its own within {result.max_nodes} reference node(s): the "
              "divergence needs more of the graph than this pair")
    ref_nodes = ", ".join(f"`{safe_name(n)}` ({op})" for n, op in zip(result.nodes, result.op_types))
    rows = [("candidate.onnx vs expected.npz", result.metrics), ("candidate.onnx vs reference.onnx",
                                                                 result.pair_metrics),
            ("reference.onnx vs expected.npz", result.reference_metrics)]
    lines = [
        f"# Divergence reproducer: `{safe_name(result.node)}` ({result.op_type})", "",
        f"This pair {status}: {_metrics_text(crit.metric, result.metrics)} (criterion: {crit.describe()}).", "",
        f"- model: `{safe_name(model.name)}` (sha256 {model.fingerprint[:16]}...)",
        f"- reference: `{plan.ref_spec}`; candidate: `{plan.cand_spec}`"
        + (f" from the user's file `{safe_name(plan.variant_info.get('file'))}`" if plan.cand_source is not None else
           " (the workbench's variant of the model)"),
        f"- reference.onnx: {len(result.nodes)} node(s): {ref_nodes}",
        f"- candidate.onnx: {len(result.candidate_nodes)} node(s): {', '.join(map(safe_name, result.candidate_nodes))}",
        f"- inputs.npz: the reference's values of {', '.join(f'`{safe_name(n)}`' for n in result.inputs) or 'nothing'}",
        f"- expected.npz: the reference's values of {', '.join(f'`{safe_name(n)}`' for n in result.outputs)}",
        f"- made with: `{result.command}`", "",
        f"## Measured divergence ({result.engine})", "",
        f"| | {crit.metric} | " + " | ".join(m for m in _SHOWN if m != crit.metric) + " |",
        "|---|" + "---|" * (1 + len([m for m in _SHOWN if m != crit.metric])),
    ]
    for label, m in rows:
        lines.append(f"| {label} | {_fmt(m.get(crit.metric))} | "
                     + " | ".join(_fmt(m.get(k)) for k in _SHOWN if k != crit.metric) + " |")
    if len(result.outputs) > 1:
        lines += ["", "With several outputs, each row shows the worst one by the criterion."]
    if result.ort_metrics is not None:
        lines += ["", f"The divergence shows on the `{plan.cand_spec.engine}` engine. ONNX Runtime CPU on "
                  f"candidate.onnx gives {_metrics_text(crit.metric, result.ort_metrics)} against expected.npz "
                  f"({'it reproduces there too' if crit.diverged(result.ort_metrics) else 'it does not show there'})."]
    elif result.ort_metrics is None and plan.cand_spec.engine not in ("ort",) and \
            plan.cand_spec.engine not in ORT_PROVIDERS:
        lines += ["", f"The divergence was measured on the `{plan.cand_spec.engine}` engine; candidate.onnx does not "
                  "run on ONNX Runtime CPU."]
    provider = ORT_PROVIDERS.get(plan.cand_spec.engine, "CPUExecutionProvider")
    lines += ["", "## Reproduce", "", "A fresh Python with only numpy and onnxruntime, run in this folder:", "",
              "```python", snippet(crit.metric, provider).rstrip(), "```"]
    if plan.cand_spec.engine not in ORT_PROVIDERS:
        lines += ["", f"The candidate as the `{plan.cand_spec}` engine runs it (needs onnx-drift-workbench):", "",
                  "```python", _engine_snippet(plan).rstrip(), "```"]
    if len(result.attempts) > 1:
        lines += ["", "## Subgraphs tried", ""]
        lines += [f"- {len(a.nodes)} node(s) {', '.join(a.nodes)}: {_metrics_text(crit.metric, a.metrics)} "
                  f"({'reproduces' if a.reproduced else 'does not reproduce'})" for a in result.attempts]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {safe_name(n)}" for n in result.notes]
    lines += ["", "## Versions", ""] + [f"- {k}: {v}" for k, v in versions.items()]
    lines.append(f"- platform: {platform.platform()}")
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _metrics_text(metric: str, m: dict) -> str:
    parts = [f"{metric} {_fmt(m.get(metric))}"] + [f"{k} {_fmt(m.get(k))}" for k in _SHOWN if k != metric]
    return ", ".join(parts)
