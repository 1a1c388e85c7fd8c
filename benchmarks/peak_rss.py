"""A child's own peak RSS, measured from a small launcher.

Linux counts a parent's pages in its child's ``ru_maxrss``: fork copies the parent's resident set into the child's
counters and exec keeps the larger mark (with vfork, the parent's high-water mark). A benchmark that has grown
(torch imported, a model built, outputs decoded) would report at least its own size for every tool it measures,
which pulls every ratio towards 1. :func:`wrap` puts a small Python between the benchmark and the tool: the
launcher starts small after its exec, waits for the tool (``wait4``) and writes the tool's ``ru_maxrss`` into a
file; :func:`peak_mib` reads it. The launcher takes the tool down with it when it is killed (PDEATHSIG), passes on
the tool's exit code (or its signal), and its own ``wait4`` rusage still sums the tool's CPU time.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

LAUNCH = """
import ctypes, os, signal, subprocess, sys
def _die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
proc = subprocess.Popen(sys.argv[2:], preexec_fn=_die_with_parent)
while True:
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        break
    except InterruptedError:
        continue
with open(sys.argv[1], "w") as fh:
    fh.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def wrap(argv: list[str]) -> tuple[list[str], Path]:
    """``argv`` run through the launcher, and the file it writes the tool's peak RSS (KiB) into."""
    fd, name = tempfile.mkstemp(prefix="bench-rss-", suffix=".txt")
    os.close(fd)
    return [sys.executable, "-c", LAUNCH, name, *map(str, argv)], Path(name)


def peak_mib(rss_file: Path, fallback_kib: int) -> float:
    """The tool's peak RSS in MiB from ``rss_file`` (removed); ``fallback_kib`` (the launcher's own figure, an upper
    bound) when the launcher was killed before it could write it."""
    try:
        kib = int(rss_file.read_text() or fallback_kib)
    except (OSError, ValueError):
        kib = fallback_kib
    finally:
        rss_file.unlink(missing_ok=True)
    return kib / 1024
