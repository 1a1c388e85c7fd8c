"""Interop with the tools users already have.

- Polygraphy RunResults JSON (``polygraphy run --save-results``): read without Polygraphy and without pickle,
  and written from our own engine runs so that ``polygraphy.comparator.RunResults.load`` reads them. Layout
  (0.53)::

      {"lst": [[runner_name, [{"outputs": {name: {"values": ARRAY, "polygraphy_class": "LazyArray"}},
                               "runtime": seconds, "runner_name": runner_name,
                               "polygraphy_class": "IterationResult"}, ...]]],
       "polygraphy_class": "RunResults"}

  where ARRAY is ``{"array": base64(np.save bytes), "polygraphy_class": "ndarray"}`` (older files: the array
  directly, or ``"__polygraphy_encoded_<Class>": "polygraphy_serialized_json_type"`` markers).
- :func:`compare_with_recording`: a saved Polygraphy run as the reference engine of a comparison.
- Model Explorer node data (per-node error overlay) and a Netron helper.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..compare.result import CompareResult
from ..core.metric_info import HIGHER_IS_BETTER
from .safety import BundleError, UnsafeBundleError, check_npy_bytes, read_json

log = logging.getLogger(__name__)

TYPE_KEY = "polygraphy_class"
LEGACY_VALUE = "polygraphy_serialized_json_type"
#: largest RunResults JSON read (base64 arrays: ~1.33x the raw bytes)
MAX_RUN_RESULTS_BYTES = 4 * 1024**3


class RecordingError(BundleError):
    """A recorded-run file (Polygraphy RunResults) is malformed."""

    default_hint = "pass a file written by `polygraphy run --save-results` or workbench.report.write_run_results"


def _class_of(d: dict) -> str | None:
    if TYPE_KEY in d:
        return str(d[TYPE_KEY])
    for key, value in d.items():
        if key.startswith("__polygraphy_encoded_") and value == LEGACY_VALUE:
            return key[len("__polygraphy_encoded_"):]
    return None


def decode_array(value: Any, where: str) -> np.ndarray:
    """One encoded array (LazyArray/ndarray wrapper), checked and loaded with ``allow_pickle=False``."""
    if not isinstance(value, dict):
        raise RecordingError(f"{where} is not an encoded array")
    kind = _class_of(value)
    if kind in ("LazyArray", "LazyNumpyArray"):
        return decode_array(value.get("values"), where)
    if kind == "Tensor":
        raise UnsafeBundleError(f"{where} is a torch.Tensor stored with torch.save (pickle); refusing to load it",
                                "save numpy arrays (Polygraphy does for ONNX Runtime and TensorRT runners)")
    if kind != "ndarray" or not isinstance(value.get("array"), str):
        raise RecordingError(f"{where} is a serialized {kind!s}, not an ndarray")
    text = value["array"]
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        try:  # Polygraphy's legacy latin-1 encoding of the same bytes
            data = text.encode("latin-1")
        except UnicodeEncodeError:
            raise RecordingError(f"{where}: the array payload is neither base64 nor latin-1 .npy bytes") from None
    check_npy_bytes(data, where)
    import io

    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise RecordingError(f"{where}: unreadable .npy payload ({e})") from None


def encode_array(array: np.ndarray) -> dict:
    """Polygraphy's ndarray encoding: base64 of ``np.save`` bytes."""
    import io

    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), TYPE_KEY: "ndarray"}


@dataclass
class Iteration:
    """One iteration of one runner: tensor name -> array."""

    outputs: dict[str, np.ndarray]
    runtime: float | None = None
    runner_name: str = ""


@dataclass
class RunResults:
    """``[(runner name, [Iteration, ...]), ...]``, as Polygraphy's RunResults (runner names may repeat)."""

    runs: list[tuple[str, list[Iteration]]] = field(default_factory=list)

    @property
    def runners(self) -> list[str]:
        return [name for name, _ in self.runs]

    def pick(self, runner: str | None = None) -> tuple[str, list[Iteration]]:
        """(name, iterations) of ``runner`` (exact name or unique prefix, e.g. "onnxrt"), or of the first."""
        if not self.runs:
            raise RecordingError("the recording holds no runner")
        if runner is None:
            if len(self.runs) > 1:
                log.info("recording holds runners %s; using the first", self.runners)
            return self.runs[0]
        exact = [r for r in self.runs if r[0] == runner]
        found = exact or [r for r in self.runs if r[0].startswith(runner)]
        if len(found) != 1:
            raise RecordingError(f"runner {runner!r} {'is ambiguous' if found else 'not found'} in the recording "
                                 f"(runners: {', '.join(self.runners)})", "pass one of the runner names")
        return found[0]


