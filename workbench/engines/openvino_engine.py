"""OpenVINO adapter: the ONNX frontend, compiled with an explicit inference precision (f32 by default)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx

from ..errors import EngineRunError, EngineUnavailableError
from .base import Engine, Feeds, Session
from .interruptible import interruptibly
from .serialize import model_payload

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install onnx-drift-workbench[openvino]"


class OpenVinoEngine(Engine):
    """OpenVINO on ``device``. ``inference_precision`` is always passed: CPUs with AMX/AVX512-BF16 otherwise
    default to bf16, which would make the "fp32" baseline silently lossy."""

    name = "openvino"
    label = "OpenVINO, CPU plugin, f32 inference precision"
    reads_files = True
    marking_changes_outputs = True  # its graph transformations fuse across unmarked tensors

    def __init__(self, device: str = "CPU", inference_precision: str = "f32", config: dict | None = None):
        self.device = device
        self.inference_precision = inference_precision
        self.config = dict(config or {})
        self._actual_precision: str | None = None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        try:
            import openvino  # noqa: F401
        except ImportError as e:
            return False, f"openvino is not installed ({e}) -- {INSTALL_HINT}"
        return True, ""

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        ok, reason = self.availability()
        if not ok:
            raise EngineUnavailableError(*reason.split(" -- ", 1))
        import openvino as ov

        wanted = list(dict.fromkeys(outputs))
        payload = model_payload(model, wanted)
        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": self.inference_precision, **self.config}
        try:
            ov_model = core.read_model(payload.source) if payload.is_file else core.read_model(payload.source, b"")
            compiled = interruptibly(lambda: core.compile_model(ov_model, self.device, config), "openvino-compile")
        except Exception as e:
            raise EngineRunError(f"OpenVINO could not read or compile the model: {_one_line(e)}",
                                 "check that every op is supported by OpenVINO's ONNX frontend") from e
        finally:
            payload.close()
        self._actual_precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
        return OpenVinoSession(compiled, wanted)

    def describe(self) -> dict:
        import openvino as ov

        return {
            "engine": self.name,
            "openvino": ov.get_version(),
            "device": self.device,
            "inference_precision_hint": self.inference_precision,
            "inference_precision": self._actual_precision,
            "config": self.config,
        }


class OpenVinoSession(Session):
    def __init__(self, compiled, outputs: list[str]):
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.outputs = outputs
        self.ports = _map_ports(compiled, outputs)
        # OpenVINO drops Parameters it folded away (e.g. an input read only by Shape): feed only those kept
        self.inputs = {name for port in compiled.inputs for name in port.get_names()}

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            results = self._request.infer({k: v for k, v in feeds.items() if k in self.inputs})
        except Exception as e:
            raise EngineRunError(f"OpenVINO failed while running the model: {_one_line(e)}",
                                 "check the feeds' names, shapes and dtypes") from e
        return {name: np.array(results[port]) for name, port in self.ports.items()}

    def close(self) -> None:
        self._request = self._compiled = None


def _map_ports(compiled, wanted: list[str]) -> dict:
    """Requested tensor name -> compiled output port, by tensor names; by position when OpenVINO dropped names
    but kept one output per marked tensor; otherwise a clear error."""
    ports = {}
    for port in compiled.outputs:
        for name in port.get_names():
            ports.setdefault(name, port)
    missing = [n for n in wanted if n not in ports]
    if not missing:
        return {n: ports[n] for n in wanted}
    if len(compiled.outputs) == len(wanted):
        log.info("OpenVINO renamed %d marked tensors; mapping them by position", len(missing))
        return dict(zip(wanted, compiled.outputs))
    raise EngineRunError(
        f"OpenVINO has no output for marked tensor(s) {', '.join(missing[:5])} after compilation (fused or renamed)",
        "compare a neighbouring tensor, or mark fewer tensors",
    )


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:400]
