"""The engine protocol: prepare a model with some tensors marked as outputs, run feeds, describe itself."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import onnx

Feeds = dict[str, np.ndarray]


class Session(ABC):
    """A prepared model. ``run`` returns the requested tensors by name."""

    outputs: list[str]

    @abstractmethod
    def run(self, feeds: Feeds) -> dict[str, np.ndarray]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release engine resources."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Engine(ABC):
    """One runtime. An engine describes itself with class attributes, so adding one is one file (the class)
    plus one line in :data:`workbench.engines.registry.BUILTIN` (or an entry point in the ``workbench.engines``
    group, for a third-party package)."""

    #: the name users type in a spec (``ort``, ``openvino``, ...)
    name: str = ""
    #: one line for pickers and ``--help``
    label: str = ""
    #: precision variants this engine can run (``fp32``, ``fp16``, ``int8``)
    variants: tuple[str, ...] = ("fp32", "fp16", "int8")
    #: native code that may crash or hang the caller: run it in a worker process by default
    isolated_by_default: bool = False
    #: True where marking every tensor as an output is cheap (ORT, OpenVINO, ref); False for TensorRT, whose
    #: fusions change (layer-wise search bisects there).
    marks_all_cheaply: bool = True
    #: True where marking intermediate tensors may change the graph outputs themselves: an optimizing runtime
    #: keeps an unmarked intermediate in higher precision (ORT's CPU provider removes FP16 Cast pairs) or fuses
    #: across it (Q/DQ into QLinear kernels, TensorRT's fusions); where such outputs fail, the layer-wise
    #: comparison runs them once more unmarked and says when they pass there (``compare.strategies.run_all``)
    marking_changes_outputs: bool = False
    #: builds sessions from model files (through :func:`workbench.engines.serialize.model_payload`), so a plan
    #: writes the weights once (:mod:`workbench.engines.files`) and every session maps them
    reads_files: bool = False

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(can it run here, why not)."""
        return True, ""

    @abstractmethod
    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        """Build a session on ``model`` that returns the tensors named in ``outputs`` (graph outputs or
        intermediate tensors). ``model`` must be neither modified nor kept: callers may edit it in place right
        after this returns (copy it if the session needs it later)."""

    @abstractmethod
    def describe(self) -> dict:
        """Versions, device, providers actually used: what a colleague needs to reproduce a run."""
