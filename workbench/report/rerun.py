"""Rerun a bundle: the same model (sha256-checked), feeds, specs and options; then say what changed (at fused
granularity, also whether the candidate engine's fused groups changed)."""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from ..compare.result import CompareResult
from ..core import arguments
from ..textfmt import safe_name
from .bundle import Bundle, load_bundle
from .diff import ResultDiff, diff_results
from .engine_options import bundle_engine_options
from .env import diff_versions, package_versions
from .safety import BundleError

log = logging.getLogger(__name__)

SCHEMA = "workbench.rerun/1"
#: bundle kind -> "module:function" that reruns it (report/ names producers above it, never imports them)
RERUNNERS = {"calibrate": "workbench.calibrate.bundle:rerun_calibration",
             "dataset": "workbench.dataset.bundle:rerun_dataset"}


def _rerunner(kind: str):
    import importlib

    target = RERUNNERS.get(kind)
    if target is None:
        raise BundleError(f"bundles of kind {kind!r} cannot be rerun by this version",
                          f"known kinds: compare, {', '.join(RERUNNERS)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def check_engines(*specs: Any, allowed: Any = ()) -> None:
    """Refuse engine specs that name code (``package.module:Class``) unless the user allowed each by name: a
    tampered bundle must not make ``rerun`` import a module of its choosing."""
    from ..engines.registry import is_dotted_path

    allowed = {str(a).strip() for a in (allowed or ())}
    for spec in specs:
        text = str(spec or "").strip()
        if not is_dotted_path(text):
            continue
        base = ":".join(text.split(":")[:2])
        if text not in allowed and base not in allowed:
            raise BundleError(f"the bundle names the engine {text!r}, a class path: code that a bundle never imports "
                              "by itself", f"if you trust it, pass --allow-engine {base} "
                              f"(Python: rerun_bundle(..., allow_engines=[{base!r}]))")


@dataclass
class RerunReport:
    """The saved result, the new one, and what differs."""

    bundle: str
    saved: CompareResult
    result: CompareResult
    diff: ResultDiff
    versions_changed: dict[str, list]
    notes: list[str] = field(default_factory=list)  # e.g. engine options of the bundle that were not allowed
    #: at granularity "fused": whether the candidate engine's fused groups changed (see
    #: :func:`workbench.engine_graphs.diff.fusion_change`); None otherwise
    fusions: dict | None = None

    @property
    def reproduced(self) -> bool:
        """Same verdict, same first divergent tensor and same top culprit as the saved result."""
        return self.diff.same_conclusion

    @property
    def exit_code(self) -> int:
        """0: reproduced, and no divergence now; 1: a divergence now, or the saved answer not reproduced (a CI
        gate on ``rerun`` fails when the answer changed either way: :attr:`reproduced` and ``diverged`` say which),
        as a dataset or calibration bundle's rerun does."""
        return 1 if self.result.diverged or not self.reproduced else 0

    def to_json(self) -> dict:
        diff = self.diff.to_json()
        first = diff["first_divergent"]
        return {
            "schema": SCHEMA,
            "bundle": self.bundle,
            "reproduced": self.reproduced,
            "metrics_match": diff["metrics_match"],
            "diverged": self.result.diverged,
            "exit_code": self.exit_code,
            "first_divergent": {"saved": first["before"], "now": first["after"], "changed": first["changed"]},
            "versions_changed": self.versions_changed,
            "notes": list(self.notes),
            **({"fusions": self.fusions} if self.fusions is not None else {}),
            "diff": diff,
            "result": self.result.to_json(),
        }

    def render(self) -> str:
        d = self.diff
        head = (f"rerun of {safe_name(self.bundle)}: " + ("REPRODUCED" if self.reproduced else "NOT REPRODUCED")
                + (" (metrics identical)" if d.metrics_match() else " (metrics drifted)"))
        lines = [head, *(f"note: {safe_name(n)}" for n in self.notes)]
        versions = self.versions_changed
        lines.append("package versions since the bundle was made: " + (
            "; ".join(f"{k} {a or 'absent'} -> {b or 'absent'}" for k, (a, b) in versions.items())
            if versions else "unchanged"))
        if self.fusions is not None:
            from ..engine_graphs.diff import render_fusion_change

            lines.append(render_fusion_change(self.fusions))
        lines.append(d.render())
        return "\n".join(lines)


@arguments.checked(bundle=arguments.path(also=(Bundle,)))
def rerun_bundle(bundle: str | os.PathLike | Bundle, *, model: str | os.PathLike | None = None,
                 cand_model: str | os.PathLike | None = None, isolate: bool | None = None,
                 timeout_s: float | None = None, progress: Any = None, allow_engines: Any = (),
                 trust_unsealed: bool = False, weights: str | os.PathLike | None = None,
                 **dataset_args: Any) -> RerunReport:
    """Re-execute the comparison a bundle recorded and compare with its saved results (a calibration or dataset
    bundle gives its own rerun report).

    The model (and candidate model) must hash to the recorded sha256, else :class:`ModelMismatchError`.
    ``model``: the file to use for a bundle that keeps only a reference to its model. An engine the bundle names
    by class path (``package.module:Class``) is imported only when listed in ``allow_engines`` (a bundle never
    imports code by itself). A bundle whose manifest carries no seal is refused (:class:`UnsealedBundleError`)
    unless ``trust_unsealed``. ``dataset_args`` (dataset bundles): ``inputs``, ``preprocess``, ``metrics``,
    ``workers``, ``executor``. ``weights``: the folder holding weight files the bundle keeps by reference (else
    they are looked for beside the bundled graph and where the original model was)."""
    from ..compare.api import compare
    from ..compare.criterion import Criterion
    from ..compare.options import CompareOptions

    b = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, trust_unsealed=trust_unsealed)
    kind = b.manifest.get("kind", "compare")
    try:
        b.use_weights(weights)
        if kind != "compare":  # another producer's bundle (calibration, dataset): its own rerunner, by name
            given = {k: v for k, v in dataset_args.items() if v is not None}
            if kind == "dataset":
                section = b.manifest.get("dataset_compare") or {}
                check_engines(section.get("reference"), section.get("candidate"), allowed=allow_engines)
                return _rerunner(kind)(b, model=model, cand_model=cand_model, progress=progress, **given)
            if given:
                raise BundleError(f"{', '.join(sorted(given))} only apply to dataset bundles, and this is a "
                                  f"{kind} bundle", "drop those options")
            return _rerunner(kind)(b, model=model)
        given = sorted(k for k, v in dataset_args.items() if v is not None)
        if given:
            raise BundleError(f"{', '.join(given)} only apply to dataset bundles, and this is a comparison bundle",
                              "drop those options")
        m = b.manifest
        opts = m["compare"]
        if not opts.get("rerunnable", True):
            raise BundleError(f"{b.source.name} cannot be rerun: {opts.get('why_not_rerunnable', 'unknown reason')}",
                              "rerun that comparison from Python, where the engine object exists")
        saved = b.result
        loaded = b.load_model("model", model)
        cand = b.load_model("cand_model", cand_model) if m.get("cand_model") else None
        try:
            criterion = Criterion.from_json(opts["criterion"])
            typed = opts.get("options")
            engine_options, notes = bundle_engine_options((typed if isinstance(typed, dict) else opts)
                                                          .get("engine_options"))
            for note in notes:
                log.info("%s", note)
            options = (CompareOptions.from_json({**typed, "engine_options": engine_options})
                       if isinstance(typed, dict) else None)
            kwargs = {
                "mode": opts.get("mode", "auto"), "memory_budget": opts.get("memory_budget"),
                "keep_fp32": list(opts.get("keep_fp32") or ()), "inline_branches": bool(opts.get("inline_branches",
                                                                                                True)),
                "culprits": bool(opts.get("culprits", True)), "max_culprits": int(opts.get("max_culprits", 10)),
                "engine_options": engine_options,
                "isolate": isolate if isolate is not None else opts.get("isolate"),
                "timeout_s": timeout_s if timeout_s is not None else opts.get("timeout_s"),
            }
            reference, candidate = str(opts["reference"]), str(opts["candidate"])
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{b.source.name}: manifest 'compare' is malformed ({type(e).__name__}: {e})") from None
        check_engines(reference, candidate, allowed=allow_engines)
        feeds = b.feeds()
        calib = b.calibration_feeds()
        log.info("rerunning %s vs %s on %s (%d feeds)", reference, candidate, loaded.name, len(feeds))
        if options is not None:
            result = compare(loaded, reference, candidate, options.replace(criterion=criterion), feeds=feeds,
                             cand_model=cand, calibration_feeds=calib, progress=progress, isolate=kwargs["isolate"],
                             timeout_s=kwargs["timeout_s"])
        else:  # a bundle written before the typed options
            result = compare(loaded, reference, candidate, feeds=feeds, cand_model=cand, criterion=criterion,
                             calibration_feeds=calib, progress=progress, **kwargs)
        result.model["path"] = None if b._tmp is not None else result.model.get("path")
        if isinstance(saved.feeds, dict) and saved.feeds.get("count") in (None, len(feeds)):
            # the bundle's inputs are the saved run's own feeds, replayed: described as they were made (random,
            # seed 0, ...) rather than as a list given, which the diff would report as other inputs
            result.feeds = {**saved.feeds, "replayed": "the bundle's saved inputs"}
        diff = diff_results(saved, result, labels=("saved", "now"))
        then = dict(m["versions"]) if isinstance(m.get("versions"), dict) else {}
        then["python"] = m.get("python")
        now = {**package_versions(), "python": platform.python_version()}
        return RerunReport(str(b.source), saved, result, diff, diff_versions(then, now), notes,
                           _fusions(b, saved, result))
    finally:
        if not isinstance(bundle, Bundle):
            b.close()


def _fusions(b: Bundle, saved: CompareResult, result: CompareResult) -> dict | None:
    """At granularity "fused": the saved engine graph's fused groups against the rerun's (the compared groups'
    when the bundle holds no engine graph)."""
    if not (saved.granularity and result.granularity):
        return None
    from ..engine_graphs.diff import fusion_change

    before = b.engine_graph()
    after = getattr(getattr(result, "plan", None), "engine_graph", None)
    if before is not None and after is not None:
        return fusion_change(before, after)
    return fusion_change(saved.granularity, result.granularity)
