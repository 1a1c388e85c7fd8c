"""Reproducible investigations: a comparison saved as a folder (or .zip) a colleague can rerun.

Layout (every path inside is relative, so the bundle can be moved or zipped)::

    manifest.json          schema "workbench.bundle/1": versions, platform, GPU, model sha256 (+ copy or
                           reference), engine specs and options, variant settings, criterion, feeds, file hashes
    results.json           the workbench.compare/1 result
    model/NAME.onnx        copy of the model (+ its external-data files at their relative locations)
    cand_model/NAME.onnx   the --cand-model file, when one was used
    inputs/feed_000.npz    the exact feeds compared (one .npz per feed, keys = input names)
    calibration/feed_*.npz calibration feeds, when they differ from the compared feeds (INT8)
    tensors/tensor_*.npz   optional selected tensors: arrays "reference" and "candidate"
    engine_graph.json      at granularity "fused": the candidate engine's graph the comparison observed
                           (workbench.engine_graph/1; a rerun says whether its fused groups changed)

Written atomically: built in a temporary folder beside the destination, then renamed into place only if
nothing is there (never replacing what another process wrote). The manifest carries the sha256 of its own
content (``manifest_sha256``) besides the sha256 of every other file.
Other producers (calibration) add their own ``kind`` through :class:`BundleWriter`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import clean_stale, place_new, staged, temp_prefix, umask
from ..compare.result import CompareResult
from ..core import arguments, scratch
from ..errors import WorkbenchError
from .safety import (
    SEAL,
    BundleError,
    ModelMismatchError,
    UnsafeBundleError,
    check_npz,
    check_seal,
    confined,
    load_npz,
    parse_json,
    read_json,
    regular_file,
    relpath,
    remove_tree,
    seal_manifest,
    sha256_file,
)

log = logging.getLogger(__name__)

SCHEMA = "workbench.bundle/1"
MANIFEST = "manifest.json"
RESULTS = "results.json"
ENGINE_GRAPH = "engine_graph.json"


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """np.savez without its keyword pitfalls (an input named "file"), never pickling."""
    from numpy.lib import format as npy_format

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                npy_format.write_array(fh, np.asarray(value), allow_pickle=False)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


class BundleWriter:
    """Builds a bundle in a temporary folder beside ``dest``; :meth:`commit` renames (or zips) it into place.

    The hook for other producers: ``w = BundleWriter(dest, kind="calibrate")``, then ``add_model``,
    ``add_feeds``, ``add_json``, ``manifest[...] = ...``, ``commit()``."""

    def __init__(self, dest: str | os.PathLike, *, kind: str, zip: bool = False, overwrite: bool = False):
        dest = Path(dest).expanduser()
        if zip and dest.suffix.lower() != ".zip":
            dest = dest.with_name(dest.name + ".zip")
        if os.path.lexists(dest) and not overwrite:
            raise BundleError(f"{dest} already exists", "pick a new destination (another --bundle path; "
                              "overwrite=True in Python)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.dest, self.zip, self.overwrite = dest, zip, overwrite
        self.root = Path(tempfile.mkdtemp(prefix=temp_prefix(dest.name), suffix=".tmp", dir=dest.parent))
        scratch.track(self.root)  # an interrupted run removes it (the CLI's Ctrl-C/SIGTERM exit)
        from .env import environment

        env = environment()
        self.manifest: dict[str, Any] = {
            "schema": SCHEMA, "kind": kind,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tool": {"name": "onnx-drift-workbench", "version": env["versions"].get("workbench")},
            **env,
        }

    def path(self, rel: str) -> Path:
        target = self.root / relpath(rel, "bundle path")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def add_json(self, rel: str, doc: dict) -> str:
        self.path(rel).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        return rel

    def add_arrays(self, rel: str, arrays: Mapping[str, np.ndarray]) -> str:
        _write_npz(self.path(rel), arrays)
        return rel

    def add_feeds(self, folder: str, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
        return [self.add_arrays(f"{folder}/feed_{i:03d}.npz", f) for i, f in enumerate(feeds)]

    def add_model(self, folder: str, source: Any, *, copy: bool, expected_sha: str | None,
                  weights: str = "auto") -> dict:
        """Copy a model (file + external data, or serialized proto/bytes) into ``folder``, or reference it
        (absolute path + sha256) when ``copy`` is False. The copy's fingerprint is checked against
        ``expected_sha`` (the sha the result recorded). ``weights``: "auto" keeps external data past the inline
        limit by reference (sha256, size, path: :mod:`workbench.report.weights_ref`), "copy" copies it,
        "reference" references it at any size."""
        from ..model.load import LoadedModel, load_model
        from .weights_ref import by_reference, check_mode, weight_entries

        check_mode(weights)

        if isinstance(source, LoadedModel) and source.path is not None:
            source = source.path
        if not copy:
            if not isinstance(source, (str, os.PathLike)):
                raise BundleError("copy_model=False needs the model as a file path (it is kept as a reference)",
                                  "pass the .onnx path, or keep copy_model=True")
            loaded = load_model(source)
            _check_sha(loaded.fingerprint, expected_sha, str(source))
            return {"copied": False, "path": str(Path(source).resolve()), "name": loaded.name,
                    "sha256": loaded.fingerprint}
        if isinstance(source, (str, os.PathLike)):
            src = Path(source).expanduser()
            loaded = load_model(src)
            base = src.resolve().parent
            target = self.path(f"{folder}/{src.name}")
            shutil.copyfile(src, target)
            if by_reference(weights, loaded.external_files):  # the graph file only; weights by sha256
                _check_sha(loaded.fingerprint, expected_sha, str(source))
                return {"copied": True, "file": target.relative_to(self.root).as_posix(), "name": loaded.name,
                        "sha256": loaded.fingerprint, "files": [target.relative_to(self.root).as_posix()],
                        "weights": weight_entries(src, loaded.external_files)}
            for ext in loaded.external_files:
                try:
                    rel = Path(ext).resolve().relative_to(base).as_posix()
                except ValueError:
                    rel = Path(ext).name
                shutil.copyfile(ext, self.path(f"{folder}/{rel}"))
        else:
            if hasattr(source, "SerializeToString"):
                data = source.SerializeToString()
            elif isinstance(source, LoadedModel):
                data = source.proto.SerializeToString()
            elif isinstance(source, (bytes, bytearray, memoryview)):
                data = bytes(source)
            else:
                raise BundleError(f"cannot bundle a {type(source).__name__} as the model",
                                  "pass model= the .onnx file (for a torch.nn.Module: its ONNX export)")
            target = self.path(f"{folder}/model.onnx")
            target.write_bytes(data)
        copied = load_model(target)
        entry = {"copied": True, "file": target.relative_to(self.root).as_posix(), "name": copied.name,
                 "sha256": copied.fingerprint,
                 "files": sorted([target.relative_to(self.root).as_posix()]
                                 + [Path(p).resolve().relative_to(self.root.resolve()).as_posix()
                                    for p in copied.external_files])}
        if expected_sha and copied.fingerprint != expected_sha:
            if isinstance(source, (str, os.PathLike)):
                _check_sha(copied.fingerprint, expected_sha, str(source))
            entry["result_sha256"] = expected_sha  # a proto re-serialised: same graph, other bytes
            log.warning("the bundled model copy hashes to %s, the result recorded %s (re-serialised proto)",
                        copied.fingerprint[:12], expected_sha[:12])
        return entry

    def commit(self) -> Path:
        files = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                files[p.relative_to(self.root).as_posix()] = sha256_file(p)
        self.manifest["files"] = files
        self.manifest = seal_manifest(self.manifest)
        self.add_json(MANIFEST, self.manifest)
        mask = umask()
        try:
            if self.zip:
                made = tempfile.mkstemp(prefix=temp_prefix(self.dest.name), suffix=".tmp", dir=self.dest.parent)
                with staged(made) as (fd, tmp):
                    os.close(fd)
                    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                        for p in sorted(self.root.rglob("*")):
                            if p.is_file():
                                zf.write(p, p.relative_to(self.root).as_posix())
                    os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600: give the user's usual permissions
                    self._place(Path(tmp))
                remove_tree(self.root)
            else:
                os.chmod(self.root, 0o777 & ~mask)  # mkdtemp makes 0700
                self._place(self.root)
        except BaseException:
            self.abort()
            raise
        scratch.untrack(self.root)
        clean_stale(self.dest.parent, legacy_name=self.dest.name)  # what killed writers left here
        log.info("wrote bundle %s", self.dest)
        return self.dest

    def _place(self, built: Path) -> None:
        """Rename ``built`` to the destination: only if nothing is there, or (``overwrite``) replacing it."""
        if not self.overwrite:
            try:
                place_new(built, self.dest)
            except FileExistsError:
                raise BundleError(f"{self.dest} already exists: it appeared while the bundle was being written "
                                  "(another process?); nothing there was replaced", "pick a new destination") from None
            return
        old = None
        if os.path.lexists(self.dest) and built.is_dir():
            old = self.dest.with_name(f".{self.dest.name}.old.{os.getpid()}")
            os.replace(self.dest, old)
        os.replace(built, self.dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()

    def abort(self) -> None:
        remove_tree(self.root)
        scratch.untrack(self.root)



def _check_sha(found: str, expected: str | None, what: str) -> None:
    if expected and found != expected:
        raise ModelMismatchError(f"model {what} has sha256 {found}, but the comparison was made on sha256 "
                                 f"{expected}")


def _compare_options(result: CompareResult, opts: dict) -> tuple[dict, list[str]]:
    """The compare() options a rerun needs, JSON-ready; plus notes on what could not be recorded."""
    notes = []
    engine_options = opts.get("engine_options") or {}
    if not _jsonable(engine_options):
        notes.append("engine_options hold Python objects and were not recorded; a rerun uses the defaults")
        engine_options = {}
    budget = opts.get("memory_budget")
    doc = {
        "reference": result.reference, "candidate": result.candidate, "mode": result.mode,
        "requested_mode": opts.get("requested_mode", result.mode), "criterion": result.criterion.to_json(),
        "memory_budget": budget if budget is None or isinstance(budget, (int, str)) else str(budget),
        "keep_fp32": list(opts.get("keep_fp32") or ()), "inline_branches": bool(opts.get("inline_branches", True)),
        "culprits": bool(opts.get("culprits", True)), "max_culprits": int(opts.get("max_culprits", 10)),
        "isolate": opts.get("isolate"), "timeout_s": opts.get("timeout_s"), "engine_options": engine_options,
        "rerunnable": True,
    }
    options = opts.get("options")
    if options is not None:  # the typed options (workbench.compare.options.CompareOptions), what rerun reads
        doc["options"] = options.replace(criterion=result.criterion, mode=opts.get("requested_mode", result.mode),
                                         engine_options=engine_options).to_json()
    if opts.get("custom_engines"):
        doc["rerunnable"] = False
        doc["why_not_rerunnable"] = f"the {' and '.join(opts['custom_engines'])} engine was a custom Engine instance"
    return doc, notes


@arguments.checked(result=CompareResult)
def save_bundle(
    result: CompareResult,
    model: Any = None,
    feeds: Any = None,
    dest: str | os.PathLike | None = None,
    *,
    zip: bool = False,
    copy_model: bool = True,
    compare_kwargs: Mapping[str, Any] | None = None,
    tensors: Mapping[str, Any] | Sequence[str] | str | None = None,
    overwrite: bool = False,
    weights: str = "auto",
) -> Path:
    """Save ``result`` as a rerunnable bundle at ``dest`` (a folder, or ``DEST.zip`` with ``zip=True``).

    ``model``/``feeds``: default to what compare() used (``result.run_options["model"]``, ``result.used_feeds``);
    a result read back from JSON needs both. ``copy_model=False`` keeps only the model's path and sha256.
    ``compare_kwargs``: compare() options overriding the recorded ones (mode, memory_budget, keep_fp32,
    calibration_feeds, cand_model, engine_options, ...). ``tensors``: ``{name: (ref, cand)}`` values, or
    names (or "auto") to capture by running both engines once more on the first feed. ``weights``: "auto" keeps
    external data past the inline limit by reference (sha256 + size + path, not copied), "copy" or "reference"
    (:mod:`workbench.report.weights_ref`). Returns the path written.
    """
    if dest is None:
        raise BundleError("save_bundle needs a destination", "pass dest='my_bundle' (a new folder)")
    from ..inputs import feeds_from

    opts = {**(result.run_options or {}), **dict(compare_kwargs or {})}
    if opts.get("options") is not None and compare_kwargs:
        from dataclasses import fields

        known = {f.name for f in fields(opts["options"])}
        opts["options"] = opts["options"].replace(**{k: v for k, v in compare_kwargs.items() if k in known})
    if {"torch", "torch-cuda"} & {result.reference.split(":")[0], result.candidate.split(":")[0]}:
        raise BundleError("a comparison that runs the torch engine cannot be bundled: the module is Python code, "
                          "not a file", "compare its ONNX export on file-based engines (e.g. ref vs ort:fp16) and "
                          "bundle that")
    model = model if model is not None else (opts.get("model") or result.model.get("path"))
    if model is None:
        raise BundleError("the model is unknown (a result read from JSON without a model path)",
                          "pass model= the .onnx file the comparison ran on")
    feed_list = feeds_from(feeds) if feeds is not None else result.used_feeds
    if feeds is not None:
        _check_same_feeds(feed_list, result)
    if not feed_list:
        raise BundleError("the feeds are unknown (a result read from JSON keeps no arrays)",
                          "pass feeds= the inputs the comparison ran on")
    values = _tensor_values(result, tensors, model, feed_list)
    writer = BundleWriter(dest, kind="compare", zip=zip, overwrite=overwrite)
    try:
        m = writer.manifest
        m["model"] = writer.add_model("model", model, copy=copy_model, expected_sha=result.model.get("sha256"),
                                      weights=weights)
        cand = opts.get("cand_model")
        m["cand_model"] = None if cand is None else writer.add_model(
            "cand_model", cand, copy=copy_model, expected_sha=(result.variant or {}).get("sha256"), weights=weights)
        m["compare"], notes = _compare_options(result, opts)
        m["engines"] = result.engines
        m["variant"] = {k: v for k, v in (result.variant or {}).items() if k != "tensor_map"}
        m["criterion"] = result.criterion.to_json()
        m["feeds"] = {**_portable_feeds(result.feeds), "files": writer.add_feeds("inputs", feed_list)}
        m["seeds"] = {"feeds": (result.feeds or {}).get("seed", opts.get("seed"))}
        calib = opts.get("calibration_feeds")
        m["calibration"] = None if calib is None else {"files": writer.add_feeds("calibration", feeds_from(calib))}
        m["tensors"] = [{"tensor": name, "file": writer.add_arrays(f"tensors/tensor_{i:03d}.npz",
                                                                   {"reference": ref, "candidate": cnd}),
                         "feed": 0, "shape": list(np.shape(ref)), "dtype": [str(ref.dtype), str(cnd.dtype)]}
                        for i, (name, (ref, cnd)) in enumerate(values.items())]
        m["results"] = writer.add_json(RESULTS, portable_result(result.to_json()))
        m["engine_graph"] = _engine_graph(writer, result, notes)
        m["notes"] = notes
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


def _check_same_feeds(given: list[dict], result: CompareResult) -> None:
    """Feeds passed to save_bundle must be the ones the comparison ran on (else the bundle is born unable to
    reproduce its own result): equal to ``result.used_feeds`` where the result holds them, else as many as it
    records."""
    used = result.used_feeds
    hint = "pass the feeds the comparison ran on, or leave feeds= out (the result keeps them)"
    if used is None:
        count = (result.feeds or {}).get("count")
        if count is not None and len(given) != count:
            raise BundleError(f"save_bundle(): {len(given)} feed(s) given, the comparison ran on {count}", hint)
        return
    if len(given) != len(used):
        raise BundleError(f"save_bundle(): {len(given)} feed(s) given, the comparison ran on {len(used)}", hint)
    for i, (a, b) in enumerate(zip(given, used)):
        if set(a) != set(b):
            raise BundleError(f"save_bundle(): feed {i} has input(s) {', '.join(sorted(a))}, the comparison's "
                              f"{', '.join(sorted(b))}", hint)
        for name in a:
            x, y = np.asarray(a[name]), np.asarray(b[name])
            if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                raise BundleError(f"save_bundle(): feed {i} input {name!r} is not the array the comparison ran on",
                                  hint)


def portable_result(doc: dict) -> dict:
    """A result JSON as a bundle stores it: file paths of the author's machine (the model's, the feeds') cut to
    their names, so a bundle handed on does not carry the author's folder layout (the model travels as a file of
    the bundle, its sha256 names it)."""
    doc = dict(doc)
    if isinstance(doc.get("model"), dict) and doc["model"].get("path"):
        doc["model"] = {**doc["model"], "path": os.path.basename(str(doc["model"]["path"]))}
    if isinstance(doc.get("feeds"), dict):
        doc["feeds"] = _portable_feeds(doc["feeds"])
    return doc


def _portable_feeds(feeds: dict | None) -> dict:
    """The feeds' provenance without the author's folders: a source path cut to its name."""
    feeds = dict(feeds or {})
    source = feeds.get("source")
    if isinstance(source, str) and source not in ("random",) and (os.sep in source or "/" in source):
        feeds["source"] = os.path.basename(source.rstrip("/" + os.sep))
    return feeds


def _engine_graph(writer: BundleWriter, result: CompareResult, notes: list[str]) -> dict | None:
    """At granularity "fused": the candidate engine's graph the comparison observed, as ``engine_graph.json``."""
    if not result.granularity:
        return None
    graph = getattr(getattr(result, "plan", None), "engine_graph", None)
    if graph is None:
        notes.append("the candidate engine's graph was not recorded (a result without its comparison, e.g. read "
                     "from JSON): a rerun checks the fusions against the compared groups only")
        return None
    return {"file": writer.add_json(ENGINE_GRAPH, graph.to_json()), "engine": graph.engine,
            "nodes": len(graph.nodes), "fused": len(graph.fused_nodes)}


