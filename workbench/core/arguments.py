"""Argument checks of the public Python API, by parameter name: ``@checked`` on a function checks every argument
the caller passed whose name :data:`RULES` knows (``seed``, ``targets``, ``model``, ``dest``, ...; keyword options
passed through ``**kwargs`` too) and raises a :class:`TypeError` (wrong type) or :class:`ValueError` (right type,
wrong value) naming the function and the argument, before any work. Defaults and None (the API's "not given")
are not checked.

    @checked(result=CompareResult)        # extra rules for this function: a type means isinstance
    def save_bundle(result, model=None, feeds=None, dest=None, *, zip=False, ...): ...
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Rule = Callable[[str, Any], None]


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def whole(lo: int | None = None) -> Rule:
    """A whole number (an int, not a bool); at least ``lo`` when given (else the function checks the range, in
    its own words)."""
    def rule(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be a whole number (int), not {_kind(value)}")
        if lo is not None and value < lo:
            raise ValueError(f"{name} must be at least {lo}, not {value}")
    return rule


def number(name: str, value: Any) -> None:
    """A real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not {_kind(value)}")


def flag(name: str, value: Any) -> None:
    """True or False."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be True or False, not {_kind(value)}")


def texts() -> Rule:
    """A list (or tuple, set) of strings; one string is refused (it would be read letter by letter)."""
    def rule(name: str, value: Any) -> None:
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, set, frozenset)):
            raise TypeError(f"{name} must be a list of strings, not {_kind(value)}")
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            raise TypeError(f"{name} must hold strings only, not {_kind(bad[0])}")
    return rule


def one_of(*types: type, what: str = "") -> Rule:
    """An instance of one of ``types`` (``what`` describes them in the message)."""
    def rule(name: str, value: Any) -> None:
        if not isinstance(value, types):
            described = what or " or ".join(t.__name__ for t in types)
            raise TypeError(f"{name} must be {described}, not {_kind(value)}")
    return rule


def path(*, also: tuple[type, ...] = ()) -> Rule:
    """A file system path (str or os.PathLike), not empty."""
    def rule(name: str, value: Any) -> None:
        if also and isinstance(value, also):
            return
        if not isinstance(value, (str, os.PathLike)):
            extra = "".join(f" or a {t.__name__}" for t in also)
            raise TypeError(f"{name} must be a path (str or os.PathLike){extra}, not {_kind(value)}")
        if not os.fspath(value):
            raise ValueError(f"{name} is an empty path")
    return rule


def model_source(name: str, value: Any) -> None:
    """What load_model takes: a path, bytes, an onnx.ModelProto, a LoadedModel or a torch.nn.Module (None: the
    function's default, where it has one)."""
    if value is None:
        return
    if isinstance(value, (bool, numbers.Number, Mapping, list, tuple, set)):
        raise TypeError(f"{name} must be a path to an .onnx file, bytes, an onnx.ModelProto, a LoadedModel or a "
                        f"torch.nn.Module, not {_kind(value)}")
    if isinstance(value, (str, os.PathLike)) and not os.fspath(value):
        raise ValueError(f"{name} is an empty path")


def _spec(name: str, value: Any) -> None:
    if not isinstance(value, str) and type(value).__name__ != "EngineSpec":
        raise TypeError(f"{name} must be an engine spec such as 'ort:fp16', not {_kind(value)}")


def _callable(name: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be a function, not {_kind(value)}")


def _code(name: str, value: Any) -> None:
    if not isinstance(value, str) and not callable(value):
        raise TypeError(f"{name} must be 'module:function', 'file.py:function' or a function, not {_kind(value)}")


def _criterion(name: str, value: Any) -> None:
    if not isinstance(value, str) and type(value).__name__ != "Criterion":
        raise TypeError(f"{name} must be a criterion such as 'sqnr_db<30', not {_kind(value)}")


def _event(name: str, value: Any) -> None:
    if not callable(getattr(value, "is_set", None)):
        raise TypeError(f"{name} must be a threading.Event, not {_kind(value)}")


def _size(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise TypeError(f"{name} must be a size such as '512M' or a number of bytes, not {_kind(value)}")


def _shapes(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        texts()(name, value)


#: parameter name -> rule, for every function marked @checked
RULES: dict[str, Rule] = {
    "model": model_source, "source": model_source, "cand_model": model_source,
    "reference": _spec, "candidate": _spec, "engine": _spec,
    "seed": whole(0), **{name: whole() for name in (
        "feed_count", "max_builds", "max_pool", "max_nodes", "top_k", "num_bins", "ort_entropy_bins", "workers",
        "runs", "warmup", "calibration_count", "worst", "max_culprits", "impact", "threads")},
    "timeout_s": number, "percentile": number,
    "targets": texts(), "keep_fp32": texts(), "nodes": texts(), "methods": texts(),
    "outputs": texts(), "allow_engines": texts(),
    "dest": path(), "out": path(), "base_dir": path(),
    "memory_budget": _size, "input_shapes": _shapes,
    "criterion": _criterion,
    "method": one_of(str), "mode": one_of(str), "batch": one_of(str),
    "node": one_of(str), "command": one_of(str), "verify": one_of(str), "optimization": one_of(str),
    "preprocess": _code, "progress": _callable, "cancel": _event,
    **{name: flag for name in ("probe", "sweep", "zip", "overwrite", "copy_model", "include_data", "layers",
                               "trust_unsealed", "culprits", "fail_on_internal_dips", "inline_branches",
                               "allow_newer_opset")},
}


class BadArgumentType(TypeError):
    """A caller passed an argument of the wrong kind (named by function and argument): the user's mistake, not
    an internal error (the notebook shows it as one plain line)."""

    user_error = True


class BadArgumentValue(ValueError):
    """A caller passed an argument out of range (see :class:`BadArgumentType`)."""

    user_error = True


def checked(**extra: Rule | type | tuple[type, ...]) -> Callable:
    """Decorator: check the arguments a call passes by their names (:data:`RULES`, plus ``extra``: a rule, or a
    type / tuple of types the value must be an instance of)."""
    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        rules = {**RULES, **{k: (v if callable(v) and not isinstance(v, type) else one_of(
            *(v if isinstance(v, tuple) else (v,)))) for k, v in extra.items()}}
        varkw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # Python's own message for a missing or unknown argument
            given = dict(bound.arguments)
            given.update(given.pop(varkw, None) or {})
            for name, value in given.items():
                rule = rules.get(name)
                param = sig.parameters.get(name)
                if rule is not None and value is None and param is not None and param.default is param.empty:
                    raise BadArgumentType(f"{fn.__name__}(): {name} is required, not None")
                if rule is None or value is None:  # None: "not given" throughout the API (the function decides)
                    continue
                try:
                    rule(name, value)
                except (TypeError, ValueError) as e:
                    bad = BadArgumentType if isinstance(e, TypeError) else BadArgumentValue
                    raise bad(f"{fn.__name__}(): {e}") from None
            return fn(*args, **kwargs)

        return call

    return wrap
