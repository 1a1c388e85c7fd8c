"""Feeds: random generation, files (.npz, folders, Polygraphy JSON written by Polygraphy itself), checks."""

from __future__ import annotations

import base64
import io
import json
import pickle
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLES, tiny_model
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import InputError
from workbench.inputs import (
    check_feeds,
    feeds_from,
    load_feeds,
    parse_range_overrides,
    parse_shape_overrides,
    random_feeds,
)


def _embedding_model() -> onnx.ModelProto:
    """ids int64 [1,8] -> Gather(emb[100,16]); attention_mask int64 [1,8] -> Cast -> Unsqueeze -> Mul."""
    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32), "emb")
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"], name="/embed/Gather"),
        helper.make_node("Cast", ["attention_mask"], ["m"], name="/mask/Cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"], name="/mask/Unsqueeze"),
        helper.make_node("Mul", ["h", "m3"], ["y"], name="/mask/Mul"),
    ]
    graph = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], [emb, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _dynamic_model() -> onnx.ModelProto:
    """x float [batch, seq, 4] -> Relu."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="/act/Relu")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------- random feeds


def test_random_feeds_are_deterministic_per_seed():
    model = onnx.load(str(SAMPLES / "transformer_block.onnx"))
    a, b = random_feeds(model, seed=3, count=2), random_feeds(model, seed=3, count=2)
    c = random_feeds(model, seed=4, count=2)
    assert len(a) == 2 and set(a[0]) == {"x", "attention_mask"}
    assert a[0]["x"].shape == (1, 16, 64) and a[0]["x"].dtype == np.float32
    for name in a[0]:
        np.testing.assert_array_equal(a[0][name], b[0][name])
        np.testing.assert_array_equal(a[1][name], b[1][name])
        assert not np.array_equal(a[0][name], c[0][name])
    assert not np.array_equal(a[0]["x"], a[1]["x"])  # successive feeds differ
    uniform = random_feeds(model, ranges={"x": (0.0, 1.0)})[0]["x"]
    assert uniform.min() >= 0.0 and uniform.max() < 1.0


def test_dynamic_dims_need_shapes():
    model = _dynamic_model()
    with pytest.raises(InputError) as err:
        random_feeds(model)
    msg = str(err.value)
    assert "'x'" in msg and "dimension 1 (seq)" in msg and "--input-shapes x:[1,N,4]" in msg and "\n" not in msg
    assert random_feeds(model, shapes={"x": [2, 5, 4]})[0]["x"].shape == (2, 5, 4)
    with pytest.raises(InputError, match="does not fit"):
        random_feeds(model, shapes={"x": [2, 5, 3]})
    with pytest.raises(InputError, match="unknown input"):
        random_feeds(model, shapes={"nope": [1]})


def test_token_ids_stay_inside_the_embedding_table_and_ort_runs_them():
    model = _embedding_model()
    feeds = random_feeds(model, count=20, seed=0)
    ids = np.stack([f["ids"] for f in feeds])
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 100 and ids.max() >= 50  # the whole table
    assert all((f["attention_mask"] == 1).all() for f in feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, feeds[0])[0]
    emb = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(out, emb[feeds[0]["ids"]], rtol=1e-6)


def test_integer_names_and_ranges():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["token_type_ids"], ["t"]), helper.make_node("Identity", ["n"], ["o"])], "ints",
        [helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, [1, 4]),
         helper.make_tensor_value_info("n", TensorProto.INT32, [50])],
        [helper.make_tensor_value_info("t", TensorProto.INT64, [1, 4]),
         helper.make_tensor_value_info("o", TensorProto.INT32, [50])],
    )
    model = helper.make_model(graph)
    feed = random_feeds(model)[0]
    assert (feed["token_type_ids"] == 0).all() and feed["n"].dtype == np.int32
    assert 0 <= feed["n"].min() and feed["n"].max() < 10
    ranged = random_feeds(model, ranges={"n": (3, 5)})[0]["n"]
    assert set(np.unique(ranged)) <= {3, 4, 5}


# ---------------------------------------------------------------- files


def test_npz_and_folder_round_trip(tmp_path):
    feeds = random_feeds(_embedding_model(), count=3)
    np.savez(tmp_path / "one.npz", **feeds[0])
    [loaded] = load_feeds(tmp_path / "one.npz")
    assert loaded.keys() == feeds[0].keys() and all(np.array_equal(loaded[k], feeds[0][k]) for k in loaded)
    folder = tmp_path / "set"
    folder.mkdir()
    for name, feed in zip(["b", "c", "a"], feeds):
        np.savez(folder / f"{name}.npz", **feed)
    loaded = load_feeds(folder)
    assert [f["ids"].tolist() for f in loaded] == [feeds[i]["ids"].tolist() for i in (2, 0, 1)]  # sorted by name
    sample = load_feeds(SAMPLES / "transformer_block_inputs.npz")
    assert len(sample) == 1 and np.isneginf(sample[0]["attention_mask"]).any()


def test_polygraphy_json_written_by_polygraphy_round_trips(tmp_path):
    from polygraphy.json import load_json, save_json

    feeds = random_feeds(_embedding_model(), count=2) + [{"ids": np.arange(8).reshape(1, 8),
                                                          "attention_mask": np.zeros((1, 8), np.int64)}]
    path = tmp_path / "inputs.json"
    save_json(feeds, str(path))
    loaded = load_feeds(path)
    assert len(loaded) == 3
    for got, want, theirs in zip(loaded, feeds, load_json(str(path))):
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_array_equal(got[name], theirs[name])
    check_feeds(_embedding_model(), loaded)


def _polygraphy_file(tmp_path, payload: bytes, kind: str = "ndarray"):
    path = tmp_path / "evil.json"
    path.write_text(json.dumps([{"x": {"array": base64.b64encode(payload).decode(), "polygraphy_class": kind}}]))
    return path


def test_pickled_payloads_are_refused(tmp_path):
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    with pytest.raises(InputError, match="pickle"):
        load_feeds(_polygraphy_file(tmp_path, pickle.dumps(Boom())))
    buf = io.BytesIO()
    np.save(buf, np.array([Boom()], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="pickle"):
        load_feeds(_polygraphy_file(tmp_path, buf.getvalue()))
    with pytest.raises(InputError, match="pickle"):
        load_feeds(_polygraphy_file(tmp_path, b"whatever", kind="Tensor"))
    np.savez(tmp_path / "obj.npz", x=np.array([Boom()], dtype=object))
    with pytest.raises(InputError, match="pickle"):
        load_feeds(tmp_path / "obj.npz")


def _forged_npy(shape=(10**11,)) -> bytes:
    """A .npy header declaring ``shape`` float32 (400 GB) followed by 8 bytes of data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 8


def test_forged_headers_are_refused_before_allocating(tmp_path):
    with pytest.raises(InputError, match="declares shape \\[100000000000\\]"):
        load_feeds(_polygraphy_file(tmp_path, _forged_npy()))
    with zipfile.ZipFile(tmp_path / "forged.npz", "w") as zf:
        zf.writestr("x.npy", _forged_npy())
    with pytest.raises(InputError, match="declares shape"):
        load_feeds(tmp_path / "forged.npz")


def test_bad_files_fail_cleanly(tmp_path):
    np.savez(tmp_path / "big.npz", x=np.zeros(1000, np.float32))
    with pytest.raises(InputError, match="feed limit"):
        load_feeds(tmp_path / "big.npz", max_bytes=1000)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_feeds(tmp_path / "junk.json")
    (tmp_path / "plain.json").write_text(json.dumps([{"x": [1, 2, 3]}]))
    with pytest.raises(InputError, match="not a Polygraphy-encoded array"):
        load_feeds(tmp_path / "plain.json")
    (tmp_path / "trunc.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(InputError, match="not a readable .npz"):
        load_feeds(tmp_path / "trunc.npz")
    with pytest.raises(InputError, match="not found"):
        load_feeds(tmp_path / "missing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no .npz or .json"):
        load_feeds(tmp_path / "empty")


def test_feeds_from_accepts_dicts_lists_and_paths(tmp_path):
    feed = {"x": np.ones((1, 4), np.float32)}
    assert feeds_from(feed)[0]["x"] is feed["x"]
    assert len(feeds_from([feed, feed])) == 2 and len(feeds_from(iter([feed]))) == 1
    np.savez(tmp_path / "f.npz", **feed)
    assert feeds_from(str(tmp_path / "f.npz"))[0]["x"].shape == (1, 4)
    with pytest.raises(InputError, match="not a dict"):
        feeds_from([feed, 3])


# ---------------------------------------------------------------- checks


def test_check_feeds_casts_exact_dtypes():
    model = _embedding_model()
    feed = {"ids": np.arange(8, dtype=np.int32).reshape(1, 8), "attention_mask": np.ones((1, 8), np.int32)}
    [checked] = check_feeds(model, feed)
    assert checked["ids"].dtype == np.int64 and checked["ids"].tolist() == feed["ids"].tolist()
    [checked] = check_feeds(tiny_model(), {"x": np.array([[1.0, -np.inf, np.inf, 0.5]])})  # float64, infs allowed
    assert checked["x"].dtype == np.float32 and np.isneginf(checked["x"]).sum() == 1


@pytest.mark.parametrize("feed, words", [
    ({"X": np.ones((1, 4), np.float32)}, ["unknown input(s) 'X'", "the model's inputs: x", "missing input(s) 'x'"]),
    ({"x": np.ones((1, 5), np.float32)}, ["input 'x' has shape [1,5]", "expects [1,4]"]),
    ({"x": np.ones((4,), np.float32)}, ["input 'x' has shape [4] (rank 1)", "rank 2"]),
    ({"x": np.array([[1, np.nan, np.nan, 0]], np.float32)}, ["input 'x' contains 2 NaN value(s)", "np.nan_to_num"]),
    ({"x": np.ones((1, 4), np.int64)}, ["input 'x' is int64 but the model expects float32"]),
])
def test_check_feeds_errors_are_one_line_and_name_the_input(feed, words):
    with pytest.raises(InputError) as err:
        check_feeds(tiny_model(), feed)
    msg = str(err.value)
    assert "\n" not in msg and " -- " in msg
    for word in words:
        assert word in msg


def test_check_feeds_float_ids_and_int_overflow():
    model = _embedding_model()
    with pytest.raises(InputError, match="'ids' is float32 but the model expects int64 \\(integer ids"):
        check_feeds(model, {"ids": np.ones((1, 8), np.float32), "attention_mask": np.ones((1, 8), np.int64)})
    graph = helper.make_graph([helper.make_node("Identity", ["n"], ["o"])], "i8",
                              [helper.make_tensor_value_info("n", TensorProto.INT8, [2])],
                              [helper.make_tensor_value_info("o", TensorProto.INT8, [2])])
    with pytest.raises(InputError, match="outside int8"):
        check_feeds(helper.make_model(graph), [{"n": np.array([1, 300])}])
    with pytest.raises(InputError, match="feed 1: input 'n'"):
        check_feeds(helper.make_model(graph), [{"n": np.array([1, 2])}, {"n": np.array([1, 2, 3])}])


def test_parse_overrides():
    assert parse_shape_overrides(["x:[1,3,224,224]", "input:0:[2]", "s:[]"]) == {
        "x": [1, 3, 224, 224], "input:0": [2], "s": []}
    assert parse_range_overrides(["x:[0,1]", "y:[-1.5, 2e3]"]) == {"x": (0.0, 1.0), "y": (-1.5, 2000.0)}
    for bad in ["x[1,3]", "x:[1,a]", "x:[-1]", ":[1]"]:
        with pytest.raises(InputError, match="input-shapes"):
            parse_shape_overrides([bad])
    for bad in ["x:[1]", "x:[2,1]", "x:[nan,1]", "x:[0,inf]", "x:0,1"]:
        with pytest.raises(InputError, match="val-range"):
            parse_range_overrides([bad])
