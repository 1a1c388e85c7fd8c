"""Command line: ``workbench inspect|...``. Bad input gives one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shlex
import sys
from collections.abc import Sequence

from . import __version__
from .core.paths import Output, check_outputs
from .errors import Cancelled, InputError, WorkbenchError
from .output_options import (
    SPACE_ERRNOS,
    OutputOption,
    check_given_outputs,
    scratch_out_of_space,
    space_error_destination,
)
from .textfmt import printable, printable_lines

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
        from ._stdout import json_stream

        stream = json_stream()  # the real stdout: user code's prints go to stderr meanwhile (see main)
        stream.write(text)
        stream.flush()
        return
    from ._atomic import atomic_write_text

    atomic_write_text(dest, text)
    log.info("wrote %s", dest)


def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspection import inspect_model
    from .inspection_text import render

    if args.engine or args.layer_info:
        return _inspect_engine(args)
    engine_only = [o for o, v in (("--input-shapes", args.input_shapes), ("--inputs", args.inputs),
                                  ("--optimization", args.optimization), ("--threads", args.threads),
                                  ("--layer-profile", args.layer_profile), ("--layer-times", args.layer_times),
                                  ("--ort-trace", args.ort_trace), ("--trt-subgraphs", args.trt_subgraphs),
                                  ("--report", args.report)) if v]
    if engine_only:
        verb = "only works" if len(engine_only) == 1 else "only work"
        raise UsageError(f"{', '.join(engine_only)} {verb} with --engine SPEC (or --layer-info): they look inside "
                         "engines")
    check_outputs([Output("--json", args.json)], models={"MODEL": args.model})
    result = inspect_model(args.model, targets=args.targets or None, probe=not args.no_probe)
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(render(result)))
    return EXIT_OK


def _inspect_engine(args: argparse.Namespace) -> int:
    """``inspect --engine``: the engine graph (workbench.engine_graph/1), live or from TensorRT's recorded files."""
    from .engine_graphs.text import render

    if args.targets or args.no_probe:
        raise UsageError("--targets and --no-probe check the ONNX graph; drop them with --engine")
    if not args.layer_info and (args.layer_profile or args.layer_times):
        raise UsageError("--layer-profile and --layer-times go with --layer-info (TensorRT's recorded layers)")
    if args.layer_info and (args.engine or "trt") != "trt":
        raise UsageError("--layer-info is TensorRT's layer information: use it with --engine trt (or alone)")
    if (args.ort_trace or args.trt_subgraphs) and not (args.ort_trace and args.trt_subgraphs
                                                       and args.engine == "ort-trt"):
        raise UsageError("--ort-trace and --trt-subgraphs go together, with --engine ort-trt (ONNX Runtime's "
                         "profiler trace and the TensorRT EP's dumped subgraphs, recorded on a GPU machine)")
    check_outputs([Output("--json", args.json), Output("--report", args.report)], models={"MODEL": args.model},
                  inputs={"--inputs": args.inputs, "--layer-info": args.layer_info,
                          "--layer-profile": args.layer_profile, "--layer-times": args.layer_times,
                          "--ort-trace": args.ort_trace, "--trt-subgraphs": args.trt_subgraphs})
    if args.trt_subgraphs:  # a file written there (even a new one) is read as a dump next time: refused up front
        dumps = os.path.realpath(args.trt_subgraphs)
        for option, out in (("--json", args.json), ("--report", args.report)):
            if out and out != "-" and os.path.commonpath([dumps, os.path.realpath(out)]) == dumps:
                raise UsageError(f"{option} {out} lies inside the --trt-subgraphs folder {args.trt_subgraphs}: "
                                 "write the output somewhere else (files there are read as dumped subgraphs)")
    if args.layer_info:
        from .engine_graphs.tensorrt_graph import from_records

        graph = from_records(args.model, args.layer_info, args.layer_profile, args.layer_times)
    elif args.ort_trace:
        from .engine_graphs.ort_trt_graph import from_ort_trt_records

        graph = from_ort_trt_records(args.model, args.ort_trace, args.trt_subgraphs, warmup=args.warmup_runs)
    else:
        from .engine_graphs.api import engine_graph
        from .inputs import parse_shape_overrides

        graph = engine_graph(args.model, args.engine, feeds=args.inputs, runs=args.runs, seed=args.seed,
                             input_shapes=parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
                             optimization=args.optimization, threads=args.threads)
    if args.json:
        _write_json(graph.to_json(), args.json)
    if args.report:
        from .report.engine_graph_html import write_engine_graph_report

        write_engine_graph_report(graph, args.report, top=args.top)
        _say(f"report written to {args.report}")
    if args.json != "-":
        print(printable_lines(render(graph, top=args.top)))
    return EXIT_OK



def _check_calib(args: argparse.Namespace) -> None:
    """--calib is INT8 calibration data: refused where no side is an :int8 variant the tool makes (it would be
    silently unused)."""
    if getattr(args, "calib", None) is None:
        return
    from .engines.spec import EngineSpec

    made = [s for s, own in ((args.ref, None), (args.cand, args.cand_model)) if own is None and s]
    if not any(EngineSpec.parse(s).variant == "int8" for s in made):
        raise UsageError(f"--calib is INT8 calibration data, and no side is an :int8 variant the tool makes "
                         f"(--ref {args.ref}, --cand {args.cand}{', --cand-model given' if args.cand_model else ''})",
                         "use --cand ENGINE:int8, or drop --calib")


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare.api import compare
    from .compare.criterion import Criterion
    from .compare.text import render
    from .inputs import parse_range_overrides, parse_shape_overrides

    check_outputs([Output("--json", args.json), Output("--report", args.report),
                   Output("--bundle", args.bundle, "new")],
                  models={"MODEL": args.model, "--cand-model": args.cand_model},
                  inputs={"--inputs": args.inputs, "--calib": None if args.calib is None or args.calib.isdigit()
                          else args.calib, **_code_inputs(args)})
    _check_calib(args)
    if args.criterion:
        Criterion.parse(args.criterion)  # a bad criterion fails before the comparison, not after
    if _dataset_mode(args):
        return _compare_dataset(args)
    result = compare(
        args.model, args.ref, args.cand, feeds=args.inputs, cand_model=args.cand_model, mode=args.mode,
        criterion=args.criterion, memory_budget=args.memory_budget, seed=args.seed, feed_count=args.feeds,
        input_shapes=parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
        val_ranges=parse_range_overrides(args.val_range) if args.val_range else None,
        keep_fp32=args.keep_fp32 or (), calibration_feeds=_feeds_arg(args.calib) if args.calib else None,
        culprits=not args.no_culprits,
        isolate={"auto": None, "yes": True, "no": False}[args.isolate], timeout_s=args.timeout,
        impact=args.impact, fail_on_internal_dips=args.fail_on_internal_dips, granularity=args.granularity,
        stream=args.stream, segment_size=args.segment_size, progress=_progress_logger() if args.verbose else None,
    )
    code = _verdict(EXIT_DIVERGED if result.failed else EXIT_OK)
    _save_report_and_bundle(args, result)  # first: a bundle is refused if its destination appeared meanwhile
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(render(result)))
    return code


