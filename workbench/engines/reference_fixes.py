"""Corrections to onnx's ReferenceEvaluator kernels, passed as ``new_ops`` until upstream releases fixes.

- BatchNormalization-9..13: onnx 1.23 picks training mode whenever ``momentum`` is set (it always is: the
  schema default is 0.9), so every exported model with BatchNormalization at opset 9-13 is normalised with
  batch statistics (PP-OCR's classifier: 17 dB SQNR against ONNX Runtime at the first BatchNormalization).
  The spec decides by the output count: one output is inference. Upstream: onnx/onnx PR #8442 (open).
- DequantizeLinear-10/13 and QuantizeLinear-13: onnx 1.23 has DequantizeLinear kernels from opset 19 only (and
  QuantizeLinear-10 without the per-axis scales of 13), so the Q/DQ models ONNX Runtime's ``quantize_static``
  writes (opset 13 and older) cannot run. Their integer semantics are the latest version's with its new attributes
  at their defaults, so that kernel runs every version.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops import op_batch_normalization as _bn
from onnx.reference.ops import op_dequantize_linear as _dq
from onnx.reference.ops import op_quantize_linear as _q


class BatchNormalization(OpRun):
    """Inference when the node has one output (or ``training_mode`` is 0); training statistics otherwise."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, **_ignored):
        eps = 1e-5 if epsilon is None else epsilon
        outputs = [o for o in self.onnx_node.output if o]
        if len(outputs) <= 1 or training_mode == 0:
            return (_bn._batchnorm_test_mode(x, scale, bias, mean, var, epsilon=eps),)
        result = _bn._batchnorm_training_mode(
            x, scale, bias, mean, var, momentum=0.9 if momentum is None else momentum, epsilon=eps
        )
        return tuple(np.asarray(r) for r in result[: len(self.onnx_node.output)])


def _latest(module, op_type: str) -> type:
    """onnx's newest ``op_type`` kernel in ``module``, named ``op_type`` (so that it runs every opset version)."""
    newest = max((getattr(module, n) for n in dir(module) if n.startswith(f"{op_type}_") and n[-1].isdigit()),
                 key=lambda cls: int(cls.__name__.rsplit("_", 1)[1]))
    return type(op_type, (newest,), {"op_domain": ""})


DequantizeLinear = _latest(_dq, "DequantizeLinear")
QuantizeLinear = _latest(_q, "QuantizeLinear")

NEW_OPS = [BatchNormalization, DequantizeLinear, QuantizeLinear]
