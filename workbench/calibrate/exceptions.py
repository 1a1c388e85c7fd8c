"""Errors raised by calibration: each is a :class:`~workbench.errors.WorkbenchError` (one line, exit code 2)."""

from __future__ import annotations

from ..errors import WorkbenchError


class CalibrationError(WorkbenchError):
    """Calibration cannot go on with what it was given (options, data, a report without a model)."""


class CacheFormatError(CalibrationError):
    """A calibration cache or table cannot be read."""

    default_hint = "pass a TensorRT calibration cache (first line TRT-<version>-<Algo>) or ORT's calibration.json"
