"""The cost of looking inside the engine: `workbench.engine_graph` (profiled runs, optimized graph, mapping) against a
plain run of the same engine on the same model and feeds, side by side in one run.

    python benchmarks/bench_engine_graph.py [--models ppocr-det ppocr-rec ppocr-cls] [--engines ort openvino]
                                            [--runs 20] [--out results.json]

Each side runs in its own process on the same seeded random feed, after the same imports and model load (so the
difference is the engine's profiling and the mapping, not the workbench's import):
    plain:    ORT: InferenceSession (ORT_ENABLE_ALL, CPU) | OpenVINO: compile_model (f32, no PERF_COUNT);
              1 warm-up + N timed session.run / infer calls
    profiled: workbench.engine_graph(model, ENGINE, runs=N): the same session with ORT's profiler on and its
              optimized model saved (OpenVINO: PERF_COUNT on), 1 warm-up + N runs, then the mapping to ONNX nodes
Printed per model and engine: median ms per run (plain vs profiled: what the profiler adds to each run), wall time
of the whole process (session build + runs + mapping), peak RSS (os.wait4's ru_maxrss of each child), and the
profiled/plain ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"ppocr-det": [1, 3, 320, 320], "ppocr-rec": [1, 3, 48, 320], "ppocr-cls": [1, 3, 48, 192],
          "ppocrv3-det": [1, 3, 320, 320], "ppocrv3-rec": [1, 3, 48, 320]}

PLAIN = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[5])
from workbench.model.load import load_model
model, engine, shape, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
load_model(model)  # the same imports and model copy as the profiled side: only the engine's part differs
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
if engine == "ort":
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, {"x": x})
else:
    import openvino as ov
    core = ov.Core()
    m = core.read_model(model)
    m.reshape({"x": shape})
    request = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    run = lambda: request.infer({"x": x})
run()
times = []
for _ in range(runs):
    t = time.perf_counter(); run(); times.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"run_ms": float(np.median(times))}))
"""

PROFILED = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[5])
from workbench import engine_graph
model, engine, shape, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
graph = engine_graph(model, engine, feeds={"x": x}, runs=runs)
print(json.dumps({"run_ms": graph.end_to_end_ms, "wall_run_ms": graph.details.get("wall_ms"),
                  "end_to_end_source": graph.end_to_end_source,
                  "nodes": len(graph.nodes), "fused": len(graph.fused_nodes),
                  "latency_share": graph.latency_share, "accounted_share": graph.accounted_share}))
"""


def measure(code: str, args: list[str]) -> dict:
    """Run ``code`` in a child Python: wall seconds, its peak RSS (MiB, os.wait4's ru_maxrss), its JSON line."""
    start = time.perf_counter()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the measured Python
        os.close(read)
        os.dup2(write, 1)
        os.execv(sys.executable, [sys.executable, "-c", code, *args])
    os.close(write)
    with os.fdopen(read) as fh:
        out = fh.read()
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed with exit code {os.waitstatus_to_exitcode(status)}")
    return {"wall_s": time.perf_counter() - start, "rss_mib": usage.ru_maxrss / 1024,
            **json.loads(out.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ppocr-det", "ppocr-rec", "ppocr-cls"], choices=list(SHAPES))
    parser.add_argument("--engines", nargs="+", default=["ort", "openvino"], choices=["ort", "openvino"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_models import fetch

    rows = []
    for name in args.models:
        path = str(fetch(name))
        for engine in args.engines:
            common = [path, engine, json.dumps(SHAPES[name]), str(args.runs)]
            plain = measure(PLAIN, [*common, str(REPO)])
            prof = measure(PROFILED, [*common, str(REPO)])
            prof["run_ms"] = prof.get("wall_run_ms") or prof["run_ms"]  # wall per run on both sides
            rows.append({"model": name, "engine": engine, "runs": args.runs, "plain": plain, "profiled": prof})
            print(f"{name:12s} {engine:9s} per run {plain['run_ms']:8.2f} -> {prof['run_ms']:8.2f} ms "
                  f"({prof['run_ms'] / plain['run_ms']:.2f}x)   process {plain['wall_s']:6.2f} -> "
                  f"{prof['wall_s']:6.2f} s ({prof['wall_s'] / plain['wall_s']:.2f}x)   peak RSS "
                  f"{plain['rss_mib']:7.1f} -> {prof['rss_mib']:7.1f} MiB ({prof['rss_mib'] / plain['rss_mib']:.2f}x)"
                  f"   {prof['nodes']} nodes, {prof['fused']} fused, node times {prof['latency_share']:.0%} of run"
                  + (f" ({prof['accounted_share']:.0%} with dispatch)" if prof.get("accounted_share") else ""),
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
