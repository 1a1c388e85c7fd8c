"""The README's commands are true: quick start scripts exist and the CLI examples on sample models run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = (REPO / "README.md").read_text()


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["bash scripts/start.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    for cmd in commands:
        assert (REPO / cmd.split()[1]).is_file()


def _readme_cli_examples():
    return [line.split("#")[0].strip() for line in README.splitlines()
            if line.startswith(("workbench ", "python -m workbench ")) and "sample_models/" in line]


@pytest.mark.parametrize("command", _readme_cli_examples())
def test_readme_cli_examples_on_sample_models(command, tmp_path):
    # outputs the README writes under /tmp go to this test's own folder (a second run must not find them there)
    argv = [str(tmp_path / a[len("/tmp/"):]) if a.startswith("/tmp/") else a for a in shlex.split(command)]
    if argv[0] == "python":
        argv[0] = sys.executable
    else:
        argv[0] = str(Path(sys.executable).with_name("workbench"))
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    if argv[1] == "compare":  # 1 = done and diverged (these samples have planted faults)
        assert proc.returncode in (0, 1), proc.stderr
        assert "verdict:" in proc.stdout and ("first divergent:" in proc.stdout) == (proc.returncode == 1)
    else:
        assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
