"""Finding the float constants an FP16 converter clamped, by diffing them against the original float32 values."""

from __future__ import annotations

import logging

import numpy as np
import onnx

from ..core.shapes import KEEP_BYTES, tensor_nbytes
from ..model.mapped import tensor_array
from ..model.walk import iter_nodes, subgraphs_of
from .graph_names import node_names, original_consumers
from .result import ClampRecord

log = logging.getLogger(__name__)

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
_SHOWN = 3  # extreme values listed per record


def float_constants(model: onnx.ModelProto, only_float32: bool = False) -> dict[str, tuple[onnx.TensorProto, str]]:
    """Key -> (tensor, source) for initializers and tensor-valued attributes, subgraphs included.

    Keys: an initializer's name, a Constant node's output name, else ``node:attribute``."""
    wanted = {onnx.TensorProto.FLOAT} if only_float32 else _FLOAT_TYPES
    found: dict[str, tuple[onnx.TensorProto, str]] = {}
    graphs = [model.graph] + [g for n in iter_nodes(model.graph) for _, g in subgraphs_of(n)]
    for graph in graphs:
        for t in graph.initializer:
            if t.data_type in wanted:
                found.setdefault(t.name, (t, "initializer"))
        for node in graph.node:
            for attr in node.attribute:
                tensors = [attr.t] if attr.type == onnx.AttributeProto.TENSOR else (
                    list(attr.tensors) if attr.type == onnx.AttributeProto.TENSORS else [])
                for k, t in enumerate(tensors):
                    if t.data_type not in wanted:
                        continue
                    if node.op_type == "Constant" and node.output and attr.name == "value":
                        found.setdefault(node.output[0], (t, "constant"))
                    else:
                        suffix = f"[{k}]" if attr.type == onnx.AttributeProto.TENSORS else ""
                        found.setdefault(f"{node.name}:{attr.name}{suffix}", (t, "attribute"))
    return found


def find_clamps(
    original: onnx.ModelProto, converted: onnx.ModelProto, *, max_finite: float, min_positive: float,
    rounding: float | None = None, only: set[str] | None = None,
) -> list[ClampRecord]:
    """ClampRecords for every float32 constant of ``original`` whose counterpart in ``converted`` (cast back to
    float32) lost values above ``max_finite`` or nonzero values below ``min_positive``. Overflows come first,
    then by largest absolute change. ``only``: diff just these constants among the large ones (those a conversion
    is known to have clamped); small ones are always diffed."""
    before = float_constants(original, only_float32=True)
    after = float_constants(converted)
    originals = set(node_names(original))
    records: list[ClampRecord] = []
    for key, (tensor, source) in before.items():
        if key not in after or (only is not None and key not in only and tensor_nbytes(tensor) > KEEP_BYTES):
            continue
        try:
            a = tensor_array(tensor)
            b = tensor_array(after[key][0])
        except (ValueError, TypeError, OSError) as e:  # external data not loaded, odd encodings
            log.debug("cannot compare constant %s: %s", key, e)
            continue
        if a.shape != b.shape:
            continue
        step = rounding
        if rounding is not None and after[key][0].data_type == onnx.TensorProto.BFLOAT16:
            step = max(rounding, 2.0 ** -7)  # bfloat16 keeps 8 significant bits
        if isinstance(a, np.memmap) or isinstance(b, np.memmap):  # weights left mapped: only the changed values
            where, a_s, b_s = _changed_values(tensor, after[key][0], max_finite, min_positive, step)
            records += _records(key, source, a_s, b_s, max_finite, min_positive, converted, originals, step,
                                where=where, size=a.size)
            continue
        a, b = a.astype(np.float32, copy=False), b.astype(np.float32)
        records += _records(key, source, a.ravel(), b.ravel(), max_finite, min_positive, converted, originals, step)
    records.sort(key=lambda r: (r.kind != "overflow", -r.max_abs_change))
    return records


