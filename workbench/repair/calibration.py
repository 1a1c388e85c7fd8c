"""INT8 calibration data for a repair from the FP32 model (``repair(..., candidate="ort:int8", calibration=...)``,
``workbench repair M.onnx --cand ort:int8 --calib FILE|DIR|N``): the variant is quantized on these feeds, the
repair judged on ``feeds``. ``calibration``: a whole number N (N seeded random feeds, seed + 1 so they differ from
random comparison feeds), a dataset (a folder of .npz, a folder of images with ``preprocess``, a generator, a
DataLoader: read into memory within the memory budget), or anything compare's ``calibration_feeds`` takes (an
.npz, a Polygraphy JSON, a dict or list of dicts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .graph import RepairError


def resolve(model: Any, calibration: Any, preprocess: Any, options: dict,
            check: Callable[[], None] = lambda: None) -> tuple[Any, Any]:
    """(model, calibration): the model loaded once where the feeds needed it, and what compare's
    ``calibration_feeds`` takes (feeds, or a count N that the comparison plan draws at seed + 1)."""
    from ..calibrate.feeds import is_dataset

    if calibration is None:
        return model, None
    if isinstance(calibration, bool):
        raise RepairError(f"calibration must be a count, a path or feeds, not {calibration!r}")
    if isinstance(calibration, int):
        if calibration < 1:
            raise RepairError(f"calibration needs at least one feed, not {calibration}",
                              "give N >= 1, a file or a folder")
        return model, calibration  # the comparison plan draws them (ComparisonPlan: seed + 1, its shapes)
    if is_dataset(calibration, preprocess):
        from .api import _dataset_feeds

        model, _, feeds = _dataset_feeds(model, calibration, preprocess, options, check)
        return model, feeds
    return model, calibration
