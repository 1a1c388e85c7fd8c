"""Dataset bundles: the model, the dataset recorded by content hashes (the data itself only when asked), the
options and the per-sample results; a rerun reads the data again, checks every hash and says which samples changed.

A bundle never runs code by itself: a custom preprocessing function or metric (``module:function``) is recorded
by name and must be passed again to rerun (built-in metrics rerun on their own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..report.bundle import RESULTS, Bundle, BundleWriter, portable_result
from ..report.env import diff_versions, package_versions
from ..report.safety import BundleError, check_seal, confined, load_npz, read_json
from ..textfmt import safe_name
from .diff import changed_samples
from .metrics import BUILTIN
from .result import DatasetResult
from .task_target import TaskTarget

KIND = "dataset"


def save_dataset_bundle(result: DatasetResult, dest: str | os.PathLike, *, include_data: bool = False,
                        zip: bool = False, overwrite: bool = False) -> Path:
    """Save ``result`` as a bundle ``workbench rerun`` reproduces. ``include_data``: also store every sample's
    feed (the preprocessed arrays, .npz), so the rerun needs neither the original files nor the preprocessing."""
    ro = result.run_options
    if not ro:
        raise BundleError("this dataset result keeps no run options (read back from JSON?)",
                          "save the bundle right after compare_dataset(), in the same session")
    if include_data and ro["dataset"].one_shot:
        raise BundleError("the dataset came from a generator, which the comparison has read: its samples cannot be "
                          "read again to store them", "pass a list or a re-iterable source to compare_dataset() to "
                          "bundle its data, or save without include_data (the rerun then needs inputs=...)")
    writer = BundleWriter(dest, kind=KIND, zip=zip, overwrite=overwrite)
    try:
        m = writer.manifest
        m["model"] = writer.add_model("model", ro["model"], copy=True, expected_sha=result.model.get("sha256"))
        if ro.get("cand_model") is not None:
            m["cand_model"] = writer.add_model("cand_model", ro["cand_model"], copy=True, expected_sha=None)
        opts = ro["options"]
        m["dataset_compare"] = {
            "reference": result.reference, "candidate": result.candidate, "criterion": result.criterion.to_json(),
            "options": {k: v for k, v in opts.to_json().items() if k not in ("criterion",)},
            "metrics": list(ro["metrics"]), "layers": bool(ro["layers"]), "worst": int(ro["worst"]),
            "calibration_count": int(ro["calibration_count"]), "executor": result.executor,
            "task_target": None if result.task_target is None else result.task_target.to_json(),
        }
        d = result.dataset
        m["dataset"] = {"kind": d.get("kind"), "folder": d.get("folder"), "preprocess": d.get("preprocess"),
                        "count": len(result.samples), "included": include_data,
                        "samples": [{"index": s["index"], "source": s["source"], "sha256": s["sha256"]}
                                    for s in result.samples]}
        if include_data:
            from ..inputs import check_feeds

            files, proto = [], result_model(ro)
            compared = {s["index"]: s["sha256"] for s in result.samples}
            for sample in ro["dataset"]:
                if compared.get(sample.index) != sample.sha256:  # changed (or new) since the comparison read it
                    raise BundleError(f"sample {sample.index} ({sample.source}) is not the data the comparison read "
                                      "(it changed since, or the dataset grew)", "keep the dataset unchanged until "
                                      "its bundle is saved, or run the comparison again")
                feed = check_feeds(proto, [sample.feed])[0]
                files.append(writer.add_arrays(f"inputs/sample_{sample.index:06d}.npz", feed))
            if len(files) != len(compared):
                raise BundleError(f"the dataset now holds {len(files)} sample(s), the comparison read "
                                  f"{len(compared)}", "keep the dataset unchanged until its bundle is saved")
            m["dataset"]["files"] = files
        if opts.calibration_feeds is not None and not isinstance(opts.calibration_feeds, (str, os.PathLike)):
            from ..inputs import feeds_from

            m["calibration"] = {"files": writer.add_feeds("calibration", feeds_from(opts.calibration_feeds))} \
                if ro.get("explicit_calibration") else None
        m["results"] = writer.add_json(RESULTS, portable_result(result.to_json()))
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


def result_model(ro: dict):
    from ..model.load import LoadedModel, load_model

    model = ro["model"]
    return model.proto if isinstance(model, LoadedModel) else load_model(model).proto


@dataclass
class DatasetRerun:
    """A dataset comparison run again from its bundle, and every sample whose answer changed."""

    bundle: str
    saved: dict
    result: DatasetResult
    changed: list[dict]
    data_changed: list[dict]
    versions_changed: dict[str, list]
    notes: list[str] = field(default_factory=list)

    @property
    def verdict_changed(self) -> bool:
        """The saved run's judgement (``verdict.failed``) and this one's differ."""
        saved = (self.saved.get("verdict") or {}).get("failed")
        return isinstance(saved, bool) and saved != self.result.failed

    @property
    def reproduced(self) -> bool:
        return not self.changed and not self.data_changed and not self.verdict_changed

    @property
    def exit_code(self) -> int:
        """0: reproduced and the run passes (no sample diverges; with a task target: the target holds); 1
        otherwise."""
        return 0 if self.reproduced and not self.result.failed else 1

    def to_json(self) -> dict:
        return {"schema": "workbench.rerun/1", "kind": KIND, "bundle": self.bundle, "reproduced": self.reproduced,
                "verdict_changed": self.verdict_changed,
                "exit_code": self.exit_code, "diverged": self.result.diverged, "failed": self.result.failed,
                "changed_samples": self.changed,
                "data_changed": self.data_changed, "versions_changed": self.versions_changed,
                "notes": self.notes, "result": self.result.to_json()}

    def render(self, top: int = 10) -> str:
        n = len(self.result.samples)
        lines = [f"rerun of {safe_name(self.bundle)} (dataset, {n} samples): "
                 + ("REPRODUCED" if self.reproduced else "NOT REPRODUCED")
                 + f" -- {n - len(self.changed)} of {n} samples identical"]
        v = self.result.verdict()
        if self.verdict_changed:
            was = "FAILED" if (self.saved.get("verdict") or {}).get("failed") is True else "ok"
            lines.append(f"  the verdict changed: {was} -> {v['headline']}")
        lines.append(f"  now: {v['headline']}: {safe_name(v['reason'])}")
        if self.data_changed:
            lines.append(f"  the data differ from the bundle's on {len(self.data_changed)} sample(s): "
                         + ", ".join(f"#{c['index']} {safe_name(c['source'])} ({c['why']})"
                                     for c in self.data_changed[:5])
                         + (f", and {len(self.data_changed) - 5} more" if len(self.data_changed) > 5 else ""))
        for c in self.changed[:top]:
            lines.append(f"  #{c['index']} {safe_name(c['source'])}: " + "; ".join(c["what"]))
        lines += [f"  note: {safe_name(n)}" for n in self.notes]
        for pkg, (old, new) in self.versions_changed.items():
            lines.append(f"  version changed: {pkg} {old} -> {new}")
        return "\n".join(lines)


def rerun_dataset(b: Bundle, *, model: str | os.PathLike | None = None,
                  cand_model: str | os.PathLike | None = None, inputs: Any = None, preprocess: str | None = None,
                  metrics: list[str] | None = None, workers: int = 1, executor: str | None = None,
                  progress: Any = None) -> DatasetRerun:
    """Run the bundle's dataset comparison again (sha256-checked models; the data from the bundle, the recorded
    folder or ``inputs``, every sample's hash checked) and list the samples whose results changed. The manifest
    must be sealed and well-formed before anything runs; its preprocessing and custom metrics are never imported
    (pass them again)."""
    from ..compare.criterion import Criterion
    from ..compare.options import CompareOptions
    from ..report.engine_options import bundle_engine_options
    from .api import compare_dataset
    from .diff import check_doc

    m = b.manifest
    name = b.source.name
    if not check_seal(m, f"{name}: manifest.json") and b.sealed:  # unsealed: only when opened trusting it
        raise BundleError(f"{name}: manifest.json carries no seal, and every dataset bundle is written with one",
                          "the bundle was edited; re-create it")
    opts, data = m.get("dataset_compare"), m.get("dataset")
    if not isinstance(opts, dict) or not isinstance(data, dict):
        raise BundleError(f"{name}: manifest has no dataset comparison")
    saved = check_doc(read_json(confined(b.root, m.get("results", RESULTS), "results"), f"{name}: results.json",
                                schema="workbench.compare/1"), f"{name}: results.json")
    notes: list[str] = []
    try:
        typed = dict(opts.get("options") or {})
        engine_options, dropped = bundle_engine_options(typed.get("engine_options"))
        notes += dropped
        typed["engine_options"] = engine_options
        options = CompareOptions.from_json(typed).replace(criterion=Criterion.from_json(opts["criterion"]))
        recorded_metrics = [_text(x, "metrics") for x in _list(opts.get("metrics"), "metrics")]
        reference, candidate = _text(opts["reference"], "reference"), _text(opts["candidate"], "candidate")
        settings = {"calibration_count": _whole(opts.get("calibration_count", 16), "calibration_count", 1),
                    "worst": _whole(opts.get("worst", 5), "worst", 0), "layers": _flag(opts.get("layers", True))}
        if opts.get("task_target") is not None:
            settings["task_target"] = TaskTarget.from_json(opts["task_target"])
        recorded = {}
        for j, s in enumerate(_list(data.get("samples"), "samples")):
            if not isinstance(s, dict) or not isinstance(s.get("sha256"), str):
                raise ValueError(f"dataset sample entry {j} is not an object with a sha256")
            recorded[_whole(s.get("index"), f"samples[{j}].index", 0)] = s
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{name}: manifest.json is malformed ({type(e).__name__}: {e})") from None
    except InputError as e:  # a task target that does not parse
        raise BundleError(f"{name}: manifest.json is malformed ({e.message})") from None
    custom = [x for x in recorded_metrics if x.partition(":")[0] not in BUILTIN]
    if metrics is None:
        if custom:
            raise BundleError(f"the bundle's metric(s) {', '.join(custom)} are user code, which a bundle never runs "
                              "by itself", "pass them again: workbench rerun BUNDLE --metric " + " ".join(
                                  recorded_metrics))
        metrics = recorded_metrics
    source, prep = _data_source(b, data, inputs, preprocess, notes)
    calib = None
    if isinstance(m.get("calibration"), dict):
        calib = [load_npz(confined(b.root, f, "manifest 'calibration'"), f"{name}: {f}")
                 for f in m["calibration"].get("files") or []]
    loaded = b.load_model("model", model)
    cand = b.load_model("cand_model", cand_model) if m.get("cand_model") else None
    if cand_model is not None and cand is None:
        raise BundleError(f"{name} compared no candidate model file", "drop --cand-model")
    result = compare_dataset(loaded, reference, candidate, source, preprocess=prep, metrics=metrics,
                             workers=workers, executor=executor, cand_model=cand, calibration=calib,
                             progress=progress, options=options, **settings)
    data_changed = []
    if not data.get("included"):
        from .diff import sample_key

        key = sample_key(list(recorded.values()), result.samples)
        by_key = {key(r): r for r in recorded.values()}
        for s in result.samples:
            r = by_key.get(key(s))
            if r is None:
                data_changed.append({"index": s["index"], "source": s["source"], "why": "not in the bundle"})
            elif r.get("sha256") != s["sha256"]:
                data_changed.append({"index": s["index"], "source": s["source"], "why": "content differs"})
        now = {key(s) for s in result.samples}
        for r in sorted(recorded.values(), key=lambda r: r["index"]):
            if key(r) not in now:
                data_changed.append({"index": r["index"], "source": r.get("source"), "why": "missing now"})
    changed = changed_samples(saved.get("samples") or [], result.to_json()["samples"], check_data=False)
    versions = diff_versions(m.get("versions") or {}, package_versions())
    return DatasetRerun(name, saved, result, changed, data_changed, versions, notes)


def _list(value: Any, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{what} is a {type(value).__name__}, not a list")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} holds a {type(value).__name__}, not text")
    return value


def _whole(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} is {value!r}, not a whole number >= {low}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"layers is {value!r}, not true or false")
    return value


def _data_source(b: Bundle, data: dict, inputs: Any, preprocess: str | None, notes: list[str]):
    if inputs is None and data.get("included"):
        files = [confined(b.root, f, "manifest 'dataset.files'") for f in _files(data.get("files"))]
        return _bundled(b, data, files), None
    recorded_prep = data.get("preprocess")
    if inputs is None:
        folder = data.get("folder")
        if data.get("kind") not in ("npz", "images", "files") or not isinstance(folder, str):
            raise BundleError("the bundle's dataset came from Python objects and its data was not included",
                              "pass the data again: rerun_bundle(BUNDLE, inputs=...) or save with include_data")
        inputs = folder
        if not Path(folder).is_dir():
            raise BundleError(f"the dataset folder {folder} recorded in the bundle is not here",
                              "pass the data: workbench rerun BUNDLE --inputs DIR")
        notes.append(f"samples read from {folder}, the folder the bundle records (pass --inputs DIR for another)")
    if recorded_prep and preprocess is None:
        raise BundleError(f"the bundle's samples were preprocessed by {recorded_prep!r}, user code that a bundle "
                          "never runs by itself", f"pass it again: --preprocess {recorded_prep}")
    return inputs, preprocess


def _files(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise BundleError("manifest 'dataset.files' is not a list of paths", "the bundle was edited; re-create it")
    return value


def _bundled(b: Bundle, data: dict, files: list[Path]):
    """The bundle's stored samples as a dataset read one file at a time (memory flat), each under the source
    name the original run gave it."""
    from .source import Dataset, Sample, hash_feed

    sources = {s.get("index"): s.get("source") for s in data.get("samples") or [] if isinstance(s, dict)}

    def at(i: int) -> Sample:
        feed = load_npz(files[i], f"{b.source.name}: {files[i].name}")
        return Sample(i, str(sources.get(i) or files[i].name), feed, hash_feed(feed))

    def items():
        for i in range(len(files)):
            yield at(i)

    return Dataset({"kind": "bundle", "count": len(files), "preprocess": None}, items, len(files), at)