def _changed(a: np.ndarray, b: np.ndarray, max_finite: float, min_positive: float, rounding: float | None
             ) -> np.ndarray:
    """Where ``b`` may be a clamp of ``a``: the union of :func:`_records`' masks. A known converter's rounding of
    every other value is left out: FP16 changes nearly every value, and keeping those positions and values held
    16 bytes per weight (a 131 MB embedding: 0.5 GB at the variant's peak)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if rounding is None:
            big = np.abs(a) > max_finite
            return np.isfinite(a) & (a != b) & (big | ((a != 0) & ((np.abs(a) < min_positive) | (b == 0))))
        changed = np.isfinite(a) & ~(np.abs(b.astype(np.float64) - a) <= rounding * np.abs(a) + min_positive)
        return changed & ((np.abs(a) >= max_finite) | (a != 0))


def _changed_values(a: onnx.TensorProto, b: onnx.TensorProto, max_finite: float, min_positive: float,
                    rounding: float | None, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat positions, values of ``a``, values of ``b``) where ``b`` may clamp ``a`` (:func:`_changed`), read
    piece by piece (mapped weights are never held whole)."""
    from ..model.mapped import flat_chunks

    where, xs, ys = [], [], []
    start = 0
    a_parts = flat_chunks(a, chunk * 4)
    b_parts = _rechunk(flat_chunks(b, chunk * 4))
    next(b_parts)
    for x in a_parts:
        x = x.astype(np.float32, copy=False)
        y = b_parts.send(x.size).astype(np.float32, copy=False)
        idx = np.flatnonzero(_changed(x, y, max_finite, min_positive, rounding))
        where.append(idx + start)
        xs.append(x[idx])
        ys.append(y[idx])
        start += x.size
    if not where:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(where), np.concatenate(xs), np.concatenate(ys)


def _rechunk(parts):
    """A generator that, sent a count, gives the next that many values of the flat pieces ``parts``."""
    buffer = np.zeros(0, np.float32)
    want = yield None
    for part in parts:
        buffer = np.concatenate([buffer, part]) if buffer.size else part
        while want is not None and buffer.size >= want:
            out, buffer = buffer[:want], buffer[want:]
            want = yield out
    while want is not None:
        out, buffer = buffer[:want], buffer[want:]
        want = yield out


def _records(
    key: str, source: str, a: np.ndarray, b: np.ndarray, max_finite: float, min_positive: float,
    converted: onnx.ModelProto, originals: set[str], rounding: float | None = None,
    where: np.ndarray | None = None, size: int | None = None,
) -> list[ClampRecord]:
    """``where``/``size``: ``a`` and ``b`` are the values at these flat positions of a tensor of ``size``."""
    finite = np.isfinite(a)
    if rounding is None:  # a known converter's limits
        changed = finite & (a != b)
        masks = {
            "overflow": changed & (np.abs(a) > max_finite),
            "underflow": changed & (a != 0) & ((np.abs(a) < min_positive) | (b == 0)),
        }
    else:  # a file of unknown making: anything changed beyond its format's rounding
        with np.errstate(invalid="ignore", over="ignore"):
            changed = finite & ~(np.abs(b.astype(np.float64) - a) <= rounding * np.abs(a) + min_positive)
        masks = {
            "overflow": changed & (np.abs(b) < np.abs(a)) & (np.abs(a) >= max_finite),
            "underflow": changed & (a != 0) & ((np.abs(a) < max_finite) | (b == 0)),
        }
    out = []
    for kind, mask in masks.items():
        idx = np.flatnonzero(mask)
        if not idx.size:
            continue
        mag = np.abs(a[idx])
        order = idx[np.argsort(-mag if kind == "overflow" else mag, kind="stable")][:_SHOWN]
        abs_change = np.abs(b[idx].astype(np.float64) - a[idx])
        if source == "attribute":
            consumers = [key.split(":", 1)[0]]
        else:
            consumers = original_consumers(key, converted, originals)
        out.append(ClampRecord(
            name=key, source=source, kind=kind, count=int(idx.size), size=int(a.size if size is None else size),
            original=[float(a[i]) for i in order], converted=[float(b[i]) for i in order],
            max_rel_change=float((abs_change / np.abs(a[idx])).max()), max_abs_change=float(abs_change.max()),
            consumers=consumers, indices=[int(i) for i in (idx if where is None else where[idx])[:5]],
        ))
    return out


