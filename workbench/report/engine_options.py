"""Engine options read from a bundle: only an allow-list per engine reaches an engine constructor.

A bundle is someone else's file: its options may not name paths, cache folders or libraries (OpenVINO's
CACHE_DIR, TensorRT cache dirs, ORT provider options that load plugins), nor numbers that exhaust the machine
(3000 threads). What is not on the list, or out of its bounds, is dropped with a note the rerun prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], str | None]  # the problem with a value, or None when it is allowed


def _threads_cap() -> int:
    return max(1, os.cpu_count() or 1) * 4


def _int(lo: int, hi: int | Callable[[], int]) -> Check:
    def check(value: Any) -> str | None:
        top = hi() if callable(hi) else hi
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= top:
            return f"allowed: a whole number {lo}..{top} on this machine"
        return None
    return check


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "allowed: true or false"


def _choice(*values: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in values else f"allowed: {', '.join(values)}"
    return check


def _pattern(regex: str, what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and re.fullmatch(regex, value) else f"allowed: {what}"
    return check


_ORT = {"threads": _int(0, _threads_cap), "graph_optimization": _choice("all", "extended", "basic", "disable"),
        "memory_arena": _bool}
_DEVICE_ID = _int(0, 63)
_WORKSPACE = _int(1, 1 << 40)
_OV_PRECISION = _choice("f32", "f16", "bf16")
#: engine name -> option -> check, or a nested table for a dict-valued option
ALLOWED: dict[str, dict[str, Any]] = {
    "ort": _ORT,
    "ort-cuda": {**_ORT, "provider_options": {
        "device_id": _DEVICE_ID, "gpu_mem_limit": _int(1, 1 << 50),
        "cudnn_conv_algo_search": _choice("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
        "arena_extend_strategy": _choice("kNextPowerOfTwo", "kSameAsRequested")}},
    "ort-trt": {**_ORT, "provider_options": {
        "device_id": _DEVICE_ID, "trt_fp16_enable": _bool, "trt_int8_enable": _bool,
        "trt_max_workspace_size": _WORKSPACE, "trt_builder_optimization_level": _int(0, 5)}},
    "openvino": {"device": _pattern(r"(CPU|GPU(\.\d{1,2})?|NPU)", "CPU, GPU, GPU.N, NPU"),
                 "inference_precision": _OV_PRECISION, "config": {
                     "INFERENCE_NUM_THREADS": _int(1, _threads_cap), "NUM_STREAMS": _int(1, _threads_cap),
                     "PERFORMANCE_HINT": _choice("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"),
                     "EXECUTION_MODE_HINT": _choice("PERFORMANCE", "ACCURACY"),
                     "INFERENCE_PRECISION_HINT": _OV_PRECISION, "ENABLE_CPU_PINNING": _bool}},
    "trt": {"strongly_typed": _bool, "workspace": _WORKSPACE, "use_debug_tensors": _bool},
    "ref": {"precision": _choice("float64", "native")},
}
_WHY_NOT = "not allowed from a bundle (paths, caches and libraries never come from one)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(text: str) -> str:
    return _short(str(text))[1:-1]  # control characters escaped, no quotes


def _filter(raw: Any, table: dict[str, Any], where: str, notes: list[str]) -> dict:
    if not isinstance(raw, dict):
        notes.append(f"engine options {where} dropped: {_short(raw)} is not a JSON object")
        return {}
    kept = {}
    for key, value in raw.items():
        name = f"{where}.{_name(key)}"
        check = table.get(key)
        if check is None:
            notes.append(f"engine option {name}={_short(value)} dropped: {_WHY_NOT}")
        elif isinstance(check, dict):
            inner = _filter(value, check, name, notes)
            if inner:
                kept[key] = inner
        elif (problem := check(value)) is not None:
            notes.append(f"engine option {name}={_short(value)} dropped ({problem})")
        else:
            kept[key] = value
    return kept


def bundle_engine_options(raw: Any) -> tuple[dict[str, dict], list[str]]:
    """The allowed part of a bundle's ``engine_options`` ({engine: {option: value}}), and a note per dropped
    option. Nothing outside :data:`ALLOWED` is kept."""
    if raw is None or raw == {}:
        return {}, []
    notes: list[str] = []
    if not isinstance(raw, dict):
        return {}, [f"engine options dropped: {_short(raw)} is not a JSON object"]
    clean = {}
    for engine, options in raw.items():
        table = ALLOWED.get(engine)
        if table is None:
            notes.append(f"engine options for {_short(engine)} dropped: only built-in engines take options from "
                         "a bundle")
            continue
        kept = _filter(options, table, _name(engine), notes)
        if kept:
            clean[engine] = kept
    return clean, notes
