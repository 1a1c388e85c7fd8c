"""A pytest plugin that records each test's CPU time (this process and the children it reaped), wall time, live
Python objects and garbage collections, one JSON line per test, to find tests that cost more inside the suite than
alone (the session that found ten full collections per repair in workers that had loaded the UI used it):

    PYTHONPATH=scripts python -m pytest -p pytest_cpu -n 4 ...   # lines in $PYTEST_CPU_OUT (default /tmp/pytest-cpu)
    python scripts/pytest_cpu.py [DIR]                            # the 30 costliest tests, and the jumps in objects

CPU of processes a test started but did not wait for (a JupyterLab server, Ray) lands on the test that reaps them.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

OUT = Path(os.environ.get("PYTEST_CPU_OUT", "/tmp/pytest-cpu"))


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own0, kids0), wall0, gc0 = _cpu(), time.time(), _collections()
    yield
    own1, kids1 = _cpu()
    record = {"id": item.nodeid, "self": own1 - own0, "children": kids1 - kids0, "wall": time.time() - wall0,
              "objects": len(gc.get_objects()), "collections": _collections() - gc0}
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def report(folder: Path) -> None:
    for path in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        print(f"{path.name}: {len(rows)} tests, {sum(r['self'] + r['children'] for r in rows):.0f} s CPU, "
              f"{sum(r['wall'] for r in rows):.0f} s wall")
        before = 0
        for r in rows:
            if r["objects"] - before > 100_000:
                print(f"  +{r['objects'] - before} live objects after {r['id']}")
            before = r["objects"]
    rows = [json.loads(line) for p in folder.glob("*.jsonl") for line in p.read_text().splitlines()]
    for r in sorted(rows, key=lambda r: -(r["self"] + r["children"]))[:30]:
        print(f"{r['self'] + r['children']:7.1f} s CPU {r['wall']:7.1f} s wall {r['collections']:5d} gc  {r['id']}")


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