def _dataset_mode(args: argparse.Namespace) -> bool:
    """Per-sample results over a dataset: asked for by any of the dataset options."""
    return bool(args.metric or args.preprocess or args.workers or args.executor or args.per_sample or args.target)


def _compare_dataset(args: argparse.Namespace) -> int:
    from .dataset.api import compare_dataset
    from .inputs import parse_shape_overrides

    if not args.inputs:
        raise InputError("per-sample options (--metric, --target, --preprocess, --workers, --executor, --per-sample) "
                         "need a "
                         "dataset", "pass --inputs DIR (a folder of .npz, or of images with --preprocess)")
    ignored = [flag for flag, on in (("--mode", args.mode != "auto"), ("--no-culprits", args.no_culprits),
                                     ("--val-range", args.val_range), ("--feeds", args.feeds != 1),
                                     ("--fail-on-internal-dips", args.fail_on_internal_dips),
                                     ("--granularity fused", args.granularity != "all")) if on]
    if ignored:
        raise InputError(f"{', '.join(ignored)} do not apply to a per-sample dataset comparison",
                         "drop them (compare one sample with its culprits: workbench compare MODEL --inputs FILE.npz)")
    result = compare_dataset(
        args.model, args.ref, args.cand, args.inputs, preprocess=args.preprocess, metrics=args.metric or (),
        workers=args.workers or 1, executor=args.executor, cand_model=args.cand_model,
        calibration=_feeds_arg(args.calib) if args.calib is not None else None,
        worst=args.worst, layers=not args.no_layers, task_target=args.target, criterion=args.criterion,
        memory_budget=args.memory_budget,
        input_shapes=parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
        keep_fp32=args.keep_fp32 or None, isolate={"auto": None, "yes": True, "no": False}[args.isolate],
        timeout_s=args.timeout, progress=_progress_logger() if args.verbose else None)
    code = _verdict(EXIT_DIVERGED if result.failed else EXIT_OK)
    if args.bundle:  # first: a bundle is refused if its destination appeared meanwhile (nothing else written)
        from .dataset.bundle import save_dataset_bundle

        path = save_dataset_bundle(result, args.bundle, include_data=args.bundle_data,
                                   zip=args.bundle.lower().endswith(".zip"))
        _say(f"bundle written to {path} (rerun it: workbench rerun {shlex.quote(str(path))})")
    if args.report:
        from .report.dataset_html import write_dataset_report

        write_dataset_report(result, args.report)
        _say(f"report written to {args.report}")
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(result.render()))
    return code


def _save_report_and_bundle(args: argparse.Namespace, result) -> None:
    """``--report`` and ``--bundle`` of compare. Tensor values of the first divergent tensor, the top culprit and
    the first output are captured once for both. (Calibrate's hook: ``report.bundle.BundleWriter(dest,
    kind="calibrate")`` with add_model/add_feeds/add_json, then commit().)"""
    if not (getattr(args, "report", None) or getattr(args, "bundle", None)):
        return
    from .report.tensors import capture_tensors

    try:
        values = capture_tensors(result, "auto")
    except WorkbenchError as e:
        log.warning("tensor values not captured: %s", e)
        values = {}
    if args.bundle:
        from .report.bundle import save_bundle

        zipped = args.bundle.lower().endswith(".zip")
        path = save_bundle(result, dest=args.bundle, zip=zipped, tensors=values,
                           weights=getattr(args, "bundle_weights", "auto"))
        _say(f"bundle written to {path} (rerun it: workbench rerun {shlex.quote(str(path))})")
    if args.report:
        from .report.html import write_report

        write_report(result, args.report, tensors=values)
        _say(f"report written to {args.report}")


def cmd_rerun(args: argparse.Namespace) -> int:
    from .report.rerun import rerun_bundle

    check_outputs([Output("--json", args.json)], models={"--model": args.model, "--cand-model": args.cand_model},
                  inputs={"BUNDLE": args.bundle, "--inputs": args.inputs, **_code_inputs(args)})
    report = rerun_bundle(args.bundle, model=args.model, cand_model=args.cand_model, inputs=args.inputs,
                          preprocess=args.preprocess, metrics=args.metric, workers=args.workers,
                          executor=args.executor, allow_engines=args.allow_engine or (),
                          trust_unsealed=args.trust_unsealed, progress=_progress_logger() if args.verbose else None,
                          weights=args.weights)
    code = _verdict(report.exit_code)
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(report.render()))
    return code


