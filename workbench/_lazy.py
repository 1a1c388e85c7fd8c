"""Lazy package attributes: ``name -> module`` imported on first access, so importing a package stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, mapping: dict[str, str], extra: tuple[str, ...] = ()) -> tuple[Callable, Callable, list]:
    """``(__getattr__, __dir__, __all__)`` for a package whose public names live in ``mapping``'s modules."""
    names = sorted([*extra, *mapping])

    def __getattr__(name: str):
        if name in mapping:
            return getattr(importlib.import_module(mapping[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return names

    return __getattr__, __dir__, names


def callable_package(package: str, module: str, function: str) -> None:
    """Make the imported package ``package`` callable: calling it runs ``module.function`` (so that
    ``from workbench import compare; compare(...)`` works although ``workbench.compare`` is a package)."""
    import sys
    import types

    class _CallablePackage(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return self.__wrapped__(*args, **kwargs)

        @property
        def __wrapped__(self):  # the function (inspect.signature, help and argument checks see it)
            return getattr(importlib.import_module(module), function)

    sys.modules[package].__class__ = _CallablePackage
