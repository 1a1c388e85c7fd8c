"""The command line's output options, marked in the parser and checked from it: every option whose argparse
``type`` is an :class:`OutputOption` is checked before any work starts (``'-'``, name lengths, destination), and a
write that fails for lack of space is reported against the output being written.

``'-'`` means standard output only where the option says so (``--json -``: the JSON, and no summary); any other
output refuses it in one line rather than writing a file called ``-``.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
from collections.abc import Iterator

from .core.paths import Output, check_outputs

#: errors of a write that ran out of room: reported against the output being written
SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: a file system with less free space than this counts as full (an error without a file name)
_NEARLY_FULL = 1024**2


class OutputOption:
    """argparse ``type`` of an output option. ``kind``: as :class:`~workbench.core.paths.Output` ("file", "new":
    must not exist, "folder"); ``stdout``: ``'-'`` writes to standard output."""

    def __init__(self, kind: str = "file", *, stdout: bool = False):
        self.kind, self.stdout = kind, stdout
        self.__name__ = "output path"  # argparse names the type in its messages

    def __call__(self, text: str) -> str:
        if text == "-" and not self.stdout:
            raise argparse.ArgumentTypeError("'-' (standard output) takes only the JSON (--json -): name a file")
        if not text:
            raise argparse.ArgumentTypeError("the path is empty: name a file")
        return text


def output_actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action, OutputOption]]:
    """``(command, action, OutputOption)`` for every output option of every subcommand of ``parser``."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions there, publicly documented or not
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for command, sub in action.choices.items():
                for option in sub._actions:  # noqa: SLF001
                    if isinstance(option.type, OutputOption):
                        yield command, option, option.type


def given_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Output]:
    """The output paths ``args`` names, as :class:`Output` (``'-'`` and unset options left out)."""
    found = []
    for command, action, kind in output_actions(parser):
        value = getattr(args, action.dest, None)
        if command == getattr(args, "command", None) and isinstance(value, str) and value != "-":
            found.append(Output(action.option_strings[0], value, kind.kind))
    return found


def check_given_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every output option of the command, checked before the command starts (each command then checks its
    outputs against its inputs, and the files it derives from them)."""
    check_outputs(given_outputs(parser, args))


def space_error_destination(error: OSError, parser: argparse.ArgumentParser, args: argparse.Namespace | None) -> str:
    """The output a write that ran out of room was writing ('--report r.html'), or '' when none matches: the one
    whose path (or our temporary beside it) the error names, else the given outputs on a full file system."""
    outs = given_outputs(parser, args) if args is not None else []
    if not outs:
        return ""
    named = [os.path.abspath(os.fspath(f)) for f in (error.filename, error.filename2) if f]
    for out in outs:
        dest = os.path.abspath(os.fspath(out.path))
        name = os.path.basename(dest)
        for f in named:
            first = os.path.relpath(f, os.path.dirname(dest)).split(os.sep)[0]
            if first == name or first.startswith("." + name[:40]):  # the output, inside it, or our temporary
                return f"{out.option} {out.path}"
    if named:
        return ""
    full = [o for o in outs if _free(o.path) < _NEARLY_FULL]
    return " or ".join(f"{o.option} {o.path}" for o in (full or outs))


def _existing_folder(path: str) -> str:
    """``path``'s nearest folder that exists (itself, when it is one)."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def _free(path: str) -> float:
    try:
        return shutil.disk_usage(_existing_folder(path)).free
    except OSError:
        return float("inf")


def scratch_out_of_space(error: OSError, parser: argparse.ArgumentParser, args: argparse.Namespace | None
                         ) -> str | None:
    """The temporary folder holding this run's scratch (model copies, weight files), when a write that ran out of
    room was there rather than at an output: the file the error names is in this run's scratch, or it names none
    while no output shares the temporary folder's file system or has little room left. Else None."""
    import tempfile

    from .core.scratch import RUN_PREFIX

    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    base = os.path.abspath(tempfile.gettempdir())
    if os.path.basename(base).startswith(RUN_PREFIX):  # the run's own folder stands in for the temp folder
        base = os.path.dirname(base)
    named = [os.path.abspath(os.fspath(f)) for f in (error.filename, error.filename2) if f]
    if named:
        runs = [f for f in named if os.path.commonpath([base, f]) == base
                and os.path.relpath(f, base).split(os.sep)[0].startswith(RUN_PREFIX)]
        return base if runs else None
    outs = given_outputs(parser, args) if args is not None else []
    device = _device(base)
    if any(_device(o.path) == device or _free(o.path) < _LITTLE_ROOM for o in outs):
        return None  # the output's disk may be the full one: the output is named
    return base


#: an output's file system with less free space than this may be the one a write ran out of
_LITTLE_ROOM = 64 * 1024**2


def _device(path: str) -> int | None:
    try:
        return os.stat(_existing_folder(path)).st_dev
    except OSError:
        return None
