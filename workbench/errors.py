"""Exception types: each says what is wrong and what to do about it.

Every error the workbench raises on purpose derives from :class:`WorkbenchError`; the CLI turns one into a
single line on stderr and its ``exit_code``: 2 for a user-caused problem (bad model, inputs, options, output
location), 3 for :class:`EngineCrashedError` (an engine died: not the user's fault). :class:`Cancelled` is not
an error: the user stopped the job (CLI exit 130).
"""

from __future__ import annotations

import errno

#: exit codes of the CLI (see the module docstring)
EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_CANCELLED = 2, 3, 130


class WorkbenchError(Exception):
    """Base class. ``str(err)`` is one line: the problem, then ``hint`` (what to do)."""

    default_hint = ""
    exit_code = EXIT_BAD_INPUT

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


class ModelStructureError(ModelLoadError):
    """The graph cannot run on any engine: a cycle, or a tensor produced twice."""

    default_hint = "fix the exporter or the graph edit that made it; onnx.checker.check_model names the problem too"


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
    """An isolated engine worker died (segfault, out of memory) or hung past its timeout. Still an
    :class:`EngineRunError` (callers that fall back when an engine fails keep doing so), but not bad input:
    the CLI exits 3 and names the engine (``engine``: its label)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None, *, engine: str | None = None):
        self.engine = engine
        super().__init__(message, hint)


class InputError(WorkbenchError):
    """Feeds do not fit the model: wrong names, shapes, dtypes, NaN values, unreadable files."""


class VariantError(WorkbenchError):
    """A precision variant (fp16, int8) could not be made from the model."""


class Cancelled(Exception):
    """The user cancelled a long-running job: not an error and not bad input, so ``except WorkbenchError``
    fall-backs never swallow it (the CLI exits 130, a panel says "cancelled")."""

    exit_code = EXIT_CANCELLED
    default_hint = "run it again when ready"

    def __init__(self, message: str = "cancelled", hint: str | None = None):
        self.message = message
        self.hint = self.default_hint if hint is None else hint
        super().__init__(message)


#: OS errors a user's path or disk causes (not a bug of ours), with what to do: the CLI and the notebook say them in
#: one line
USER_ERRNOS = {
    errno.ENOSPC: "free disk space or write somewhere else", errno.EDQUOT: "free space in your quota",
    errno.EFBIG: "write somewhere that takes files this large", errno.EROFS: "write to a writable file system",
    errno.EACCES: "check the permissions or write somewhere else", errno.EPERM: "check the permissions",
    errno.EISDIR: "name a file, not a folder", errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a part of the path already exists as a file", errno.ENAMETOOLONG: "use a shorter path",
    errno.ELOOP: "the path has a symbolic link loop", errno.ENOENT: "check the path",
}


def os_error_text(exc: BaseException, writing: str | None = None) -> str | None:
    """One line for an OSError a user's path or disk caused (``USER_ERRNOS``), naming the path (the output a
    temporary of ours stands for), or ``writing``: the output being written, when the caller knows it better (a
    full disk); None for any other exception."""
    if not isinstance(exc, OSError) or exc.errno not in USER_ERRNOS:
        return None
    from ._atomic import shown_path

    where = f" writing {writing}" if writing else f": {shown_path(exc.filename)}" if exc.filename else ""
    return f"{exc.strerror or exc}{where} -- {USER_ERRNOS[exc.errno]}"
