"""The torch.nn.Module itself, run eagerly (``torch`` on the CPU, ``torch-cuda`` on an NVIDIA GPU); its submodules'
outputs are mapped to the ONNX export's tensors.

The legacy exporter names nodes by module scope: submodule ``layer1.0.conv1`` becomes the node-name prefix
``/layer1/layer1.0/conv1/`` (each scope level is its unqualified name: the last non-numeric atom of the dotted
path and any numeric atoms after it). A submodule's output is the output of the last node under that prefix
whose shape matches; graph outputs are forward()'s outputs in order. Tensors that map nowhere are left out.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx

from ..errors import EngineRunError, EngineUnavailableError, InputError
from .base import Engine, Feeds, Session

log = logging.getLogger(__name__)


class TorchEngine(Engine):
    """Run ``module`` eagerly under ``torch.no_grad()`` in eval mode (the caller's train/eval flags are restored
    afterwards). ``example_inputs`` let ``prepare`` map tensors before the first run."""

    name = "torch"
    label = "the torch.nn.Module itself, run eagerly"
    variants = ("fp32",)
    #: runs the nn.Module itself (a comparison needs the module, not only its ONNX export)
    runs_module = True

    def __init__(self, module: Any, example_inputs: Any = None, variant: str = "fp32"):
        if variant not in self.variants:
            raise ValueError(f"the {self.name} engine has no {variant!r} variant (it runs {', '.join(self.variants)})")
        self.module = module
        self.example_inputs = example_inputs
        self.variant = variant
        self._mapped: tuple[int, int] | None = None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        try:
            import torch  # noqa: F401
        except ImportError as e:
            return False, f"torch is not installed ({e}) -- pip install onnx-drift-workbench[torch]"
        return True, ""

    def usable(self) -> tuple[bool, str]:
        """(can this instance run here, why not): the class's availability, or its device's."""
        return self.availability()

    def prepare(self, model: onnx.ModelProto, outputs: Sequence[str]) -> Session:
        ok, reason = self.usable()
        if not ok:
            raise EngineUnavailableError(*reason.split(" -- ", 1))
        session = TorchSession(self, model, list(dict.fromkeys(outputs)))
        if self.example_inputs is not None:
            args = self.example_inputs if isinstance(self.example_inputs, tuple) else (self.example_inputs,)
            session.map_with(args)
        return session

    def describe(self) -> dict:
        import torch

        mapped, wanted = self._mapped or (0, 0)
        return {"engine": self.name, "torch": torch.__version__, "module": type(self.module).__name__,
                "device": "cpu", "mapped_tensors": mapped, "requested_tensors": wanted}

    # --- how the module runs (TorchCudaEngine places it on a GPU, in a precision) ---------------------------
    def placed(self) -> Any:
        """Per-session state the module runs with (CUDA: its parameters on the device); None on the CPU."""
        return None

    def to_inputs(self, args: tuple) -> tuple:
        return args

    def call(self, placed: Any, args: tuple) -> Any:
        return self.module(*args)

    def hint(self, error: BaseException) -> str:
        """What to do when forward() failed with ``error``."""
        return "check that the feeds match forward()'s positional arguments"

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """The arithmetic settings of one forward pass (CUDA: TF32 on or off, autocast)."""
        yield


class TorchSession(Session):
    def __init__(self, engine: TorchEngine, model: onnx.ModelProto, outputs: list[str]):
        self._engine = engine
        self.outputs = outputs
        self._inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        self._graph_outputs = [o.name for o in model.graph.output]
        self._scoped = _scoped_tensors(model)
        self.mapping: dict[str, str | int] | None = None  # ONNX name -> module path, or index into forward()'s outputs
        self._placed = engine.placed()

    def close(self) -> None:
        self._placed = None

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        import torch

        missing = [n for n in self._inputs if n not in feeds]
        if missing:
            raise InputError(f"no feed for model input(s) {', '.join(missing)}",
                             f"feed {', '.join(self._inputs)} (they map to forward()'s positional arguments)")
        args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self._inputs)
        captured, result = self._forward(args)
        if self.mapping is None:
            self.mapping = self._map(captured, result)
        flat = _flatten(result)
        out = {}
        for name, where in self.mapping.items():
            if isinstance(where, int):
                value = flat[where] if where < len(flat) else None
            else:
                value = captured[where][1] if where in captured else None
            if value is not None:
                out[name] = value.detach().cpu().numpy()
        for name in self.outputs:
            if name in feeds and name not in out:
                out[name] = np.asarray(feeds[name])
        return out

    def map_with(self, args: tuple) -> None:
        captured, result = self._forward(args)
        self.mapping = self._map(captured, result)

    def _forward(self, args: tuple) -> tuple[dict[str, Any], Any]:
        import torch

        captured: dict[str, Any] = {}
        engine = self._engine
        module = engine.module
        args = engine.to_inputs(args)
        hooks = [sub.register_forward_hook(_recorder(path, captured))
                 for path, sub in module.named_modules() if path]
        try:
            with _eval_mode(module), torch.no_grad(), engine.numerics():
                result = engine.call(self._placed, args)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            raise EngineRunError(f"the torch module failed in forward(): {' '.join(str(e).split())[:300]}",
                                 engine.hint(e)) from e
        finally:
            for hook in hooks:
                hook.remove()
        return captured, result

    def _map(self, captured: dict[str, tuple[Any, Any]], result: Any) -> dict[str, str | int]:
        """Captured submodules (in the order of their last call) -> ONNX names. An outer module that lands on the
        same tensor as an inner one wins (it fires later); a module with no ONNX node of its own that consumed a
        mapped module's output (BatchNorm folded into Conv, eval-mode Dropout) takes over that module's name."""
        by_module: dict[str, str] = {}
        for path, (_, tensor) in captured.items():
            scoped = next((self._scoped[p] for p in scope_prefixes(path) if p in self._scoped), [])
            name = _last_matching(scoped, tuple(tensor.shape))
            if name is not None:
                by_module[path] = name
        leaves = {path for path, sub in self._engine.module.named_modules() if path and not any(sub.children())}
        mapping: dict[str, str | int] = {}
        producer = {}  # id of a module output tensor -> ONNX name it maps to
        for path, (inp, tensor) in captured.items():
            name = by_module.get(path)
            # only a leaf can be a no-op in the export: a container whose nodes did not map stays unmapped
            if name is None and path in leaves and inp is not None and id(inp) in producer \
                    and inp.shape == tensor.shape:
                name = producer[id(inp)]
            if name is not None:
                mapping[name] = path
                producer[id(tensor)] = name
        for i, name in enumerate(self._graph_outputs):
            if i < len(_flatten(result)):
                mapping[name] = i
        wanted = {n: mapping[n] for n in self.outputs if n in mapping}
        self._engine._mapped = (len(wanted), len(self.outputs))
        log.info("torch engine mapped %d of %d requested tensors to module outputs", len(wanted), len(self.outputs))
        return wanted


def scope_prefixes(path: str) -> list[str]:
    """The node-name prefixes submodule ``path`` may have, most likely first: :func:`scope_prefix` when every
    container on the path was called (Sequential), then with containers that were only indexed left out
    (a ModuleList iterated in forward(): ``layers.0.ln1`` -> ``/layers.0/ln1/``)."""
    atoms = path.split(".")
    levels = [_unqualified(atoms[:end]) for end in range(1, len(atoms) + 1)]
    optional = [i for i in range(len(levels) - 1) if levels[i + 1].startswith(levels[i] + ".")]
    out = []
    for mask in range(1 << len(optional)):
        drop = {optional[k] for k in range(len(optional)) if mask >> k & 1}
        out.append("/" + "/".join(lv for i, lv in enumerate(levels) if i not in drop) + "/")
    return list(dict.fromkeys(out))


def scope_prefix(path: str) -> str:
    """ONNX node-name prefix the legacy exporter gives submodule ``path``: ``layer1.0.conv1`` ->
    ``/layer1/layer1.0/conv1/``."""
    atoms = path.split(".")
    return "/" + "/".join(_unqualified(atoms[:end]) for end in range(1, len(atoms) + 1)) + "/"


def _unqualified(atoms: list[str]) -> str:
    """The exporter's name for one scope level: from the last non-numeric atom on (``head.1`` stays ``head.1``)."""
    start = len(atoms) - 1
    while start > 0 and atoms[start].isnumeric():
        start -= 1
    return ".".join(atoms[start:])


