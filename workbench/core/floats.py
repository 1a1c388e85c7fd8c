"""JSON has no inf/NaN: they are written as the strings "inf", "-inf" and "nan" and read back."""

from __future__ import annotations

import math


def encode_float(value):
    """inf/NaN -> "inf"/"-inf"/"nan"; anything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def decode_float(value):
    """Inverse of :func:`encode_float`."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def encode_metrics(metrics: dict) -> dict:
    return {k: encode_float(v) for k, v in metrics.items()}


def decode_metrics(metrics: dict) -> dict:
    return {k: decode_float(v) for k, v in metrics.items()}
