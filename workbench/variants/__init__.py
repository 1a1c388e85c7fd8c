"""Precision variants: transforms of the ONNX graph (FP16, INT8 QDQ) that then run on any engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from ..errors import VariantError
from .graph_names import copy_model
from .result import ClampRecord, VariantResult

VARIANTS = ("fp32", "fp16", "int8")


def make_variant(
    model: onnx.ModelProto,
    variant: str,
    *,
    calibration_feeds: Any = None,
    keep_fp32: Sequence[str] = (),
    **options: Any,
) -> VariantResult:
    """Make ``variant`` ("fp32" | "fp16" | "int8") of ``model`` (a ModelProto or LoadedModel; never changed).

    fp32 returns a copy. fp16 passes ``keep_fp32`` and ``options`` to :func:`~workbench.variants.fp16.to_fp16`.
    int8 needs ``calibration_feeds`` (dict, list of dicts or a path); ``keep_fp32`` nodes are excluded from
    quantization; ``options`` go to :func:`~workbench.variants.int8.to_int8`.
    """
    name = str(variant).lower()
    proto = getattr(model, "proto", model)
    if not isinstance(proto, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or a LoadedModel, got {type(model).__name__}")
    if name == "fp32":
        if options:
            raise VariantError(f"fp32 takes no options (got {', '.join(options)})", "drop them")
        return VariantResult(model=copy_model(proto), variant="fp32", converter="none")
    if name in ("fp16", "int8"):  # the converters would fail on these graphs and take the blame
        from ..model.validate import check_structure

        check_structure(proto)
    if name == "fp16":
        from .fp16 import to_fp16

        return to_fp16(proto, keep_fp32=keep_fp32, **options)
    if name == "int8":
        if calibration_feeds is None:
            raise VariantError(
                "INT8 needs calibration feeds to set activation ranges",
                "pass --inputs/--data (or calibration_feeds=) with a calibration set of representative inputs",
            )
        from ..inputs import feeds_from
        from .int8 import to_int8

        exclude = list(dict.fromkeys([*options.pop("exclude_nodes", ()), *keep_fp32]))
        return to_int8(proto, feeds_from(calibration_feeds), exclude_nodes=exclude, **options)
    raise VariantError(f"unknown variant '{variant}'", f"use one of {', '.join(VARIANTS)}")


__all__ = ["VARIANTS", "ClampRecord", "VariantResult", "make_variant"]