#: FP16 keeps 11 significant bits: a value rounded to FP16 moves by at most 2^-11 of itself (normals)
FP16_ROUNDING = 2.0 ** -10
FP16_MIN_NORMAL = 2.0 ** -14
FP16_MIN_SUBNORMAL = 2.0 ** -24


def find_changed_constants(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> list[ClampRecord]:
    """Constants of a user's own candidate file (matched to the reference's by name) that differ beyond FP16
    rounding: clamped toward zero ("overflow": a magnitude cut, e.g. 9.8e7 -> 1e4), flushed or raised
    ("underflow"); and INT8 weights whose re-quantization clips or crushes them ("requantized"). Each record says
    ``by``: "the candidate file"."""
    records = find_clamps(reference, candidate, max_finite=FP16_MIN_NORMAL, min_positive=FP16_MIN_SUBNORMAL,
                          rounding=FP16_ROUNDING)
    records += requantized_weights(reference, candidate)
    for r in records:
        r.by = "the candidate file"
    return records


def requantized_weights(reference: onnx.ModelProto, candidate: onnx.ModelProto, min_sqnr_db: float = 30.0,
                        limit: int = 20) -> list[ClampRecord]:
    """Float weights of ``reference`` that ``candidate`` holds as integers behind a DequantizeLinear with constant
    scales (ORT's quantizer names them NAME_quantized), when the dequantized weight is worse than ``min_sqnr_db``
    or clips values."""
    from ..compare.floor import NumberFormat, _dq_format
    from ..core.metrics import ErrorStats

    ref = {t.name: t for t in reference.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    inits = {t.name: t for t in candidate.graph.initializer}
    types = {t.name: t.data_type for t in candidate.graph.initializer}
    originals = set(node_names(reference))
    out = []
    for node in candidate.graph.node:
        if node.op_type != "DequantizeLinear" or not node.input or node.input[0] not in inits:
            continue
        qname = node.input[0]
        base = qname[: -len("_quantized")] if qname.endswith("_quantized") else qname
        if base not in ref:
            continue
        fmt = _dq_format(node, inits, {}, types)
        if not isinstance(fmt, NumberFormat):
            continue
        a = tensor_array(ref[base]).astype(np.float32)
        q = tensor_array(inits[qname]).astype(np.float64)
        scale, zp = fmt._broadcast(q, fmt.scale), fmt._broadcast(q, fmt.zero_point)
        b = ((q - zp) * scale).astype(np.float32)
        if a.shape != b.shape:
            continue
        m = ErrorStats().update(a, b).metrics()
        lo, hi = fmt.bounds()
        clipped = int(((q <= lo) | (q >= hi)).sum()) if fmt.name in ("int8", "uint8") else 0
        if (m["sqnr_db"] or 0) >= min_sqnr_db and not clipped:
            continue
        d = np.abs(b.astype(np.float64) - a).ravel()
        order = np.argsort(-d, kind="stable")[:_SHOWN]
        out.append(ClampRecord(
            name=base, source="initializer", kind="requantized", count=clipped or int((d > 0).sum()),
            size=int(a.size), original=[float(a.ravel()[i]) for i in order],
            converted=[float(b.ravel()[i]) for i in order], max_rel_change=float(m["norm_max_abs"] or 0),
            max_abs_change=float(d.max()) if d.size else 0.0,
            consumers=original_consumers(base, reference, originals), indices=[int(i) for i in order]))
        if len(out) >= limit:
            break
    return out