def read_run_results(path: str | os.PathLike, *, max_bytes: int = MAX_RUN_RESULTS_BYTES) -> RunResults:
    """Read a Polygraphy RunResults JSON file; never unpickles (torch payloads and pickles are refused)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise RecordingError(f"recorded results not found: {p}", "check the path")
    doc = read_json(p, p.name, max_bytes=max_bytes)
    if _class_of(doc) != "RunResults" or not isinstance(doc.get("lst"), list):
        raise RecordingError(f"{p.name} is not a Polygraphy RunResults file (class {_class_of(doc)!r})")
    runs = []
    for i, entry in enumerate(doc["lst"]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], list)):
            raise RecordingError(f"{p.name}: lst[{i}] is not [runner_name, [iterations]]")
        name, items = entry
        iterations = []
        for j, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("outputs"), dict):
                raise RecordingError(f"{p.name}: runner {name!r} iteration {j} has no outputs")
            outputs = {str(k): decode_array(v, f"{p.name}: {name} iteration {j} output {k!r}")
                       for k, v in item["outputs"].items()}
            runtime = item.get("runtime")
            iterations.append(Iteration(outputs, float(runtime) if isinstance(runtime, (int, float)) else None,
                                        str(item.get("runner_name", name))))
        runs.append((name, iterations))
    return RunResults(runs)


def run_results_json(results: RunResults | Mapping[str, Sequence[Mapping[str, np.ndarray]]]) -> dict:
    """The RunResults document for ``results`` (a RunResults, or ``{runner: [outputs dict per iteration]}``)."""
    if not isinstance(results, RunResults):
        results = RunResults([(name, [Iteration(dict(o), None, name) for o in its]) for name, its in results.items()])
    lst = []
    for name, iterations in results.runs:
        lst.append([name, [{"outputs": {k: {"values": encode_array(v), TYPE_KEY: "LazyArray"}
                                        for k, v in it.outputs.items()},
                            "runtime": it.runtime if it.runtime is not None else 0.0,
                            "runner_name": it.runner_name or name, TYPE_KEY: "IterationResult"}
                           for it in iterations]])
    return {"lst": lst, TYPE_KEY: "RunResults"}


def write_run_results(path: str | os.PathLike,
                      results: RunResults | Mapping[str, Sequence[Mapping[str, np.ndarray]]]) -> Path:
    """Write a RunResults JSON that ``polygraphy.comparator.RunResults.load`` (and ``polygraphy run
    --load-outputs``) reads. Atomic."""
    from .._atomic import atomic_write_text

    return atomic_write_text(path, json.dumps(run_results_json(results)) + "\n")


def write_inputs_json(path: str | os.PathLike, feeds: Any) -> Path:
    """Write feeds as the inputs JSON ``polygraphy run --load-inputs`` reads (a list of ``{name: array}``), e.g. a
    bundle's inputs, so Polygraphy runs on exactly the compared data. Atomic."""
    from .._atomic import atomic_write_text
    from ..inputs import feeds_from

    doc = [{name: encode_array(value) for name, value in feed.items()} for feed in feeds_from(feeds)]
    return atomic_write_text(path, json.dumps(doc) + "\n")


