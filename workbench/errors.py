"""Exception types: each says what is wrong and what to do about it.

Every error the workbench raises on bad input derives from :class:`WorkbenchError`; the CLI turns
one into a single line on stderr and exit code 2.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class. ``str(err)`` is one line: the problem, then ``hint`` (what to do)."""

    default_hint = ""

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = self.default_hint if hint is None else hint
        super().__init__(f"{message} -- {self.hint}" if self.hint else message)


class ModelLoadError(WorkbenchError):
    """The model could not be loaded."""


class ModelNotFoundError(ModelLoadError):
    default_hint = "check the path"


class NotAModelFileError(ModelLoadError):
    """The path exists but is not a single ONNX file (a folder, an empty file, another format)."""


class ModelFormatError(ModelLoadError):
    """The bytes are not a valid ONNX ModelProto (truncated, corrupt, random)."""

    default_hint = "the file is damaged or not ONNX; re-export or re-download the model"


class ExternalDataError(ModelLoadError):
    """External data is missing, truncated or unreadable."""


class UnsafePathError(ExternalDataError):
    """An external-data location points outside the model's folder."""

    default_hint = (
        "external data must be a relative path inside the model's folder; "
        "re-save the model with onnx.save(..., save_as_external_data=True, location='weights.bin')"
    )


class OpsetTooNewError(ModelLoadError):
    """The model imports an opset newer than the installed onnx package knows."""


class TorchExportError(ModelLoadError):
    """Exporting a torch.nn.Module to ONNX failed."""


class SpecError(WorkbenchError):
    """An engine spec (``ENGINE[:VARIANT]``) is malformed or names an unknown engine or variant."""


class EngineUnavailableError(WorkbenchError):
    """The engine cannot run here (library missing, no GPU, silent CPU fallback detected)."""


class EngineRunError(WorkbenchError):
    """An engine rejected the model or failed while running it."""


class EngineCrashedError(EngineRunError):
    """An isolated engine worker died (segfault, out of memory) or hung past its timeout."""


class InputError(WorkbenchError):
    """Feeds do not fit the model: wrong names, shapes, dtypes, NaN values, unreadable files."""


class VariantError(WorkbenchError):
    """A precision variant (fp16, int8) could not be made from the model."""