def _scoped_tensors(model: onnx.ModelProto) -> dict[str, list[tuple[str, tuple | None]]]:
    """Scope prefix -> [(first output name, static shape or None)] of its nodes in graph order."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):
        inferred = model
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    scoped: dict[str, list] = {}
    for node in model.graph.node:
        if not node.output or not node.output[0] or not node.name.startswith("/"):
            continue
        parts = node.name.split("/")[1:-1]
        for depth in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth]) + "/"
            scoped.setdefault(prefix, []).append((node.output[0], shapes.get(node.output[0])))
    return scoped


def _last_matching(candidates: list[tuple[str, tuple | None]], shape: tuple) -> str | None:
    for name, onnx_shape in reversed(candidates):
        if onnx_shape is not None and len(onnx_shape) == len(shape) and all(
                d is None or d == s for d, s in zip(onnx_shape, shape)):
            return name
    return None


def _recorder(path: str, captured: dict):
    def hook(_module, inputs, output):
        import torch

        if isinstance(output, torch.Tensor):
            first = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            captured.pop(path, None)  # a module called twice keeps its last call, like the last ONNX node
            captured[path] = (first, output)
    return hook


def _flatten(result: Any) -> list:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, (list, tuple)):
        return [t for item in result for t in _flatten(item)]
    return []


@contextlib.contextmanager
def _eval_mode(module) -> Iterator[None]:
    """eval() for the duration, then every submodule's own ``training`` flag back as it was."""
    flags = {sub: sub.training for sub in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for sub, training in flags.items():
            sub.training = training
