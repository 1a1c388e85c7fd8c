"""Calibration data as feeds: a list when it is small and already in memory (random feeds, a dict, a list, an .npz,
a Polygraphy JSON), or a :class:`FeedStream` over a dataset (a folder of .npz, a folder of images with a
``preprocess`` function, a generator, a DataLoader) that reads and checks one sample at a time on every pass.

Collection reads the data several times (once per chunk of tensors, and again for ONNX Runtime's histograms), so
a stream must be re-iterable: a one-shot source (a generator, an iterable of unknown length) is written once to a
temporary folder of .npz files and read back from there. Every complete pass is checked to see the same samples
(their content hashes), so data that changes under a calibration fails it instead of mixing two datasets.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.scratch import temporary_dir
from ..errors import InputError
from .exceptions import CalibrationError

log = logging.getLogger(__name__)


class FeedStream:
    """Checked feeds of a :class:`~workbench.dataset.source.Dataset`, read lazily on every pass (see the module
    docstring). Sized; ``stream[i]`` and ``stream[:n]`` read from the start (a list for slices)."""

    def __init__(self, proto, dataset, what: str = "data", cancel: threading.Event | None = None):
        self.proto, self.what, self.cancel = proto, what, cancel
        self.describe = dict(dataset.describe)
        self._spill = None
        if dataset.size is None:
            dataset = self._spilled(dataset)
        self.dataset = dataset
        self.size = int(dataset.size)
        self.digest: str | None = None  # sha256 over the samples' hashes, from the first complete pass
        if self.size == 0:
            raise CalibrationError(f"{what} holds no samples", "check the folder or the iterable")

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        h = hashlib.sha256()
        count = 0
        for sample in self._samples(self.dataset):
            h.update(sample.sha256.encode())
            count += 1
            yield self._check(sample)
        self._seen(h.hexdigest(), count)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self.size)
            if step != 1:
                raise TypeError("a FeedStream slices from the start with step 1 only")
            out: list[dict[str, np.ndarray]] = []
            if stop <= start:
                return out
            for i, feed in enumerate(self):  # reads no sample past ``stop``
                if i >= start:
                    out.append(feed)
                if i + 1 >= stop:
                    break
            return out
        if isinstance(index, bool) or not isinstance(index, int) or not -self.size <= index < self.size:
            raise IndexError(index)
        return self[index % self.size:index % self.size + 1][0]

    def _samples(self, dataset):
        """``dataset``'s samples; with ``cancel``, read ahead on a thread so that a Cancel ends a pass even while
        one sample's preprocessing blocks."""
        if self.cancel is None:
            return iter(dataset)
        from ..core.progress import Steps
        from ..dataset.source import Prefetch

        return iter(Prefetch(dataset, Steps(None, self.cancel).check))

    def _check(self, sample) -> dict[str, np.ndarray]:
        from ..dataset.source import checked

        return checked(self.proto, sample, f"{self.what} sample")

    def _seen(self, digest: str, count: int) -> None:
        if self.digest is None:
            self.digest = digest
            if count != self.size:
                log.info("%s: %d samples read, %d expected", self.what, count, self.size)
                self.size = count
            return
        if digest != self.digest or count != self.size:
            raise InputError(f"{self.what} changed while it was read: a later pass saw other samples than the first "
                             f"({count} of {self.size})", "keep the dataset unchanged during calibrate() and until "
                             "its bundle is saved (or pass a list of feeds)")

    def _spilled(self, dataset):
        """A one-shot or unsized ``dataset`` written once to a temporary folder of .npz (removed with the
        stream), as a re-iterable folder dataset."""
        from ..dataset.source import open_dataset

        self._spill = temporary_dir("workbench-calibration-")
        folder = Path(self._spill.name)
        count = 0
        for sample in self._samples(dataset):
            np.savez(folder / f"{count:08d}.npz", **self._check(sample))
            count += 1
        log.info("%s: %d samples of a one-shot source written to %s to be read on every pass", self.what, count,
                 folder)
        if count == 0:
            raise CalibrationError(f"{self.what} holds no samples", "check the iterable")
        self.describe["spilled"] = count
        return open_dataset(folder)


def as_feeds(loaded, data: Any, *, preprocess: Any = None, what: str = "data",
             cancel: threading.Event | None = None) -> list[dict] | FeedStream:
    """Checked feeds of ``data``: a :class:`FeedStream` for datasets (see the module docstring), else a list.
    ``cancel``: a Cancel that ends a pass over a dataset even while a sample's preprocessing blocks."""
    from ..dataset.source import Dataset, open_dataset
    from ..inputs import check_feeds

    if is_dataset(data, preprocess):
        names = [i.name for i in loaded.proto.graph.input
                 if i.name not in {t.name for t in loaded.proto.graph.initializer}]
        dataset = data if isinstance(data, Dataset) else open_dataset(data, preprocess=preprocess, input_names=names)
        return FeedStream(loaded.proto, dataset, what, cancel)
    feeds = check_feeds(loaded.proto, data)
    if not feeds:
        raise CalibrationError(f"{what} holds no feeds", "give at least one feed")
    return feeds


def is_dataset(data: Any, preprocess: Any) -> bool:
    """Streamed: a Dataset, anything with a preprocess function, a folder of .npz or images, an iterable that is
    not a list/tuple/dict (a generator, a DataLoader)."""
    from ..dataset.source import IMAGE_SUFFIXES, Dataset

    if isinstance(data, Dataset) or preprocess is not None:
        return True
    if isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser()
        return path.is_dir() and any(f.suffix.lower() in (".npz", *IMAGE_SUFFIXES) for f in path.iterdir())
    if isinstance(data, (Mapping, Sequence, bytes, np.ndarray)):
        return False
    return hasattr(data, "__iter__")
