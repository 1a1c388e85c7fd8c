"""One-sentence explanations of why a node introduces error, from numbers the comparison measured."""

from __future__ import annotations

from .metrics import ErrorStats

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.104e-05


def explain(
    node: str, variant: str, introduced: ErrorStats, received: dict, clamps: list[dict], outlier_ratio: float = 50.0,
    tensor: str | None = None,
) -> str:
    """Say what the numbers point to: a converter clamp used by this node, FP16 overflow, INT8 outliers."""
    m = introduced.metrics()
    parts = []
    for clamp in clamps:
        orig, conv = clamp.get("original"), clamp.get("converted")
        what = f" from {_num(orig)} to {_num(conv)}" if orig is not None and conv is not None else ""
        count = f"{clamp['count']} value{'s' if clamp['count'] != 1 else ''}"
        if node in clamp.get("consumers", []):
            parts.append(f"the FP16 converter clamped constant '{clamp['name']}'{what} ({clamp['kind']}, {count}) "
                         "and this node uses it")
        elif tensor is not None and clamp.get("name") == tensor:
            users = ", ".join(clamp.get("consumers", [])[:3]) or "no node"
            parts.append(f"the FP16 converter clamped this constant{what} ({clamp['kind']}, {count}); used by {users}")
    if variant == "fp16" and introduced.max_ref > FP16_MAX:
        parts.append(f"reference values reach {_num(introduced.max_ref)}, beyond FP16's largest finite value 65504")
    if m.get("nonfinite_mismatch"):
        parts.append(f"{m['nonfinite_mismatch']} inf/NaN values appear where the reference has finite ones")
    if variant == "int8" and introduced.mean_ref > 0 and introduced.max_ref / introduced.mean_ref > outlier_ratio:
        parts.append(f"its values peak at {_num(introduced.max_ref)}, {introduced.max_ref / introduced.mean_ref:.0f}x "
                     f"their mean magnitude {_num(introduced.mean_ref)}: outliers set the INT8 scale and crush the "
                     "ordinary values")
    sqnr, rsqnr = m.get("sqnr_db"), received.get("sqnr_db")
    if isinstance(sqnr, float) and isinstance(rsqnr, float):
        parts.append(f"alone it gives {_db(sqnr)} SQNR from exact inputs (its inputs arrive at {_db(rsqnr)})")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "." if text else ""


def _num(x) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_num(v) for v in x[:3]) + (", ..." if len(x) > 3 else "") + "]"
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def _db(x: float) -> str:
    return "exact" if x == float("inf") else f"{x:.1f} dB"
