"""Models whose weights sit in external data files (over 2 GB when asked), made cheaply, and a CLI runner that
measures a child's peak RSS.

The big tables are sparse files: only the row the graph gathers holds data, the rest are holes, so a 2.4 GB
model costs a few MB of disk and a second to make. The graph: ``h = x; h = MatMul(h, W_i) + Gather(T_i, ids)``
for each table ``T_i`` (float32, ``rows x width``; ``ids``: an embedding lookup), output ``y = h``. One gathered
value of ``T_1`` is 1e5, past FP16's range, so an FP16 variant diverges there (a culprit to name).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from peak_rss import peak_mib, wrap  # noqa: E402 - the benchmarks' launcher (its docstring says why)

#: a lock file shared with other multi-GB jobs on a developer's machine (``flock``); unset (CI): no lock
LOCK = os.environ.get("WORKBENCH_BIG_LOCK")
WIDTH = 1024
#: the row every table holds data in (the others are holes); the feeds' ``ids``
ROW = 4097


def _external(name: str, dims: list[int], location: str, offset: int, length: int) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def make_big_model(folder: Path, *, rows: int = 196_608, tables: int = 3, width: int = WIDTH,
                   seed: int = 0) -> Path:
    """Write ``folder/big.onnx`` with ``tables`` float32 tables of ``rows x width`` in external data (tables 0 and 1
    in ``big.bin``, the others in ``big2.bin``; page-aligned offsets); return the model path. Default: 3 x 805 MB
    = 2.4 GB of weights. Only the gathered rows are written (sparse files)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    nbytes = rows * width * 4
    files: dict[str, int] = {}
    inits, nodes = [], []
    handles: dict[str, object] = {}
    h = "x"
    for i in range(tables):
        location = "big.bin" if i < 2 else "big2.bin"
        offset = files.get(location, 0)
        files[location] = offset + nbytes
        fh = handles.get(location) or open(folder / location, "wb")
        handles[location] = fh
        row = rng.standard_normal(width).astype(np.float32)
        if i == 1:
            row[7] = 1e5  # past FP16's largest value: the FP16 variant clamps it
        fh.seek(offset + ROW % rows * width * 4)
        fh.write(row.tobytes())
        inits.append(_external(f"T{i}", [rows, width], location, offset, nbytes))
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                             f"W{i}"))
        nodes.append(helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Gather", [f"T{i}", "ids"], [f"g{i}"], name=f"gather{i}", axis=0))
        out = "y" if i == tables - 1 else f"h{i}"
        nodes.append(helper.make_node("Add", [f"m{i}", f"g{i}"], [out], name=f"add{i}"))
        h = out
    for location, size in files.items():
        fh = handles[location]
        fh.truncate(size)
        fh.close()
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, [1])]
    graph = helper.make_graph(nodes, "big", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    path = folder / "big.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def write_feeds(folder: Path, count: int = 2, width: int = WIDTH, rows: int = 196_608, seed: int = 1) -> Path:
    """``count`` .npz feeds for the big model in ``folder`` (``ids`` = the row holding data)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        np.savez(folder / f"feed{i}.npz", x=rng.standard_normal((1, width)).astype(np.float32),
                 ids=np.array([ROW % rows], dtype=np.int64))
    return folder




def run_cli(args: list[str], *, env: dict | None = None, cap_bytes: int = 6 << 30, lock: bool = True,
            timeout: float = 500) -> tuple[int, str, int, float]:
    """Run ``python -m workbench ARGS`` (under ``flock`` on $WORKBENCH_BIG_LOCK when set); return (exit code,
    stdout+stderr, peak RSS in bytes (ru_maxrss of the child, from os.wait4), seconds). A watchdog kills the child
    past ``cap_bytes`` of RSS (it then fails with -9)."""
    import psutil

    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [sys.executable, "-m", "workbench", *args]
    if lock and LOCK:
        cmd = ["flock", LOCK, *cmd]
    t0 = time.perf_counter()
    out_path = Path(full_env.get("TMPDIR", "/tmp")) / f"bigmodel-cli-{os.getpid()}-{time.monotonic_ns()}.log"
    # through a small launcher: a child's ru_maxrss counts the pages of the pytest worker (GBs) it was forked from
    cmd, rss_path = wrap(cmd)
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
        stop = threading.Event()

        def watch():
            while not stop.wait(0.2):
                try:
                    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                    rss = sum(p.memory_info().rss for p in procs)
                except psutil.Error:
                    continue
                if rss > cap_bytes:
                    for p in procs:
                        try:
                            p.kill()
                        except psutil.Error:
                            pass

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        stop.set()
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text(errors="replace")
    out_path.unlink()
    return proc.returncode, text, int(peak_mib(rss_path, usage.ru_maxrss) * 1024 * 1024), time.perf_counter() - t0
