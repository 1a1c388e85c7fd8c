"""Typed, JSON-round-tripping options of a comparison: one object that compare(), bundles, rerun, the layer
probe and repair all read, instead of keyword dicts translated by hand at each step."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..errors import WorkbenchError

MODES = ("auto", "all", "bisect")
#: "all": every tensor both sides have; "fused": only the candidate engine's fused-group boundaries
GRANULARITIES = ("all", "fused")


@dataclass(frozen=True)
class CompareOptions:
    """How to compare. Every field is JSON-ready except ``calibration_feeds`` (arrays or a path, recorded by
    bundles as files) and ``engine_options`` values that hold Python objects (never recorded).

    ``criterion``: text (``"sqnr_db<30"``) or None for the default of the lossier side's inferred precision.
    ``fail_on_internal_dips``: count internal tensors under the criterion as a divergence (for CI gates).
    ``impact``: how many top culprits get their impact on the outputs measured (0: none).
    ``granularity``: "all" compares every tensor; "fused" only those the candidate engine's own graph holds (its
    fused-group boundaries, see :mod:`workbench.engine_graphs.granularity`), so marking them leaves fusion alone.
    """

    mode: str = "auto"
    criterion: Any = None  # "sqnr_db<30", a Criterion, or None (the default of the inferred precision)
    memory_budget: str | int | None = None
    seed: int = 0
    feed_count: int = 1
    input_shapes: dict[str, list[int]] | None = None
    val_ranges: dict[str, tuple[float, float]] | None = None
    keep_fp32: tuple[str, ...] = ()
    inline_branches: bool = True
    culprits: bool = True
    max_culprits: int = 10
    impact: int = 5
    fail_on_internal_dips: bool = False
    isolate: bool | None = None
    timeout_s: float | None = None
    engine_options: dict[str, dict] = field(default_factory=dict)
    granularity: str = "all"
    stream: str = "auto"  # "auto" | "on" | "off": segment streaming (workbench.compare.stream)
    segment_size: str | int | None = None  # most weights per streamed segment (default: an eighth of the budget)
    calibration_feeds: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise WorkbenchError(f"unknown mode {self.mode!r}", f"use one of {', '.join(MODES)}")
        if self.stream not in ("auto", "on", "off"):
            raise WorkbenchError(f"unknown stream setting {self.stream!r}", "use auto, on or off")
        if self.granularity not in GRANULARITIES:
            raise WorkbenchError(f"unknown granularity {self.granularity!r}", f"use one of {', '.join(GRANULARITIES)}")
        for name, lo in (("feed_count", 1), ("max_culprits", 0), ("impact", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise WorkbenchError(f"{name} must be a whole number >= {lo}, not {value!r}")
        if self.timeout_s is not None and (not isinstance(self.timeout_s, (int, float)) or
                                           not math.isfinite(self.timeout_s) or self.timeout_s <= 0):
            raise WorkbenchError(f"timeout must be a positive number of seconds, not {self.timeout_s!r}")
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32 or ()))
        object.__setattr__(self, "engine_options", dict(self.engine_options or {}))

    @classmethod
    def build(cls, options: CompareOptions | dict | None = None, **overrides: Any) -> CompareOptions:
        """Options from an instance or dict, with keyword overrides (None values are ignored)."""
        base = options if isinstance(options, CompareOptions) else cls(**(options or {}))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown comparison option(s): {', '.join(unknown)}")
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(base, **given) if given else base

    def replace(self, **changes: Any) -> CompareOptions:
        return replace(self, **changes)

    def to_json(self) -> dict:
        """JSON-ready options (calibration feeds and non-JSON engine options are left out)."""
        import json

        doc = {k: v for k, v in asdict(self).items() if k not in ("calibration_feeds", "engine_options")}
        doc["keep_fp32"] = list(self.keep_fp32)
        if self.criterion is not None and not isinstance(self.criterion, str):
            doc["criterion"] = self.criterion.text()
        if self.val_ranges:
            doc["val_ranges"] = {k: list(v) for k, v in self.val_ranges.items()}
        try:
            json.dumps(self.engine_options, allow_nan=False)
            doc["engine_options"] = self.engine_options
        except (TypeError, ValueError):
            doc["engine_options"] = {}
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> CompareOptions:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in doc.items() if k in known}
        if kwargs.get("val_ranges"):
            kwargs["val_ranges"] = {k: tuple(v) for k, v in kwargs["val_ranges"].items()}
        kwargs["keep_fp32"] = tuple(kwargs.get("keep_fp32") or ())
        return cls(**kwargs)
