"""Linear-time stand-ins for two helpers of ONNX Runtime's static quantizer, used while it runs.

ONNX Runtime's QDQ quantizer renames a tensor's readers by visiting every node of the graph for each tensor it
quantizes (``ONNXModel.replace_input_of_all_nodes``: a Python call per node and tensor, O(nodes x tensors)), and
finds initializers by building a list of every initializer with the wanted name (``find_by_name``, called a few
thousand times). On a PP-OCRv4 recognizer (573 nodes, 390 activation pairs) the two took ~0.4 s of its ~1.6 s.
:func:`linear_helpers` swaps in versions that do the same in one pass: the renaming skips the per-node call where
the node does not read the tensor (a membership test in C), the lookup returns the first match without building a
list. The quantized model is byte-identical (``tests/test_quantizer_speed.py``). Where the installed ONNX Runtime
lacks either helper, it runs unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading

log = logging.getLogger(__name__)

#: the quantizer's modules that bind ``find_by_name`` by name (``from .quant_utils import find_by_name``)
_FINDERS = ("quant_utils", "base_quantizer", "onnx_model", "onnx_quantizer", "qdq_quantizer")
_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: list[tuple[object, str, object]] = []


def find_by_name(item_name, item_list):
    """The first item of ``item_list`` named ``item_name``, or None (ORT's ``find_by_name``, one pass)."""
    for item in item_list:
        if item.name == item_name:
            return item
    return None


def _replacing(replace_one, attribute: str):
    """ORT's ``ONNXModel.replace_{input,output}_of_all_nodes``, calling ``replace_one`` only on the nodes that
    hold the old name."""

    def replace_all(self, old_name, new_name):
        assert isinstance(old_name, str) and isinstance(new_name, str)
        for node in self.model.graph.node:
            if old_name in getattr(node, attribute):
                replace_one(node, old_name, new_name)

    return replace_all


def _patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for the helpers this ONNX Runtime has."""
    out = []
    try:
        onnx_model = importlib.import_module("onnxruntime.quantization.onnx_model")
    except ImportError:
        return out
    model_cls = getattr(onnx_model, "ONNXModel", None)
    for kind in ("input", "output"):
        one = getattr(model_cls, f"replace_node_{kind}", None)
        if callable(one) and callable(getattr(model_cls, f"replace_{kind}_of_all_nodes", None)):
            out.append((model_cls, f"replace_{kind}_of_all_nodes", _replacing(one, kind)))
    for name in _FINDERS:
        try:
            module = importlib.import_module(f"onnxruntime.quantization.{name}")
        except ImportError:
            continue
        if callable(getattr(module, "find_by_name", None)):
            out.append((module, "find_by_name", find_by_name))
    return out


@contextlib.contextmanager
def linear_helpers():
    """While the block runs, ONNX Runtime's quantizer uses the one-pass helpers (module docstring); nested and
    concurrent blocks share one swap, undone when the last one ends."""
    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            for owner, attribute, replacement in _patches():
                _SAVED.append((owner, attribute, owner.__dict__[attribute]))
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
