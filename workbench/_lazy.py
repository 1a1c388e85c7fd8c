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
