"""Engines: ``get_engine("ort:fp16")`` builds an adapter; ``available_engines()`` says what can run here.

Adapters are imported on first use, and each imports its runtime (onnxruntime, openvino, torch, tensorrt) only
inside its methods, so importing this package stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import SpecError
from .base import Engine, Session
from .spec import ENGINES, EngineSpec

__all__ = ["Engine", "Session", "EngineSpec", "get_engine", "available_engines", "engine_class", "should_isolate"]

#: engine name -> ("module:Class", default constructor options)
REGISTRY: dict[str, tuple[str, dict[str, Any]]] = {
    "ort": ("workbench.engines.ort:OrtEngine", {"provider": "cpu"}),
    "ort-cuda": ("workbench.engines.ort:OrtEngine", {"provider": "cuda"}),
    "ort-trt": ("workbench.engines.ort:OrtEngine", {"provider": "trt"}),
    "openvino": ("workbench.engines.openvino_engine:OpenVinoEngine", {}),
    "ref": ("workbench.engines.reference:ReferenceEngine", {}),
    "torch": ("workbench.engines.torch_engine:TorchEngine", {}),
    "trt": ("workbench.engines.tensorrt:TensorRTEngine", {}),
}
#: engines whose native code can crash or hang the process: run them in a worker (see workbench.engines.isolated)
ISOLATED_BY_DEFAULT = frozenset({"trt", "ort-cuda", "ort-trt"})


def is_dotted_path(name: str) -> bool:
    """``package.module:Class`` or ``module:Class``, as opposed to a spec such as ``ort:fp16``."""
    module, sep, attr = name.partition(":")
    return bool(sep and attr and module not in ENGINES and ("." in module or attr[0].isupper()))


def engine_class(name: str) -> tuple[type[Engine], dict[str, Any]]:
    """(adapter class, default options) for an engine name, a spec (``ort:fp16``) or ``package.module:Class``."""
    if is_dotted_path(name):
        target, defaults = name, {}
    else:
        target, defaults = REGISTRY[EngineSpec.parse(name).engine]
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"cannot load engine class {target!r}: {e}", "use package.module:Class") from e
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise SpecError(f"{target!r} is not a workbench.engines.base.Engine subclass", "use package.module:Class")
    return cls, dict(defaults)


def get_engine(spec_or_name: str | EngineSpec, **options: Any) -> Engine:
    """Build the adapter for ``spec_or_name`` (``ort``, ``ort-cuda:fp16``, ``package.module:Class``); ``options``
    go to its constructor over the registry's defaults (e.g. ``get_engine("torch", module=net)``)."""
    cls, defaults = engine_class(str(spec_or_name))
    return cls(**{**defaults, **options})


def should_isolate(engine_name: str | EngineSpec) -> bool:
    """Whether an engine runs in a worker process by default (TensorRT and ORT's GPU providers)."""
    name = str(engine_name)
    return not is_dotted_path(name) and EngineSpec.parse(name).engine in ISOLATED_BY_DEFAULT


def available_engines() -> list[dict]:
    """One entry per engine for UI pickers: ``{"name", "description", "available", "reason"}``."""
    rows = []
    for name, description in ENGINES.items():
        cls, defaults = engine_class(name)
        provider = {"provider": defaults["provider"]} if "provider" in defaults else {}
        available, reason = cls.availability(**provider)
        rows.append({"name": name, "description": description, "available": available, "reason": reason})
    return rows
