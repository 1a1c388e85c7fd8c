"""Marking intermediate tensors as graph outputs, on a copy of the model."""

from __future__ import annotations

from collections.abc import Sequence

import onnx


def mark_outputs(model: onnx.ModelProto, names: Sequence[str], keep_original: bool = False) -> onnx.ModelProto:
    """Return a copy of ``model`` whose graph outputs are ``names`` (plus the original outputs if
    ``keep_original``). Types come from value_info/outputs where known; otherwise the name alone
    (ONNX Runtime and OpenVINO infer the rest)."""
    known = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    wanted = list(dict.fromkeys(([o.name for o in model.graph.output] if keep_original else []) + list(names)))
    del out.graph.output[:]
    for name in wanted:
        vi = onnx.ValueInfoProto()
        if name in known:
            vi.CopyFrom(known[name])
        else:
            vi.name = name
        out.graph.output.append(vi)
    return out
