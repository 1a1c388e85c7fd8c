"""One-sentence explanations of why a node introduces error, from numbers the comparison measured."""

from __future__ import annotations

import math

from ..core.metrics import ErrorStats
from .floor import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL

#: how a flush-to-zero clause blames the format; :func:`reconcile` replaces it when the node matters after all
FLOOR_BLAME = ": the format's limit, not the node"
#: a reduction this long, summed in FP16, loses accuracy visibly (FP16 has an 11-bit significand)
LONG_REDUCTION = 1024
_REDUCTIONS = {"MatMul": "products", "Gemm": "products", "Conv": "products", "Softmax": "exponentials",
               "LogSoftmax": "exponentials", "LayerNormalization": "values", "ReduceMean": "values",
               "ReduceSum": "values"}


def explain(
    node: str, family: str, introduced: ErrorStats, received: dict, clamps: list[dict], outlier_ratio: float = 50.0,
    tensor: str | None = None, floor: dict | None = None, op_type: str = "", reduction: int | None = None,
    beyond: float | None = None,
) -> str:
    """Say what the numbers point to: a constant the converter (or the user's file) changed, FP16 overflow or
    underflow of activations, a long FP16 reduction, INT8 outliers or clipping. ``family``: the candidate's
    precision family (fp32, fp16, bf16, int8); ``floor``: the output tensor's floor summary."""
    m = introduced.metrics()
    parts = []
    for clamp in clamps:
        orig, conv = clamp.get("original"), clamp.get("converted")
        what = f" from {_num(orig)} to {_num(conv)}" if orig is not None and conv is not None else ""
        count = f"{clamp['count']} value{'s' if clamp['count'] != 1 else ''}"
        who = clamp.get("by") or "the FP16 converter"
        verb = {"requantized": "re-quantized"}.get(clamp.get("kind"), "clamped")
        if node in clamp.get("consumers", []):
            parts.append(f"{who} {verb} constant '{clamp['name']}'{what} ({clamp['kind']}, {count}) "
                         "and this node uses it")
        elif tensor is not None and clamp.get("name") == tensor:
            users = ", ".join(clamp.get("consumers", [])[:3]) or "no node"
            parts.append(f"{who} {verb} this constant{what} ({clamp['kind']}, {count}); used by {users}")
    fmt = (floor or {}).get("format")
    if family in ("fp16", "bf16") and (introduced.max_ref > FP16_MAX and family == "fp16"
                                       or (floor or {}).get("share_over_max")):
        parts.append(f"reference values reach {_num(introduced.max_ref)}, beyond {family.upper()}'s largest finite "
                     f"value{' 65504' if family == 'fp16' else ''}")
    if fmt in ("fp16", "bf16") and (floor.get("share_flushed") or 0) > 0.01:
        tiny = f"smallest subnormal {FP16_MIN_SUBNORMAL:.1e}" if fmt == "fp16" else "smallest normal"
        parts.append(f"{100 * floor['share_flushed']:.0f}% of its reference values are below {fmt.upper()}'s {tiny} "
                     f"and flush to zero (its floor is {_db(floor.get('sqnr_db'))}{FLOOR_BLAME})")
    elif fmt == "fp16" and (floor.get("share_under_min_normal") or 0) > 0.1:
        parts.append(f"{100 * floor['share_under_min_normal']:.0f}% of its reference values are FP16 subnormals "
                     f"(below {FP16_MIN_NORMAL:.1e}), with fewer significant bits")
    if m.get("nonfinite_mismatch"):
        parts.append(f"{m['nonfinite_mismatch']} inf/NaN values appear where the reference has finite ones")
    if family in ("fp16", "bf16") and reduction and reduction >= LONG_REDUCTION and op_type in _REDUCTIONS and \
            (beyond is None or (isinstance(beyond, float) and math.isfinite(beyond) and beyond < 60)):
        parts.append(f"it sums {reduction} {_REDUCTIONS[op_type]} per output in {family.upper()}")
    if family == "int8" and introduced.mean_ref > 0 and introduced.max_ref / introduced.mean_ref > outlier_ratio:
        parts.append(f"its values peak at {_num(introduced.max_ref)}, {introduced.max_ref / introduced.mean_ref:.0f}x "
                     f"their mean magnitude {_num(introduced.mean_ref)}: outliers set the INT8 scale and crush the "
                     "ordinary values")
    if fmt and fmt not in ("fp16", "bf16") and (floor.get("share_over_max") or 0) > 0.001:
        parts.append(f"{100 * floor['share_over_max']:.1f}% of its values lie beyond the {fmt.upper()} grid's range "
                     "and are clipped (saturation)")
    sqnr, rsqnr = m.get("sqnr_db"), received.get("sqnr_db")
    if isinstance(sqnr, float) and isinstance(rsqnr, float):
        floor_text = ""
        if floor and isinstance(floor.get("sqnr_db"), float):
            floor_text = f"; its {fmt.upper()} floor is {_db(floor['sqnr_db'])}"
        parts.append(f"alone it gives {_db(sqnr)} SQNR from exact inputs (its inputs arrive at {_db(rsqnr)}"
                     f"{floor_text})")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "." if text else ""


def reconcile(culprit) -> None:
    """Make a culprit's explanation agree with its measured impact: one that fixing gains something on the
    outputs (not harmless) is not blamed on the format's floor alone; said in place of :data:`FLOOR_BLAME`."""
    impact = culprit.impact
    if not impact or culprit.harmless or FLOOR_BLAME not in (culprit.explanation or ""):
        return
    said = gain_text(impact.get("best_gain_db"))
    culprit.explanation = culprit.explanation.replace(FLOOR_BLAME, f"; yet {said}: it adds error beyond that floor")


def gain_text(gain) -> str:
    """What fixing a culprit gains on the outputs, in words: ``fixing it gains 12.3 dB on the outputs``; an
    unbounded gain (the fixed outputs match the reference exactly) and a loss said as such."""
    if not isinstance(gain, (int, float)) or math.isnan(gain):
        return "what fixing it gains was not measured"
    if math.isinf(gain):
        return ("fixing it makes the outputs match the reference exactly (the outputs' whole error comes from it)"
                if gain > 0 else "fixing it alone makes the outputs worse")
    return f"fixing it gains {gain:.3g} dB on the outputs"


def impact_sentence(impact: dict) -> str:
    """What fixing a culprit does to the outputs, in one sentence (the CLI's and the notebook's): its gain; the
    inf/NaN it removes where there are any (the dB figure reads the finite values only); or, where the patched
    value overflows too, the impact's note (the gain then measures nothing)."""
    gain = impact.get("best_gain_db")
    if impact.get("harmless"):
        return f"fixing it gains at most {gain or 0:.1f} dB on the outputs"
    if not isinstance(gain, (int, float)):
        return ""
    if impact.get("note"):
        return str(impact["note"])
    fixed = impact.get("nonfinite_fixed") or 0
    if fixed:
        return f"fixing it removes {fixed} inf/NaN from the outputs" + (
            f" (on their finite values: {gain:+.3g} dB)" if math.isfinite(gain) else "")
    return gain_text(gain)


def _num(x) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_num(v) for v in x[:3]) + (", ..." if len(x) > 3 else "") + "]"
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def _db(x) -> str:
    if not isinstance(x, (int, float)):
        return "?"
    return "exact" if x == float("inf") else f"{x:.1f} dB"
