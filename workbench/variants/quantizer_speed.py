"""Faster stand-ins for helpers of ONNX Runtime's static quantizer, swapped in while it runs (:func:`fast_quantizer`).

ONNX Runtime's QDQ quantizer renames a tensor's readers by visiting every node of the graph for each tensor it
quantizes (``ONNXModel.replace_input_of_all_nodes``: a Python call per node and tensor, O(nodes x tensors)), finds
initializers by building a list of every initializer with the wanted name (``find_by_name``, called a few thousand
times, mostly to learn that a new initializer's name is free), and computes symmetric per-channel INT8 weight
scales, and quantizes those weights, one channel at a time (a dozen numpy calls per channel). On a PP-OCRv5
recognizer these took 1.3 of the 1.9 s of ORT's placement's quantization. The stand-ins: the renaming and the
lookups answer from an index of the graph's nodes (by the names they read, and write) and initializers (by name)
that follows the fields as the quantizer appends to them, and starts over when anything else may have changed them
(:class:`_Index`: a removal, an insertion, a node edited through ORT's own one-node helpers); and for the weights ORT's
own code would take the plain per-channel path for (INT8, no overrides, no reduced range or minimum range, finite
float32 values) :func:`per_channel_int8` does the same arithmetic on every channel at once; any other weight goes
through ORT's own code. The quantized model is byte-identical (``tests/test_quantizer_speed.py``, with every indexed
answer checked against a full scan; 7 real models x both placements x per-channel on/off checked when this was
written). Where the installed ONNX Runtime lacks a helper, it runs unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading

import numpy as np
import onnx

log = logging.getLogger(__name__)

#: the quantizer's modules that bind ``find_by_name`` by name (``from .quant_utils import find_by_name``)
_FINDERS = ("quant_utils", "base_quantizer", "onnx_model", "onnx_quantizer", "qdq_quantizer")
_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: list[tuple[object, str, object]] = []


class _Index:
    """The items of one protobuf repeated field by key (``keys(item)``: an item's name, or the tensor names a node
    reads or writes), kept in step with the field while the quantizer runs. ORT's quantizer only appends to the
    fields it indexes here (nodes, initializers) and renames node inputs and outputs through the helpers this module
    swaps; :meth:`sync` indexes what was appended since, and starts over when anything else may have changed the
    field: fewer items, a first or last indexed item that is no longer where it was (a removal, an insertion, a
    cleared field), or an edit through a helper this module does not see (``stamp``: :data:`_EDITS` where that
    matters)."""

    __slots__ = ("field", "keys", "count", "first", "last", "stamp", "map")

    def __init__(self, field, keys):
        self.field, self.keys = field, keys
        self.count, self.first, self.last, self.stamp, self.map = 0, None, None, None, {}

    def sync(self, stamp=None) -> dict:
        """The index, brought up to date."""
        self.unseen(stamp)
        return self.map

    def unseen(self, stamp=None) -> list:
        """The items the index had not seen (every item when it starts over), now indexed."""
        field, count = self.field, self.count
        size = len(field)
        if stamp != self.stamp or size < count or (count and (field[0] is not self.first
                                                              or field[count - 1] is not self.last)):
            self.map, count, self.stamp = {}, 0, stamp
        new = field[count:]
        for item in new:
            for key in self.keys(item):
                self.add(key, item)
        self.count = size
        self.first, self.last = (field[0], field[size - 1]) if size else (None, None)
        return new

    def add(self, key, item) -> None:
        """``item`` under ``key`` (once, though it holds the key twice)."""
        found = self.map.setdefault(key, [])
        if not found or found[-1] is not item:
            found.append(item)


#: the type of a repeated message field (a graph's nodes, initializers)
_REPEATED = type(onnx.GraphProto().node)
_INDEXES: dict[tuple[int, str], _Index] = {}
#: bumped by every node edit made outside :func:`_replacing`'s renaming (ORT's ``replace_node_input``/
#: ``replace_node_output`` called directly, ``remove_node``): the reader/writer indexes start over
_EDITS = [0]
#: when True, every indexed answer is checked against a full scan (tests)
CHECK = False


#: what each index keys its items by
_KEYS = {"name": lambda item: (item.name,), "input": lambda node: node.input, "output": lambda node: node.output,
         "checked": lambda item: ()}


def _index(field, kind: str) -> _Index:
    """The index of ``field`` by ``kind`` (a key of :data:`_KEYS`), made on first use."""
    key = (id(field), kind)
    found = _INDEXES.get(key)
    if found is None or found.field is not field:
        found = _INDEXES[key] = _Index(field, _KEYS[kind])
    return found


def find_by_name(item_name, item_list):
    """The first item of ``item_list`` named ``item_name``, or None (ORT's ``find_by_name``): looked up in an index
    of the field (:class:`_Index`) for a protobuf repeated field, one pass over anything else."""
    if type(item_list) is not _REPEATED:  # a list (or any iterable): one pass
        return next((item for item in item_list if item.name == item_name), None)
    found = _index(item_list, "name").sync().get(item_name)
    item = found[0] if found else None
    if CHECK:
        assert item is next((i for i in item_list if i.name == item_name), None), item_name
    return item


def _extending(original):
    """ORT's ``ONNXModel.initializer_extend``, which checks every initializer already in the graph before adding
    (``_check_init``: a NaN in an FP8 initializer) on each call: here only those added since the last call (all of
    them after anything but appends changed the field), then the new ones, as ORT's does."""

    def initializer_extend(self, inits):
        if len(inits) == 0:
            return original(self, inits)  # ORT's own error
        field = self.model.graph.initializer
        for init in _index(field, "checked").unseen():
            self._check_init(init, "gain")
        for init in inits:
            self._check_init(init)
            field.append(init)

    return initializer_extend


def _get_initializer(self, name):
    """ORT's ``ONNXModel.get_initializer``: the first initializer named ``name``, or None."""
    return find_by_name(name, self.model.graph.initializer)


def _replacing(replace_one, attribute: str):
    """ORT's ``ONNXModel.replace_{input,output}_of_all_nodes``, calling ``replace_one`` on the nodes that hold the
    old name, found in an index of the graph's nodes by the names they read (write) instead of visiting every node."""

    def replace_all(self, old_name, new_name):
        assert isinstance(old_name, str) and isinstance(new_name, str)
        nodes = self.model.graph.node
        index = _index(nodes, attribute)
        holders = [n for n in index.sync(_EDITS[0]).pop(old_name, ()) if old_name in getattr(n, attribute)]
        if CHECK:
            expected = [n for n in nodes if old_name in getattr(n, attribute)]
            assert len(holders) == len(expected) and all(a is b for a, b in zip(holders, expected)), old_name
        for node in holders:
            replace_one(node, old_name, new_name)
            index.add(new_name, node)

    return replace_all


def _counted(function):
    """``function`` (an edit of a node the indexes do not follow), bumping :data:`_EDITS` first."""

    def edit(*args, **kwargs):
        _EDITS[0] += 1
        return function(*args, **kwargs)

    return edit


def per_channel_int8(data: np.ndarray, axis: int, qmin: np.ndarray, qmax: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(zero points, scales) of symmetric INT8 quantization of each slice of ``data`` along ``axis``, as ORT's
    ``compute_scale_zp(symmetric=True)`` computes them slice by slice: the range widened to include 0 and made
    symmetric, scale = (2 * absmax, in float64) / (qmax - qmin), stored as float32; 1.0 where it is below float32's
    smallest normal; the zero point round((qmin + qmax) / 2)."""
    moved = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)
    rmin = np.minimum(moved.min(axis=1), np.array(0, dtype=data.dtype))
    rmax = np.maximum(moved.max(axis=1), np.array(0, dtype=data.dtype))
    absmax = np.maximum(np.abs(rmin), np.abs(rmax))
    scale = (absmax.astype(np.float64) - (-absmax).astype(np.float64)) / (
        np.array(qmax, dtype=np.float64) - np.array(qmin, dtype=np.float64))
    stored = scale.astype(data.dtype)
    stored[scale < np.finfo(data.dtype).tiny] = 1.0
    zero = np.array(np.round((qmin + qmax) / np.array(2.0, dtype=np.float64)), dtype=qmin.dtype)
    return np.full(len(stored), zero, dtype=qmin.dtype), stored


def _plain_int8(data: np.ndarray) -> bool:
    """Weights ORT's own per-channel path quantizes without a special case: finite float32, no empty slice."""
    return data.dtype == np.float32 and data.size > 0 and bool(np.isfinite(data).all())


def _fast_initializer_params(original, qdq):
    """``QDQQuantizer._calc_initializer_quant_params`` with the plain per-channel INT8 weights (:func:`_plain_int8`,
    no overrides, no block size, reduced range or minimum range) computed by :func:`per_channel_int8`; the others,
    and the order of the result, as ORT's own."""
    from onnx import TensorProto

    weight_kind = qdq.QDQQuantTensorType.WEIGHT

    def calc(self):
        try:
            todo, overrides = self.tensors_to_quantize, self.tensor_quant_overrides
            plain = (self.weight_qType == TensorProto.INT8 and not self.reduce_range and self.min_real_range is None
                     and not getattr(self, "block_size", 0))
        except AttributeError:  # another ONNX Runtime's quantizer
            plain = False
        if not plain:
            return original(self)
        inits = {i.name: i for i in self.model.initializer()}
        qmin, qmax = qdq.get_qmin_qmax_for_qType(TensorProto.INT8, False, symmetric=True)
        fast = {}
        for name, info in todo.items():
            init = inits.get(name)
            if (init is None or info.tensor_type is not weight_kind or info.axis is None
                    or name in overrides):
                continue
            data = qdq.tensor_proto_to_array(init)
            valid, axis = qdq.normalize_axis(info.axis, data.ndim)
            if valid and _plain_int8(data):
                zero, scale = per_channel_int8(data, axis, qmin, qmax)
                fast[name] = qdq.QuantizationParams(zero_point=zero, scale=scale, quant_type=TensorProto.INT8,
                                                    axis=axis)
        if not fast:
            return original(self)
        try:
            self.tensors_to_quantize = {k: v for k, v in todo.items() if k not in fast}
            rest = original(self)
        finally:
            self.tensors_to_quantize = todo
        return {k: fast[k] if k in fast else rest[k] for k in todo if k in fast or k in rest}

    return calc


def _per_channel(values, dtype, count: int) -> bool:
    return isinstance(values, np.ndarray) and values.dtype == dtype and values.shape == (count,)


def _fast_quantize_initializer(original, suffix: str):
    """ORT's ``quantize_onnx_initializer`` with plain per-channel INT8 weights quantized on every channel at once
    (the same float32 division by the channel's scale, rounding half to even, zero point added, clipped to
    [-128, 127]); anything else by ORT's own."""
    import onnx
    from onnx import TensorProto

    def quantize(weight, quant_type, zero_point, scale, axis=None, quant_weight_name=None, block_size=0):
        per_channel = (quant_type == TensorProto.INT8 and axis is not None and not block_size
                       and weight.data_type == TensorProto.FLOAT)
        data = onnx.numpy_helper.to_array(weight) if per_channel else None
        if (data is None or not _plain_int8(data) or not _per_channel(scale, np.float32, data.shape[axis])
                or not _per_channel(zero_point, np.int8, data.shape[axis])):
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        shape = [1] * data.ndim
        shape[axis] = data.shape[axis]
        values = np.asarray((data / scale.reshape(shape)).round() + zero_point.reshape(shape))
        np.clip(values, -128, 127, out=values)
        name = quant_weight_name if quant_weight_name else f"{weight.name}{suffix}"
        return onnx.numpy_helper.from_array(values.astype(np.int8).reshape(weight.dims), name)

    return quantize


def _quant_suffix() -> str:
    """The suffix ORT's ``quantize_onnx_initializer`` names a quantized weight with by default."""
    utils = importlib.import_module("onnxruntime.quantization.quant_utils")
    return getattr(utils, "TENSOR_NAME_QUANT_SUFFIX", "_quantized")


def _patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for the helpers this ONNX Runtime has."""
    out = []
    try:
        onnx_model = importlib.import_module("onnxruntime.quantization.onnx_model")
    except ImportError:
        return out
    model_cls = getattr(onnx_model, "ONNXModel", None)
    renaming = all(callable(getattr(model_cls, f"replace_{kind}_of_all_nodes", None))
                   and isinstance(vars(model_cls).get(f"replace_node_{kind}"), staticmethod)
                   for kind in ("input", "output")) and callable(getattr(model_cls, "remove_node", None))
    if renaming:
        for kind in ("input", "output"):
            one = getattr(model_cls, f"replace_node_{kind}")
            out.append((model_cls, f"replace_{kind}_of_all_nodes", _replacing(one, kind)))
            out.append((model_cls, f"replace_node_{kind}", staticmethod(_counted(one))))
        out.append((model_cls, "remove_node", _counted(vars(model_cls)["remove_node"])))
    if callable(getattr(model_cls, "get_initializer", None)):
        out.append((model_cls, "get_initializer", _get_initializer))
    if model_cls is not None and callable(vars(model_cls).get("initializer_extend")) \
            and callable(getattr(model_cls, "_check_init", None)):
        out.append((model_cls, "initializer_extend", _extending(vars(model_cls)["initializer_extend"])))
    try:
        qdq = importlib.import_module("onnxruntime.quantization.qdq_quantizer")
    except ImportError:
        qdq = None
    needed = ("QDQQuantizer", "QDQQuantTensorType", "QuantizationParams", "tensor_proto_to_array", "normalize_axis",
              "get_qmin_qmax_for_qType", "quantize_onnx_initializer")
    if qdq is not None and all(hasattr(qdq, n) for n in needed) \
            and callable(getattr(qdq.QDQQuantizer, "_calc_initializer_quant_params", None)):
        out.append((qdq.QDQQuantizer, "_calc_initializer_quant_params",
                    _fast_initializer_params(qdq.QDQQuantizer.__dict__["_calc_initializer_quant_params"], qdq)))
        out.append((qdq, "quantize_onnx_initializer",
                    _fast_quantize_initializer(qdq.quantize_onnx_initializer, _quant_suffix())))
    for name in _FINDERS:
        try:
            module = importlib.import_module(f"onnxruntime.quantization.{name}")
        except ImportError:
            continue
        if callable(getattr(module, "find_by_name", None)):
            out.append((module, "find_by_name", find_by_name))
    return out


@contextlib.contextmanager
def fast_quantizer():
    """While the block runs, ONNX Runtime's quantizer uses the faster helpers (module docstring); nested and
    concurrent blocks share one swap, undone when the last one ends."""
    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            for owner, attribute, replacement in _patches():
                if attribute in vars(owner):  # defined there (not inherited): put back as it was
                    _SAVED.append((owner, attribute, vars(owner)[attribute]))
                    setattr(owner, attribute, replacement)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                while _SAVED:
                    owner, attribute, original = _SAVED.pop()
                    setattr(owner, attribute, original)
                _INDEXES.clear()  # they hold the quantized graphs' fields