def _tensor_values(result, tensors, model, feeds) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from .tensors import capture_tensors, normalize

    if tensors is None:
        return {}
    if isinstance(tensors, Mapping):
        return normalize(tensors)
    try:
        return capture_tensors(result, tensors, model, feeds)
    except WorkbenchError as e:  # selected tensors are a bonus: never lose the bundle over them
        log.warning("selected tensors not saved: %s", e)
        return {}


@dataclass
class Bundle:
    """A bundle opened for reading; every file it names has been checked to lie inside it."""

    root: Path
    manifest: dict
    source: Path
    _tmp: Path | None = field(default=None, repr=False)
    #: False for a bundle without a seal that the caller chose to trust (``trust_unsealed=True``)
    sealed: bool = True
    #: the folder holding weight files the bundle keeps by reference (``rerun --weights DIR``), if given
    weights_dir: str | os.PathLike | None = None

    def use_weights(self, folder: str | os.PathLike | None) -> None:
        """Look for the weights kept by reference in ``folder`` first; refused when the bundle keeps none, or when
        ``folder`` is not a folder."""
        if folder is None:
            return
        from .._files import file_kind

        path = Path(folder).expanduser()
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise BundleError(f"--weights {folder}: {e.strerror}", "pass the folder holding the weight files") \
                from None
        if not stat.S_ISDIR(mode):
            raise BundleError(f"--weights {folder} is {file_kind(mode)}, not a folder",
                              "pass the folder holding the weight files")
        with os.scandir(path) as entries:  # only regular files are read: a FIFO or device there is refused
            for entry in entries:
                try:
                    mode = os.stat(entry.path).st_mode
                except OSError:
                    continue
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise BundleError(f"--weights {folder}: {entry.path} is {file_kind(mode)}, not a regular "
                                      "file; refusing to read it", "pass a folder of regular weight files")
        if not any(isinstance(self.manifest.get(s), dict) and self.manifest[s].get("weights")
                   for s in ("model", "cand_model")):
            raise BundleError(f"--weights {folder}: {self.source.name} keeps no weights by reference",
                              "drop --weights")
        self.weights_dir = path

    @property
    def result(self) -> CompareResult:
        doc = read_json(confined(self.root, self.manifest.get("results", RESULTS), "manifest 'results'"),
                        f"{self.source.name}: results.json", schema="workbench.compare/1")
        try:
            result = CompareResult.from_json(doc)
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{self.source.name}: results.json is incomplete ({type(e).__name__}: {e})") from None
        # the feeds and options it ran with: the layer-values view (inspect_tensor.probe_for) reruns both engines
        if self.manifest.get("feeds") is not None:
            result.used_feeds = self.feeds()
        result.run_options = self._run_options()
        return result

    def _run_options(self) -> dict:
        """The recorded comparison options, as ``CompareResult.run_options`` holds them (engine options filtered
        through the bundle allow-list, as a rerun does)."""
        from ..compare.options import CompareOptions
        from .engine_options import bundle_engine_options

        opts = self.manifest.get("compare")
        if not isinstance(opts, dict):
            return {}
        typed = opts.get("options")
        try:
            engine_options, _notes = bundle_engine_options((typed if isinstance(typed, dict) else opts)
                                                           .get("engine_options"))
            calib = self.calibration_feeds()
            run = {"keep_fp32": list(opts.get("keep_fp32") or ()), "memory_budget": opts.get("memory_budget"),
                   "engine_options": engine_options, "calibration_feeds": calib}
            if isinstance(typed, dict):
                run["options"] = CompareOptions.from_json({**typed, "engine_options": engine_options}).replace(
                    calibration_feeds=calib)
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{self.source.name}: manifest 'compare' is malformed "
                              f"({type(e).__name__}: {e})") from None
        return run

    def engine_graph(self):
        """The candidate engine's graph a fused-granularity comparison recorded (an
        :class:`~workbench.engine_graphs.result.EngineGraph`), or None when the bundle holds none."""
        from ..engine_graphs.result import SCHEMA as GRAPH_SCHEMA
        from ..engine_graphs.result import EngineGraph

        entry = self.manifest.get("engine_graph")
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise BundleError(f"{self.source.name}: manifest 'engine_graph' is malformed")
        where = f"{self.source.name}: {entry.get('file')}"
        doc = read_json(confined(self.root, entry.get("file"), "manifest 'engine_graph.file'"), where,
                        schema=GRAPH_SCHEMA)
        try:
            return EngineGraph.from_json(doc)
        except WorkbenchError as e:
            raise BundleError(f"{where}: {e.message}", "the bundle was edited or damaged; re-create it") from None

    def _files(self, section: Any, where: str) -> list[Path]:
        if section is None:
            return []
        files = section.get("files") if isinstance(section, dict) else None
        if not isinstance(files, list):
            raise BundleError(f"{self.source.name}: manifest '{where}' lists no files")
        return [confined(self.root, f, f"manifest '{where}'") for f in files]

    def feeds(self) -> list[dict[str, np.ndarray]]:
        files = self._files(self.manifest.get("feeds"), "feeds")
        if not files:
            raise BundleError(f"{self.source.name} holds no feeds")
        return [load_npz(f, f"{self.source.name}: {f.relative_to(self.root.resolve()).as_posix()}") for f in files]

    def calibration_feeds(self) -> list[dict[str, np.ndarray]] | None:
        section = self.manifest.get("calibration")
        if section is None:
            return None
        return [load_npz(f, f"{self.source.name}: {f.name}") for f in self._files(section, "calibration")]

    def tensors(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for i, entry in enumerate(self.manifest.get("tensors") or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("tensor"), str):
                raise BundleError(f"{self.source.name}: manifest 'tensors' entry {i} is malformed")
            arrays = load_npz(confined(self.root, entry.get("file"), f"manifest 'tensors[{i}]'"),
                              f"{self.source.name}: {entry.get('file')}")
            if set(arrays) != {"reference", "candidate"}:
                raise BundleError(f"{self.source.name}: {entry.get('file')} must hold 'reference' and 'candidate'")
            out[entry["tensor"]] = (arrays["reference"], arrays["candidate"])
        return out

    def model_file(self, section: str = "model", override: str | os.PathLike | None = None) -> Path | None:
        """The bundled copy (checked inside the bundle), or for a reference-only bundle the recorded path
        (or ``override``). The caller checks the sha256 (see :meth:`load_model`)."""
        entry = self.manifest.get(section)
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise BundleError(f"{self.source.name}: manifest '{section}' is malformed")
        if override is not None:
            return Path(override).expanduser()
        if entry.get("copied", True):
            target = confined(self.root, entry.get("file"), f"manifest '{section}.file'")
            for f in entry.get("files") or []:  # external data: inside the bundle too
                confined(self.root, f, f"manifest '{section}.files'")
            return target
        path = entry.get("path")
        if not isinstance(path, str) or not path.lower().endswith(".onnx"):
            raise UnsafeBundleError(f"{self.source.name}: manifest '{section}.path' {path!r} is not an .onnx path")
        return Path(path)

    def load_model(self, section: str = "model", override: str | os.PathLike | None = None,
                   weights: str | os.PathLike | None = None):
        """The model as a LoadedModel, refused unless its sha256 is the one the manifest records. Weights kept by
        reference are looked for in ``weights`` (a folder), beside the bundled graph, then where they were
        (:func:`workbench.report.weights_ref.find_weights`)."""
        from ..model.load import load_model

        path = self.model_file(section, override)
        entry = self.manifest.get(section) or {}
        if override is None and path is not None and entry.get("weights"):
            from .._files import read_capped
            from ..model.load import MAX_MODEL_BYTES
            from .weights_ref import check_contents, find_weights

            base = find_weights(entry["weights"], path.parent, weights if weights is not None else self.weights_dir,
                                f"{self.source.name}: {section.replace('_', ' ')}")
            loaded = load_model(read_capped(path, MAX_MODEL_BYTES, "model file", BundleError), base_dir=base)
            loaded.path = path.absolute()  # its name; the weights (mapped, or read in) came from ``base``
            if loaded.fingerprint != entry.get("sha256"):  # the fingerprint read the weights: name the file
                check_contents(entry["weights"], base)
        else:
            loaded = None
        if path is None:
            return None
        expected = self.manifest[section].get("sha256")
        if not isinstance(expected, str):
            raise BundleError(f"{self.source.name}: manifest '{section}' records no sha256")
        if loaded is None:
            if not path.exists():
                raise BundleError(f"{section.replace('_', ' ')} file {path} not found (the bundle keeps only a "
                                  "reference to it)", "pass the model file: `workbench rerun BUNDLE --model PATH`")
            regular_file(path, f"{section.replace('_', ' ')} file {path}", "pass the .onnx file itself")
            loaded = load_model(path)
        if loaded.fingerprint != expected:
            raise ModelMismatchError(f"{section.replace('_', ' ')} {path.name} has sha256 {loaded.fingerprint}, "
                                     f"the bundle recorded sha256 {expected}")
        return loaded

    def verify_files(self) -> None:
        """Every file the manifest lists (except models, checked by fingerprint) still has its sha256."""
        files = self.manifest.get("files") or {}
        if not isinstance(files, dict):
            raise BundleError(f"{self.source.name}: manifest 'files' is malformed")
        model_files = {f for s in ("model", "cand_model") for f in ((self.manifest.get(s) or {}).get("files") or [])}
        for rel, digest in files.items():
            path = confined(self.root, rel, "manifest 'files'")
            if rel in model_files:
                continue
            if sha256_file(path) != digest:
                raise BundleError(f"{self.source.name}: {rel} changed since the bundle was written "
                                  f"(sha256 {sha256_file(path)[:16]}..., recorded {str(digest)[:16]}...)",
                                  "the bundle was edited or damaged; re-create it")

    def check_arrays(self) -> None:
        """Header checks of every array file the manifest names (no pickles, sane sizes), loading none."""
        files = [f for section in ("feeds", "calibration", "eval_feeds")
                 for f in self._files(self.manifest.get(section), section)]
        for i, entry in enumerate(self.manifest.get("tensors") or []):
            files.append(confined(self.root, entry.get("file") if isinstance(entry, dict) else None,
                                  f"manifest 'tensors[{i}]'"))
        for f in files:
            check_npz(f, f"{self.source.name}: {f.relative_to(self.root.resolve()).as_posix()}")

    def close(self) -> None:
        if self._tmp is not None:
            remove_tree(self._tmp)
            self._tmp = None

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class UnsealedBundleError(BundleError):
    """A bundle whose manifest carries no seal, opened without ``trust_unsealed=True``."""


def _check_manifest(manifest: dict, name: str, trust_unsealed: bool = False) -> dict:
    """The sections a bundle of its kind needs, and its seal: a manifest without one is refused unless the caller
    trusts it (``trust_unsealed``), since without it an edited manifest (criterion, options, file hashes) would
    pass unnoticed."""
    kind = manifest.get("kind", "compare")
    sections = {"calibrate": ("model", "calibrate", "feeds"), "dataset": ("model", "dataset_compare", "dataset")}
    for key in sections.get(kind, ("model", "compare", "feeds")):
        if not isinstance(manifest.get(key), dict):
            raise BundleError(f"{name}: manifest.json has no '{key}' section")
    if not isinstance(manifest.get("files", {}), dict):
        raise BundleError(f"{name}: manifest 'files' is malformed")
    if not check_seal(manifest, f"{name}: manifest.json"):
        if not trust_unsealed:
            raise UnsealedBundleError(
                f"{name}: manifest.json carries no seal ({SEAL}), so an edit of it or of the files it lists "
                "cannot be detected", "re-create the bundle; if you trust this one: workbench rerun (or diff) ... "
                "--trust-unsealed (Python: trust_unsealed=True)")
        log.warning("%s: manifest.json carries no seal; trusted as asked (trust_unsealed)", name)
    return manifest


@arguments.checked(path=arguments.path())
def load_bundle(path: str | os.PathLike, *, trust_unsealed: bool = False) -> Bundle:
    """Open a bundle folder or .zip. A zip's entries are checked and its manifest read before anything is
    extracted (to a temporary folder), and only the files that manifest lists are extracted. The manifest must
    carry its seal (``manifest_sha256``) unless ``trust_unsealed``; every file it lists must still have its
    sha256 (models: their fingerprint, checked when loaded)."""
    from .zipread import open_zip

    src = Path(path).expanduser()
    if not src.exists():
        raise BundleError(f"bundle not found: {src}", "check the path")
    tmp = None
    if src.is_dir():
        root = src
        manifest_path = root / MANIFEST
        if manifest_path.is_symlink():
            raise UnsafeBundleError(f"{src.name}: manifest.json is a symlink; refusing it")
        manifest = _check_manifest(read_json(manifest_path, f"{src.name}: manifest.json", schema=SCHEMA), src.name,
                                   trust_unsealed)
    else:
        regular_file(src, f"bundle {src.name}")  # a FIFO or a device would block or never end
        if not zipfile.is_zipfile(src):
            if src.suffix.lower() == ".zip":
                raise BundleError(f"{src} is not a readable .zip (truncated or damaged)",
                                  "copy the bundle again from where it was made")
            raise BundleError(f"{src} is neither a bundle folder nor a .zip")
        tmp, manifest = open_zip(src, MANIFEST, lambda data: _check_manifest(
            parse_json(data, f"{src.name}: manifest.json", schema=SCHEMA), src.name, trust_unsealed))
        root = tmp
    try:
        bundle = Bundle(root=root, manifest=manifest, source=src, _tmp=tmp, sealed=SEAL in manifest)
        bundle.verify_files()
        bundle.check_arrays()
        return bundle
    except BaseException:
        if tmp is not None:
            remove_tree(tmp)
        raise
