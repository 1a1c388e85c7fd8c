"""Test engines that really misbehave, loaded by dotted path ("engine_fixtures:MisbehavingEngine") in a worker.

``how``: "segfault" (ctypes.string_at(0)), "abort" (os.abort), "hang" (sleeps), "memory" (allocates until
MemoryError), "exit" (os._exit(3)), "raise" (a plain ValueError), "none" (doubles input "x" into "y").
``when``: "run" or "prepare"; a feed named "how" overrides ``how`` for one run.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from workbench.engines.base import Engine, Session


def misbehave(how: str) -> None:
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    elif how == "hang":
        time.sleep(3600)
    elif how == "memory":
        blocks = []
        while True:
            blocks.append(np.ones(2**25))  # 256 MiB each, touched
    elif how == "exit":
        os._exit(3)
    elif how == "raise":
        raise ValueError("boom from the test engine")


class MisbehavingEngine(Engine):
    name = "misbehaving"

    def __init__(self, how: str = "none", when: str = "run"):
        self.how, self.when = how, when

    def prepare(self, model, outputs) -> Session:
        if self.when == "prepare":
            misbehave(self.how)
        return _Session(self.how, list(outputs))

    def describe(self) -> dict:
        return {"engine": self.name, "how": self.how, "when": self.when, "pid": os.getpid()}


class _Session(Session):
    def __init__(self, how: str, outputs: list[str]):
        self.how, self.outputs = how, outputs

    def run(self, feeds):
        misbehave(str(feeds["how"]) if "how" in feeds else self.how)
        return {"y": np.asarray(feeds["x"]) * 2, "pid": np.array(os.getpid())}


class CountingReference(Engine):
    """A third-party engine in one file: onnx's reference evaluator in the model's own types, counting sessions.
    Registered by class path (``engine_fixtures:CountingReference``) or through an entry point in the tests."""

    name = "counting-ref"
    label = "onnx reference evaluator, counting sessions (test engine)"
    variants = ("fp32", "fp16")
    sessions = 0

    def prepare(self, model, outputs) -> Session:
        from workbench.engines.reference import ReferenceEngine

        type(self).sessions += 1
        return ReferenceEngine(precision="native").prepare(model, outputs)

    def describe(self) -> dict:
        return {"engine": self.name, "sessions": type(self).sessions}


class WrongOutputsEngine(Engine):
    """ONNX Runtime with its results spoilt as a broken engine spoils them: ``how`` "drop" returns none of the
    requested tensors, "first3" each tensor's first three values (another shape)."""

    name = "wrong-outputs"
    how = "drop"

    def prepare(self, model, outputs) -> Session:
        from workbench.engines.ort import OrtEngine

        return _Spoilt(OrtEngine().prepare(model, outputs), self.how)

    def describe(self) -> dict:
        return {"engine": self.name, "how": self.how}


class TruncatingEngine(WrongOutputsEngine):
    how = "first3"


class _Spoilt(Session):
    def __init__(self, inner: Session, how: str):
        self.inner, self.how = inner, how

    def run(self, feeds):
        got = self.inner.run(feeds)
        return {} if self.how == "drop" else {k: np.asarray(v).ravel()[:3] for k, v in got.items()}

    def close(self) -> None:
        self.inner.close()
