"""The precision floor: the error that merely *holding* the reference values in the candidate's number format
would cost, per tensor, with no arithmetic at all.

A healthy FP16 layer whose reference values sit below FP16's smallest subnormal (6e-8) flushes to zero: 0 dB SQNR,
and no node is at fault. Measuring each tensor's floor next to its error tells a format limit (error at the floor)
from a defect (error far beyond it). Formats: FP16 (round to nearest even, subnormals, overflow to inf), BF16,
and INT8/UINT8/INT16 with the scale and zero point the candidate's own DequantizeLinear uses (per tensor or per
axis). A tensor the candidate holds in float32 (or wider) has no floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto

from ..core.metrics import ErrorStats

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14  # 6.1e-5
FP16_MIN_SUBNORMAL = 2.0 ** -24  # 6.0e-8: half of it and below round to zero
BF16_MAX = 3.3895313892515355e38
BF16_MIN_NORMAL = 1.1754943508222875e-38
#: an error within this many dB (noise power) of its floor is "at the floor"
FLOOR_MARGIN_DB = 6.0
#: floors are statistics of the reference values: past this many values per tensor and feed, an evenly strided
#: sample of this size estimates them (its SQNR within ~0.1 dB on real tensors) at a fraction of the cost
FLOOR_SAMPLE = 1 << 18

_QUANT_NAMES = {TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.INT16: "int16",
                TensorProto.UINT16: "uint16", TensorProto.FLOAT8E4M3FN: "fp8e4m3fn", TensorProto.FLOAT8E5M2: "fp8e5m2"}
_FP8 = {"fp8e4m3fn": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}


@dataclass(frozen=True, eq=False)
class NumberFormat:
    """A number format a candidate holds a tensor in. ``name``: fp16, bf16, int8, uint8, int16, uint16,
    fp8e4m3fn or fp8e5m2 (the last six with the scale and zero point of the model's DequantizeLinear)."""

    name: str
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int | None = None

    @property
    def is_integer(self) -> bool:
        return self.scale is not None

    def represent(self, x: np.ndarray) -> np.ndarray:
        """``x`` as this format holds it, as float32 (float64 kept for float64 input in FP16/BF16)."""
        x = np.asarray(x)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.name == "fp16":
                return x.astype(np.float16).astype(np.float32)
            if self.name == "bf16":
                return x.astype(ml_dtypes.bfloat16).astype(np.float32)
            if self.name in _FP8:
                scale = self._broadcast(x, self.scale)
                return ((x / scale).astype(_FP8[self.name]).astype(np.float64) * scale).astype(np.float32)
            return self._grid(x)[0]

    def _grid(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """(``x`` on this integer grid as float32, how many values fall past the grid's ends by more than half a
        step). In float32, as QuantizeLinear and DequantizeLinear compute (ONNX Runtime, TensorRT): ``x / scale``
        rounded half to even, plus the zero point, saturated; in place on one buffer (a float64 version spent ~5x
        the time, mostly allocating its temporaries)."""
        work = np.float64 if x.dtype == np.float64 else np.float32
        scale = self._broadcast(x, self.scale).astype(work)
        zp = self._broadcast(x, self.zero_point).astype(work)
        lo, hi = self.bounds()
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            q = np.asarray(np.divide(x, scale, dtype=work))  # a 0-d tensor: a (writable) 0-d array, not a scalar
            q = np.rint(q, out=q)
            q += zp
            over = int(np.count_nonzero(q < lo) + np.count_nonzero(q > hi))
            np.clip(q, lo, hi, out=q)
            q -= zp
            q *= scale
        return q.astype(np.float32, copy=False), over

    def bounds(self) -> tuple[float, float]:
        if self.name in _FP8:
            info = ml_dtypes.finfo(_FP8[self.name])
            return float(info.min), float(info.max)
        return {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}[self.name]

    def _broadcast(self, x: np.ndarray, v: np.ndarray | None) -> np.ndarray:
        v = np.zeros(1, np.float32) if v is None else v.astype(np.float64)
        if v.size == 1 or self.axis is None:
            return v.reshape(()) if v.size == 1 else v
        shape = [1] * x.ndim
        shape[self.axis % x.ndim] = v.size
        return v.reshape(shape)

    def describe(self) -> str:
        if not self.is_integer:
            return self.name.upper()
        s = self.scale
        per = f"per-axis scales ({s.size})" if s.size > 1 else f"scale {float(s.reshape(-1)[0]):.3g}"
        return f"{self.name.upper()} ({per})"

    def to_json(self) -> dict:
        doc: dict = {"format": self.name}
        if self.is_integer:
            doc["scale"] = float(self.scale.reshape(-1)[0]) if self.scale.size == 1 else \
                [float(v) for v in self.scale.reshape(-1)[:8]]
            if self.axis is not None and self.scale.size > 1:
                doc["axis"] = self.axis
        return doc


@dataclass
class FloorStats(ErrorStats):
    """Error of the reference held in ``format``, plus where its values fall against the format's range."""

    format_name: str = ""
    values: int = 0
    under_min_normal: int = 0  # nonzero |x| below the smallest normal (subnormal or flushed)
    flushed: int = 0  # nonzero |x| that become 0
    over_max: int = 0  # |x| beyond the largest finite value (float) or clipped at the grid's ends (integer)

    def add(self, ref: np.ndarray, fmt: NumberFormat) -> FloorStats:
        ref = np.asarray(ref)
        if ref.dtype.kind != "f":
            return self
        if ref.size > FLOOR_SAMPLE and not fmt.is_integer:  # per-axis grids need the layout: never subsampled
            ref = ref.reshape(-1)[:: -(-ref.size // FLOOR_SAMPLE)]
        if fmt.is_integer and fmt.name not in _FP8:
            held, over = fmt._grid(ref)
        else:
            held, over = fmt.represent(ref), None
        self.format_name = fmt.name
        self.update(ref, held, rel=False)
        self.values += ref.size
        self.flushed += int(np.count_nonzero((held == 0) & (ref != 0)))  # nonzero values held as 0
        if fmt.name in ("fp16", "bf16"):
            tiny, big = (FP16_MIN_NORMAL, FP16_MAX) if fmt.name == "fp16" else (BF16_MIN_NORMAL, BF16_MAX)
            a = np.abs(ref)
            self.under_min_normal += int(np.count_nonzero(a < tiny)) - int(np.count_nonzero(a == 0))
            self.over_max += int(np.count_nonzero(a > big))
        elif over is not None:
            self.over_max += over
        else:  # FP8: past the format's largest finite value
            lo, hi = fmt.bounds()
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                q = ref / fmt._broadcast(ref, fmt.scale) + fmt._broadcast(ref, fmt.zero_point)
            self.over_max += int(np.count_nonzero((q < lo - 0.5) | (q > hi + 0.5)))
        return self

    def merge(self, other: FloorStats) -> FloorStats:
        super().merge(other)
        for name in ("values", "under_min_normal", "flushed", "over_max"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.format_name = self.format_name or other.format_name
        return self

    def summary(self) -> dict:
        """Floor metrics plus the format and the shares of values under/over its range."""
        n = max(self.values, 1)
        doc = dict(self.metrics())
        doc.update(format=self.format_name, share_under_min_normal=self.under_min_normal / n,
                   share_flushed=self.flushed / n, share_over_max=self.over_max / n)
        return doc


def excess_db(metric: str, measured: dict, floor: dict) -> float | None:
    """How far ``measured`` is beyond ``floor`` on ``metric``, in dB of noise power (0: at the floor; None:
    unknown). SQNR: floor minus measured; cosine: ratio of (1 - cos); error metrics: 20 log10 of their ratio."""
    m, f = measured.get(metric), floor.get(metric)
    if not isinstance(m, (int, float)) or not isinstance(f, (int, float)) or math.isnan(m) or math.isnan(f):
        return None
    if metric == "sqnr_db":
        if math.isinf(f) and math.isinf(m):
            return 0.0
        return f - m
    if metric == "cosine":
        em, ef = 1.0 - m, 1.0 - f
        return _ratio_db(em, ef, 10.0)
    return _ratio_db(float(m), float(f), 20.0)


def _ratio_db(a: float, b: float, k: float) -> float:
    if a <= 0:
        return 0.0 if b <= 0 else -math.inf
    if b <= 0:
        return math.inf
    return k * math.log10(a / b)


def tensor_formats(model: onnx.ModelProto, types: dict[str, int], candidates: list[str]) -> dict[str, NumberFormat]:
    """Candidate tensor -> the format the candidate holds it in (float16/bfloat16 tensors; float32 tensors cast
    from them, as FP16 models with float32 outputs end; DequantizeLinear outputs with constant scales).
    ``types``: candidate tensor -> ONNX element type."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    inits = {t.name: t for t in model.graph.initializer}
    consts = {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" and n.output
              for a in n.attribute if a.name == "value"}
    out: dict[str, NumberFormat] = {}
    for name in candidates:
        fmt = _format_of(name, producer, inits, consts, types, depth=0)
        if fmt is not None:
            out[name] = fmt
    return out


def _format_of(name, producer, inits, consts, types, depth) -> NumberFormat | None:
    et = types.get(name, 0)
    if et == TensorProto.FLOAT16:
        return NumberFormat("fp16")
    if et == TensorProto.BFLOAT16:
        return NumberFormat("bf16")
    node = producer.get(name)
    if node is None or depth > 4:
        return None
    if node.op_type == "DequantizeLinear":
        return _dq_format(node, inits, consts, types)
    if node.op_type in ("Cast", "Identity") and node.input:  # a narrow value widened for the graph's output
        src = node.input[0]
        if node.op_type == "Cast" and types.get(src, 0) not in (TensorProto.FLOAT16, TensorProto.BFLOAT16) and \
                (producer.get(src) is None or producer[src].op_type != "DequantizeLinear"):
            return None
        return _format_of(src, producer, inits, consts, types, depth + 1)
    return None


def _tensor_of(node, i, inits, consts) -> TensorProto | None:
    if len(node.input) <= i or not node.input[i]:
        return None
    return inits.get(node.input[i]) if node.input[i] in inits else consts.get(node.input[i])


def _dq_format(node, inits, consts, types) -> NumberFormat | None:
    from ..model.mapped import tensor_array

    def value(i):
        t = _tensor_of(node, i, inits, consts)
        return None if t is None else tensor_array(t).astype(np.float64)  # weights left in files: mapped

    scale, zp = value(1), value(2)
    if scale is None:
        return None
    qtype = types.get(node.input[0], 0)
    zp_tensor = _tensor_of(node, 2, inits, consts)
    if zp_tensor is not None:
        qtype = zp_tensor.data_type
    if qtype not in _QUANT_NAMES:
        return None
    name = _QUANT_NAMES[qtype]
    if name in _FP8:
        zp = None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) if scale.size > 1 else None
    return NumberFormat(name, scale.astype(np.float64), None if zp is None else zp.astype(np.float64), axis)


@dataclass
class Floors:
    """Per reference tensor: its floor accumulated over feeds."""

    formats: dict[str, NumberFormat] = field(default_factory=dict)  # reference tensor -> format
    stats: dict[str, FloorStats] = field(default_factory=dict)

    def add(self, tensor: str, ref: np.ndarray) -> None:
        fmt = self.formats.get(tensor)
        if fmt is not None:
            self.stats.setdefault(tensor, FloorStats()).add(ref, fmt)
