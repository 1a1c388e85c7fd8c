"""TensorRT calibration caches (bit-exact, tolerant reading) and ONNX Runtime's calibration table."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import SAMPLES

from workbench.calibrate import calibrate
from workbench.calibrate.exceptions import CacheFormatError
from workbench.calibrate.formats import TrtCache, read_ort_json, read_trt_cache, scale_bits, write_trt_cache


def _float_bits(value: float) -> int:
    return struct.unpack(">I", struct.pack(">f", value))[0]


def test_scale_encoding_known_values():
    assert f"{scale_bits(1.0):08x}" == "3c010204"  # 1/127 as float32, big-endian
    assert f"{scale_bits(127.0):08x}" == "3f800000"
    cache = TrtCache.from_amax({"t": 1.0}, "EntropyCalibration2", 100300)
    assert cache.to_bytes() == b"TRT-100300-EntropyCalibration2\nt: 3c010204\n"
    assert cache.amax["t"] == pytest.approx(1.0, rel=1e-7)


def test_round_trip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(3)
    names = ["input", "(Unnamed Layer* 22) [Constant]_output", "a:b: c", "/model/conv1/Conv_output_0",
             "odd name: 12345678", "trailing:"]
    amax = dict(zip(names, np.abs(rng.standard_normal(len(names))) * 10 ** rng.uniform(-6, 4, len(names))))
    first = write_trt_cache(tmp_path / "a.cache", TrtCache.from_amax(amax, "MinMaxCalibration", 8601))
    cache = read_trt_cache(first)
    assert (cache.version, cache.algorithm, list(cache.bits)) == (8601, "MinMaxCalibration", names)
    second = write_trt_cache(tmp_path / "b.cache", cache)
    assert first.read_bytes() == second.read_bytes()
    for name, a in amax.items():  # the scale read back is float32(amax / 127), bit for bit
        assert _float_bits(cache.scales[name]) == _float_bits(float(np.float32(a / 127)))
        assert scale_bits(cache.amax[name]) == cache.bits[name]


def test_reading_is_tolerant_of_trt_names_colons_case_and_blank_lines():
    text = ("\r\nTRT-100300-EntropyCalibration2\r\n\r\n"
            "(Unnamed Layer* 22) [Constant]_output: 3C010204\r\n"
            "scope:tensor:0: 3f800000\n\n"
            "plain:40000000\n")
    cache = TrtCache.from_bytes(text.encode())
    assert cache.scales == {"(Unnamed Layer* 22) [Constant]_output": pytest.approx(1 / 127, rel=1e-7),
                            "scope:tensor:0": 1.0, "plain": 2.0}
    # ORT's TensorRT EP splits a line at the FIRST ':' and would read the second entry as "scope"
    assert "scope:tensor:0: 3f800000".split(":", 1)[0] == "scope"


@pytest.mark.parametrize("text", ["", "\n\n", "name: 3c010204\n", "TRT-x-Entropy\n", "TRT-8601-MinMax\nname 3c01\n",
                                  "TRT-8601-MinMax\nname: 3c0102\n"])
def test_malformed_caches_raise_one_clear_error(text):
    with pytest.raises(CacheFormatError):
        TrtCache.from_bytes(text.encode())


@pytest.fixture(scope="module")
def report():
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(8)]
    return calibrate(SAMPLES / "int8_outlier.onnx", feeds)


def test_report_cache_and_import(report, tmp_path):
    path = report.write_trt_cache(tmp_path / "out" / "model.cache", "entropy", version=100300)
    lines = path.read_text().splitlines()
    assert lines[0] == "TRT-100300-EntropyCalibration2" and len(lines) == 1 + len(report.tensors)
    assert report.write_trt_cache(tmp_path / "max.cache", "max").read_text().startswith("TRT-100300-MinMaxCalibration")
    imported = report.read_cache(path)
    assert imported.format == "trt" and imported.matched == report.tensors and not imported.unmatched
    for t in report.tensors:
        assert np.float32(imported.amax[t] / 127) == np.float32(report.ranges["entropy"][t] / 127)
    frame = report.ranges_frame()
    assert np.allclose(frame["amax_imported"], frame["amax_entropy"], rtol=1e-6)
    assert report.to_json()["imported"]["scale_bits"]["x"] == f"{imported.bits['x']:08x}"


def test_ort_table_through_ort_writer(report, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dest = tmp_path / "table"
    written = report.write_ort_table(dest, "percentile")
    assert sorted(p.name for p in written) == ["calibration.cache", "calibration.flatbuffers", "calibration.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table"]  # nothing in the working directory
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in written)
    back = read_ort_json(dest / "calibration.json")
    usable = report.usable_ranges("percentile")
    assert back.keys() == usable.keys()
    for t, a in usable.items():
        assert back[t] == float(np.float32(a))
    # the flatbuffers table, read with ORT's generated classes, holds str(amax) per tensor
    from onnxruntime.quantization.CalTableFlatBuffers.TrtTable import TrtTable

    table = TrtTable.GetRootAsTrtTable((dest / "calibration.flatbuffers").read_bytes(), 0)
    entries = {table.Dict(i).Key().decode(): float(table.Dict(i).Value()) for i in range(table.DictLength())}
    assert entries == pytest.approx({t: float(np.float32(a)) for t, a in usable.items()}, rel=1e-6)
    imported = report.read_cache(dest / "calibration.json")
    assert imported.format == "ort-json" and set(imported.matched) == set(usable)
    # ORT's own loader (what quantize_static(calibration_cache_path=...) calls) reads it, labelled Percentile
    from onnxruntime.quantization.calibrate import CalibrationMethod, load_tensors_data

    loaded = load_tensors_data(dest / "calibration.json")
    assert loaded.calibration_method == CalibrationMethod.Percentile and set(loaded.keys()) == set(usable)
    assert all(float(loaded[t].range_value[1]) == float(np.float32(a)) for t, a in usable.items())


def test_read_ort_json_variants(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"a": [-1.5, 2.0], "b": {"lowest": {"data": -3.0, "dtype": "float32",
                                                                      "CLS": "numpy.array"}, "highest": 1.0}}))
    assert read_ort_json(plain) == {"a": 2.0, "b": 3.0}
    wrapped = tmp_path / "tensors.json"
    wrapped.write_text(json.dumps({"CLS": "TensorsData", "data": {"c": {"lowest": -0.5, "highest": 0.25}},
                                   "calibration_method": {"CLS": "CalibrationMethod", "value": "MinMax"}}))
    assert read_ort_json(wrapped) == {"c": 0.5}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(CacheFormatError):
        read_ort_json(bad)
