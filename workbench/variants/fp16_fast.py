"""The FP16 converters' clamp-and-cast rule, vectorised, with a record of whether it changed anything.

Both converters (onnxruntime.transformers.float16 and onnxconverter_common.float16) convert every float tensor
with ``convert_np_to_float16``: positive values strictly between 0 and ``min_positive_val`` become
``min_positive_val``, finite values beyond ``max_finite_val`` become ``max_finite_val`` (signs kept; 0, NaN and
inf unchanged), then ``np.float16``. Their implementation also scans each tensor six more times to log the
extremes, which costs seconds on a transformer. :func:`fast_converter` swaps in this equivalent (tests check it
bit for bit against the original) for the duration of one conversion and counts the tensors it changed, so the
clamp report needs to diff constants only when something was clamped.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import numpy as np


class ClampCounter:
    """How many tensors the conversion clamped (0: the clamp report has nothing to find)."""

    def __init__(self) -> None:
        self.clamped = 0

    def __call__(self, np_array, min_positive_val=5.96e-08, max_finite_val=65504.0):
        x = np.asarray(np_array)
        a = np.abs(x)
        small = (a > 0) & (a < min_positive_val)
        big = (a > max_finite_val) & np.isfinite(x)
        if small.any() or big.any():
            self.clamped += 1
            x = x.copy()
            x[small] = np.copysign(np.asarray(min_positive_val, dtype=x.dtype), x[small])
            x[big] = np.copysign(np.asarray(max_finite_val, dtype=x.dtype), x[big])
        return np.float16(x)


@contextlib.contextmanager
def fast_converter(module_name: str) -> Iterator[ClampCounter]:
    """Replace ``module_name.convert_np_to_float16`` with :class:`ClampCounter` while the block runs."""
    module = importlib.import_module(module_name)
    original = module.convert_np_to_float16
    counter = ClampCounter()
    module.convert_np_to_float16 = counter
    try:
        yield counter
    finally:
        module.convert_np_to_float16 = original