def record_run(model: Any, spec: str = "ort", feeds: Any = None, *, outputs: Sequence[str] | str = "all",
               runner_name: str | None = None, path: str | os.PathLike | None = None, seed: int = 0) -> RunResults:
    """Run ``model`` on engine ``spec`` (with its variant) for each feed and record ``outputs`` ("all": every
    node output, like ``--onnx-outputs mark all``). Writes a RunResults JSON to ``path`` when given."""
    from ..compare.api import make_engine
    from ..engines.spec import EngineSpec
    from ..inputs import check_feeds, feeds_from, random_feeds
    from ..model.load import load_model
    from ..variants import make_variant

    loaded = load_model(model)
    feed_list = check_feeds(loaded.proto, feeds_from(feeds)) if feeds is not None else random_feeds(loaded.proto,
                                                                                                    seed=seed)
    parsed = EngineSpec.parse(spec)
    proto = loaded.proto if parsed.variant == "fp32" else make_variant(loaded.proto, parsed.variant,
                                                                       calibration_feeds=feed_list).model
    if isinstance(outputs, str) and outputs == "all":
        names = [o for n in proto.graph.node if n.op_type != "Constant" for o in n.output if o]
    else:
        names = list(outputs)
    name = runner_name or f"workbench-{parsed}-{time.strftime('%Y%m%d-%H%M%S')}"
    iterations = []
    with make_engine(parsed).prepare(proto, names) as session:
        for feed in feed_list:
            t0 = time.perf_counter()
            values = session.run(feed)
            iterations.append(Iteration({k: np.asarray(values[k]) for k in names if k in values},
                                        time.perf_counter() - t0, name))
    results = RunResults([(name, iterations)])
    if path is not None:
        write_run_results(path, results)
    return results


def compare_with_recording(model: Any, results_json: Any, candidate: str = "ort", *, inputs_json: Any = None,
                           feeds: Any = None, runner: str | None = None, **compare_kwargs: Any) -> CompareResult:
    """Compare a recorded run (the reference: a Polygraphy ``--save-results`` file or a RunResults) with a live
    ``candidate`` engine, layer by layer, culprits included (a recording made with ``--onnx-outputs mark all``
    holds every tensor; tensors it lacks are left out of the comparison).

    ``inputs_json``: the inputs the run was recorded on (``polygraphy run --save-inputs``): they are the feeds
    and pick each iteration. ``feeds``: feeds when there is no inputs file (iterations replayed in order)."""
    from ..compare.api import compare
    from ..inputs import feeds_from
    from .recorded import RecordedEngine

    recorded_inputs = feeds_from(inputs_json) if inputs_json is not None else None
    engine = RecordedEngine(results_json, runner=runner, inputs=recorded_inputs)
    if feeds is None and recorded_inputs is None:
        raise RecordingError("the recording's inputs are unknown", "pass inputs_json= (polygraphy run "
                             "--save-inputs) or feeds= the inputs it was recorded on")
    result = compare(model, "ort", candidate, feeds=feeds if feeds is not None else recorded_inputs,
                     reference_engine=engine, **compare_kwargs)
    result.reference = f"recorded:{engine.runner}"
    return result


# --- Model Explorer -----------------------------------------------------------------------------------------

_RED, _ORANGE, _YELLOW, _LIGHT_GREEN, _GREEN = "#d32f2f", "#ff9800", "#fff176", "#c8e6c9", "#388e3c"
#: Model Explorer's JSON cannot hold inf: exact agreement (inf dB) is written as this
SQNR_EXACT_DB = 200.0


def _node_value(value: Any, metric: str) -> float | None:
    if value is None or isinstance(value, str):
        return None
    v = float(value)
    if math.isnan(v):
        return None
    if math.isinf(v):
        return (SQNR_EXACT_DB if v > 0 else -SQNR_EXACT_DB) if metric == "sqnr_db" else (1e300 if v > 0 else -1e300)
    return v


def _thresholds(metric: str, threshold: float | None) -> list[dict]:
    """Ascending ``value`` upper bounds, as Model Explorer reads them (a node takes the first band >= its value)."""
    if metric == "sqnr_db":
        t = 30.0 if threshold is None else threshold
        bands = [(t, _RED), (t + 15, _ORANGE), (t + 30, _YELLOW), (SQNR_EXACT_DB - 1, _LIGHT_GREEN),
                 (SQNR_EXACT_DB, _GREEN)]
    elif metric in HIGHER_IS_BETTER:  # cosine
        t = 0.999 if threshold is None else threshold
        bands = [(t, _RED), (1 - (1 - t) / 10, _ORANGE), (1 - (1 - t) / 100, _LIGHT_GREEN), (1.0, _GREEN)]
    else:  # errors: lower is better
        t = 1e-2 if threshold is None else threshold
        bands = [(t / 100, _GREEN), (t / 10, _LIGHT_GREEN), (t, _YELLOW), (t * 10, _ORANGE), (1e300, _RED)]
    return [{"value": v, "bgColor": c} for v, c in bands]


