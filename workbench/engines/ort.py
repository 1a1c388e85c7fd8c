"""ONNX Runtime adapter: CPU, CUDA and TensorRT execution providers, with silent-CPU-fallback detection."""

from __future__ import annotations

import ctypes
import functools
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from ..errors import EngineRunError, EngineUnavailableError, SpecError
from .base import Engine, Feeds, Session
from .interruptible import interruptibly
from .serialize import ModelPayload, model_payload

log = logging.getLogger(__name__)

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "trt": "TensorrtExecutionProvider"}
ENGINE_NAMES = {"cpu": "ort", "cuda": "ort-cuda", "trt": "ort-trt"}
OPTIMIZATION_LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC",
                       "disable": "ORT_DISABLE_ALL"}
_PROVIDER_LIBS = {"cuda": "onnxruntime_providers_cuda", "trt": "onnxruntime_providers_tensorrt"}
_ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino",
                      "onnxruntime-qnn", "onnxruntime-training")
GPU_HINT = ("pip uninstall onnxruntime && pip install onnxruntime-gpu on a machine with an NVIDIA GPU, "
            "with the CUDA and cuDNN libraries onnxruntime-gpu was built for (and the TensorRT libraries for ort-trt)")


#: above this many marked outputs the CPU memory arena is off by default (memory_arena=None)
MANY_OUTPUTS = 16
#: environment variable: intra-op threads of every ONNX Runtime session not given ``threads`` (default: ORT's own,
#: one per core). Set it where several jobs share the cores (a CI runner, ``scripts/test.sh``'s test workers):
#: ORT's threads spin while they wait, which costs a shared machine more than the parallelism gains.
THREADS_ENV = "WORKBENCH_ORT_THREADS"


def env_threads() -> int | None:
    """The thread count :data:`THREADS_ENV` asks for (None when unset or empty); a value that is not a whole number
    >= 1 is one clear error."""
    import os

    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise SpecError(f"{THREADS_ENV}={text[:40]!r} is not a number of threads",
                        f"set it to a whole number >= 1 (e.g. {THREADS_ENV}=1) or unset it")
    return int(text)


