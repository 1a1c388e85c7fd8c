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
    """One runtime. Adapters live beside this module; :func:`workbench.engines.get_engine` builds them."""

    name: str = ""
    #: True where marking every tensor as an output is cheap and does not change the computation
    #: (ORT, OpenVINO, ref); False for TensorRT, whose fusions change (layer-wise search bisects there).
    marks_all_cheaply: bool = True

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(can it run here, why not)."""
        return True, ""

    @abstractmethod
    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        """Build a session on ``model`` (never modified) that returns the tensors named in ``outputs``
        (graph outputs or intermediate tensors)."""

    @abstractmethod
    def describe(self) -> dict:
        """Versions, device, providers actually used: what a colleague needs to reproduce a run."""
