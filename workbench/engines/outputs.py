"""Marking intermediate tensors as graph outputs: on a copy of the model, or in place for the moment it takes
to serialize it (no copy of the weights).

Engines hand ONNX Runtime and OpenVINO serialized bytes, so a marked *copy* of a model is only ever serialized
and dropped: on a transformer that copy is hundreds of MB per session. :func:`temporarily` swaps the graph's
outputs in place under a lock and restores them, for the moment a serialization takes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import onnx

#: one lock for every temporary in-place edit: edits are short (a serialization), so one lock costs nothing
_EDIT_LOCK = threading.RLock()


def edit_lock(model: onnx.ModelProto | None = None) -> threading.RLock:
    """The lock serialising temporary in-place edits of models (see :func:`temporarily`)."""
    return _EDIT_LOCK


def _output_infos(model: onnx.ModelProto, names: Sequence[str], keep_original: bool) -> list[onnx.ValueInfoProto]:
    known = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    wanted = list(dict.fromkeys(([o.name for o in model.graph.output] if keep_original else []) + list(names)))
    infos = []
    for name in wanted:
        vi = onnx.ValueInfoProto()
        if name in known:
            vi.CopyFrom(known[name])
        else:
            vi.name = name
        infos.append(vi)
    return infos


def mark_outputs(model: onnx.ModelProto, names: Sequence[str], keep_original: bool = False) -> onnx.ModelProto:
    """Return a copy of ``model`` whose graph outputs are ``names`` (plus the original outputs if
    ``keep_original``). Types come from value_info/outputs where known; otherwise the name alone
    (ONNX Runtime and OpenVINO infer the rest)."""
    infos = _output_infos(model, names, keep_original)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(infos)
    return out


@contextlib.contextmanager
def temporarily(model: onnx.ModelProto, names: Sequence[str], keep_original: bool = False
                ) -> Iterator[onnx.ModelProto]:
    """``model`` itself with its graph outputs set to ``names`` until the block ends (then restored), under
    :func:`edit_lock`. Use it only for work that reads the model and keeps nothing of it (serializing)."""
    lock = edit_lock(model)
    with lock:
        saved = [onnx.ValueInfoProto() for _ in model.graph.output]
        for copy, vi in zip(saved, model.graph.output):
            copy.CopyFrom(vi)
        infos = _output_infos(model, names, keep_original)
        del model.graph.output[:]
        model.graph.output.extend(infos)
        try:
            yield model
        finally:
            del model.graph.output[:]
            model.graph.output.extend(saved)
