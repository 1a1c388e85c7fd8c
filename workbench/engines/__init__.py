"""Engines: ``get_engine("ort:fp16")`` builds an adapter; ``available_engines()`` says what can run here.

Adapters are imported on first use, and each imports its runtime (onnxruntime, openvino, torch, tensorrt) only
inside its methods, so importing this package stays light.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .base import Engine, Session
from .registry import class_for, is_dotted_path, registered
from .spec import EngineSpec

__all__ = ["Engine", "Session", "EngineSpec", "get_engine", "available_engines", "engine_class",
           "should_isolate", "is_dotted_path", "registered"]


def engine_class(name: str) -> tuple[type[Engine], dict[str, Any]]:
    """(adapter class, default options) for an engine name, a spec (``ort:fp16``) or ``package.module:Class``."""
    return class_for(EngineSpec.parse(str(name)).engine), {}


def get_engine(spec_or_name: str | EngineSpec, **options: Any) -> Engine:
    """Build the adapter for ``spec_or_name`` (``ort``, ``ort-cuda:fp16``, ``package.module:Class``); ``options``
    go to its constructor (e.g. ``get_engine("torch", module=net)``)."""
    cls, defaults = engine_class(str(spec_or_name))
    return cls(**{**defaults, **options})


def should_isolate(engine_name: str | EngineSpec) -> bool:
    """Whether an engine runs in a worker process by default (its class says so: TensorRT, ORT's GPU providers)."""
    return bool(engine_class(str(engine_name))[0].isolated_by_default)


def available_engines() -> list[dict]:
    """One entry per registered engine for UI pickers: ``{"name", "description", "available", "reason",
    "variants"}``."""
    rows = []
    for name in registered():
        try:
            cls = class_for(name)
        except SpecError as e:
            rows.append({"name": name, "description": "", "available": False, "reason": str(e), "variants": ()})
            continue
        available, reason = cls.availability()
        rows.append({"name": name, "description": cls.label, "available": available, "reason": reason,
                     "variants": tuple(cls.variants)})
    return rows