def cmd_diff(args: argparse.Namespace) -> int:
    from .report.diff import diff_results

    check_outputs([Output("--json", args.json)], inputs={"A": args.a, "B": args.b})
    from .dataset.diff import dataset_doc, diff_datasets

    labels = (os.path.basename(args.a.rstrip("/")) or "A", os.path.basename(args.b.rstrip("/")) or "B")
    trust = args.trust_unsealed
    if dataset_doc(args.a, trust_unsealed=trust) is not None or dataset_doc(args.b, trust_unsealed=trust) is not None:
        if args.metric:
            raise UsageError("--metric ranks the layers of two single comparisons; a dataset diff lists every "
                             "changed sample", "drop --metric")
        diff = diff_datasets(args.a, args.b, labels=labels, trust_unsealed=trust)
        if args.json:
            _write_json(diff.to_json(), args.json)
        if args.json != "-":
            print(printable_lines(diff.render(top=args.top)))
        return EXIT_OK
    diff = diff_results(args.a, args.b, metric=args.metric, labels=labels, trust_unsealed=trust)
    if args.json:
        _write_json(diff.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(diff.render(top=args.top)))
    return EXIT_OK


def cmd_reduce(args: argparse.Namespace) -> int:
    from .compare.criterion import Criterion
    from .inputs import parse_shape_overrides
    from .reduce import command_line, reduce

    check_outputs([Output("--out", args.out, "folder"), Output("--json", args.json)],
                  models={"MODEL": args.model, "--cand-model": args.cand_model}, inputs={"--inputs": args.inputs})
    if args.criterion:
        Criterion.parse(args.criterion)  # a bad criterion fails before the comparison, not after
    options = {"criterion": args.criterion, "seed": args.seed, "feed_count": args.feeds,
               "input_shapes": parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
               "keep_fp32": args.keep_fp32 or ()}
    command = command_line(args.model, args.ref, args.cand, cand_model=args.cand_model, feeds=args.inputs,
                           node=args.node, out=args.out, max_nodes=args.max_nodes, options=options)
    result = reduce(args.model, args.ref, args.cand, cand_model=args.cand_model, feeds=args.inputs, node=args.node,
                    out=args.out, max_nodes=args.max_nodes, command=command, **options)
    code = _verdict(EXIT_OK if result.reproduced else EXIT_DIVERGED)
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(result.render()))
    return code


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate.api import calibrate
    from .calibrate.report import read_thresholds
    from .calibrate.text import render

    check_outputs([Output("--cache", args.cache), Output("--qdq", args.qdq), Output("--json", args.json),
                   Output("--report", args.report), Output("--bundle", args.bundle, "new"),
                   *Output.files_in("--ort-table", args.ort_table, ("calibration.json", "calibration.flatbuffers",
                                                                    "calibration.cache"))],
                  models={"MODEL": args.model},
                  inputs={"--data": _feeds_arg(args.data), "--import-cache": args.import_cache,
                          "--eval-data": _feeds_arg(args.eval_data) if args.eval_data else None,
                          "--preprocess": _code_file(args.preprocess)})
    if args.import_cache:
        read_thresholds(args.import_cache)  # a bad file fails before the calibration, not after
    report = calibrate(
        args.model, _feeds_arg(args.data), eval_data=_feeds_arg(args.eval_data) if args.eval_data else None,
        preprocess=args.preprocess, methods=args.methods, method=args.method, percentile=args.percentile,
        num_bins=args.num_bins, ort_entropy_bins=args.ort_entropy_bins, memory_budget=args.memory_budget,
        seed=args.seed, input_shapes=args.input_shapes, sweep=args.sweep, top_k=args.top_k,
        progress=_progress_logger() if args.verbose else None,
    )
    written, hints = [], []
    if args.import_cache:
        report.read_cache(args.import_cache)
    if args.qdq:  # checked against FP32 too; first: the quantizer is what may refuse, before anything is written
        written.append(f"QDQ model ({report.method}: {report.rule(report.method)}): {report.save_qdq(args.qdq)}")
    left = report.left_out() if args.cache or args.ort_table else {}
    out_of = f" ({len(left)} tensor(s) left out: " + ", ".join(f"{t} {why}" for t, why in list(left.items())[:3]) \
        + (" ..." if len(left) > 3 else "") + ")" if left else ""
    if args.cache:
        path = report.write_trt_cache(args.cache, version=args.cache_version)
        written.append(f"TensorRT calibration cache ({report.method}: {report.rule(report.method)}): {path}{out_of}")
    if args.ort_table:
        written += [f"ORT calibration table ({report.method}): {p}{out_of if i == 0 else ''}"
                    for i, p in enumerate(report.write_ort_table(args.ort_table))]
        hints.append(f"ONNX Runtime loads calibration.json with quantize_static(..., calibrate_method="
                     f"CalibrationMethod.{report.ort_method()}, calibration_cache_path=...)")
    if args.report:
        from .report.calibration_html import write_calibration_report

        written.append(f"report: {write_calibration_report(report, args.report)}")
    if args.bundle:
        from .calibrate.bundle import save_calibration_bundle

        written.append(f"bundle: {save_calibration_bundle(report, args.bundle, zip=args.bundle.endswith('.zip'))}")
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(printable_lines(render(report, top=args.top)))
        for line in written:
            print(f"wrote {printable(line)}")
        for line in hints:
            print(printable(line))
    return EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    from .inputs import parse_shape_overrides
    from .repair.api import repair

    metric_file = (args.metric or "").rpartition(":")[0]
    check_outputs([Output("--out", args.out), Output("--out", args.out and f"{args.out}.data"),
                   Output("--json", args.json), Output("--bundle", args.bundle, "new")],
                  models={"MODEL": args.model, "--cand-model": args.cand_model},
                  inputs={"--inputs": args.inputs, "--metric": metric_file if metric_file.endswith(".py") else None,
                          "--preprocess": _code_file(args.preprocess),
                          "--calib": None if args.calib is None or args.calib.isdigit() else args.calib})
    _check_calib(args)
    if args.preprocess and not (args.inputs or args.calib):
        raise InputError("--preprocess needs a dataset", "pass --inputs DIR (a folder of images)")
    result = repair(
        args.model, args.ref, args.cand, cand_model=args.cand_model, feeds=args.inputs, target=args.target,
        metric=args.metric, out=args.out, nodes=args.nodes, max_builds=args.max_builds, batch=args.batch,
        verify=None if args.verify == "none" else args.verify, seed=args.seed, feed_count=args.feeds,
        memory_budget=args.memory_budget, preprocess=args.preprocess, workers=args.workers or 1,
        executor=args.executor, rewrites=not args.no_rewrites, keep_placement=args.keep_placement,
        calibration=_feeds_arg(args.calib) if args.calib is not None else None,
        input_shapes=parse_shape_overrides(args.input_shapes) if args.input_shapes else None,
        progress=_progress_logger() if args.verbose else None,
    )
    code = _verdict(result.exit_code)
    try:
        if args.bundle:
            path = result.save_bundle(args.bundle, zip=args.bundle.lower().endswith(".zip"))
            _say(f"bundle written to {path} (rerun it: workbench rerun {shlex.quote(str(path))})")
        if args.json:
            _write_json(result.to_json(), args.json)
    except BaseException:  # interrupted or failed before its other outputs: the run leaves no repaired model either
        _remove_written_model(result.model_path)
        raise
    if args.json != "-":
        print(printable_lines(result.render()))
    return code


