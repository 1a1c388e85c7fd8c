"""What changed between two dataset comparisons (JSON files or dataset bundles): samples whose verdict, task
metric, output metrics or first divergence changed, and the task aggregates (``workbench diff A B``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..textfmt import safe_name
from .result import KIND

#: numbers that differ by more than this (relative) count as changed
RTOL = 1e-9


def dataset_doc(source: Any, *, trust_unsealed: bool = False) -> dict | None:
    """The dataset result JSON of ``source`` (a ``kind: "dataset"`` results file or a dataset bundle: one without a
    seal only when ``trust_unsealed``), else None. Files are read only when regular and within the size cap of any
    workbench JSON."""
    from ..report.bundle import MANIFEST, RESULTS, load_bundle
    from ..report.safety import BundleError, confined, read_json

    if isinstance(source, dict):
        return source if source.get("kind") == KIND else None
    if hasattr(source, "to_json") and getattr(source, "samples", None) is not None:
        return source.to_json()
    path = Path(source).expanduser()
    if path.is_dir() or path.suffix.lower() == ".zip":
        if path.is_dir() and not (path / MANIFEST).is_file():
            return None
        try:
            manifest = read_json(path / MANIFEST, f"{path.name}: {MANIFEST}") if path.is_dir() else None
        except BundleError:
            return None
        if manifest is not None and manifest.get("kind") != KIND:
            return None
        with load_bundle(path, trust_unsealed=trust_unsealed) as b:
            if b.manifest.get("kind") != KIND:
                return None
            return read_json(confined(b.root, b.manifest.get("results", RESULTS), "results"),
                             f"{path.name}: results.json", schema="workbench.compare/1")
    if path.is_file() and path.suffix.lower() == ".json":
        try:
            doc = read_json(path, path.name)
        except BundleError:
            return None
        return doc if doc.get("kind") == KIND else None
    return None


def check_doc(doc: dict, where: str) -> dict:
    """``doc`` when its samples and task aggregates have the shape a dataset result has (each sample an object
    with a whole-number ``index``; ``task``/``outputs`` objects), else a :class:`BundleError` in one line."""
    from ..report.safety import BundleError

    def bad(what: str):
        return BundleError(f"{where} is not a well-formed dataset result: {what}",
                           "pass a file written by `workbench compare --inputs DIR --json` (unedited)")

    samples = doc.get("samples", [])
    if not isinstance(samples, list):
        raise bad("'samples' is not a list")
    for j, s in enumerate(samples):
        if not isinstance(s, dict):
            raise bad(f"samples[{j}] is not an object")
        if isinstance(s.get("index"), bool) or not isinstance(s.get("index"), int):
            raise bad(f"samples[{j}] has no whole-number index")
        for key in ("task", "outputs", "first_divergent"):
            if s.get(key) is not None and not isinstance(s[key], dict):
                raise bad(f"samples[{j}].{key} is not an object")
        if any(not isinstance(v, dict) for v in (s.get("outputs") or {}).values()):
            raise bad(f"samples[{j}].outputs holds a non-object")
    for key in ("task", "verdict"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise bad(f"'{key}' is not an object")
    if any(not isinstance(v, dict) for v in (doc.get("task") or {}).values()):
        raise bad("'task' holds a non-object")
    return doc


@dataclass
class DatasetDiff:
    labels: tuple[str, str]
    before: dict
    after: dict
    changed: list[dict]
    only_before: list[int]
    only_after: list[int]

    def to_json(self) -> dict:
        task = {}
        for name in dict.fromkeys([*self.before.get("task", {}), *self.after.get("task", {})]):
            a = (self.before.get("task", {}).get(name) or {}).get("mean")
            b = (self.after.get("task", {}).get(name) or {}).get("mean")
            task[name] = {"before": a, "after": b}
        return {"schema": "workbench.diff/1", "kind": KIND, "labels": list(self.labels),
                "verdict": {"before": self.before.get("diverged"), "after": self.after.get("diverged")},
                "diverged_samples": {"before": (self.before.get("verdict") or {}).get("diverged_samples"),
                                     "after": (self.after.get("verdict") or {}).get("diverged_samples")},
                "failed": {"before": (self.before.get("verdict") or {}).get("failed"),
                           "after": (self.after.get("verdict") or {}).get("failed")},
                "task_target": {"before": _target_text(self.before.get("task_target")),
                                "after": _target_text(self.after.get("task_target"))},
                "task": task, "changed_samples": self.changed, "only_before": self.only_before,
                "only_after": self.only_after}

    def render(self, top: int = 10) -> str:
        a, b = (safe_name(label) for label in self.labels)
        doc = self.to_json()
        n = len(self.after.get("samples", []))
        lines = [f"{a} -> {b}: {len(self.changed)} of {n} sample(s) changed; diverged samples "
                 f"{doc['diverged_samples']['before']} -> {doc['diverged_samples']['after']}"]
        targets = doc["task_target"]
        if targets["before"] or targets["after"]:
            lines.append(f"  task target {safe_name(targets['before'] or 'none')} -> "
                         f"{safe_name(targets['after'] or 'none')}: {_said(doc['failed']['before'])} -> "
                         f"{_said(doc['failed']['after'])}")
        for name, v in doc["task"].items():
            lines.append(f"  {safe_name(name)} mean: {_fmt(v['before'])} -> {_fmt(v['after'])}")
        for c in self.changed[:top]:
            lines.append(f"  #{c['index']} {safe_name(c['source'])}: " + "; ".join(safe_name(w) for w in c["what"]))
        for label, only in ((a, self.only_before), (b, self.only_after)):
            if only:
                lines.append(f"  samples only in {label}: {len(only)} ("
                             + ", ".join(f"#{s['index']} {safe_name(s['source'])}" for s in only[:top])
                             + (", ..." if len(only) > top else "") + ")")
        return "\n".join(lines)


def _said(failed: Any) -> str:
    return ("FAILED" if failed else "ok") if isinstance(failed, bool) else "?"


def _target_text(doc: Any) -> str | None:
    """A saved task target's text (its JSON object, or the text itself), None when there is none or it is not one."""
    if isinstance(doc, dict):
        doc = doc.get("text")
    return doc if isinstance(doc, str) else None


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else safe_name(v)


