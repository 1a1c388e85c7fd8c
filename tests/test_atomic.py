"""Atomic writes: whole files only, ordinary permissions, no temp files left behind."""

from __future__ import annotations

import contextlib
import io
import os
import stat

import pytest
from conftest import SAMPLES

from workbench._atomic import atomic_write_bytes, atomic_write_text, tag


def test_atomic_write_replaces_whole_file_with_umask_permissions(tmp_path):
    target = tmp_path / "out" / "a.json"
    atomic_write_text(target, "one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")

    with pytest.raises(TypeError):
        atomic_write_bytes(target, object())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_an_error_names_the_output_not_our_temporary(tmp_path):
    """An output folder where no file can be made (here: /proc) fails at the temporary: the CLI's one line names
    the output the user asked for."""
    from workbench._atomic import shown_path
    from workbench.cli import main

    assert shown_path(f"/proc/.x.json.{tag()}1234.tmp") == "/proc/x.json"
    assert shown_path("/data/model.onnx") == "/data/model.onnx"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["inspect", str(SAMPLES / "healthy_cnn.onnx"), "--no-probe", "--json", "/proc/wb-test.json"])
    assert code == 2 and err.getvalue().rstrip().endswith(": /proc/wb-test.json -- check the path"), err.getvalue()
