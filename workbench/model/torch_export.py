"""Export a torch.nn.Module to ONNX (in a private temporary folder) and load the result."""

from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.scratch import temporary_dir
from ..errors import TorchExportError

log = logging.getLogger(__name__)

EXPORTERS = ("legacy", "dynamo")


@dataclass
class ExportInfo:
    """How a module became ONNX: which exporter, the opset asked for and the one obtained."""

    exporter: str
    requested_opset: int
    actual_opset: int
    torch_version: str
    dynamic_axes: dict | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def export_module(
    module: Any, example_inputs: Any, *, opset: int = 17, dynamic_axes: dict | None = None,
    input_names: list[str] | None = None, output_names: list[str] | None = None, exporter: str = "legacy",
):
    """Export ``module`` with ``example_inputs`` (a tensor or a tuple of them) and return a LoadedModel.

    "legacy" (TorchScript) honours ``opset``; "dynamo" (torch.export) may pick another opset: the opset
    actually obtained is recorded in ``LoadedModel.export`` and logged when it differs.
    """
    import torch

    from .load import load_model

    if exporter not in EXPORTERS:
        raise TorchExportError(f"unknown exporter {exporter!r}", f"use one of {', '.join(EXPORTERS)}")
    if example_inputs is None:
        raise TorchExportError("a torch.nn.Module needs example inputs to be exported",
                               "pass example_inputs=(tensor, ...) matching forward()'s arguments")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    caught: list[str] = []
    with temporary_dir("workbench-export-") as tmp:
        out = Path(tmp) / "model.onnx"
        try:
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                if exporter == "legacy":
                    torch.onnx.export(
                        module, args, str(out), opset_version=opset, dynamo=False, input_names=input_names,
                        output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True,
                    )
                else:
                    program = torch.onnx.export(
                        module, args, dynamo=True, opset_version=opset, input_names=input_names,
                        output_names=output_names, dynamic_axes=dynamic_axes, report=False,
                        artifacts_dir=tmp,
                    )
                    program.save(str(out))
            caught = sorted({str(w.message).splitlines()[0] for w in ws})
        except Exception as e:  # noqa: BLE001 - any exporter failure becomes one clear error
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TorchExportError(
                f"torch.onnx.export ({exporter} exporter) failed: {first}",
                "check that example_inputs match forward(); try exporter='dynamo' or 'legacy'",
            ) from e
        loaded = load_model(out)
        loaded.proto.graph.name = loaded.proto.graph.name or type(module).__name__
    from .walk import opset_imports

    actual = opset_imports(loaded.proto).get("ai.onnx", 0)
    if actual != opset:
        log.warning("%s exporter produced opset %d although opset %d was requested", exporter, actual, opset)
    loaded.source, loaded.path, loaded.external_files = "torch", None, []
    loaded.export = ExportInfo(exporter, opset, actual, torch.__version__, dynamic_axes, caught)
    return loaded