def model_explorer_node_data(result: CompareResult, metric: str | None = None, *, graph_id: str | None = None,
                             model: Any = None) -> dict:
    """Model Explorer node data (``ModelNodeData``): ``{graph_id: {"results": {node name: {"value": x}},
    "thresholds": [{"value", "bgColor"}, ...]}}`` colouring each node by ``metric`` of its (worst) output
    tensor; graph outputs also under their ``[io]NAME`` node, as the ONNX adapter names them. ``graph_id``:
    the ONNX graph's name (read from ``model`` or the result's model file; "main_graph" otherwise)."""
    m = metric or result.criterion.metric
    crit = result.criterion
    worst: dict[str, Any] = {}
    for t in result.tensors:
        v = t.metrics.get(m)
        prev = worst.get(t.node)
        if prev is None or crit.badness({m: v}) > crit.badness({m: prev}):
            worst[t.node] = v
    results = {}
    for node, v in worst.items():
        value = _node_value(v, m)
        if value is not None:
            results[node] = {"value": value}
    for t in result.tensors:
        if t.tensor in result.outputs:
            value = _node_value(t.metrics.get(m), m)
            if value is not None:
                results[f"[io]{t.tensor}"] = {"value": value}
    gid = graph_id or _graph_name(model if model is not None else result.model.get("path")) or "main_graph"
    return {gid: {"results": results, "thresholds": _thresholds(m, crit.threshold if crit.metric == m else None)}}


def _graph_name(model: Any) -> str | None:
    if model is None:
        return None
    proto = getattr(model, "proto", model)
    if hasattr(proto, "graph"):
        return proto.graph.name or None
    try:
        import onnx

        from .._files import read_capped
        from ..model.load import MAX_MODEL_BYTES

        return onnx.load_from_string(read_capped(str(model), MAX_MODEL_BYTES, "model file")).graph.name or None
    except Exception:  # noqa: BLE001 - the graph id falls back to the exporter's default
        return None


def save_model_explorer_node_data(result: CompareResult, path: str | os.PathLike, metric: str | None = None,
                                  **kwargs: Any) -> Path:
    """Write :func:`model_explorer_node_data` as JSON: load it in Model Explorer with
    ``model-explorer MODEL.onnx --extensions=model_explorer_onnx --node_data_paths=PATH``."""
    from .._atomic import atomic_write_text

    doc = model_explorer_node_data(result, metric, **kwargs)
    return atomic_write_text(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


# --- Netron --------------------------------------------------------------------------------------------------

NETRON_HINT = "install it with `pip install netron` (or open the file at https://netron.app)"


def netron_command(model_path: str | os.PathLike, *, port: int | None = None) -> list[str]:
    """The command line that opens ``model_path`` in Netron (``netron`` on PATH, else ``python -m netron``)."""
    import sys

    exe = shutil.which("netron")
    cmd = [exe] if exe else [sys.executable, "-m", "netron"]
    cmd.append(str(Path(model_path).expanduser().resolve()))
    if port is not None:
        cmd += ["--port", str(port)]
    return cmd


def netron_available() -> bool:
    import importlib.util

    return shutil.which("netron") is not None or importlib.util.find_spec("netron") is not None


def open_in_netron(model_path: str | os.PathLike, *, port: int | None = None) -> subprocess.Popen | str:
    """Start Netron on ``model_path`` in the background and return the process; when Netron is not installed,
    return a message saying how to get it (nothing is started)."""
    path = Path(model_path).expanduser()
    if not path.is_file():
        raise BundleError(f"model file not found: {path}", "check the path")
    if not netron_available():
        message = f"Netron is not installed: {NETRON_HINT}; then run: netron {path}"
        log.warning(message)
        return message
    cmd = netron_command(path, port=port)
    log.info("starting %s", " ".join(cmd))
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
