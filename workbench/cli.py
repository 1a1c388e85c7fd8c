"""Command line: ``workbench inspect|...``. Bad input gives one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .errors import WorkbenchError

log = logging.getLogger("workbench")

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class UsageError(WorkbenchError):
    """Wrong command-line usage."""

    default_hint = "see `workbench --help`"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + error
        raise UsageError(f"{self.prog}: {message}")


def _write_json(doc: dict, dest: str) -> None:
    text = json.dumps(doc, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        return
    from ._atomic import atomic_write_text

    atomic_write_text(dest, text)
    log.info("wrote %s", dest)


def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspection import inspect_model
    from .inspection_text import render

    result = inspect_model(args.model, targets=args.targets or None, probe=not args.no_probe)
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(render(result))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Find where and why an ONNX model drifts between engines.")
    parser.add_argument("--version", action="version", version=f"onnx-drift-workbench {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("inspect", help="graph, opset inventory, problems and runtime compatibility of a model")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", metavar="OUT", help="write the workbench.inspect/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--targets", nargs="+", metavar="TARGET",
                   help="runtimes to check against, e.g. trt-10 trt-8.6 ort-1.20 openvino (default: a handful)")
    p.add_argument("--no-probe", action="store_true", help="do not build a real ONNX Runtime session")
    p.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    parser = build_parser()
    debug = False
    try:
        args = parser.parse_args(argv)
        debug = args.debug
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        if not args.command:
            parser.print_help()
            return EXIT_BAD_INPUT
        return args.func(args)
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI never shows a raw traceback unless asked
        if debug:
            raise
        print(f"workbench: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(rerun with --debug for the traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL
