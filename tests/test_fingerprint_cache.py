"""A model's fingerprint over big external data is remembered per state of its files
(workbench.model.fingerprint): the same value as hashing, no read of the weights the next time, and a fresh hash
after any change to a file -- one rewritten in place with its size and modification time put back included."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.model import fingerprint as fp
from workbench.model.load import load_model


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv(fp.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(fp, "REMEMBER_BYTES", 1024)  # remember this small model's fingerprint too
    table = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(1024, 4), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "i"], ["y"], name="g")], "g",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [table])
    path = tmp_path / "m" / "m.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
              save_as_external_data=True, location="m.bin", size_threshold=0)
    return path


def _by_hand(path) -> str:
    """The fingerprint's definition, computed here: the .onnx bytes, then each file's name and content."""
    h = hashlib.sha256(path.read_bytes())
    h.update(b"\x00m.bin\x00" + (path.parent / "m.bin").read_bytes())
    return h.hexdigest()


def test_remembered_fingerprint_is_the_hash_and_reads_no_weight(model, tmp_path, monkeypatch):
    first = load_model(model).fingerprint
    assert first == _by_hand(model)
    assert [p.read_text().strip() for p in (tmp_path / "cache").iterdir()] == [first]

    def no_read(*a, **k):
        raise AssertionError("the weights were read again")

    monkeypatch.setattr(fp, "open_regular", no_read)
    assert load_model(model).fingerprint == first


def test_a_file_changed_in_place_is_hashed_again(model, tmp_path):
    first = load_model(model).fingerprint
    weights = model.parent / "m.bin"
    st = os.stat(weights)
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF  # same size
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # its modification time put back
    second = load_model(model).fingerprint
    assert second != first and second == _by_hand(model)


def test_a_bad_entry_is_hashed_again_and_the_cache_can_be_off(model, tmp_path, monkeypatch):
    first = load_model(model).fingerprint
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text("0" * 63 + "g\n")
    assert load_model(model).fingerprint == first
    assert entry.read_text().strip() == first
    monkeypatch.setenv(fp.DIR_ENV, "none")
    entry.unlink()
    assert load_model(model).fingerprint == first and not list((tmp_path / "cache").iterdir())