def _remove_written_model(path: str | None) -> None:
    """Delete the repaired model a run wrote (and its external data) when the run ends without its other outputs."""
    from pathlib import Path

    if not path:
        return
    for p in (Path(path), Path(f"{path}.data")):
        with contextlib.suppress(OSError):
            p.unlink()


def _code_inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The files of ``--preprocess`` and ``--metric`` ``file.py:function`` references, as inputs no output may
    overwrite."""
    out = {"--preprocess": _code_file(getattr(args, "preprocess", None))}
    for ref in getattr(args, "metric", None) or ():
        out[f"--metric {ref}"] = _code_file(ref)
    return out


def _code_file(ref: str | None) -> str | None:
    """The file of a ``file.py:function`` reference (checked like any input), else None."""
    path = (ref or "").rpartition(":")[0]
    return path if path.endswith(".py") else None


def _feeds_arg(text: str):
    """``--data``: a whole number N (and no such file) means N seeded random feeds."""
    if text.strip().isdigit() and not os.path.exists(text):
        return int(text)
    return text


def _whole(lo: int, hi: int = 2**31 - 1):
    """argparse type: a whole number in [``lo``, ``hi``]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside the allowed range {lo}..{hi}")
        return value

    parse.__name__ = "whole number"
    return parse


def _number(lo: float, hi: float, *, above: bool = False):
    """argparse type: a finite number in [``lo``, ``hi``] (``above``: strictly above ``lo``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and (value > lo if above else value >= lo) and value <= hi):
            low = f"above {lo:g}" if above else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(f"{text} is outside the allowed range ({low}, at most {hi:g})")
        return value

    parse.__name__ = "number"
    return parse


def _power_of_two(lo: int, hi: int):
    """argparse type: a power of two in [``lo``, ``hi``]."""
    whole = _whole(lo, hi)

    def parse(text: str) -> int:
        value = whole(text)
        if value & (value - 1):
            raise argparse.ArgumentTypeError(f"{value} is not a power of two ({lo}, {2 * lo}, ... {hi})")
        return value

    parse.__name__ = "power of two"
    return parse


def _size(text: str) -> str:
    """argparse type: a memory size (512M, 2G), checked here and passed on as written."""
    from .core.budget import parse_size

    try:
        parse_size(text)
    except WorkbenchError as e:
        raise argparse.ArgumentTypeError(e.message) from None
    return text


_size.__name__ = "memory size"
#: ranges of the numeric options
SEED = _whole(0, 2**63 - 1)
#: output options (checked from the parser before any work: workbench.output_options)
JSON_OUT, FILE_OUT, NEW_OUT, FOLDER_OUT = (OutputOption("file", stdout=True), OutputOption("file"),
                                          OutputOption("new"), OutputOption("folder"))
COUNT = _whole(1, 100_000)
ROWS = _whole(0, 100_000)


def _progress_logger():
    last = [-1]

    def report(fraction: float, message: str) -> None:
        step = int(fraction * 10)
        if step != last[0]:
            last[0] = step
            log.info("%3d%% %s", int(fraction * 100), message)

    return report


def _add_pair_arguments(p: argparse.ArgumentParser, cand_model_help: str) -> None:
    """The model, the two engine specs, the candidate file and the feeds: what compare, reduce and repair share."""
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--ref", default="ort", metavar="SPEC", help="reference ENGINE[:VARIANT] (default: ort)")
    p.add_argument("--cand", default="ort:fp16", metavar="SPEC", help="candidate ENGINE[:VARIANT] (default: ort:fp16)")
    p.add_argument("--cand-model", metavar="OTHER.onnx", help=cand_model_help)
    p.add_argument("--inputs", metavar="FILE", help=".npz, folder of .npz, or Polygraphy inputs JSON "
                   "(default: seeded random feeds)")
    p.add_argument("--input-shapes", nargs="+", metavar="NAME:[d,...]", help="shapes for dynamic inputs")
    p.add_argument("--seed", type=SEED, default=0, help="seed for random feeds (default 0)")
    p.add_argument("--feeds", type=COUNT, default=1, metavar="N", help="number of random feeds (default 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Find where and why an ONNX model drifts between engines.")
    parser.add_argument("--version", action="version", version=f"onnx-drift-workbench {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("inspect", help="graph, opset inventory, problems and runtime compatibility of a model")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.inspect/1 JSON to OUT ('-' for stdout); "
                   "with --engine the workbench.engine_graph/1 JSON")
    p.add_argument("--targets", nargs="+", metavar="TARGET",
                   help="runtimes to check against, e.g. trt-10 trt-8.6 ort-1.18 openvino (default: a handful)")
    p.add_argument("--no-probe", action="store_true", help="do not build a real ONNX Runtime session")
    g = p.add_argument_group("inside the engine (--engine): what it fused, where each node ran, in what precision, "
                             "how long it took")
    g.add_argument("--engine", metavar="SPEC", help="ENGINE[:VARIANT] to look inside: ort, ort:fp16, openvino, trt")
    g.add_argument("--input-shapes", nargs="+", metavar="NAME:[d,...]", help="shapes for dynamic inputs")
    g.add_argument("--inputs", metavar="FILE", help=".npz, folder of .npz, or Polygraphy inputs JSON (default: seeded "
                   "random feeds)")
    g.add_argument("--seed", type=SEED, default=0, help="seed for random feeds (default 0)")
    g.add_argument("--runs", type=_whole(0, 100_000), default=10, metavar="N", help="profiled runs after one warm-up "
                   "(default 10; 0: the graph only, no latency)")
    g.add_argument("--optimization", choices=["all", "extended", "basic", "disable"], help="ONNX Runtime's graph "
                   "optimization level (default all)")
    g.add_argument("--threads", type=_whole(1, 1024), metavar="N", help="intra-op (ORT) or inference (OpenVINO) "
                   "threads (default: the engine's)")
    g.add_argument("--layer-info", metavar="FILE", help="TensorRT's layer information JSON, recorded with trtexec "
                   "--exportLayerInfo --profilingVerbosity=detailed (no GPU needed to read it)")
    g.add_argument("--layer-profile", metavar="FILE", help="TensorRT's per-layer profile (trtexec --exportProfile)")
    g.add_argument("--layer-times", metavar="FILE", help="TensorRT's per-iteration times (trtexec --exportTimes)")
    g.add_argument("--ort-trace", metavar="FILE", help="with --engine ort-trt: ONNX Runtime's profiler trace of a "
                   "TensorRT EP session (enable_profiling), recorded on a GPU machine")
    g.add_argument("--trt-subgraphs", metavar="DIR", help="with --ort-trace: the folder the TensorRT EP dumped its "
                   "subgraphs into (provider option trt_dump_subgraphs; it writes them into the working directory)")
    g.add_argument("--warmup-runs", type=_whole(0, 100_000), default=1, metavar="N", help="with --ort-trace: runs "
                   "at the start of the trace to drop (default 1)")
    g.add_argument("--top", type=ROWS, default=10, metavar="N", help="slowest nodes listed (and plotted in "
                   "--report; default 10)")
    g.add_argument("--report", type=FILE_OUT, metavar="OUT.html",
                   help="write a self-contained HTML report of the engine graph "
                   "(slowest nodes, providers, precisions, fused groups, plots; works offline)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("compare", help="layer-wise comparison of two engines/precisions: first divergent layer, "
                       "culprit nodes")
    _add_pair_arguments(p, "run the candidate on this file (your own FP16/QDQ export); tensors are matched by name")
    p.add_argument("--val-range", nargs="+", metavar="NAME:[lo,hi]", help="value ranges for random inputs")
    p.add_argument("--calib", metavar="FILE|N", help="calibration data for :int8: a file, a folder of .npz, or N "
                   "seeded random feeds (default: the comparison feeds)")
    p.add_argument("--keep-fp32", nargs="+", metavar="NODE", help="nodes the fp16/int8 variant keeps in float32")
    p.add_argument("--mode", choices=["auto", "all", "bisect"], default="auto",
                   help="all: mark every tensor (chunked); bisect: one extra tensor per build; auto: all unless "
                   "the candidate is TensorRT")
    p.add_argument("--memory-budget", type=_size, metavar="SIZE", help="peak memory for marked tensors, e.g. 512M, "
                   "2G (default: a quarter of RAM, at most 4G)")
    p.add_argument("--criterion", metavar="METRIC<VALUE", help="when a tensor diverges, e.g. sqnr_db<30, "
                   "norm_mean_abs>0.1 (default per candidate precision)")
    p.add_argument("--no-culprits", action="store_true", help="skip running nodes alone (faster)")
    p.add_argument("--impact", type=_whole(0, 10_000), default=5, metavar="N", help="measure what fixing each of "
                   "the top N culprits gains on the outputs; harmless ones rank last (default 5, 0: off)")
    p.add_argument("--fail-on-internal-dips", action="store_true", help="exit 1 also when only internal tensors "
                   "fall under the criterion while the outputs pass (a stricter CI gate)")
    p.add_argument("--granularity", choices=["all", "fused"], default="all", help="fused: compare only the "
                   "tensors at the candidate engine's fused-group boundaries (marking them keeps its fusions)")
    p.add_argument("--isolate", choices=["auto", "yes", "no"], default="auto",
                   help="run engines in a worker process (auto: TensorRT and GPU providers)")
    p.add_argument("--timeout", type=_number(0, 7 * 86400, above=True), metavar="S",
                   help="worker timeout in seconds (isolated engines), above 0, at most a week")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.compare/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--stream", choices=["auto", "on", "off"], default="auto", help="compare segment by segment "
                   "(cut at single-tensor frontiers, weights memory-mapped one segment at a time): peak memory follows "
                   "the largest segment; auto: when the model's files exceed --memory-budget")
    p.add_argument("--segment-size", type=_size, metavar="SIZE", help="most weights per streamed segment "
                   "(default: an eighth of the memory budget)")
    p.add_argument("--report", type=FILE_OUT, metavar="OUT.html",
                   help="write a self-contained HTML report (plots work offline)")
    p.add_argument("--bundle", type=NEW_OUT, metavar="DIR",
                   help="save a rerunnable bundle: model copy, feeds, options, results "
                   "(DIR.zip: zipped); rerun it with `workbench rerun DIR`")
    p.add_argument("--bundle-weights", choices=["auto", "copy", "reference"], default="auto",
                   help="external weight files in the bundle: auto (past 1 GiB kept by reference: sha256, size, "
                   "path; not copied), copy, reference")
    g = p.add_argument_group("dataset (per-sample results; any of these turns them on)")
    g.add_argument("--metric", nargs="+", metavar="NAME", help="task metrics per sample: top1, topk[:K], ctc, "
                   "mask_iou[:T], or module:function / file.py:function returning {name: number}")
    g.add_argument("--target", metavar="TEXT", help="judge the run by a task metric instead of the outputs' "
                   "criterion: NAME OP NUMBER on every sample (e.g. ctc>=1, mask_iou>=0.99) or 'mean NAME OP NUMBER' "
                   "on the mean; exit 1 only when it is missed (needs --metric)")
    g.add_argument("--preprocess", metavar="MODULE:FUNCTION", help="turns each file of an image folder (its path) "
                   "into the model's input array or a feed dict")
    g.add_argument("--workers", type=_whole(1, 1024), metavar="N", help="N local worker processes (default: serial)")
    g.add_argument("--executor", metavar="KIND", help="serial, processes, ray (a local Ray) or ray://HOST:PORT (a Ray "
                   "cluster; pip install 'onnx-drift-workbench[ray]')")
    g.add_argument("--per-sample", action="store_true", help="per-sample results without task metrics")
    g.add_argument("--worst", type=_whole(0, 100_000), default=5, metavar="K", help="worst samples listed (default 5)")
    g.add_argument("--no-layers", action="store_true", help="compare the graph outputs only (no per-layer statistics)")
    g.add_argument("--bundle-data", action="store_true", help="store every sample's feed in the bundle (default: "
                   "content hashes only; the rerun reads the data again)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("calibrate", help="INT8 calibration diagnostics: histograms, ranges by method, sensitivity, "
                       "representativeness, TensorRT cache, QDQ model")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--data", required=True, metavar="FILE|DIR|N", help="calibration feeds: .npz, folder of .npz, "
                   "folder of images (with --preprocess), Polygraphy inputs JSON, or a number N for N seeded random "
                   "feeds; folders are streamed one sample at a time")
    p.add_argument("--preprocess", metavar="MODULE:FUNCTION", help="turns each file of a --data/--eval-data image "
                   "folder (its path) into the model's input array or a feed dict (module:function or "
                   "file.py:function)")
    p.add_argument("--eval-data", metavar="FILE|DIR|N", help="evaluation feeds to check the calibration data "
                   "against (same forms; N random feeds use seed+1)")
    from .calibrate.methods import METHODS, RULES

    rules = "; ".join(f"{m}: {RULES[m].label}" for m in METHODS)
    p.add_argument("--method", choices=METHODS, default="entropy",
                   help="the rule for the cache, the ORT table, the QDQ model, sensitivity and the checks "
                   "(default: entropy, TensorRT's EntropyCalibration2)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="RULE",
                   help=f"the rules computed (default: all). {rules}")
    p.add_argument("--percentile", type=_number(0, 100, above=True), default=None, metavar="P",
                   help="percentile for both percentile rules, in (0, 100] (default: each rule's own, "
                   "99.99 for ModelOpt's, 99.999 for ONNX Runtime's)")
    p.add_argument("--ort-entropy-bins", type=_whole(128, 2**16), default=128, metavar="N",
                   help="histogram bins of the ort-entropy rule, 128 to 65536 (default 128, ONNX "
                   "Runtime's; its 128 levels then leave one window: max)")
    p.add_argument("--num-bins", type=_power_of_two(128, 2**16), default=2048, metavar="N", help="histogram bins, "
                   "a power of two from 128 to 65536 (default 2048, TensorRT's)")
    p.add_argument("--cache", type=FILE_OUT, metavar="OUT",
                   help="write TensorRT's calibration cache of --method to OUT")
    p.add_argument("--cache-version", type=_whole(0), default=100300, metavar="INT",
                   help="version in the cache's TRT-<version>-<Algo> header (default 100300: TensorRT 10.3)")
    p.add_argument("--ort-table", type=FOLDER_OUT, metavar="DIR",
                   help="write ORT's calibration.json and .cache into DIR (and .flatbuffers where the flatbuffers "
                        "package is installed: onnxruntime writes it only then)")
    p.add_argument("--import-cache", metavar="FILE", help="overlay thresholds from a TensorRT cache or ORT "
                   "calibration.json")
    p.add_argument("--qdq", type=FILE_OUT, metavar="OUT.onnx",
                   help="write a QDQ INT8 model with --method's ranges and compare its "
                   "outputs with FP32 on ORT")
    p.add_argument("--sweep", action="store_true", help="quantize-only-this / keep-only-this-in-float sweep on the "
                   "top tensors, judged on the model's outputs")
    p.add_argument("--top-k", type=COUNT, default=16, metavar="K", help="tensors in the sweep (default 16)")
    p.add_argument("--input-shapes", nargs="+", metavar="NAME:[d,...]", help="shapes for dynamic inputs")
    p.add_argument("--memory-budget", type=_size, metavar="SIZE", help="peak memory for marked tensors per feed, "
                   "e.g. 512M, 2G (default: a quarter of RAM, at most 4G)")
    p.add_argument("--seed", type=SEED, default=0, help="seed for random feeds (default 0)")
    p.add_argument("--top", type=ROWS, default=5, metavar="N", help="rows per section in the summary (default 5)")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.calibrate/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--report", type=FILE_OUT, metavar="OUT.html",
                   help="write a self-contained HTML report (histograms with "
                   "each method's threshold, sensitivity, representativeness)")
    p.add_argument("--bundle", type=NEW_OUT, metavar="DIR",
                   help="save model, feeds, options and results as a bundle that "
                   "`workbench rerun` recollects (DIR.zip for a zip)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("rerun", help="rerun a bundle (same model, feeds, specs, options) and say what changed")
    p.add_argument("bundle", help="bundle folder or .zip written by `workbench compare --bundle`")
    p.add_argument("--model", metavar="PATH", help="the model file, for a bundle that keeps only a reference "
                   "(its sha256 must match)")
    p.add_argument("--cand-model", metavar="PATH", help="the candidate model file, likewise")
    p.add_argument("--weights", metavar="DIR", help="the folder holding the weight files a bundle keeps by "
                   "reference (default: beside the bundled model, then where the original model was)")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.rerun/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--allow-engine", nargs="+", metavar="MODULE:CLASS", help="import these engine classes named by "
                   "the bundle (a bundle never imports code by itself)")
    p.add_argument("--trust-unsealed", action="store_true", help="rerun a bundle whose manifest carries no seal "
                   "(manifest_sha256; refused by default: edits to it or its files would go unnoticed)")
    g = p.add_argument_group("dataset bundles")
    g.add_argument("--inputs", metavar="DIR", help="the dataset, when it is no longer where the bundle recorded it")
    g.add_argument("--preprocess", metavar="MODULE:FUNCTION", help="the preprocessing the bundle names (a bundle "
                   "never runs code by itself)")
    g.add_argument("--metric", nargs="+", metavar="NAME", help="the task metrics (needed again for module:function "
                   "metrics)")
    g.add_argument("--workers", type=_whole(1, 1024), metavar="N", help="N local worker processes")
    g.add_argument("--executor", metavar="KIND", help="serial, processes, ray or ray://HOST:PORT")
    p.set_defaults(func=cmd_rerun)

    p = sub.add_parser("diff", help="what changed between two comparisons (results JSON files or bundles)")
    p.add_argument("a", metavar="A", help="results JSON (`compare --json`) or bundle: before")
    p.add_argument("b", metavar="B", help="results JSON or bundle: after")
    p.add_argument("--metric", help="metric to rank changes by (default: A's criterion metric)")
    p.add_argument("--top", type=ROWS, default=10, metavar="N", help="largest changes to list (default 10)")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.diff/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--trust-unsealed", action="store_true", help="read bundles whose manifest carries no seal "
                   "(made by hand or by an old version: an edit of them cannot be detected)")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("reduce", help="write the smallest reference/candidate model pair around a culprit, with its "
                       "inputs and expected outputs: a bug report that reproduces the divergence with onnxruntime")
    _add_pair_arguments(p, "the candidate side comes from this file (your own FP16/QDQ export)")
    p.add_argument("--node", metavar="NAME", help="reference node to reduce (default: the top harmful culprit)")
    p.add_argument("--out", required=True, type=FOLDER_OUT, metavar="DIR", help="new (or empty) folder for the files")
    p.add_argument("--max-nodes", type=_whole(1, 10_000), default=3, metavar="N", help="grow the subgraph up to N "
                   "reference nodes when the node alone does not reproduce (default 3)")
    p.add_argument("--keep-fp32", nargs="+", metavar="NODE", help="nodes the fp16/int8 variant keeps in float32")
    p.add_argument("--criterion", metavar="METRIC<VALUE", help="when a tensor diverges (default per precision)")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.reduce/1 JSON to OUT ('-' for stdout)")
    p.set_defaults(func=cmd_reduce)

    p = sub.add_parser("repair", help="the smallest set of nodes to keep in reference precision (FP32 islands, Q/DQ "
                       "removed) so that the candidate meets a target; writes the repaired model")
    _add_pair_arguments(p, "repair this file (your own FP16/QDQ export) instead of the tool's variant")
    p.add_argument("--target", metavar="TEXT", help="without --metric: a criterion every output must pass on every "
                   "feed, e.g. sqnr_db<40 (default: the candidate precision's); with --metric: OP NUMBER on every "
                   "feed, e.g. >=0.99, or mean OP NUMBER on the mean over the feeds, e.g. 'mean>=0.95'")
    p.add_argument("--metric", metavar="module:function", help="task metric: top1, topk:K, ctc, mask_iou:T (as "
                   "compare's), or fn(reference_outputs, candidate_outputs) -> number|bool per feed (module:function "
                   "or path/file.py:function)")
    p.add_argument("--out", required=True, type=FILE_OUT, metavar="FIXED.onnx",
                   help="where to write the repaired model")
    p.add_argument("--calib", metavar="FILE|DIR|N", help="INT8 calibration data for :int8 (.npz, a folder of .npz "
                   "or of images with --preprocess, or N random feeds; default: the --inputs feeds)")
    p.add_argument("--nodes", nargs="+", metavar="NODE", help="search among these nodes (reference names, best "
                   "first) instead of the comparison's culprits")
    p.add_argument("--max-builds", type=COUNT, default=40, metavar="N", help="cap on the search's candidate "
                   "builds (default 40; the Q/DQ ordering's group testing, the baseline and the verification build "
                   "apart from it, counted in the result's builds)")
    p.add_argument("--batch", choices=["auto", "switch", "build"], default="auto", help="switch: one switchable "
                   "model, a run per evaluated set; build: a build per set; auto: switch for FP16/BF16, build for Q/DQ")
    p.add_argument("--memory-budget", type=_size, metavar="SIZE", help="peak memory for the comparison's marked "
                   "tensors and for the feeds of a dataset, e.g. 512M (default: 512M for the marked tensors, a "
                   "quarter of RAM, at most 4G, for the feeds)")
    p.add_argument("--preprocess", metavar="MODULE:FUNCTION", help="turns each file of an --inputs image folder (its "
                   "path) into the model's input array or a feed dict (module:function or file.py:function)")
    p.add_argument("--workers", type=_whole(1, 1024), metavar="N", help="evaluate the search's candidate builds on N "
                   "local worker processes (same result as serial)")
    p.add_argument("--executor", metavar="KIND", help="serial, processes, ray (a local Ray) or ray://HOST:PORT (a Ray "
                   "cluster) for the candidate evaluations")
    p.add_argument("--verify", default="auto", metavar="ENGINE", help="independent engine the repaired model is "
                   "verified on besides the candidate's (default auto: ref, onnx's evaluator in the model's own types, "
                   "for FP16/BF16; onnxruntime with graph optimizations off, Q/DQ unfused, for INT8; none: skip)")
    p.add_argument("--no-rewrites", action="store_true", help="islands only (FP32 islands, Q/DQ pairs removed): do "
                   "not first try rewrites that keep a culprit in FP16 (a clamped constant restored, a "
                   "BatchNormalization folded or rescaled) or in INT8 (the FP32 model quantized again with TensorRT's "
                   "Q/DQ placement, depthwise Conv inputs equalized per channel; BatchNormalizations folded into "
                   "their Convs before quantizing)")
    p.add_argument("--keep-placement", action="store_true", help="INT8 from the FP32 model: keep ONNX Runtime's Q/DQ "
                   "placement (pairs around every op it quantizes) instead of trying TensorRT's (the inputs of Conv, "
                   "ConvTranspose, MatMul and Gemm alone, depthwise Conv inputs equalized per channel) first")
    p.add_argument("--json", type=JSON_OUT, metavar="OUT",
                   help="write the workbench.repair/1 JSON to OUT ('-' for stdout)")
    p.add_argument("--bundle", type=NEW_OUT, metavar="DIR",
                   help="save a comparison bundle of the reference vs the repaired model "
                   "(rerun it with `workbench rerun DIR`)")
    p.set_defaults(func=cmd_repair)
    return parser


def entry() -> None:
    """The ``workbench`` command (and ``python -m workbench``): :func:`main`, then exit with its code, this run's
    scratch folder and staged temporaries removed first. After Ctrl-C (130) or SIGTERM (143) the process leaves at
    once (``os._exit``, outputs flushed; ``with`` blocks have already cleaned up while the interrupt unwound): ONNX
    Runtime or OpenVINO may still be busy in native threads, and interpreter shutdown under them can crash
    (SIGSEGV) after the "interrupted" line."""
    code = main()
    if code in (130, 143):
        _leave_now(code)
    from .core.lifeline import ignore_interrupts
    from .core.scratch import cleanup

    ignore_interrupts()
    cleanup()
    sys.exit(code)


def _leave_now(code: int) -> None:
    """Exit at once with ``code`` (130/143): flush the outputs, remove the scratch folder, ``os._exit``."""
    from .core.lifeline import ignore_interrupts
    from .core.scratch import cleanup

    ignore_interrupts()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        cleanup()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code. SIGTERM is handled like Ctrl-C (exit 143 instead of 130); temporaries go
    to this run's scratch folder (:mod:`workbench.core.scratch`), stale ones of killed runs are removed."""
    from .core import lifeline, scratch

    try:
        with lifeline.sigterm_as_interrupt(), scratch.as_tempdir():
            return _main(argv)
    except KeyboardInterrupt as e:  # arrived after the command had finished its own handling
        return lifeline.exit_code(e)


