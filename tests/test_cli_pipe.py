"""A CI gate reads the exit code: output piped into a reader that stops early (``| head -1``, ``| true``) must
not turn a divergence into 0."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import SAMPLES


def test_a_closed_stdout_keeps_the_verdicts_exit_code(tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write raises BrokenPipeError
    try:
        proc = subprocess.run([sys.executable, "-m", "workbench", "compare", str(SAMPLES / "fp16_clamp_constant.onnx"),
                               "--cand", "ort:fp16"], stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 1, proc.stderr  # diverged, as with a reader
    assert "Traceback" not in proc.stderr
