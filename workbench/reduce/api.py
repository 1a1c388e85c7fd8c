"""The reduction: compare, pick the culprit, grow the subgraph until it reproduces, write the folder."""

from __future__ import annotations

import logging
import math
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .._atomic import atomic_write_bytes, atomic_write_text, clean_stale, staged, temp_prefix, umask
from ..compare.criterion import Criterion
from ..compare.isolate import build_isolation
from ..core.arguments import checked
from ..core.metrics import ErrorStats
from ..errors import WorkbenchError
from ..model.mapped import save_model
from ..textfmt import safe_name
from .common import _ISO_PREFIX, _NUMPY_TYPES, FILES, SCHEMA, ReduceError
from .files import _agrees, _ort_or_fail, npz_bytes, run_ort
from .models import _constant_outputs, _extra_outputs, _spec, _standalone
from .readme import _fmt, _metrics_text, readme

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One subgraph tried: its reference nodes and the candidate's error against ``expected`` on them."""

    nodes: list[str]
    metrics: dict[str, Any]
    reproduced: bool

    def to_json(self) -> dict:
        from ..core.metrics import encode_metrics

        return {"nodes": self.nodes, "metrics": encode_metrics(self.metrics), "reproduced": self.reproduced}


@dataclass
class ReduceResult:
    """What :func:`reduce` wrote and measured. ``metrics``: candidate.onnx vs expected.npz (the worst output by
    the criterion); ``pair_metrics``: candidate.onnx vs reference.onnx; ``reference_metrics``: reference.onnx vs
    expected.npz (float round-off when the reference engine is ONNX Runtime CPU)."""

    out: Path
    node: str
    op_type: str
    nodes: list[str]
    op_types: list[str]
    candidate_nodes: list[str]
    outputs: list[str]
    inputs: list[str]
    reproduced: bool
    criterion: Criterion
    metrics: dict[str, Any]
    pair_metrics: dict[str, Any]
    reference_metrics: dict[str, Any]
    engine: str
    max_nodes: int
    command: str
    files: dict[str, Path] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    ort_metrics: dict[str, Any] | None = None  # candidate.onnx on ORT CPU, when another engine ran the check
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0: written and reproduces; 1: written but the divergence did not reproduce within ``max_nodes``."""
        return 0 if self.reproduced else 1

    def to_json(self) -> dict:
        from ..core.metrics import encode_metrics

        return {"schema": SCHEMA, "out": str(self.out), "node": self.node, "op_type": self.op_type,
                "nodes": self.nodes, "op_types": self.op_types, "candidate_nodes": self.candidate_nodes,
                "outputs": self.outputs, "inputs": self.inputs, "reproduced": self.reproduced,
                "criterion": self.criterion.to_json(), "metrics": encode_metrics(self.metrics),
                "pair_metrics": encode_metrics(self.pair_metrics),
                "reference_metrics": encode_metrics(self.reference_metrics), "engine": self.engine,
                "ort_metrics": encode_metrics(self.ort_metrics) if self.ort_metrics is not None else None,
                "max_nodes": self.max_nodes, "command": self.command,
                "files": {k: str(v) for k, v in self.files.items()},
                "attempts": [a.to_json() for a in self.attempts], "notes": self.notes}

    def render(self) -> str:
        """A few lines for the terminal."""
        crit = self.criterion
        lines = [f"reduced {safe_name(self.node)} ({safe_name(self.op_type)}) into {safe_name(self.out)}",
                 f"  reference.onnx: {len(self.nodes)} node(s) {', '.join(self.op_types)}; candidate.onnx: "
                 f"{len(self.candidate_nodes)} node(s) {', '.join(map(safe_name, self.candidate_nodes))}",
                 f"  candidate vs expected on {self.engine}: {_metrics_text(crit.metric, self.metrics)}"]
        if self.reproduced:
            lines.append(f"  reproduces alone ({crit.describe()})")
        else:
            lines.append(f"  NOT reproduced within {self.max_nodes} node(s): the pair passes {crit.describe()}; "
                         "the divergence needs more of the graph (see README.md)")
        if self.ort_metrics is not None:
            lines.append(f"  on ONNX Runtime CPU: {_metrics_text(crit.metric, self.ort_metrics)}")
        lines += [f"  note: {safe_name(n)}" for n in self.notes]
        return "\n".join(lines)


# --- entry point ---------------------------------------------------------------------------------------------
@checked()
def reduce(model: Any, reference: str = "ort", candidate: str = "ort:fp16", *, cand_model: Any = None,
           feeds: Any = None, node: str | None = None, out: str | os.PathLike, max_nodes: int = 3,
           command: str | None = None, **compare_options: Any) -> ReduceResult:
    """Write the smallest pair of models around ``node`` (default: the top harmful culprit) that reproduces the
    divergence alone into the new folder ``out``; see the module docstring. ``compare_options``: the
    comparison's options (criterion, seed, feed_count, input_shapes, ...). ``command``: the command line the
    README records (default: the equivalent ``workbench reduce`` line)."""
    from ..compare.plan import ComparisonPlan

    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ReduceError(f"max_nodes must be a whole number >= 1, not {max_nodes!r}")
    dest = check_out(out)
    command = command or command_line(model, reference, candidate, cand_model=cand_model, feeds=feeds, node=node,
                                      out=dest, max_nodes=max_nodes, options=compare_options)
    plan = ComparisonPlan(model, reference, candidate, feeds=feeds, cand_model=cand_model, **compare_options)
    try:
        return _Reducer(plan, dest, max_nodes, command).run(node)
    finally:
        plan.close()


def check_out(out: str | os.PathLike) -> Path:
    """``out`` as a Path, refused when it is a file or a non-empty folder."""
    dest = Path(out).expanduser()
    if dest.exists() and not dest.is_dir():
        raise ReduceError(f"--out {dest} is a file", "name a new or empty folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise ReduceError(f"--out {dest} is a folder that is not empty", "name a new or empty folder")
    return dest


def command_line(model: Any, reference: str, candidate: str, *, cand_model: Any = None, feeds: Any = None,
                 node: str | None = None, out: Any = None, max_nodes: int = 3, options: dict | None = None) -> str:
    """The ``workbench reduce`` command equivalent to a :func:`reduce` call."""
    def text(value: Any, what: str) -> str:
        return os.fspath(value) if isinstance(value, (str, os.PathLike)) else f"<{what}>"

    args = ["workbench", "reduce", text(model, "model"), "--ref", str(reference), "--cand", str(candidate)]
    if cand_model is not None:
        args += ["--cand-model", text(cand_model, "candidate model")]
    if feeds is not None:
        args += ["--inputs", text(feeds, "feeds")]
    if node:
        args += ["--node", node]
    opts = options or {}
    if opts.get("criterion") is not None:
        crit = opts["criterion"]
        args += ["--criterion", crit.text() if isinstance(crit, Criterion) else str(crit)]
    if opts.get("input_shapes"):
        args += ["--input-shapes", *(f"{k}:[{','.join(str(d) for d in v)}]" for k, v in opts["input_shapes"].items())]
    if opts.get("seed"):
        args += ["--seed", str(opts["seed"])]
    if opts.get("feed_count", 1) != 1:
        args += ["--feeds", str(opts["feed_count"])]
    if opts.get("keep_fp32"):
        args += ["--keep-fp32", *opts["keep_fp32"]]
    if max_nodes != 3:
        args += ["--max-nodes", str(max_nodes)]
    args += ["--out", text(out, "folder")]
    return shlex.join(args)


# --- the reduction -------------------------------------------------------------------------------------------
@dataclass
class _Pair:
    nodes: list[str]  # reference nodes, topological order
    targets: list[str]  # reference tensors both models output
    reference: onnx.ModelProto
    candidate: onnx.ModelProto
    inputs: list[str]  # reference tensors either model reads


@dataclass
class _Measured:
    feed: int
    cand: dict[str, Any]  # candidate vs expected (worst output)
    pair: dict[str, Any]  # candidate vs reference.onnx
    ref: dict[str, Any]  # reference.onnx vs expected
    reproduced: bool
    ort: dict[str, Any] | None = None  # candidate on ORT CPU vs expected, when the candidate engine is not ORT CPU


class _Reducer:
    def __init__(self, plan, out: Path, max_nodes: int, command: str):
        self.plan, self.out, self.max_nodes, self.command = plan, out, max_nodes, command
        self.crit: Criterion = plan.criterion
        self.graph = plan.ref_graph
        self.values: list[dict[str, np.ndarray]] = [dict(f) for f in plan.feeds]
        self.result = None
        self.notes: list[str] = []
        self._ref_types: dict | None = None
        self.ref_consts = _constant_outputs(plan.ref_model)
        self.cand_consts = _constant_outputs(plan.cand_model)
        self.cand_spec = plan.cand_spec
        self.on_ort = plan.cand_spec.engine == "ort"  # the README snippet's own runtime runs the check

    # nodes --------------------------------------------------------------------------------------------------
    def pick(self, node: str | None) -> tuple[str, list[str]]:
        """The reference node to reduce and the output tensors to compare (paired with the candidate's)."""
        if node is None:
            self.result = self.plan.run()
            harmful = self.result.harmful_culprits
            if not harmful:
                some = [c for c in self.result.culprits if c.introduces_divergence]
                hint = (f"every culprit is harmless to the outputs; pass --node {some[0].node} to reduce it anyway"
                        if some else "nothing to reduce; pass --node NAME to reduce a node anyway")
                raise ReduceError(f"no node introduces a harmful divergence between {self.plan.ref_spec} and "
                                  f"{self.plan.cand_spec} ({self.crit.describe()})", hint)
            top = harmful[0]
            node, first = top.node, top.tensor
        else:
            first = None
            try:
                self.graph.node(node)
            except KeyError:
                node = self._node_from_tensor(node)
        info = self.graph.node(node)
        targets = [t for t in info.outputs if t and t in self.plan.pair_by_tensor]
        if first in targets:
            targets.remove(first)
            targets.insert(0, first)
        if not targets:
            raise ReduceError(f"node {node!r} has no output the candidate model also computes",
                              "pick a node whose output tensor exists on both sides")
        return node, targets

    def _node_from_tensor(self, name: str) -> str:
        producer = self.graph.producer.get(name)
        if producer is not None:
            return producer
        import difflib

        close = difflib.get_close_matches(name, [n.name for n in self.graph.nodes], n=3)
        raise ReduceError(f"unknown node {name!r} in the reference model",
                          f"did you mean {', '.join(close)}?" if close else
                          "pass a node name as `workbench compare` lists culprits")

    # reference values ---------------------------------------------------------------------------------------
    @property
    def ref_types(self) -> dict:
        if self._ref_types is None:
            from ..core.shapes import infer_shapes_lenient, value_types

            self._ref_types = value_types(infer_shapes_lenient(self.plan.ref_model))
        return self._ref_types

    def need(self, names) -> None:
        """Compute the reference's values of ``names`` for every feed (once)."""
        missing = sorted({n for n in names if n not in self.values[0]})
        if not missing:
            return
        log.info("reference values of %d tensor(s)", len(missing))
        with self.plan.ref_engine.prepare(self.plan.ref_model, missing) as session:
            for values, feed in zip(self.values, self.plan.feeds):
                got = session.run(feed)
                for name in missing:
                    values[name] = self._ref_dtype(name, np.asarray(got[name]))

    def _ref_dtype(self, name: str, value: np.ndarray) -> np.ndarray:
        """A reference value in the type the reference model declares (the ``ref`` engine computes in float64)."""
        tp = self.ref_types.get(name)
        et = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
        if et in _NUMPY_TYPES and value.dtype != helper.tensor_dtype_to_np_dtype(et):
            return value.astype(helper.tensor_dtype_to_np_dtype(et))
        return value

    # building -----------------------------------------------------------------------------------------------
    def build(self, nodes: set[str], targets: list[str]) -> _Pair:
        plan, g = self.plan, self.graph
        internal = {o for n in nodes for o in g.node(n).outputs if o} - set(targets)
        ref_known = {t: t for t in (set(g.producer) | set(g.inputs)) if t not in internal and t not in self.ref_consts}
        ref_iso = build_isolation(plan.ref_model, [targets[0]], ref_known, self.ref_types)
        cand_known = {c: r for c, r in plan.known.items() if r not in internal and c not in self.cand_consts}
        cand_targets = [plan.candidate_name(t) for t in targets]
        cand_iso = build_isolation(plan.cand_model, [cand_targets[0]], cand_known, plan.cand_types)
        for side, iso, first in (("reference", ref_iso, targets[0]), ("candidate", cand_iso, cand_targets[0])):
            if first in iso.skipped:
                raise ReduceError(f"cannot cut the {side} side of {sorted(nodes)} out of its model: "
                                  f"{iso.skipped[first]}", "pick another node with --node")
        got = {_ISO_PREFIX.sub("", n.name) for n in ref_iso.model.graph.node if n.op_type != "Constant"}
        if got != nodes:
            log.debug("reference segment %s differs from the chosen nodes %s", sorted(got), sorted(nodes))
        kept = _extra_outputs(ref_iso, targets, targets)
        cand_kept = _extra_outputs(cand_iso, cand_targets, targets)
        both = [t for t in targets if t in kept.values() and t in cand_kept.values()]
        inputs = sorted(set(ref_iso.boundary.values()) | set(cand_iso.boundary.values()))
        self.need(set(inputs) | set(both))
        specs = {n: _spec(n, [v[n] for v in self.values]) for n in set(inputs) | set(both)}
        ref = _standalone(ref_iso, {k: v for k, v in kept.items() if v in both}, specs, "reference")
        cand = _standalone(cand_iso, {k: v for k, v in cand_kept.items() if v in both}, specs, "candidate")
        order = {n.name: n.topo_index for n in g.nodes}
        return _Pair(sorted(nodes, key=order.get), both, ref, cand, inputs)

    # measuring ----------------------------------------------------------------------------------------------
    def measure(self, pair: _Pair, ref_model: Any, cand_model: Any, feeds: list[int]) -> _Measured:
        """Run both models on the given feeds (``*_model``: serialized bytes or file paths, as the README runs
        them); the worst feed by the criterion."""
        best: _Measured | None = None
        for k in feeds:
            inputs = {n: self.values[k][n] for n in pair.inputs}
            expected = {t: self.values[k][t] for t in pair.targets}
            m = self._measure_one(k, ref_model, cand_model, pair.candidate, inputs, expected)
            if best is None or (m.reproduced, self.crit.badness(m.cand)) > (best.reproduced,
                                                                            self.crit.badness(best.cand)):
                best = m
        return best

    def _measure_one(self, k: int, ref_model, cand_model, cand_proto, inputs, expected) -> _Measured:
        ref_out = _ort_or_fail("reference.onnx", ref_model, inputs)
        ort_out = _ort_or_fail("candidate.onnx", cand_model, inputs) if self.on_ort else None
        cand_out = ort_out if ort_out is not None else self._run_engine(cand_proto, inputs)
        cand = self._worst(expected, cand_out)
        pair = self._worst({t: ref_out[t] for t in expected}, cand_out)
        ref = self._worst(expected, ref_out)
        reproduced = self.crit.diverged(cand) and self.crit.diverged(pair)
        ort = None
        if ort_out is None:
            try:
                ort = self._worst(expected, run_ort(cand_model, inputs))
            except Exception as e:  # noqa: BLE001 - ORT CPU may not run what another engine runs; say so
                ort = None
                log.info("candidate.onnx does not run on ONNX Runtime CPU: %s", e)
        return _Measured(k, cand, pair, ref, reproduced, ort)

    def _run_engine(self, model: onnx.ModelProto, inputs: dict) -> dict[str, np.ndarray]:
        from ..core.feeds import input_dtypes

        dtypes = input_dtypes(model)
        with np.errstate(over="ignore", invalid="ignore"):
            feed = {vi.name: np.asarray(inputs[vi.name]).astype(dtypes.get(vi.name, inputs[vi.name].dtype))
                    for vi in model.graph.input}
        with self.plan.cand_engine.prepare(model, [o.name for o in model.graph.output]) as session:
            return session.run(feed)

    def _worst(self, expected: dict, got: dict) -> dict:
        worst = None
        for name, value in expected.items():
            m = ErrorStats().update(value, got[name]).metrics()
            if worst is None or self.crit.badness(m) > self.crit.badness(worst):
                worst = m
        return worst

    # growing ------------------------------------------------------------------------------------------------
    def grow(self, nodes: set[str]) -> str | None:
        """The producer to add next: of the subgraph's input with the worst received error; None when the
        subgraph reads only graph inputs and constants."""
        g = self.graph
        frontier = []
        for n in nodes:
            for t in g.node(n).inputs:
                p = g.producer.get(t) if t else None
                if p is not None and p not in nodes and t not in self.ref_consts and t not in frontier:
                    frontier.append(t)
        if not frontier:
            return None
        received = self._received(frontier)
        worst = max(frontier, key=lambda t: self.crit.badness(received[t]) if t in received else -math.inf)
        log.info("growing by %s (its output %s arrives with %s)", g.producer[worst], worst,
                 _metrics_text(self.crit.metric, received.get(worst, {})))
        return g.producer[worst]

    def _received(self, tensors: list[str]) -> dict[str, dict]:
        """The candidate's full-run error on ``tensors`` (from the comparison when it ran, else measured now)."""
        if self.result is not None:
            known = {t.tensor: t.metrics for t in self.result.tensors}
            if all(t in known for t in tensors):
                return {t: known[t] for t in tensors}
        plan = self.plan
        names = {}
        for t in tensors:
            try:
                names[t] = plan.candidate_name(t)
            except WorkbenchError:
                continue
        self.need(names)
        stats = {t: ErrorStats() for t in names}
        with plan.cand_engine.prepare(plan.cand_model, sorted(set(names.values()))) as session:
            for values, feed in zip(self.values, plan.cand_feeds):
                got = session.run(feed)
                for t, c in names.items():
                    stats[t].update(values[t], got[c])
        return {t: s.metrics() for t, s in stats.items()}

    # the whole run ------------------------------------------------------------------------------------------
    def run(self, node: str | None) -> ReduceResult:
        node, targets = self.pick(node)
        log.info("reducing %s (%s)", node, self.graph.node(node).op_type)
        nodes, attempts = {node}, []
        feeds = list(range(len(self.values)))
        while True:
            pair = self.build(nodes, targets)
            m = self.measure(pair, _source(pair.reference), _source(pair.candidate), feeds)
            attempts.append(Attempt(pair.nodes, m.cand, m.reproduced))
            log.info("%d node(s): %s -> %s", len(nodes), _metrics_text(self.crit.metric, m.cand),
                     "reproduces" if m.reproduced else "does not reproduce")
            if m.reproduced or len(nodes) >= self.max_nodes:
                break
            more = self.grow(nodes)
            if more is None:
                self.notes.append("the subgraph reads only graph inputs and constants: it cannot grow further")
                break
            nodes.add(more)
        return self.write(node, pair, m.feed, attempts)

    def write(self, node: str, pair: _Pair, feed: int, attempts: list[Attempt]) -> ReduceResult:
        """Write the files into a private folder beside ``out``, check them, then rename it into place."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        made = tempfile.mkdtemp(prefix=temp_prefix(self.out.name), suffix=".tmp", dir=self.out.parent)
        with staged(made):  # removed on an error, an interrupt, or by the CLI's Ctrl-C/SIGTERM exit
            stage = Path(made)
            result = self._write_into(stage, node, pair, feed, attempts)
            os.chmod(stage, 0o777 & ~umask())
            check_out(self.out)  # again: it may have filled up while the comparison ran
            if self.out.is_dir():
                self.out.rmdir()
            os.replace(stage, self.out)
        clean_stale(self.out.parent)  # what killed runs left beside it
        result.files = {name: self.out / name for name in FILES}
        log.info("wrote %s", self.out)
        return result

    def _write_into(self, folder: Path, node: str, pair: _Pair, feed: int, attempts: list[Attempt]) -> ReduceResult:
        files = {name: folder / name for name in FILES}
        inputs = {n: self.values[feed][n] for n in pair.inputs}
        expected = {t: self.values[feed][t] for t in pair.targets}
        save_model(pair.reference, files["reference.onnx"])  # weights left mapped: NAME.onnx.data beside it
        save_model(pair.candidate, files["candidate.onnx"])
        atomic_write_bytes(files["inputs.npz"], npz_bytes(inputs))
        atomic_write_bytes(files["expected.npz"], npz_bytes(expected))
        # the check, from the written files, as the README does it
        with np.load(files["inputs.npz"]) as fi, np.load(files["expected.npz"]) as fe:
            stored_in = {k: fi[k] for k in fi.files}
            stored_exp = {k: fe[k] for k in fe.files}
        self.values = [{**stored_in, **stored_exp}]
        m = self.measure(pair, os.fspath(files["reference.onnx"]), os.fspath(files["candidate.onnx"]), [0])
        if m.reproduced != attempts[-1].reproduced:
            self.notes.append("the check from the written files disagrees with the in-memory one")
        info = self.graph.node(node)
        if len(self.plan.feeds) > 1:
            self.notes.append(f"inputs.npz holds the reference's tensors from feed {feed + 1} of "
                              f"{len(self.plan.feeds)} (the one with the worst divergence)")
        ref_err = m.ref.get(self.crit.metric)
        if not _agrees(m.ref):
            self.notes.append(f"reference.onnx on ONNX Runtime CPU differs from the {self.plan.ref_spec} engine's "
                              f"values ({self.crit.metric} {_fmt(ref_err)})")
        result = ReduceResult(
            out=self.out, node=node, op_type=info.op_type, nodes=pair.nodes,
            op_types=[self.graph.node(n).op_type for n in pair.nodes],
            candidate_nodes=[n.op_type for n in pair.candidate.graph.node], outputs=pair.targets,
            inputs=pair.inputs, reproduced=m.reproduced, criterion=self.crit, metrics=m.cand, pair_metrics=m.pair,
            reference_metrics=m.ref, engine=self._engine_label(), max_nodes=self.max_nodes, command=self.command,
            files=files, attempts=attempts, ort_metrics=m.ort, notes=self.notes)
        atomic_write_text(files["README.md"], readme(result, self.plan))
        return result

    def _engine_label(self) -> str:
        if self.on_ort:
            return "ONNX Runtime CPU"
        return str(self.cand_spec.engine)


def _source(model: onnx.ModelProto):
    """What ONNX Runtime runs a pair side from: its bytes, or the proto itself when its weights are left mapped
    (:func:`workbench.reduce.files.run_ort` tells ONNX Runtime where they are)."""
    from ..model.mapped import has_mapped

    return model if has_mapped(model) else model.SerializeToString()
