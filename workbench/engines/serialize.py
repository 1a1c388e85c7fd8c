"""Handing a ModelProto to a runtime: serialized bytes, or a private file with external data past 2 GB."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx

log = logging.getLogger(__name__)

#: protobuf cannot serialize a message of 2 GiB or more; models past this go through a file with external data.
PROTOBUF_LIMIT = 2**31 - 1


@dataclass
class ModelPayload:
    """``source`` is bytes or the path of a temporary .onnx file; ``close()`` deletes that file's folder."""

    source: bytes | str
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def is_file(self) -> bool:
        return isinstance(self.source, str)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def model_payload(model: onnx.ModelProto, limit: int | None = None) -> ModelPayload:
    """Serialize ``model``; past ``limit`` (default :data:`PROTOBUF_LIMIT`) save it with external data into a
    private temporary folder (never the working directory) and return that path instead."""
    limit = PROTOBUF_LIMIT if limit is None else limit
    if model.ByteSize() < limit:
        return ModelPayload(model.SerializeToString())
    tmp = tempfile.TemporaryDirectory(prefix="workbench-model-")
    path = Path(tmp.name) / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=1024)
    log.info("model is %.1f GB: handing it to the runtime as %s with external data", model.ByteSize() / 1e9, path)
    return ModelPayload(str(path), tmp)
