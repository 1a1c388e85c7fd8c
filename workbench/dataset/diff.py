"""What changed between two dataset comparisons (JSON files or dataset bundles): samples whose verdict, task
metric, output metrics or first divergence changed, and the task aggregates (``workbench diff A B``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import KIND

#: numbers that differ by more than this (relative) count as changed
RTOL = 1e-9


def dataset_doc(source: Any) -> dict | None:
    """The dataset result JSON of ``source`` (a ``kind: "dataset"`` results file or a dataset bundle), else None."""
    import json

    from ..report.bundle import MANIFEST, RESULTS, load_bundle
    from ..report.safety import confined, read_json

    if isinstance(source, dict):
        return source if source.get("kind") == KIND else None
    if hasattr(source, "to_json") and getattr(source, "samples", None) is not None:
        return source.to_json()
    path = Path(source).expanduser()
    if path.is_dir() or path.suffix.lower() == ".zip":
        if path.is_dir() and not (path / MANIFEST).is_file():
            return None
        try:
            manifest = json.loads((path / MANIFEST).read_text()) if path.is_dir() else None
        except (OSError, ValueError):
            return None
        if manifest is not None and manifest.get("kind") != KIND:
            return None
        with load_bundle(path) as b:
            if b.manifest.get("kind") != KIND:
                return None
            return read_json(confined(b.root, b.manifest.get("results", RESULTS), "results"),
                             f"{path.name}: results.json", schema="workbench.compare/1")
    if path.is_file() and path.suffix.lower() == ".json":
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("kind") == KIND else None
    return None


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
                "task": task, "changed_samples": self.changed, "only_before": self.only_before,
                "only_after": self.only_after}

    def render(self, top: int = 10) -> str:
        a, b = self.labels
        doc = self.to_json()
        n = len(self.after.get("samples", []))
        lines = [f"{a} -> {b}: {len(self.changed)} of {n} sample(s) changed; diverged samples "
                 f"{doc['diverged_samples']['before']} -> {doc['diverged_samples']['after']}"]
        for name, v in doc["task"].items():
            lines.append(f"  {name} mean: {_fmt(v['before'])} -> {_fmt(v['after'])}")
        for c in self.changed[:top]:
            lines.append(f"  #{c['index']} {c['source']}: " + "; ".join(c["what"]))
        if self.only_before or self.only_after:
            lines.append(f"  samples only in {a}: {len(self.only_before)}, only in {b}: {len(self.only_after)}")
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)


def diff_datasets(before: Any, after: Any, labels: tuple[str, str] = ("before", "after")) -> DatasetDiff:
    """Compare two dataset results sample by sample (matched by index)."""
    from ..errors import WorkbenchError

    a, b = dataset_doc(before), dataset_doc(after)
    if a is None or b is None:
        raise WorkbenchError("one side is a dataset comparison and the other is not",
                             "diff two dataset results, or two single comparisons")
    ia = {s["index"] for s in a.get("samples", [])}
    ib = {s["index"] for s in b.get("samples", [])}
    return DatasetDiff(labels, a, b, changed_samples(a.get("samples", []), b.get("samples", [])),
                       sorted(ia - ib), sorted(ib - ia))


def changed_samples(saved: list[dict], now: list[dict], check_data: bool = True) -> list[dict]:
    """Samples (matched by index) whose verdict, task metrics, output metrics or first divergence changed (and,
    with ``check_data``, whose content hash changed)."""
    by_index = {s["index"]: s for s in saved}
    out = []
    for s in now:
        old = by_index.get(s["index"])
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