#: the exit code a command has decided before printing (a closed stdout must not turn a divergence into 0)
_VERDICT = [EXIT_OK]


def _verdict(code: int) -> int:
    """Record ``code`` as the command's exit code before its output is written; returns it."""
    _VERDICT[0] = code
    return code


def _main(argv: Sequence[str] | None) -> int:
    _VERDICT[0] = EXIT_OK
    parser = build_parser()
    debug, args = False, None
    try:
        args = parser.parse_args(argv)
        debug = args.debug
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
        before = set(logging.getLogger().handlers)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        for handler in set(logging.getLogger().handlers) - before:  # ours: one escaped line per record
            handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
        if not args.verbose:  # onnxruntime.quantization warns per tensor on the root logger: keep it for -v
            for handler in logging.getLogger().handlers:
                handler.addFilter(lambda r: not (r.name == "root" and "onnxruntime" in r.pathname))
        if not args.command:
            raise UsageError("no command given: choose one of " + ", ".join(_commands(parser)))
        check_given_outputs(parser, args)  # every output option, from the parser, before any work
        from ._stdout import reserved

        with reserved(getattr(args, "json", None) == "-"):  # stdout holds the JSON only
            return args.func(args)
    except WorkbenchError as e:
        crashed = f"engine crash ({e.engine})" if getattr(e, "engine", None) else "engine crash"
        _say(f"{crashed if e.exit_code == EXIT_INTERNAL else 'error'}: {e}")
        return e.exit_code
    except Cancelled as e:
        _say(f"cancelled: {e.message}")
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (lifeline.Terminated)
        from .core.lifeline import exit_code
        from .engines.interruptible import native_work_running

        _say("terminated" if exit_code(e) == 143 else "interrupted")
        if native_work_running():  # a session build is still in C++: leave without running destructors under it
            _leave_now(exit_code(e))
        return exit_code(e)
    except BrokenPipeError:  # output piped into `head`: stop quietly, with the verdict's exit code
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown from writing again
        return _VERDICT[0]
    except OSError as e:
        from .errors import os_error_text

        scratch = scratch_out_of_space(e, parser, args) if e.errno in SPACE_ERRNOS and not debug else None
        if scratch is not None:  # the run's own temporaries filled their folder: the outputs' disk is not the one
            _say(f"error: {e.strerror or e} in the temporary folder {printable(scratch)} (this run's scratch: model "
                 "copies and weight files) -- free space there, or set TMPDIR to a folder with room")
            return EXIT_BAD_INPUT
        # a full disk: name the output being written, not a temporary or an input
        dest = space_error_destination(e, parser, args) if e.errno in SPACE_ERRNOS else None
        said = None if debug else os_error_text(e, writing=dest)
        if said is None:
            return _internal(e, debug)
        _say(f"error: {said}")
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - the CLI never shows a raw traceback unless asked
        interrupt = _interrupted(e)
        if interrupt is not None:  # Ctrl-C inside a native import or call surfaces as another error: still Ctrl-C
            from .core.lifeline import exit_code

            _say("terminated" if exit_code(interrupt) == 143 else "interrupted")
            return exit_code(interrupt)
        return _internal(e, debug)


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
            for name in a.choices]


def _interrupted(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt somewhere in ``e``'s chain (its cause or the exception it was raised during)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


#: errors of the user's environment (full disk, read-only or forbidden folder, a file where a folder goes), not
#: our bugs: what to do about each


def _internal(e: BaseException, debug: bool) -> int:
    if debug:
        raise e
    first = str(e).splitlines()[0] if str(e) else ""
    _say(f"internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback and report it)")
    return EXIT_INTERNAL


def _say(text: str) -> None:
    """One line on stderr, control characters escaped (a model's names and paths cannot forge lines)."""
    print(f"workbench: {printable(text)}", file=sys.stderr)


class _PrintableFormatter(logging.Formatter):
    """Log records as one line each: control characters in the message escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))
