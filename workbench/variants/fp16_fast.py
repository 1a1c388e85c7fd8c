"""The weights of an FP16 variant, filled into the converter's weight-free output one tensor at a time.

Both converters (onnxruntime.transformers.float16 and onnxconverter_common.float16) convert every float tensor
with ``convert_np_to_float16``: positive values strictly between 0 and ``min_positive_val`` become
``min_positive_val``, finite values beyond ``max_finite_val`` become ``max_finite_val`` (signs kept; 0, NaN and
inf unchanged), then ``np.float16``. Their implementation also scans each tensor six more times to log the
extremes, which costs seconds on a transformer. :class:`ClampCounter` is the same rule vectorised (tests check it
bit for bit against both converters' own function) and counts the tensors it changed, so the clamp report diffs
constants only when something was clamped. On a tensor without data a converter only changes the type, so it can
run on a weight-free copy and :func:`fill_weights` brings the data in afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..core.shapes import is_stub
from ..model.mapped import is_mapped
from ..model.walk import subgraphs_of


class ClampCounter:
    """The converters' rule, counting the tensors it clamped (0: the clamp report has nothing to find);
    ``names``: those the weight fill clamped, in :func:`workbench.variants.clamps.float_constants`' keys."""

    def __init__(self) -> None:
        self.clamped = 0
        self.names: set[str] = set()

    def __call__(self, np_array, min_positive_val=5.96e-08, max_finite_val=65504.0):
        x = np.asarray(np_array)
        a = np.abs(x)
        if not a.size or (a.max(initial=0) <= max_finite_val and not _has_small(a, min_positive_val)):
            return np.float16(x)  # the common case: nothing to clamp (NaN compares false, as in the rule)
        small = (a > 0) & (a < min_positive_val)
        big = (a > max_finite_val) & np.isfinite(x)
        if small.any() or big.any():
            self.clamped += 1
            x = x.copy()
            x[small] = np.copysign(np.asarray(min_positive_val, dtype=x.dtype), x[small])
            x[big] = np.copysign(np.asarray(max_finite_val, dtype=x.dtype), x[big])
        return np.float16(x)


#: elements per slice of :func:`_has_small`
_SLICE = 1 << 20


def _has_small(a: np.ndarray, limit: float) -> bool:
    """Any 0 < |x| < limit (NaN-safe), slice by slice: no array-sized temporaries, and a table of zeros (a sparse or
    pruned weight) costs one pass instead of gathering every zero into a copy (805 MB of zeros in memory: 4.2 s ->
    0.24 s)."""
    flat = a.reshape(-1)
    for start in range(0, flat.size, _SLICE):
        part = flat[start:start + _SLICE]
        if np.count_nonzero(part[part < limit]):
            return True
    return False




def _tensors(graph: onnx.GraphProto, path: str = "") -> Iterator[tuple[tuple, str, TensorProto]]:
    """(key, clamp-report name, tensor) for every tensor a graph holds: initializers by name, tensor attributes by
    node output (or name) and attribute, subgraphs included (keys carry the subgraph's place)."""
    for t in graph.initializer:
        yield (path, "init", t.name), t.name, t
    for node in graph.node:
        owner = node.output[0] if node.output else node.name
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                name = owner if node.op_type == "Constant" and a.name == "value" else f"{node.name}:{a.name}"
                yield (path, "attr", owner, a.name), name, a.t
        for attr, sub in subgraphs_of(node):
            yield from _tensors(sub, f"{path}/{owner}/{attr}")


def fill_weights(converted: onnx.ModelProto, original: onnx.ModelProto, limits: tuple[float, float],
                 counter: ClampCounter) -> None:
    """Replace each data-less tensor of ``converted`` (a converter's output on a weight-free copy) by the
    ``original`` tensor's data, converted to float16 by ``counter`` (the converters' rule) where the converter
    made it float16."""
    source = {key: t for key, _, t in _tensors(original.graph)}
    writer = None
    try:
        for key, name, t in _tensors(converted.graph):
            if not is_stub(t):
                continue
            src = source.get(key)
            if src is None:
                raise ValueError(f"the converter created tensor {key[-1]!r} that the original model does not hold")
            if is_mapped(src):  # weights left in their files: converted piece by piece into a file of this run
                writer = writer or _variant_writer()
                _fill_mapped(t, src, limits, counter, name, writer)
                continue
            _fill(t, src, limits, counter, name)
    finally:
        if writer is not None:
            writer.close()


def _variant_writer():
    from ..core.scratch import scratch_dir
    from ..model.mapped import WeightWriter

    return WeightWriter(scratch_dir("workbench-fp16-") / "weights.bin")


def _fill_mapped(t: TensorProto, src: TensorProto, limits, counter: ClampCounter, name: str, writer) -> None:
    """Fill ``t`` with a mapped tensor ``src``: its float16 conversion (or its bytes) written by ``writer``."""
    from ..model.mapped import flat_chunks

    if t.data_type == TensorProto.FLOAT16 and src.data_type == TensorProto.FLOAT:
        before = counter.clamped
        ref = writer.write_array(t, (counter(chunk, *limits) for chunk in flat_chunks(src)))
        if counter.clamped > before:
            counter.clamped = before + 1  # one tensor, however many of its pieces were clamped
            counter.names.add(name)
    else:
        ref = writer.copy(src)
    dims = list(t.dims)
    t.CopyFrom(ref)
    t.data_type = ref.data_type
    del t.dims[:]
    t.dims.extend(dims)


def _fill(t: TensorProto, src: TensorProto, limits, counter: ClampCounter, name: str) -> None:
    """Fill ``t`` with ``src``'s data in memory, converted to float16 where the converter made ``t`` float16."""
    if t.data_type == TensorProto.FLOAT16 and src.data_type == TensorProto.FLOAT:
        before = counter.clamped
        data = counter(numpy_helper.to_array(src), *limits)
        if counter.clamped > before:
            counter.names.add(name)
        tname, dims = t.name, list(t.dims)
        t.Clear()
        t.name, t.data_type = tname, TensorProto.FLOAT16
        t.dims.extend(dims)
        t.raw_data = data.tobytes()
    else:
        dims = list(t.dims)
        t.CopyFrom(src)
        del t.dims[:]
        t.dims.extend(dims)