class OrtEngine(Engine):
    """ONNX Runtime with one execution provider (``cpu``, ``cuda`` or ``trt``; CPU stays last for unsupported
    nodes). A session whose requested GPU provider was silently dropped is refused, never run on CPU."""

    name = "ort"
    label = "ONNX Runtime, CPU execution provider"
    provider_default = "cpu"
    reads_files = True
    marking_changes_outputs = True  # FP16 Cast pairs removed between unmarked nodes; Q/DQ fused into QLinear ops

    def __init__(self, provider: str | None = None, threads: int | None = None, graph_optimization: str = "all",
                 provider_options: dict | None = None, memory_arena: bool | None = None):
        provider = provider or self.provider_default
        if provider not in PROVIDERS:
            raise SpecError(f"unknown onnxruntime provider {provider!r}", f"use one of {', '.join(PROVIDERS)}")
        if graph_optimization not in OPTIMIZATION_LEVELS:
            raise SpecError(f"unknown graph_optimization {graph_optimization!r}",
                            f"use one of {', '.join(OPTIMIZATION_LEVELS)}")
        self.provider = provider
        self.threads = threads if threads is not None else env_threads()
        self.graph_optimization = graph_optimization
        self.provider_options = dict(provider_options or {})
        self.memory_arena = memory_arena
        self.name = ENGINE_NAMES[provider]
        # TensorRT EP fusions change when tensors are marked; the bisecting search handles that.
        self.marks_all_cheaply = provider != "trt"
        self.availability = functools.partial(_availability, provider)  # per instance: its own provider
        self._providers_used: list[str] | None = None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return _availability(cls.provider_default)

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        import onnxruntime as ort

        warn_if_distributions_clash()
        problem = _unavailable(self.provider)
        if problem:
            raise EngineUnavailableError(f"{self.name}: {problem[0]}", problem[1])
        payload = model_payload(model, list(outputs), external_folder=True)
        try:
            options, providers = self._session_options(len(outputs)), self._providers()
            if payload.data_dir:  # weights left in the user's files (workbench.model.mapped)
                from ..model.mapped import ORT_FOLDER_KEY

                options.add_session_config_entry(ORT_FOLDER_KEY, payload.data_dir)
            session = interruptibly(lambda: ort.InferenceSession(payload.source, options, providers=providers),
                                    "ort-session")
        except Exception as e:
            payload.close()
            raise _error("onnxruntime could not create a session", e,
                         "check that the marked tensors exist and that this onnxruntime supports the model's "
                         "IR version, opset and ops") from e
        session._model_bytes = None  # onnxruntime keeps the serialized model for ever otherwise
        if not payload.is_file or payload._on_close is not None:  # a graph file beside shared weights is read
            payload.close()
        self._providers_used = session.get_providers()
        try:
            self._check_fallback(self._providers_used)
        except EngineUnavailableError:
            payload.close()
            raise
        return OrtSession(session, list(dict.fromkeys(outputs)), payload)

    def describe(self) -> dict:
        import onnxruntime as ort

        return {
            "engine": self.name,
            "onnxruntime": ort.__version__,
            "distributions": installed_ort_distributions(),
            "providers": self._providers_used or [p if isinstance(p, str) else p[0] for p in self._providers()],
            "device": "cpu" if self.provider == "cpu" else f"cuda:{self.provider_options.get('device_id', 0)}",
            "graph_optimization": self.graph_optimization,
            "threads": self.threads,
        }

    def _session_options(self, marked: int = 0):
        import onnxruntime as ort

        options = ort.SessionOptions()
        arena = self.memory_arena if self.memory_arena is not None else marked <= MANY_OUTPUTS
        if not arena:  # with many marked outputs the arena would keep their peak reserved after each run
            options.enable_cpu_mem_arena = False
            options.enable_mem_pattern = False
        options.log_severity_level = 4  # errors are raised and reported as ours: none printed raw
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                   OPTIMIZATION_LEVELS[self.graph_optimization])
        if self.threads:
            options.intra_op_num_threads = int(self.threads)
        return options

    def _providers(self) -> list:
        device = {"device_id": self.provider_options.get("device_id", 0)}
        if self.provider == "cuda":
            return [("CUDAExecutionProvider", self.provider_options), "CPUExecutionProvider"]
        if self.provider == "trt":
            return [("TensorrtExecutionProvider", self.provider_options), ("CUDAExecutionProvider", device),
                    "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def _check_fallback(self, used: list[str]) -> None:
        wanted = PROVIDERS[self.provider]
        if used and used[0] == wanted:
            return
        problem = provider_library_problem(self.provider)
        why = f"its library could not be loaded ({problem})" if problem else "it could not be initialised"
        raise EngineUnavailableError(
            f"{self.name}: onnxruntime silently fell back from {wanted} to {', '.join(used)}: {why}",
            f"refusing to report CPU numbers as GPU ones; {GPU_HINT}",
        )


class OrtCudaEngine(OrtEngine):
    """ONNX Runtime's CUDA execution provider (onnxruntime-gpu)."""

    name = "ort-cuda"
    label = "ONNX Runtime, CUDA execution provider (onnxruntime-gpu)"
    provider_default = "cuda"
    isolated_by_default = True


class OrtTrtEngine(OrtEngine):
    """ONNX Runtime's TensorRT execution provider (onnxruntime-gpu + TensorRT)."""

    name = "ort-trt"
    label = "ONNX Runtime, TensorRT execution provider (onnxruntime-gpu + TensorRT)"
    provider_default = "trt"
    isolated_by_default = True
    marks_all_cheaply = False


def _availability(provider: str) -> tuple[bool, str]:
    problem = _unavailable(provider)
    return (False, f"{problem[0]} -- {problem[1]}") if problem else (True, "")


class OrtSession(Session):
    def __init__(self, session, outputs: list[str], payload: ModelPayload):
        self._session = session
        self._payload = payload  # a >2 GB model's file stays until close(): ORT may map its weights
        self.outputs = outputs
        self._names = [o.name for o in session.get_outputs()]

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        stop = ort.RunOptions()  # Ctrl-C/SIGTERM mid-run: terminate the run instead of waiting for its end
        try:
            values = interruptibly(lambda: self._session.run(self._names, feeds, stop), "run",
                                   cancel=lambda: setattr(stop, "terminate", True))
        except Exception as e:
            raise _error("onnxruntime failed while running the model", e,
                         "check the feeds' names, shapes and dtypes against the model's inputs") from e
        return dict(zip(self._names, values))

    def close(self) -> None:
        self._session = None
        self._payload.close()


def _unavailable(provider: str) -> tuple[str, str] | None:
    """(problem, hint) when ``provider`` cannot run here, else None."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return f"onnxruntime cannot be imported ({e})", "pip install onnxruntime"
    if provider == "cpu":
        return None
    available = ort.get_available_providers()
    if PROVIDERS[provider] not in available:
        return (f"{PROVIDERS[provider]} is not among onnxruntime {ort.__version__}'s available providers "
                f"({', '.join(available)})", GPU_HINT)
    return None


def _error(what: str, exc: BaseException, hint: str) -> EngineRunError:
    """One-line EngineRunError from an ORT exception, naming the node when ORT does."""
    text = " ".join(str(exc).split())
    text = _strip_source_location(re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text))
    text = re.sub(r"^Load model from \S+ failed:\s*", "", text)  # a private graph file the user never saw
    match = re.search(r"[Nn]ode \(([^)]+)\)|[Nn]ame:\s*'([^']+)'|In Node, \(\"([^\"]+)\"|node ([^\s,]+) failed", text)
    node = next((g for g in match.groups() if g), None) if match else None
    where = f" at node {node}" if node else ""
    if "Type Error" in text or "does not match expected type" in text:  # the file contradicts itself
        hint = ("the model file is inconsistent: a node's declared type disagrees with what its inputs give (a "
                "converter bug, e.g. onnxconverter-common's float16 Casts on some models); check it with "
                "onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True), or convert it again "
                "(--cand ort:fp16 converts the FP32 model itself)")
    return EngineRunError(f"{what}{where}: {text[:400] or type(exc).__name__}", hint)


def _strip_source_location(text: str) -> str:
    """Drop ORT's "/src/file.cc:123 ns::Function(args...) " prefix, keeping the message."""
    if not re.match(r"^\S+\.(?:cc|cpp|h):\d+ ", text):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ")" and depth == 0:
            return text[i + 1:].strip()
    return text


def provider_library_problem(provider: str) -> str | None:
    """Why onnxruntime's provider library for ``provider`` cannot load (e.g. the missing libcudnn), or None."""
    import onnxruntime as ort

    capi = Path(ort.__file__).parent / "capi"
    libs = sorted(capi.glob(f"*{_PROVIDER_LIBS[provider]}*"))
    if not libs:
        return f"{_PROVIDER_LIBS[provider]} is not part of this onnxruntime package (the CPU-only wheel?)"
    try:
        for shared in capi.glob("*onnxruntime_providers_shared*"):
            ctypes.CDLL(str(shared), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        ctypes.CDLL(str(libs[0]))
    except OSError as e:
        return " ".join(str(e).split())
    return None


def installed_ort_distributions() -> list[str]:
    """Installed distributions that provide the ``onnxruntime`` module, with versions."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in _ORT_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return found


@functools.lru_cache(maxsize=1)
def warn_if_distributions_clash() -> bool:
    """Log (once) when several onnxruntime distributions share the module: the last installed one wins."""
    found = installed_ort_distributions()
    if len(found) > 1:
        log.warning("%s are all installed and share the `onnxruntime` module, so whichever was installed last "
                    "wins (often the CPU-only one): pip uninstall -y %s, then pip install the one you need",
                    " and ".join(found), " ".join(f.split("==")[0] for f in found))
        return True
    return False
