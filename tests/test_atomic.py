"""Atomic writes: whole files only, ordinary permissions, no temp files left behind."""

from __future__ import annotations

import os
import stat

import pytest

from workbench._atomic import atomic_write_bytes, atomic_write_text


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
