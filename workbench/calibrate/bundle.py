"""Calibration bundles: model, calibration and evaluation feeds, options and the report; a rerun collects again
and compares every threshold."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report.bundle import RESULTS, Bundle, BundleWriter
from ..report.env import diff_versions, package_versions
from ..report.safety import BundleError, confined, load_npz, read_json
from ..textfmt import safe_name
from .methods import METHODS
from .report import SCHEMA, CalibrationReport

OPTIONS = ("methods", "method", "percentile", "num_bins", "ort_entropy_bins", "seed", "memory_budget", "input_shapes")
#: thresholds that differ by more than this (relative) count as changed
RTOL = 1e-6


def save_calibration_bundle(report: CalibrationReport, dest: str | os.PathLike, *, model: Any = None,
                            zip: bool = False, copy_model: bool = True, overwrite: bool = False) -> Path:
    """Save ``report`` with its model, the exact calibration/evaluation feeds and options as a bundle that
    ``workbench rerun`` recollects. ``model`` defaults to the model the report was computed on. Data calibrate()
    streamed from a dataset is read again, one sample at a time, and written as it was checked (the rerun needs no
    preprocessing); a dataset that changed since calibrate() is refused."""
    if not report.used_feeds:
        raise BundleError("this calibration report keeps no feeds (read back from JSON?)",
                          "save the bundle right after calibrate(), in the same session")
    model = model if model is not None else report.source_model
    if model is None:
        raise BundleError("the model is unknown", "pass model= the .onnx file that was calibrated")
    path = getattr(model, "path", None)
    if path is not None and not Path(path).exists():  # moved since calibrate(): bundle the copy held in memory
        model = model.proto
    writer = BundleWriter(dest, kind="calibrate", zip=zip, overwrite=overwrite)
    try:
        m = writer.manifest
        m["model"] = writer.add_model("model", model, copy=copy_model, expected_sha=report.model.sha256)
        m["calibrate"] = {k: report.config.get(k) for k in OPTIONS}
        m["feeds"] = {"count": len(report.used_feeds), "files": writer.add_feeds("inputs", report.used_feeds),
                      **_source(report.used_feeds)}
        evals = report.used_eval_feeds
        m["eval_feeds"] = None if not evals else {"count": len(evals), "files": writer.add_feeds("eval_inputs", evals),
                                                  **_source(evals)}
        m["results"] = writer.add_json(RESULTS, report.to_json())
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


@dataclass
class CalibrationRerun:
    """A calibration recollected from a bundle, and every threshold that moved."""

    bundle: str
    saved: CalibrationReport
    report: CalibrationReport
    changes: list[dict]
    missing: list[str]
    versions_changed: dict[str, list]

    @property
    def reproduced(self) -> bool:
        return not self.changes and not self.missing

    @property
    def exit_code(self) -> int:
        """0: every threshold reproduced; 1: thresholds changed (listed)."""
        return 0 if self.reproduced else 1

    def to_json(self) -> dict:
        return {"schema": "workbench.rerun/1", "kind": "calibrate", "bundle": self.bundle,
                "reproduced": self.reproduced, "exit_code": self.exit_code, "changes": self.changes,
                "missing_tensors": self.missing, "versions_changed": self.versions_changed,
                "result": self.report.to_json()}

    def render(self, top: int = 10) -> str:
        n = sum(len(r) for r in self.report.ranges.values())
        lines = [f"rerun of {safe_name(self.bundle)} (calibration): "
                 + ("REPRODUCED" if self.reproduced else "NOT REPRODUCED")
                 + f" -- {n - len(self.changes)} of {n} thresholds identical"]
        for c in sorted(self.changes, key=lambda c: -c["relative_change"])[:top]:
            lines.append(f"  {c['method']:<10} {safe_name(c['tensor'])}: amax {c['saved']:.6g} -> {c['now']:.6g} "
                         f"({c['relative_change']:.2%})")
        if self.missing:
            lines.append(f"  tensors no longer calibrated: {', '.join(self.missing[:5])}")
        for pkg, (old, new) in self.versions_changed.items():
            lines.append(f"  version changed: {pkg} {old} -> {new}")
        return "\n".join(lines)


def _source(feeds) -> dict:
    """The dataset a stream of feeds came from (for the manifest), else nothing."""
    from .feeds import FeedStream

    if not isinstance(feeds, FeedStream):
        return {}
    return {"source": {**feeds.describe, "sha256": feeds.digest}}


def _feeds(b: Bundle, section: str):
    """The bundle's feeds of ``section`` as a dataset read one file at a time (None when the section is empty)."""
    from ..dataset.source import Dataset, Sample, hash_feed

    entry = b.manifest.get(section)
    if entry is None:
        return None
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, list) or not files:
        raise BundleError(f"{b.source.name}: manifest '{section}' lists no files")
    paths = [confined(b.root, f, f"manifest '{section}'") for f in files]

    def items():
        for i, (f, path) in enumerate(zip(files, paths)):
            feed = load_npz(path, f"{b.source.name}: {f}")
            yield Sample(i, str(f), feed, hash_feed(feed))

    return Dataset({"kind": "bundle", "bundle": b.source.name, "section": section, "count": len(files)}, items,
                   len(files))


def rerun_calibration(b: Bundle, *, model: str | os.PathLike | None = None) -> CalibrationRerun:
    """Collect the bundle's calibration again (sha256-checked model, same feeds and options); compare thresholds."""
    from .api import calibrate

    opts = b.manifest.get("calibrate")
    if not isinstance(opts, dict):
        raise BundleError(f"{b.source.name}: manifest has no 'calibrate' options")
    saved = CalibrationReport.from_json(read_json(confined(b.root, b.manifest.get("results", RESULTS), "results"),
                                                  f"{b.source.name}: results.json", schema=SCHEMA))
    loaded = b.load_model("model", model)
    report = calibrate(loaded, _feeds(b, "feeds"), eval_data=_feeds(b, "eval_feeds"),
                       methods=opts.get("methods") or METHODS, ort_entropy_bins=opts.get("ort_entropy_bins", 128),
                       method=opts.get("method"), percentile=opts.get("percentile"),
                       num_bins=opts.get("num_bins", 2048), memory_budget=opts.get("memory_budget"),
                       seed=opts.get("seed", 0), input_shapes=opts.get("input_shapes"))
    changes = []
    for method, ranges in saved.ranges.items():
        for tensor, before in ranges.items():
            now = report.ranges.get(method, {}).get(tensor)
            if now is None or before == now or (math.isnan(before) and math.isnan(now)):
                continue
            rel = abs(now - before) / max(abs(before), 1e-30)
            if rel > RTOL:
                changes.append({"method": method, "tensor": tensor, "saved": before, "now": now,
                                "relative_change": rel})
    missing = [t for t in saved.tensors if t not in report.tensors]
    versions = diff_versions(b.manifest.get("versions") or {}, package_versions())
    return CalibrationRerun(b.source.name, saved, report, changes, missing, versions)
