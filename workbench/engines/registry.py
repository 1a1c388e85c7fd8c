"""The one engine registry: spec name -> ``module:Class``. An engine describes itself (name, label, variants,
isolation, marking) with class attributes on its class (:class:`~workbench.engines.base.Engine`); adding one
is one file plus one line here, or, from another package, an entry point in the ``workbench.engines`` group
(``myengine = "mypkg.engine:MyEngine"``). ``package.module:Class[:VARIANT]`` specs work without registering."""

from __future__ import annotations

import functools
import importlib
import logging

from ..errors import SpecError

log = logging.getLogger(__name__)

BUILTIN: dict[str, str] = {
    "ort": "workbench.engines.ort:OrtEngine",
    "ort-cuda": "workbench.engines.ort:OrtCudaEngine",
    "ort-trt": "workbench.engines.ort:OrtTrtEngine",
    "openvino": "workbench.engines.openvino_engine:OpenVinoEngine",
    "ref": "workbench.engines.reference:ReferenceEngine",
    "torch": "workbench.engines.torch_engine:TorchEngine",
    "torch-cuda": "workbench.engines.torch_cuda:TorchCudaEngine",
    "trt": "workbench.engines.tensorrt:TensorRTEngine",
}
ENTRY_POINT_GROUP = "workbench.engines"


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, str]:
    """Every registered engine name -> ``module:Class``: the built-in ones, then entry points (which cannot
    shadow a built-in name)."""
    from importlib.metadata import entry_points

    found = dict(BUILTIN)
    try:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in found:
                log.warning("engine entry point %s (%s) ignored: the name is taken", ep.name, ep.value)
                continue
            found[ep.name] = ep.value
    except Exception as e:  # noqa: BLE001 - a broken third-party distribution must not break the built-ins
        log.warning("engine entry points could not be read: %s", e)
    return found


def is_dotted_path(name: str) -> bool:
    """``package.module:Class`` or ``module:Class`` (optionally ``:VARIANT`` after it), as opposed to a registered
    name with a variant such as ``ort:fp16``."""
    module, sep, rest = name.partition(":")
    attr = rest.partition(":")[0]
    return bool(sep and attr and module not in registered() and ("." in module or attr[:1].isupper()))


def load_class(target: str) -> type:
    """The Engine subclass at ``module:Class``."""
    from .base import Engine

    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise SpecError(f"cannot load engine class {target!r}: {e}", "use package.module:Class") from e
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise SpecError(f"{target!r} is not a workbench.engines.base.Engine subclass", "use package.module:Class")
    return cls


def class_for(engine: str) -> type:
    """The class for a registered engine name or a ``module:Class`` path."""
    target = registered().get(engine)
    if target is None:
        if not is_dotted_path(engine):
            raise SpecError(f"unknown engine {engine!r}",
                            f"use one of {', '.join(registered())} or package.module:Class")
        target = engine
    return load_class(target)
