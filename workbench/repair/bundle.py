"""A repair's evidence as a comparison bundle: the reference vs the saved repaired model, on the same feeds and
criterion, so that ``workbench rerun BUNDLE`` reproduces the verdict."""

from __future__ import annotations

import os
from pathlib import Path

from .graph import RepairError


def save_repair_bundle(result, dest: str | os.PathLike, *, zip: bool = False, overwrite: bool = False) -> Path:
    """Compare the reference with ``result``'s saved model (``--cand-model``) and save that as a bundle; the
    verdict lands in ``result.bundle``."""
    from ..compare.api import compare
    from ..report.bundle import save_bundle

    plan = result.plan
    if plan is None or result.model_path is None:
        raise RepairError("a repair bundle needs the repaired model saved", "pass out= (--out) as well")
    options = plan.options.replace(criterion=result.target.get("criterion"), keep_fp32=(), calibration_feeds=None)
    source = plan.model_source if plan.module is None else plan.original
    cmp = compare(source, str(plan.ref_spec), plan.cand_spec.engine, options, feeds=plan.feeds,
                  cand_model=result.model_path)
    path = save_bundle(cmp, dest=dest, zip=zip, overwrite=overwrite)
    result.bundle = {"path": str(path), "diverged": cmp.diverged, "verdict": cmp.verdict()["reason"]}
    return path
