"""The calibration report: typed records with JSON in/out (``workbench.calibrate/1``), DataFrame views, and the
outputs made from it (TensorRT cache, ORT calibration table, QDQ model). No numerics live in any UI: plots read
these attributes."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..core.floats import decode_float, encode_float
from .errors import QuantError, SensitivityEntry, rank_sensitivity
from .exceptions import CalibrationError
from .histogram import TensorHistogram
from .methods import RULES
from .ort_rules import OrtHistograms
from .represent import Representativeness
from .sweep import SweepResult
from .trt_histogram import GrowingHistogram

log = logging.getLogger(__name__)

SCHEMA = "workbench.calibrate/1"


@dataclass
class ModelRef:
    name: str
    sha256: str

    def to_json(self) -> dict:
        return {"name": self.name, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: dict) -> ModelRef:
        return cls(d.get("name", ""), d.get("sha256", ""))


@dataclass
class ImportedThresholds:
    """Thresholds read from a cache or table, to overlay on the histograms. ``bits``: float32 scale bits (TensorRT
    caches only). ``matched``: names that are tensors of the report; ``unmatched``: the others."""

    source: str
    format: str  # "trt" | "ort-json"
    amax: dict[str, float]
    version: int | None = None
    algorithm: str | None = None
    bits: dict[str, int] = field(default_factory=dict)
    matched: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"source": self.source, "format": self.format, "version": self.version, "algorithm": self.algorithm,
                "amax": {k: encode_float(v) for k, v in self.amax.items()},
                "scale_bits": {k: f"{v:08x}" for k, v in self.bits.items()},
                "matched": self.matched, "unmatched": self.unmatched}

    @classmethod
    def from_json(cls, d: dict) -> ImportedThresholds:
        return cls(d["source"], d["format"], {k: float(decode_float(v)) for k, v in d.get("amax", {}).items()},
                   d.get("version"), d.get("algorithm"), {k: int(v, 16) for k, v in d.get("scale_bits", {}).items()},
                   list(d.get("matched", [])), list(d.get("unmatched", [])))


def read_thresholds(path: str | os.PathLike) -> ImportedThresholds:
    """Thresholds from a TensorRT calibration cache or an ORT calibration JSON (told apart by content)."""
    from .formats import read_ort_json, read_trt_cache, sniff

    kind = sniff(path)
    if kind == "trt":
        cache = read_trt_cache(path)
        return ImportedThresholds(str(path), kind, cache.amax, cache.version, cache.algorithm, dict(cache.bits))
    return ImportedThresholds(str(path), kind, read_ort_json(path))


@dataclass
class CalibrationReport:
    """What :func:`workbench.calibrate.calibrate` found. ``ranges[method][tensor]`` is an amax (the
    larger of |lowest| and |highest|); ``bounds[method][tensor]`` the (lowest, highest) of the asymmetric ONNX
    Runtime rules; ``errors[tensor][method]`` a :class:`QuantError`; ``sensitivity`` ranks tensors under
    ``method``; ``summary[method]`` names each rule and scores it; ``trt_histograms`` / ``ort_histograms``
    are the histograms the TensorRT/ModelOpt and ONNX Runtime rules read."""

    model: ModelRef
    method: str
    tensors: list[str]
    histograms: dict[str, TensorHistogram]
    ranges: dict[str, dict[str, float]]
    errors: dict[str, dict[str, QuantError]]
    sensitivity: list[SensitivityEntry]
    config: dict[str, Any] = field(default_factory=dict)
    representativeness: list[Representativeness] | None = None
    eval_histograms: dict[str, TensorHistogram] | None = None
    sweep: SweepResult | None = None
    imported: ImportedThresholds | None = None
    qdq: dict[str, dict] = field(default_factory=dict)
    trt_histograms: dict[str, GrowingHistogram] = field(default_factory=dict)
    ort_histograms: dict[str, OrtHistograms] = field(default_factory=dict)
    bounds: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    summary: dict[str, dict] = field(default_factory=dict)
    #: the depthwise Conv inputs, widest channel spread first (:func:`workbench.calibrate.api.channel_spread`)
    depthwise: list[dict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    #: not serialised: the loaded model and a few feeds, for to_qdq() / check_qdq() after calibrate()
    source_model: Any = field(default=None, repr=False, compare=False)
    sample_feeds: list | None = field(default=None, repr=False, compare=False)
    used_feeds: list | None = field(default=None, repr=False, compare=False)  # for bundles: the exact feeds
    used_eval_feeds: list | None = field(default=None, repr=False, compare=False)
    _variants: dict = field(default_factory=dict, repr=False, compare=False)  # QDQ variants of source_model

    @property
    def methods(self) -> list[str]:
        return list(self.ranges)

    def _method(self, method: str | None) -> str:
        method = (method or self.method).lower()
        if method not in self.ranges:
            raise CalibrationError(f"method {method!r} was not computed", f"use one of {', '.join(self.ranges)}")
        return method

    def worst(self, method: str | None = None, k: int | None = None) -> list[SensitivityEntry]:
        """Tensors ranked by worst_sqnr_db under ``method`` (default: the report's), worst first."""
        method = self._method(method)
        ranked = self.sensitivity if method == self.method else rank_sensitivity(self.errors, method, self.tensors)
        return ranked[:k] if k else ranked

    def usable_ranges(self, method: str | None = None) -> dict[str, float]:
        """{tensor: amax} under ``method`` for the tensors an INT8 scale fits (:meth:`left_out` says why the others
        do not)."""
        left = self.left_out(method)
        return {t: a for t, a in self.ranges[self._method(method)].items() if t not in left}

    def check_exportable(self, method: str | None = None) -> dict[str, float]:
        """:meth:`usable_ranges`, refused (one :class:`CalibrationError`) when the calibration data itself held
        NaN/inf in a graph input, or when no tensor has a usable range: an export would be empty or built on
        broken data while saying it was written."""
        bad = self.config.get("nonfinite_inputs") or []
        if bad:
            raise CalibrationError(f"the calibration data holds NaN or +inf in input(s) {', '.join(bad)}: no "
                                   "export is written from it", "drop or fix the samples that hold them, and "
                                   "calibrate again")
        usable = self.usable_ranges(method)
        if not usable:
            left = self.left_out(method)
            raise CalibrationError(f"no tensor has a usable INT8 range ({len(left)} left out: "
                                   + ", ".join(f"{t} {why}" for t, why in list(left.items())[:3]) + ")",
                                   "calibrate on data where the tensors vary and stay finite")
        return usable

    def left_out(self, method: str | None = None) -> dict[str, str]:
        """{tensor: why} for tensors no INT8 scale fits under ``method``: those holding NaN/inf on the calibration
        data (a scale from their finite values would clip an additive -inf mask to a finite value, and the QDQ
        export keeps the nodes around them float), and those without a positive finite amax (only zeros)."""
        out = {}
        for t, a in self.ranges[self._method(method)].items():
            h = self.histograms.get(t)
            if h is not None and h.nonfinite:
                out[t] = f"holds NaN/inf ({h.nonfinite:,} value(s))"
            elif not (np.isfinite(a) and a > 0):
                out[t] = "holds only zeros" if h is not None and h.only_zeros else f"amax {a}"
        return out

    def usable_bounds(self, method: str | None = None) -> dict[str, tuple[float, float]]:
        """{tensor: (lowest, highest)} under ``method``: the rule's own bounds, (-amax, amax) for symmetric ones."""
        method = self._method(method)
        own = self.bounds.get(method, {})
        return {t: tuple(own.get(t, (-a, a))) for t, a in self.usable_ranges(method).items()}

    @staticmethod
    def rule(method: str) -> str:
        """The rule's label: whose threshold ``method`` reproduces."""
        return RULES[method].label if method in RULES else method

    # --- DataFrame views -------------------------------------------------------------------------------------
    def ranges_frame(self):
        """One row per tensor (topological order): observed statistics and amax per method (and imported)."""
        import pandas as pd

        rows = []
        for i, t in enumerate(self.tensors):
            h = self.histograms[t]
            row = {"topo_index": i, "tensor": t, "count": h.count, "min": h.min if h.count else None,
                   "max": h.max if h.count else None, "nonfinite": h.nonfinite, "zeros": h.zeros}
            row |= {f"amax_{m}": self.ranges[m].get(t) for m in self.ranges}
            if self.imported is not None:
                row["amax_imported"] = self.imported.amax.get(t)
            rows.append(row)
        return pd.DataFrame(rows)

    def errors_frame(self):
        """One row per tensor x method: amax, sqnr_db, bulk_sqnr_db, clipped_fraction, worst_sqnr_db."""
        import pandas as pd

        rows = [{"topo_index": i, "tensor": t, "method": m, "amax": e.amax, "sqnr_db": e.sqnr_db,
                 "bulk_sqnr_db": e.bulk_sqnr_db, "clipped_fraction": e.clipped_fraction,
                 "worst_sqnr_db": e.worst_sqnr_db}
                for i, t in enumerate(self.tensors) for m, e in self.errors.get(t, {}).items()]
        return pd.DataFrame(rows)

    def sensitivity_frame(self, method: str | None = None):
        import pandas as pd

        return pd.DataFrame([vars(e) for e in self.worst(method)])

    def representativeness_frame(self):
        import pandas as pd

        rows = [vars(r) | {"excess_beyond": r.excess_beyond} for r in self.representativeness or []]
        return pd.DataFrame(rows)

    def sweep_frame(self):
        import pandas as pd

        return pd.DataFrame([vars(e) for e in (self.sweep.entries if self.sweep else [])])

    # --- outputs ----------------------------------------------------------------------------------------------
    def trt_cache(self, method: str | None = None, version: int = 100300, algorithm: str | None = None):
        """A :class:`~workbench.calibrate.formats.TrtCache` of ``method``'s ranges (topological order)."""
        from .formats import TRT_ALGORITHMS, TrtCache

        method = self._method(method)
        ranges = self.check_exportable(method)
        left = self.left_out(method)
        if left:
            log.info("%d tensor(s) left out of the cache: %s", len(left), list(left.items())[:5])
        return TrtCache.from_amax(ranges, algorithm or TRT_ALGORITHMS[method], version)

    def write_trt_cache(self, path: str | os.PathLike, method: str | None = None, version: int = 100300,
                        algorithm: str | None = None) -> Path:
        """Write TensorRT's calibration cache (``TRT-<version>-<Algo>``, scale = amax/127) atomically."""
        from .formats import write_trt_cache

        return write_trt_cache(path, self.trt_cache(method, version, algorithm))

    def write_ort_table(self, folder: str | os.PathLike, method: str | None = None) -> list[Path]:
        """ORT's calibration.json/.flatbuffers/.cache for ``method``'s ranges, into ``folder`` (calibration.json
        labelled with :meth:`ort_method`: pass it as quantize_static's calibrate_method to load the file)."""
        from .formats import write_ort_table

        self.check_exportable(method)
        return write_ort_table(folder, self.usable_bounds(method), self.ort_method(method))

    def ort_method(self, method: str | None = None) -> str:
        """The ``onnxruntime.quantization.CalibrationMethod`` name ORT's calibration.json is labelled with for
        ``method`` (MinMax for rules ORT has no method of its own for: the ranges are used as they are)."""
        method = self._method(method)
        return "Entropy" if "entropy" in method else "Percentile" if "percentile" in method else "MinMax"

    def read_cache(self, path: str | os.PathLike) -> ImportedThresholds:
        """Read a TensorRT cache or ORT calibration JSON; its thresholds become ``self.imported``."""
        imported = read_thresholds(path)
        known = set(self.tensors)
        invalid = {t: a for t, a in imported.amax.items() if not (np.isfinite(a) and a > 0)}
        if invalid:  # a scale of 0, inf or NaN sets no INT8 range: left out, said
            imported.amax = {t: a for t, a in imported.amax.items() if t not in invalid}
            self.notes.append(f"{len(invalid)} threshold(s) in {Path(path).name} are not positive finite numbers "
                              "and were left out: " + ", ".join(f"{t!r} (amax {a})" for t, a in
                                                                list(invalid.items())[:3]))
        imported.matched = [t for t in imported.amax if t in known]
        imported.unmatched = [t for t in imported.amax if t not in known]
        if imported.unmatched:
            self.notes.append(f"{len(imported.unmatched)} name(s) in {Path(path).name} are not calibrated tensors of "
                              f"this model (e.g. {imported.unmatched[0]!r})")
        self.imported = imported
        return imported

    def to_qdq(self, method: str | None = None, *, model: Any = None, feeds: Any = None,
               per_channel: bool = True) -> onnx.ModelProto:
        """A QDQ INT8 model with ``method``'s ranges (ORT's quantize_static, ranges as TensorQuantOverrides,
        weights per-channel symmetric int8). ``model``/``feeds`` default to those calibrate() used."""
        return self._qdq_variant(method, model, feeds, per_channel)[0].model

    def save_qdq(self, path: str | os.PathLike, method: str | None = None, *, check: bool = True, **kwargs) -> Path:
        """Write :meth:`to_qdq`'s model to ``path`` atomically (weights past 2 GB in ``PATH.data`` beside it); with
        ``check``, also :meth:`check_qdq` it."""
        from ..model.mapped import save_model

        proto = self.to_qdq(method, **kwargs)
        try:  # past 2 GB (or with weights left mapped) its weights go to PATH.data beside it
            written = save_model(proto, path)[0]
        except OSError as e:
            raise CalibrationError(f"cannot write {path}: {e.strerror or e}", "check permissions") from None
        if check:
            self.check_qdq(method, **kwargs)
        return written

    def check_qdq(self, method: str | None = None, *, model: Any = None, feeds: Any = None,
                  per_channel: bool = True) -> dict:
        """Run the QDQ model and the FP32 model on ORT (CPU) over ``feeds``; per-output metrics (the worst output's
        ``sqnr_db`` and ``cosine`` on top), stored in ``self.qdq[method]``."""
        from ..core.metrics import ErrorStats
        from ..engines import get_engine

        method = self._method(method)
        variant, loaded, feeds = self._qdq_variant(method, model, feeds, per_channel)
        outputs = [o.name for o in loaded.proto.graph.output]
        engine = get_engine("ort")
        stats = {o: ErrorStats() for o in outputs}
        with engine.prepare(loaded.proto, outputs) as fp32, engine.prepare(variant.model, outputs) as int8:
            for feed in feeds:
                ref, got = fp32.run(feed), int8.run(feed)
                for o in outputs:
                    stats[o].update(ref[o], got[o])
        metrics = {o: s.metrics() for o, s in stats.items()}
        result = {"method": method, "feeds": len(feeds), "outputs": metrics,
                  "sqnr_db": _worst(m["sqnr_db"] for m in metrics.values()),
                  "cosine": _worst(m["cosine"] for m in metrics.values()),
                  "quantize_nodes": variant.details.get("quantize_nodes"),
                  "range_overrides": variant.details.get("range_overrides"), "notes": list(variant.notes)}
        self.qdq[method] = result
        return result

    def _sources(self, model: Any, feeds: Any):
        from ..inputs import check_feeds
        from ..model.load import load_model

        if model is None and self.source_model is None:
            raise CalibrationError("this report holds no model (it was read from JSON)", "pass model=")
        loaded = load_model(model) if model is not None else self.source_model
        if feeds is None and not self.sample_feeds:
            raise CalibrationError("this report holds no feeds (it was read from JSON)", "pass feeds=")
        return loaded, (check_feeds(loaded.proto, feeds) if feeds is not None else self.sample_feeds)

    def _qdq_variant(self, method: str | None, model: Any, feeds: Any, per_channel: bool):
        """(VariantResult, loaded model, feeds); the report's own model and feeds' variants are made once."""
        from ..variants.int8 import to_int8

        method = self._method(method)
        key = (method, per_channel) if model is None and feeds is None else None
        loaded, feeds = self._sources(model, feeds)
        if key is not None and key in self._variants:
            return self._variants[key], loaded, feeds
        self.check_exportable(method)
        ranges = self.usable_bounds(method)
        variant = to_int8(loaded.proto, feeds, per_channel=per_channel, method="minmax", ranges=ranges)
        rule = (("workbench.calibration.method", method), ("workbench.calibration.rule", self.rule(method)))
        if "percentile" in method:
            rule += (("workbench.calibration.percentile", str(self.config.get("percentile"))),)
        for name, value in rule:
            variant.model.metadata_props.add(key=name, value=value)
        if key is not None:
            self._variants[key] = variant
        return variant, loaded, feeds

    # --- JSON -------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "model": self.model.to_json(),
            "method": self.method,
            "config": self.config,
            "tensors": self.tensors,
            "histograms": {t: h.to_json() for t, h in self.histograms.items()},
            "trt_histograms": {t: h.to_json() for t, h in self.trt_histograms.items()},
            "ort_histograms": {t: h.to_json() for t, h in self.ort_histograms.items()},
            "rules": {m: {"label": RULES[m].label, "toolchain": RULES[m].toolchain} for m in self.ranges
                      if m in RULES},
            "summary": {m: _encode(v) for m, v in self.summary.items()},
            "ranges": {m: {t: encode_float(a) for t, a in r.items()} for m, r in self.ranges.items()},
            "bounds": {m: {t: [encode_float(lo), encode_float(hi)] for t, (lo, hi) in b.items()}
                       for m, b in self.bounds.items()},
            "errors": {t: {m: e.to_json() for m, e in by.items()} for t, by in self.errors.items()},
            "sensitivity": [e.to_json() for e in self.sensitivity],
            "representativeness": None if self.representativeness is None else [
                r.to_json() for r in self.representativeness],
            "eval_histograms": None if self.eval_histograms is None else {
                t: h.to_json() for t, h in self.eval_histograms.items()},
            "sweep": None if self.sweep is None else self.sweep.to_json(),
            "imported": None if self.imported is None else self.imported.to_json(),
            "qdq": {m: _encode(v) for m, v in self.qdq.items()},
            "depthwise": self.depthwise,  # finite numbers (a ratio of positive values, steps of a positive amax)
            "skipped": self.skipped,
            "notes": self.notes,
            "timing": self.timing,
        }

    @classmethod
    def from_json(cls, doc: dict) -> CalibrationReport:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if schema != SCHEMA:
            raise CalibrationError(f"not a calibration report (schema {schema!r}, expected {SCHEMA!r})",
                                   "pass a file written by `workbench calibrate --json`")
        rep = doc.get("representativeness")
        ev = doc.get("eval_histograms")
        return cls(
            model=ModelRef.from_json(doc["model"]), method=doc["method"], tensors=list(doc["tensors"]),
            histograms={t: TensorHistogram.from_json(h) for t, h in doc["histograms"].items()},
            ranges={m: {t: float(decode_float(a)) for t, a in r.items()} for m, r in doc["ranges"].items()},
            bounds={m: {t: (float(decode_float(v[0])), float(decode_float(v[1]))) for t, v in b.items()}
                    for m, b in (doc.get("bounds") or {}).items()},
            trt_histograms={t: GrowingHistogram.from_json(h) for t, h in (doc.get("trt_histograms") or {}).items()},
            ort_histograms={t: OrtHistograms.from_json(h) for t, h in (doc.get("ort_histograms") or {}).items()},
            summary={m: _decode(v) for m, v in (doc.get("summary") or {}).items()},
            errors={t: {m: QuantError.from_json(e) for m, e in by.items()} for t, by in doc["errors"].items()},
            sensitivity=[SensitivityEntry.from_json(e) for e in doc.get("sensitivity", [])],
            config=dict(doc.get("config", {})),
            representativeness=None if rep is None else [Representativeness.from_json(r) for r in rep],
            eval_histograms=None if ev is None else {t: TensorHistogram.from_json(h) for t, h in ev.items()},
            sweep=None if doc.get("sweep") is None else SweepResult.from_json(doc["sweep"]),
            imported=None if doc.get("imported") is None else ImportedThresholds.from_json(doc["imported"]),
            qdq={m: _decode(v) for m, v in doc.get("qdq", {}).items()},
            depthwise=[dict(r) for r in doc.get("depthwise") or []],
            skipped=dict(doc.get("skipped", {})), notes=list(doc.get("notes", [])), timing=dict(doc.get("timing", {})),
        )

    def save_json(self, path: str | os.PathLike) -> Path:
        from .._atomic import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> CalibrationReport:
        from .._files import read_json

        return cls.from_json(read_json(path, "calibration report", CalibrationError, hint="pass a valid JSON file"))


def _worst(values) -> float:
    """The smallest metric; NaN when any is unknown (None)."""
    numbers = [math.nan if v is None else float(v) for v in values]
    return math.nan if any(math.isnan(v) for v in numbers) else min(numbers)


def _encode(value):
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return encode_float(value)


def _decode(value):
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return decode_float(value)
