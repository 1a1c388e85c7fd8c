"""Issue 22 defect 7: calibration's range phase (every method over every tensor's histogram, after the feeds are
collected) reports progress tensor by tensor and stops on cancel within it, not at its end. Event order only: the
cancel is set by the phase's own work, never by a clock."""

from __future__ import annotations

import threading

import pytest
from conftest import SAMPLES

from workbench.calibrate import api, calibrate
from workbench.calibrate.collect import activation_tensors
from workbench.calibrate.methods import METHODS, compute_range
from workbench.errors import Cancelled
from workbench.model.load import load_model

MODEL = SAMPLES / "transformer_block.onnx"
RANGES = "ranges by"


def _tensors() -> int:
    return len(activation_tensors(load_model(MODEL)))


def test_range_phase_reports_progress_tensor_by_tensor():
    seen: list[tuple[float, str]] = []
    calibrate(MODEL, 2, progress=lambda f, m: seen.append((f, m)))
    phase = [f for f, m in seen if m.startswith(RANGES)]
    n = _tensors()
    assert n >= 10 and len(phase) >= n  # one update per tensor (the skipped ones aside), plus its start
    assert len(set(phase)) == len(phase) and phase == sorted(phase)  # strictly increasing within the phase
    values = [f for f, _ in seen]
    assert values == sorted(values) and values[-1] == 1.0
    first = next(k for k, (_, m) in enumerate(seen) if m.startswith(RANGES))
    before, after = values[:first], values[first + len(phase):]
    assert max(before) <= phase[0] and phase[-1] <= min(after)  # its own span of the bar, after collecting


def test_cancel_during_the_range_phase_stops_it_before_its_end(monkeypatch):
    cancel = threading.Event()
    calls: list[int] = []
    lock = threading.Lock()
    at = 3 * len(METHODS)  # the third tensor's last method: the phase is under way

    def counted(*args, **kwargs):
        with lock:
            calls.append(1)
            if len(calls) == at:
                cancel.set()
        return compute_range(*args, **kwargs)

    monkeypatch.setattr(api, "compute_range", counted)
    seen: list[str] = []
    with pytest.raises(Cancelled):
        calibrate(MODEL, 2, cancel=cancel, progress=lambda f, m: seen.append(m))
    total = _tensors() * len(METHODS)
    # the workers (at most two) finish the method they are in; no tensor after them starts
    assert at <= len(calls) <= at + 2 * len(METHODS) < total, (len(calls), total)
    assert any(m.startswith(RANGES) for m in seen)
    assert not any(m.startswith(RANGES) and m.endswith(f"{_tensors()}/{_tensors()}") for m in seen)
