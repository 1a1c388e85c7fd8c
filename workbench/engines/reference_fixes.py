"""Corrections to onnx's ReferenceEvaluator kernels, passed as ``new_ops`` until upstream releases fixes.

- BatchNormalization-9..13: onnx 1.23 picks training mode whenever ``momentum`` is set (it always is: the
  schema default is 0.9), so every exported model with BatchNormalization at opset 9-13 is normalised with
  batch statistics (PP-OCR's classifier: 17 dB SQNR against ONNX Runtime at the first BatchNormalization).
  The spec decides by the output count: one output is inference. Upstream: onnx/onnx PR #8442 (open).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops import op_batch_normalization as _bn


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


NEW_OPS = [BatchNormalization]
