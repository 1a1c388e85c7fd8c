"""Feeds cast to the dtypes a model's own inputs declare."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """Graph input name -> numpy dtype, for inputs with a declared tensor element type."""
    out = {}
    for vi in model.graph.input:
        et = vi.type.tensor_type.elem_type
        if et:
            try:
                out[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def cast_feeds(model: onnx.ModelProto, feeds: list[dict]) -> list[dict]:
    """Feeds cast to ``model``'s input dtypes (a user's FP16 export may take float16 inputs); names the model does
    not take are dropped (kept when the model declares no input types)."""
    dtypes = input_dtypes(model)
    return [cast_to(dtypes, f) for f in feeds]


def cast_to(dtypes: dict[str, np.dtype], feed: dict) -> dict:
    """One feed cast to ``dtypes`` (:func:`input_dtypes` of a model), as :func:`cast_feeds` does."""
    return {k: (v.astype(dtypes[k]) if k in dtypes and v.dtype != dtypes[k] else v) for k, v in feed.items()
            if k in dtypes or not dtypes}