def diff_datasets(before: Any, after: Any, labels: tuple[str, str] = ("before", "after"), *,
                  trust_unsealed: bool = False) -> DatasetDiff:
    """Compare two dataset results sample by sample (paired by source name, else by index: :func:`sample_key`);
    bundles without a seal only when ``trust_unsealed``."""
    from ..report.safety import BundleError

    a, b = dataset_doc(before, trust_unsealed=trust_unsealed), dataset_doc(after, trust_unsealed=trust_unsealed)
    if a is None or b is None:
        other = labels[0] if a is None else labels[1]
        raise BundleError(f"{other} is not a dataset comparison (a single comparison, or not a workbench result) and "
                          "the other side is", "diff two dataset results, or two single comparisons")
    a, b = check_doc(a, labels[0]), check_doc(b, labels[1])
    sa, sb = a.get("samples", []), b.get("samples", [])
    key = sample_key(sa, sb)
    ka, kb = {key(s) for s in sa}, {key(s) for s in sb}
    return DatasetDiff(labels, a, b, changed_samples(sa, sb),
                       [_named(s) for s in sa if key(s) not in kb], [_named(s) for s in sb if key(s) not in ka])


def _named(sample: dict) -> dict:
    return {"index": sample.get("index"), "source": sample.get("source")}


def sample_key(saved: list[dict], now: list[dict]):
    """How two runs' samples are paired: by source name (a file of a folder) when each side names every sample
    once, so that a file added or removed does not shift the pairs; else by index."""
    def unique(samples: list[dict]) -> bool:
        names = [s.get("source") for s in samples]
        return all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)

    if saved and now and unique(saved) and unique(now):
        return lambda s: s["source"]
    return lambda s: s["index"]


def changed_samples(saved: list[dict], now: list[dict], check_data: bool = True) -> list[dict]:
    """Samples (paired by :func:`sample_key`) whose verdict, task metrics, output metrics or first divergence
    changed (and, with ``check_data``, whose content hash changed)."""
    key = sample_key(saved, now)
    by_key = {key(s): s for s in saved}
    out = []
    for s in now:
        old = by_key.get(key(s))
        if old is None:
            continue
        what = []
        if check_data and old.get("sha256") and s.get("sha256") and old["sha256"] != s["sha256"]:
            what.append("different data")
        if old.get("diverged") != s.get("diverged"):
            what.append(f"verdict {'diverged' if old.get('diverged') else 'ok'} -> "
                        f"{'diverged' if s.get('diverged') else 'ok'}")
        for k, v in (s.get("task") or {}).items():
            before = (old.get("task") or {}).get(k)
            if not _same(before, v):
                what.append(f"{k} {_fmt(before)} -> {_fmt(v)}")
        for o, metrics in (s.get("outputs") or {}).items():
            for k, v in metrics.items():
                before = ((old.get("outputs") or {}).get(o) or {}).get(k)
                if not _same(before, v):
                    what.append(f"{o} {k} {_fmt(before)} -> {_fmt(v)}")
                    break
        if (old.get("first_divergent") or {}).get("tensor") != (s.get("first_divergent") or {}).get("tensor"):
            what.append(f"first divergence {(old.get('first_divergent') or {}).get('tensor')} -> "
                        f"{(s.get('first_divergent') or {}).get('tensor')}")
        if what:
            out.append({"index": s["index"], "source": s.get("source"), "what": what})
    return out


def _same(a, b) -> bool:
    if a == b:
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= RTOL * max(abs(a), abs(b), 1e-30)
    return False
