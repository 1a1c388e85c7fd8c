"""Calibration caches and tables: TensorRT's calibration cache (read/write, bit-exact) and ONNX Runtime's
calibration table (written through ORT's own writer; calibration.json read back).

TensorRT cache (TensorRT <= 10, implicit INT8): the first line is ``TRT-<version>-<Algorithm>`` (e.g.
``TRT-100300-EntropyCalibration2``), then one ``name: xxxxxxxx`` line per tensor, the 8 hex digits being the
big-endian IEEE-754 float32 bits of scale = amax / 127 (``3c010204`` is 1/127: amax 1.0). Scales are kept as
float32 bit patterns, so write -> read -> write gives identical bytes. Reading is tolerant: blank lines, CRLF,
upper-case hex, TensorRT-internal names ("(Unnamed Layer* 22) [Constant]_output") and names holding ': '
(a line splits at its LAST ': ' followed by 8 hex digits; ORT's TensorRT EP splits at the FIRST ':', so it
misreads such names).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._atomic import atomic_write_bytes
from .._files import open_regular, read_capped, read_json
from .exceptions import CacheFormatError, CalibrationError

log = logging.getLogger(__name__)

#: TensorRT calibrator algorithm names by our method. Only max and entropy are TensorRT's own rules; the others
#: have no TensorRT calibrator: their caches are headed for IInt8EntropyCalibrator2, the calibrator that usually
#: serves a cache (TensorRT reads a cache only when its header names the calibrator's algorithm)
TRT_ALGORITHMS = {"max": "MinMaxCalibration", "entropy": "EntropyCalibration2", "percentile": "EntropyCalibration2",
                  "mse": "EntropyCalibration2", "ort-entropy": "EntropyCalibration2",
                  "ort-percentile": "EntropyCalibration2"}
DEFAULT_TRT_VERSION = 100300
_HEADER = re.compile(r"^TRT-(\d+)-([A-Za-z0-9_]+)$")
_LINE = re.compile(r"^(.*): ?([0-9A-Fa-f]{8})$")


def scale_bits(amax: float) -> int:
    """float32 bits of scale = amax / 127 (computed in float64, rounded once to float32)."""
    return struct.unpack(">I", struct.pack(">f", np.float32(float(amax) / 127.0)))[0]


def bits_to_scale(bits: int) -> float:
    return float(struct.unpack(">f", struct.pack(">I", int(bits)))[0])


@dataclass
class TrtCache:
    """A TensorRT calibration cache: header fields and float32 scale bits by tensor name (file order)."""

    version: int
    algorithm: str
    bits: dict[str, int] = field(default_factory=dict)

    @property
    def scales(self) -> dict[str, float]:
        return {name: bits_to_scale(b) for name, b in self.bits.items()}

    @property
    def amax(self) -> dict[str, float]:
        """scale * 127 (exact in float64, so float32(amax / 127) gives the scale back bit for bit)."""
        return {name: s * 127.0 for name, s in self.scales.items()}

    @classmethod
    def from_amax(cls, amax: dict[str, float], algorithm: str, version: int = DEFAULT_TRT_VERSION) -> TrtCache:
        return cls(int(version), algorithm, {name: scale_bits(a) for name, a in amax.items()})

    def to_bytes(self) -> bytes:
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.algorithm):
            raise CacheFormatError(f"invalid TensorRT calibrator algorithm name {self.algorithm!r}",
                                   "use e.g. EntropyCalibration2 or MinMaxCalibration")
        lines = [f"TRT-{int(self.version)}-{self.algorithm}"]
        for name, b in self.bits.items():
            if "\n" in name or "\r" in name:
                raise CacheFormatError(f"tensor name {name!r} holds a line break", "rename the tensor")
            lines.append(f"{name}: {int(b):08x}")
        return ("\n".join(lines) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "the cache") -> TrtCache:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CacheFormatError(f"{source} is not a text file") from None
        lines = [ln.rstrip("\r") for ln in text.split("\n")]
        body = [(i, ln) for i, ln in enumerate(lines, 1) if ln.strip()]
        if not body:
            raise CacheFormatError(f"{source} is empty")
        header = _HEADER.match(body[0][1].strip())
        if not header:
            raise CacheFormatError(f"{source} does not start with a TRT-<version>-<Algorithm> line "
                                   f"(found {body[0][1][:60]!r})")
        cache = cls(int(header.group(1)), header.group(2))
        for number, line in body[1:]:
            match = _LINE.match(line)
            if not match:
                raise CacheFormatError(f"{source} line {number} is not 'name: 8 hex digits' ({line[:80]!r})")
            name, bits = match.group(1), int(match.group(2), 16)
            if name in cache.bits:
                raise CacheFormatError(f"{source} line {number}: tensor {name!r} appears a second time",
                                       "keep one line per tensor")
            cache.bits[name] = bits
        return cache


def write_trt_cache(path: str | os.PathLike, cache: TrtCache) -> Path:
    """Write ``cache`` to ``path`` atomically."""
    data = cache.to_bytes()
    try:
        return atomic_write_bytes(path, data)
    except OSError as e:
        raise CalibrationError(f"cannot write {path}: {e.strerror or e}", "check the folder's permissions") from None


def read_trt_cache(path: str | os.PathLike) -> TrtCache:
    p = Path(path)
    return TrtCache.from_bytes(read_capped(p, None, "calibration cache", CacheFormatError, kind="calibration"), str(p))


def write_ort_table(dest: str | os.PathLike, amax: dict[str, float | tuple[float, float]],
                    calibration_method: str = "MinMax") -> list[Path]:
    """ONNX Runtime's calibration table for ``amax`` (an amax: range -amax..amax, or a (lowest, highest)
    pair): calibration.json and .cache (and .flatbuffers, which onnxruntime writes only where the ``flatbuffers``
    package is installed) written by ``onnxruntime.quantization.quant_utils.write_calibration_table`` into a
    temporary folder, then moved into the folder ``dest`` (created if needed). ORT's .cache is NOT TensorRT's
    format. calibration.json is ORT's TensorsData form, labelled ``calibration_method`` (a CalibrationMethod
    name): ``quantize_static(..., calibrate_method=CalibrationMethod.<it>, calibration_cache_path=...)`` loads it
    and runs no calibrator."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.quant_utils import write_calibration_table

    folder = Path(dest)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CalibrationError(f"cannot create {folder}: {e.strerror or e}", "check the path and permissions") from None
    pairs = {name: (a if isinstance(a, tuple) else (-a, a)) for name, a in amax.items()}
    table = {name: TensorData(lowest=np.array(lo, np.float32), highest=np.array(hi, np.float32))
             for name, (lo, hi) in pairs.items()}
    written = []
    from .._atomic import staged, temp_prefix

    with staged(tempfile.mkdtemp(prefix=temp_prefix("calibration-table"), suffix=".tmp", dir=folder)) as tmp:
        write_calibration_table(TensorsData(CalibrationMethod[calibration_method], table), dir=tmp)
        for name in sorted(os.listdir(tmp)):
            target = folder / name
            shutil.move(str(Path(tmp) / name), target)  # same file system: an atomic rename
            written.append(target)
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def read_ort_json(path: str | os.PathLike) -> dict[str, float]:
    """amax = max(|lowest|, |highest|) by tensor from ORT's calibration.json (write_calibration_table), a
    ``save_tensors_data`` file ({"CLS": "TensorsData", "data": ...}) or a plain {name: [lo, hi]} JSON."""
    p = Path(path)
    doc = read_json(p, "calibration table", CacheFormatError, kind="calibration")
    if isinstance(doc, dict) and doc.get("CLS") == "TensorsData":
        doc = doc.get("data", {})
    if not isinstance(doc, dict):
        raise CacheFormatError(f"{p} holds a {type(doc).__name__}, not a {{tensor: range}} object")
    out = {}
    for name, value in doc.items():
        try:
            lo, hi = _range(value)
        except (KeyError, TypeError, ValueError, IndexError):
            raise CacheFormatError(f"{p}: cannot read the range of tensor {name!r}") from None
        out[name] = max(abs(lo), abs(hi))
    return out


def _range(value) -> tuple[float, float]:
    if isinstance(value, dict):
        return _number(value["lowest"]), _number(value["highest"])
    lo, hi = value[0], value[1]
    return _number(lo), _number(hi)


def _number(value) -> float:
    if isinstance(value, dict):  # {"data": x, "dtype": "float32", "CLS": "numpy.array"}
        value = value["data"]
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


def sniff(path: str | os.PathLike) -> str:
    """"trt" (TensorRT cache) or "ort-json" (ORT calibration JSON), by content."""
    p = Path(path)
    with open_regular(p, "calibration cache", CacheFormatError) as fh:
        try:
            head = fh.read(4096)
        except OSError as e:
            raise CacheFormatError(f"cannot read {p}: {e.strerror or e}", "check the path") from None
    text = head.lstrip()
    if text.startswith(b"TRT-"):
        return "trt"
    if text.startswith(b"{"):
        return "ort-json"
    raise CacheFormatError(f"{p} is neither a TensorRT calibration cache nor an ORT calibration JSON")
