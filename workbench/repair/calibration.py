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
    """(model, calibration feeds): the model loaded once where the feeds needed it, and feeds that
    ``make_variant`` accepts."""
    from ..calibrate.feeds import is_dataset
    from ..model.load import LoadedModel, is_torch_module, load_model

    if calibration is None:
        return model, None
    if isinstance(calibration, bool):
        raise RepairError(f"calibration must be a count, a path or feeds, not {calibration!r}")
    if isinstance(calibration, int):
        if calibration < 1:
            raise RepairError(f"calibration needs at least one feed, not {calibration}",
                              "give N >= 1, a file or a folder")
        from ..inputs.generate import random_feeds

        loaded = model if isinstance(model, LoadedModel) else load_model(
            model, example_inputs=options.get("example_inputs"))
        feeds = random_feeds(loaded.proto, seed=int(options.get("seed") or 0) + 1, count=calibration,
                             shapes=options.get("input_shapes"), ranges=options.get("val_ranges"))
        return (model if is_torch_module(model) else loaded), feeds
    if is_dataset(calibration, preprocess):
        from .api import _dataset_feeds

        model, _, feeds = _dataset_feeds(model, calibration, preprocess, options, check)
        return model, feeds
    return model, calibration
