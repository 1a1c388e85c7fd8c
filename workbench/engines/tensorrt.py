"""TensorRT adapter, through Polygraphy's loaders and runner (TensorRT 10/11 API).

Precision comes from the model variant (an FP16 or Q/DQ ONNX): networks are strongly typed on TRT >= 10 (the only
kind on 11); builder precision flags are set only for weakly typed networks (TRT < 10). Intermediate tensors are
marked as debug tensors (``INetworkDefinition.mark_debug``, read back through the execution context's debug
listener, which Polygraphy's TrtRunner merges into its outputs) where available, else as network outputs. Either
way marking changes TensorRT's fusions, so ``marks_all_cheaply`` is False. Not runnable on this CPU-only machine:
run it in an isolated worker (``should_isolate("trt")``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from .._atomic import atomic_write_bytes
from ..errors import EngineRunError, EngineUnavailableError
from .base import Engine, Feeds, Session
from .serialize import model_payload

log = logging.getLogger(__name__)

NOT_INSTALLED = ("tensorrt is not installed (needs an NVIDIA GPU and the TensorRT wheels: "
                 "pip install onnx-drift-workbench[gpu])")


class TensorRTEngine(Engine):
    """TensorRT via Polygraphy. ``strongly_typed`` defaults to True on TRT >= 10; ``workspace`` caps the builder's
    workspace pool (bytes); ``timing_cache`` is a file read and extended; ``engine_cache_dir`` (never the working
    directory unless given) keeps built engines keyed by model bytes, marked tensors and TRT version."""

    name = "trt"
    label = "TensorRT (strongly typed networks on TRT >= 10)"
    marks_all_cheaply = False
    marking_changes_outputs = True
    isolated_by_default = True
    reads_files = True

    def __init__(self, strongly_typed: bool | None = None, workspace: int | None = None,
                 timing_cache: str | None = None, engine_cache_dir: str | None = None, use_debug_tensors: bool = True):
        self.strongly_typed = strongly_typed
        self.workspace = workspace
        self.timing_cache = timing_cache
        self.engine_cache_dir = engine_cache_dir
        self.use_debug_tensors = use_debug_tensors
        self._last: dict = {}

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            return False, NOT_INSTALLED
        except OSError as e:  # the wheel is there but libnvinfer / CUDA cannot be loaded
            return False, f"tensorrt cannot load its libraries ({e}); check the CUDA driver and LD_LIBRARY_PATH"
        try:
            import polygraphy.backend.trt  # noqa: F401
        except ImportError:
            return False, "polygraphy is not installed: pip install onnx-drift-workbench[gpu]"
        return True, ""

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        ok, reason = self.availability()
        if not ok:
            raise EngineUnavailableError(reason, "use ort-cuda, ort or openvino on this machine")
        import tensorrt as trt
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner
        from polygraphy.exception import PolygraphyException

        wanted = list(dict.fromkeys(outputs))
        inputs = {i.name for i in model.graph.input}
        to_mark = [n for n in wanted if n not in inputs]
        strongly = self._strongly_typed(trt.__version__)
        debug = self.use_debug_tensors and _debug_tensors_supported(trt, TrtRunner)
        settings = {"strongly_typed": strongly, "debug": debug, "workspace": self.workspace,
                    "flags": {} if strongly else precision_flags(model)}
        payload = model_payload(model)
        try:
            key = engine_cache_key(_digest(payload.source), to_mark, trt.__version__, settings)
            plan = self._load_cached(key)
            if plan is None:
                plan = self._build(payload.source, to_mark, settings)
                self._store_cached(key, plan)
            runner = TrtRunner(EngineFromBytes(plan))
            runner.activate()
        except (PolygraphyException, RuntimeError, TypeError, ValueError) as e:
            raise EngineRunError(f"TensorRT could not build the engine: {_one_line(e)}",
                                 "rerun with --mode bisect or fewer marked tensors; see the TensorRT log above") from e
        finally:
            payload.close()
        self._last = {"strongly_typed": strongly, "marking": "debug tensors" if debug else "outputs",
                      "engine_key": key, **settings["flags"]}
        return TensorRTSession(runner, wanted, inputs)

    def describe(self) -> dict:
        import tensorrt as trt

        try:
            import polygraphy
            poly = polygraphy.__version__
        except ImportError:
            poly = None
        return {"engine": self.name, "tensorrt": trt.__version__, "polygraphy": poly, "device": "cuda:0",
                "workspace": self.workspace, "engine_cache_dir": self.engine_cache_dir, **self._last}

    def _strongly_typed(self, version: str) -> bool:
        major = int(version.split(".")[0])
        if major >= 11 and self.strongly_typed is False:
            log.warning("TensorRT %s only builds strongly typed networks; ignoring strongly_typed=False", version)
            return True
        return major >= 10 if self.strongly_typed is None else self.strongly_typed

    def _build(self, source: bytes | str, to_mark: list[str], settings: dict) -> bytes:
        import tensorrt as trt
        from polygraphy.backend.trt import (
            CreateConfig,
            EngineBytesFromNetwork,
            NetworkFromOnnxBytes,
            NetworkFromOnnxPath,
        )

        loader = NetworkFromOnnxPath if isinstance(source, str) else NetworkFromOnnxBytes
        parse = loader(source, strongly_typed=bool(settings["strongly_typed"]))

        def network():
            builder, net, parser = parse()
            tensors = _tensors_by_name(net)
            missing = [n for n in to_mark if n not in tensors]
            if missing:
                log.info("TensorRT's network has no tensor %s; left out of the results", ", ".join(missing[:5]))
            for name in (n for n in to_mark if n in tensors):
                if settings["debug"]:
                    net.mark_debug(tensors[name])
                elif not tensors[name].is_network_output:
                    net.mark_output(tensors[name])
            return builder, net, parser

        pools = {trt.MemoryPoolType.WORKSPACE: int(self.workspace)} if self.workspace else None
        config = CreateConfig(memory_pool_limits=pools, load_timing_cache=self.timing_cache, **settings["flags"])
        return bytes(EngineBytesFromNetwork(network, config=config, save_timing_cache=self.timing_cache)())

    def _cache_path(self, key: str) -> Path | None:
        return Path(self.engine_cache_dir).expanduser() / f"{key}.engine" if self.engine_cache_dir else None

    def _load_cached(self, key: str) -> bytes | None:
        path = self._cache_path(key)
        if path is not None and path.is_file():
            from .._files import read_capped

            log.info("TensorRT engine cache hit: %s", path)
            return read_capped(path, None, "TensorRT engine cache", kind="engine")
        return None

    def _store_cached(self, key: str, plan: bytes) -> None:
        path = self._cache_path(key)
        if path is not None:
            atomic_write_bytes(path, plan)


class TensorRTSession(Session):
    def __init__(self, runner, outputs: list[str], inputs: set[str]):
        self._runner = runner
        self.outputs = outputs
        self._inputs = inputs

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        from polygraphy.exception import PolygraphyException

        try:
            results = self._runner.infer({k: np.ascontiguousarray(v) for k, v in feeds.items()})
        except (PolygraphyException, RuntimeError, TypeError, ValueError) as e:
            raise EngineRunError(f"TensorRT failed while running the engine: {_one_line(e)}",
                                 "check the feeds' shapes and dtypes against the engine's inputs") from e
        out = {n: np.array(results[n]) for n in self.outputs if n in results}
        out.update({n: np.asarray(feeds[n]) for n in self.outputs if n in self._inputs and n in feeds})
        return out

    def close(self) -> None:
        if self._runner is not None and self._runner.is_active:
            self._runner.deactivate()
        self._runner = None


def engine_cache_key(model_digest: str, marked: Sequence[str], trt_version: str, settings: dict | None = None) -> str:
    """sha256 over the model bytes' digest, the marked tensor names (order-free), the TensorRT version and the
    build settings: any change gives a new engine file."""
    blob = json.dumps({"model": model_digest, "marked": sorted(set(marked)), "tensorrt": trt_version,
                       "settings": settings or {}}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def precision_flags(model: onnx.ModelProto) -> dict:
    """Builder flags a weakly typed (TRT < 10) network needs to honour the model variant's precision."""
    from ..model.walk import iter_nodes

    half = onnx.TensorProto.FLOAT16
    fp16 = any(t.data_type == half for t in model.graph.initializer) or any(
        vi.type.tensor_type.elem_type == half for vi in list(model.graph.input) + list(model.graph.value_info))
    fp16 = fp16 or any(n.op_type == "Cast" and any(a.name == "to" and a.i == half for a in n.attribute)
                       for n in iter_nodes(model.graph))
    int8 = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in iter_nodes(model.graph))
    flags = {"fp16": True} if fp16 else {}
    if int8:
        flags["int8"] = True
    if flags:
        flags["precision_constraints"] = "obey"
    return flags


def _digest(source: bytes | str) -> str:
    sha = hashlib.sha256()
    if isinstance(source, bytes):
        sha.update(source)
        return sha.hexdigest()
    from .._files import open_regular

    for path in sorted(Path(source).parent.iterdir()):  # the .onnx file and its external data
        if not path.is_file():
            continue
        with open_regular(path, "model file") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 24), b""):
                sha.update(chunk)
    return sha.hexdigest()


def _debug_tensors_supported(trt, runner_cls) -> bool:
    return (hasattr(trt.INetworkDefinition, "mark_debug")
            and hasattr(trt.IExecutionContext, "set_all_tensors_debug_state")
            and hasattr(runner_cls, "set_debug_listener"))


def _tensors_by_name(network) -> dict:
    tensors = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            tensors.setdefault(layer.get_output(j).name, layer.get_output(j))
    return tensors


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:400]
