"""Command line: ``workbench inspect|...``. Bad input gives one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
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


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare.api import compare
    from .compare.text import render
    from .inputs import parse_range_overrides, parse_shape_overrides

    result = compare(
        args.model, args.ref, args.cand, feeds=args.inputs, cand_model=args.cand_model, mode=args.mode,
        criterion=args.criterion, memory_budget=args.memory_budget, seed=args.seed, feed_count=args.feeds,
        input_shapes=parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
        val_ranges=parse_range_overrides(args.val_range) if args.val_range else None,
        keep_fp32=args.keep_fp32 or (), calibration_feeds=args.calib, culprits=not args.no_culprits,
        isolate={"auto": None, "yes": True, "no": False}[args.isolate], timeout_s=args.timeout,
        progress=_progress_logger() if args.verbose else None,
    )
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(render(result))
    return EXIT_DIVERGED if result.diverged else EXIT_OK


def _progress_logger():
    last = [-1]

    def report(fraction: float, message: str) -> None:
        step = int(fraction * 10)
        if step != last[0]:
            last[0] = step
            log.info("%3d%% %s", int(fraction * 100), message)

    return report


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

    p = sub.add_parser("compare", help="layer-wise comparison of two engines/precisions: first divergent layer, "
                       "culprit nodes")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--ref", default="ort", metavar="SPEC", help="reference ENGINE[:VARIANT] (default: ort)")
    p.add_argument("--cand", default="ort:fp16", metavar="SPEC", help="candidate ENGINE[:VARIANT] (default: ort:fp16)")
    p.add_argument("--cand-model", metavar="OTHER.onnx", help="run the candidate on this file (your own FP16/QDQ "
                   "export); tensors are matched by name")
    p.add_argument("--inputs", metavar="FILE", help=".npz, folder of .npz, or Polygraphy inputs JSON "
                   "(default: seeded random feeds)")
    p.add_argument("--input-shapes", nargs="+", metavar="NAME:[d,...]", help="shapes for dynamic inputs")
    p.add_argument("--val-range", nargs="+", metavar="NAME:[lo,hi]", help="value ranges for random inputs")
    p.add_argument("--seed", type=int, default=0, help="seed for random feeds (default 0)")
    p.add_argument("--feeds", type=int, default=1, metavar="N", help="number of random feeds (default 1)")
    p.add_argument("--calib", metavar="FILE", help="calibration data for :int8 (default: the comparison feeds)")
    p.add_argument("--keep-fp32", nargs="+", metavar="NODE", help="nodes the fp16/int8 variant keeps in float32")
    p.add_argument("--mode", choices=["auto", "all", "bisect"], default="auto",
                   help="all: mark every tensor (chunked); bisect: one extra tensor per build; auto: all unless "
                   "the candidate is TensorRT")
    p.add_argument("--memory-budget", metavar="SIZE", help="peak memory for marked tensors, e.g. 512M, 2G "
                   "(default: a quarter of RAM, at most 4G)")
    p.add_argument("--criterion", metavar="METRIC<VALUE", help="when a tensor diverges, e.g. sqnr_db<30, "
                   "norm_mean_abs>0.1 (default per candidate precision)")
    p.add_argument("--no-culprits", action="store_true", help="skip running nodes alone (faster)")
    p.add_argument("--isolate", choices=["auto", "yes", "no"], default="auto",
                   help="run engines in a worker process (auto: TensorRT and GPU providers)")
    p.add_argument("--timeout", type=float, metavar="S", help="worker timeout in seconds (isolated engines)")
    p.add_argument("--json", metavar="OUT", help="write the workbench.compare/1 JSON to OUT ('-' for stdout)")
    p.set_defaults(func=cmd_compare)
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
        if not args.verbose:  # onnxruntime.quantization warns per tensor on the root logger: keep it for -v
            for handler in logging.getLogger().handlers:
                handler.addFilter(lambda r: not (r.name == "root" and "onnxruntime" in r.pathname))
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
    except BrokenPipeError:  # output piped into `head`: stop quietly
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown from writing again
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - the CLI never shows a raw traceback unless asked
        if debug:
            raise
        print(f"workbench: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(rerun with --debug for the traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL
