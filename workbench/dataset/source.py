"""Datasets streamed sample by sample: a folder of .npz, a folder of images with a preprocessing function, or any
Python iterable (a list, a generator, a torch DataLoader).

``open_dataset(obj, preprocess=..., input_names=...)`` gives a :class:`Dataset`; iterating it yields
:class:`Sample` (``index``, ``source``, ``feed``, ``sha256``) one at a time, so memory does not grow with the
number of samples. Each sample's ``sha256`` hashes what identifies it: the file's bytes for files, the arrays
(names, dtypes, shapes, bytes) for Python objects; bundles record these to rerun the same data.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import logging
import numbers
import os
import queue
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
_HINT = ("pass a folder of .npz files (one sample each), a folder of images with --preprocess module:function, or "
         "a Python iterable of feed dicts")


@dataclass
class Sample:
    """One sample: its position, where it came from, its feed and a content hash."""

    index: int
    source: str
    feed: dict[str, np.ndarray]
    sha256: str


class Dataset:
    """A re-iterable stream of :class:`Sample`. ``len()`` is known for folders and sized Python objects (None
    otherwise: :attr:`size`). ``at(index)``, when given, reads one sample directly (see :func:`sample_at`)."""

    def __init__(self, describe: dict, items: Callable[[], Iterable[Sample]], size: int | None,
                 at: Callable[[int], Sample] | None = None):
        self.describe, self._items, self.size, self._at = describe, items, size, at

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._items())

    def __len__(self) -> int:
        if self.size is None:
            raise TypeError("this dataset's length is not known before it is read")
        return self.size

    @property
    def one_shot(self) -> bool:
        """Readable once (a generator): a second pass raises."""
        return isinstance(self._items, _Once)

    def head(self, count: int) -> list[Sample]:
        """The first ``count`` samples (for calibration or a plan's example feed)."""
        out = []
        for sample in self:
            if len(out) >= count:
                break
            out.append(sample)
        return out


def sample_at(dataset: Dataset, index: int) -> Sample:
    """Sample ``index`` of ``dataset`` read again (a result keeps no arrays): directly for folders and Python
    sequences, else by reading the stream up to it. Its ``sha256`` tells whether it is still the sample a run saw."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0 or \
            (dataset.size is not None and index >= dataset.size):
        raise InputError(f"no sample {index!r} in this dataset"
                         + (f" of {dataset.size}" if dataset.size is not None else ""),
                         "pass a sample index from the result (its samples' 'index')")
    if dataset._at is not None:
        return dataset._at(index)
    for sample in dataset:
        if sample.index == index:
            return sample
    raise InputError(f"no sample {index} in this dataset: it ended earlier", "pass an index from the result")


def hash_feed(feed: Mapping[str, np.ndarray]) -> str:
    """A content hash of a feed: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(feed):
        a = np.ascontiguousarray(feed[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _module_from_file(path: Path, what: str):
    """The module of a ``file.py`` named by ``--preprocess``/``--metric``: its source read like any input (a
    regular file, capped: see :mod:`workbench._files`), then compiled and run."""
    from .._files import read_text

    if not os.path.lexists(path):
        raise InputError(f"{what} file not found: {path}", "check the path")
    source = read_text(path, f"{what} file", InputError, kind="code", hint="pass a Python source file")
    resolved = path.resolve()
    spec = importlib.util.spec_from_loader(f"workbench_user_{resolved.stem}", loader=None, origin=str(resolved))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(resolved)
    exec(compile(source, str(resolved), "exec"), module.__dict__)  # noqa: S102 - the user's own code, asked for
    return module


def load_function(ref: str, what: str) -> Callable:
    """``module:function`` or ``path/to/file.py:function`` as a callable, with one clear error when it is not."""
    module_name, sep, attr = str(ref).rpartition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{what} {ref!r} is not MODULE:FUNCTION", f"write e.g. mypackage.prep:{what}")
    try:
        if module_name.endswith(".py"):
            module = _module_from_file(Path(module_name).expanduser(), what)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # a module beside the user's command, as `python -m` finds it
            module = importlib.import_module(module_name)
    except InputError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - user code: any failure is the user's to fix, in one line
        raise InputError(f"cannot import {what} module {module_name!r}: {type(e).__name__}: {e}",
                         "check the module name and that it imports on its own (or pass path/to/file.py:function)") \
            from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"{what} {ref!r}: {module_name} has no function {attr!r}", "check the function name")
    return guarded(fn, ref)


class UserCodeExit(RuntimeError):
    """User code called ``sys.exit()``: reported like any other failure of that code, never ending the run."""


def guarded(fn: Callable, ref: str) -> Callable:
    """``fn`` with a ``sys.exit()`` inside it turned into :class:`UserCodeExit` (an ordinary exception, which
    callers report in one line naming the sample), so user code cannot end the CLI silently with its own code."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SystemExit as e:
            raise UserCodeExit(f"{ref} called sys.exit({e.code!r})") from None

    return call


def open_dataset(obj: Any, *, preprocess: str | Callable | None = None,
                 input_names: list[str] | None = None) -> Dataset:
    """A :class:`Dataset` from ``obj``: a folder (of .npz, or of images when ``preprocess`` is given), a list of
    feed dicts, a generator or a torch DataLoader. ``preprocess`` turns one item (an image path for image folders,
    an element for Python iterables) into a feed dict or an array; ``input_names``: the model's inputs, to name a
    bare array (single-input models) or a tuple of arrays (in input order)."""
    if isinstance(obj, Dataset):
        return obj
    if isinstance(preprocess, str):
        fn = load_function(preprocess, "preprocess")
    elif preprocess is None or callable(preprocess):
        fn = preprocess and guarded(preprocess, _name_of(preprocess))
    else:
        raise InputError(f"preprocess must be a function or 'module:function', not a {type(preprocess).__name__}",
                         "pass a function taking one item (an image path for image folders)")
    names = list(input_names or [])
    if isinstance(obj, (str, os.PathLike)):
        return _folder(Path(obj).expanduser(), fn, names, preprocess if isinstance(preprocess, str) else None)
    if isinstance(obj, Mapping):
        obj = [obj]
    if not isinstance(obj, Iterable) or isinstance(obj, (bytes, np.ndarray)):
        raise InputError(f"cannot read samples from a {type(obj).__name__}", _HINT)
    try:
        size = len(obj)  # type: ignore[arg-type]
    except TypeError:
        size = None
    kind = type(obj).__name__
    described = {"kind": "python", "type": kind, "preprocess": _name_of(preprocess)}

    def make(i: int, item: Any) -> Sample:
        if fn is None:
            return _sample(i, kind, _as_feed(item, names, f"sample {i}"))
        try:
            raw = fn(item)
        except Exception as e:  # noqa: BLE001 - user code: name the sample and the error in one line
            raise InputError(f"preprocess failed on sample {i}: {type(e).__name__}: {e}",
                             "fix the preprocessing function") from None
        return _sample(i, kind, _as_feed(raw, names, f"preprocess of sample {i}"))

    def items() -> Iterator[Sample]:
        for i, item in enumerate(obj):
            yield make(i, item)

    if size is None and iter(obj) is obj:  # a generator: readable once
        once = _Once(items)
        return Dataset(described, once, None)

    def at(i: int) -> Sample:
        return make(i, obj[i])

    return Dataset(described, items, size, at if isinstance(obj, Sequence) else None)


def _sample(i: int, kind: str, feed: dict[str, np.ndarray]) -> Sample:
    return Sample(i, f"{kind}[{i}]", feed, hash_feed(feed))


class _Once:
    """A one-shot iterator behind a re-iterable facade: a second pass says so instead of yielding nothing."""

    def __init__(self, items: Callable[[], Iterator[Sample]]):
        self._items, self._used = items, False

    def __call__(self) -> Iterator[Sample]:
        if self._used:
            raise InputError("this generator's samples were already read once",
                             "pass a list, a DataLoader or a function's fresh generator for every run")
        self._used = True
        return self._items()


def _folder(folder: Path, fn: Callable | None, names: list[str], preprocess_ref: str | None) -> Dataset:
    if not folder.exists():
        raise InputError(f"dataset folder not found: {folder}", "check the path")
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder", _HINT)
    entries, odd = _entries(folder)
    npz = [f for f in entries if f.suffix.lower() == ".npz"]
    images = [f for f in entries if f.suffix.lower() in IMAGE_SUFFIXES]
    if fn is not None:
        files = images or entries
        kind = "images" if images else "files"
    elif npz:
        files, kind = npz, "npz"
    elif images:
        raise InputError(f"{folder} holds images but no preprocessing function",
                         "pass --preprocess module:function (a function taking an image path and returning the "
                         "model's input array or a feed dict)")
    else:
        raise InputError(f"{folder} holds no .npz samples", _HINT)
    suffixes = {"npz": (".npz",), "images": IMAGE_SUFFIXES}.get(kind)
    bad = [(f, why) for f, why in odd if suffixes is None or f.suffix.lower() in suffixes]
    if bad:  # named like a sample but unreadable as one: refused rather than silently left out of the count
        f, why = bad[0]
        raise InputError(f"{folder}: {f.name} is {why}, not a sample file"
                         + (f" (and {len(bad) - 1} more like it)" if len(bad) > 1 else ""),
                         "remove it from the dataset folder or replace it with the sample's file")
    if not files:
        raise InputError(f"{folder} holds no samples", _HINT)
    described = {"kind": kind, "folder": str(folder.resolve()), "count": len(files), "preprocess": preprocess_ref
                 or _name_of(fn)}

    def read(i: int) -> Sample:
        from ..inputs.files import _load_npz

        f = files[i]
        digest = _digest(f)
        if fn is None:
            feed = _load_npz(f, max_bytes=MAX_SAMPLE_BYTES)
        else:
            try:
                raw = fn(str(f))
            except Exception as e:  # noqa: BLE001 - user code: name the sample and the error in one line
                raise InputError(f"preprocess failed on {f.name}: {type(e).__name__}: {e}",
                                 "fix the preprocessing function (it takes a file path)") from None
            feed = _as_feed(raw, names, f"preprocess of {f.name}")
        return Sample(i, f.name, feed, digest)

    def items() -> Iterator[Sample]:
        for i in range(len(files)):
            yield read(i)

    return Dataset(described, items, len(files), read)


#: the largest sample file read
MAX_SAMPLE_BYTES = 2 * 1024**3


def _entries(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The folder's regular files (symbolic links followed; hidden names skipped), and the entries that cannot
    be read as a sample file (a FIFO would block, a device never ends): with what each is. Sub-folders count
    there only when named like a sample (``x.npz/``); other sub-folders are not samples and are skipped."""
    from .._files import file_kind

    regular, odd = [], []
    for f in sorted(folder.iterdir()):
        if f.name.startswith("."):
            continue
        try:
            mode = f.stat().st_mode
        except OSError as e:
            odd.append((f, f"{'a symbolic link that leads nowhere' if f.is_symlink() else 'unreadable'} "
                           f"({e.strerror})"))
            continue
        if stat.S_ISREG(mode):
            regular.append(f)
        elif not stat.S_ISDIR(mode) or f.suffix.lower() in (".npz", *IMAGE_SUFFIXES):
            odd.append((f, file_kind(mode)))
    return regular, odd


def _digest(path: Path) -> str:
    """sha256 of a sample file, read in blocks (never held whole) and refused past :data:`MAX_SAMPLE_BYTES`."""
    from .._files import human_size, open_regular

    def over(size: int) -> InputError:
        return InputError(f"sample file {path} is {human_size(size)}, over the {human_size(MAX_SAMPLE_BYTES)} limit",
                          "use smaller samples")

    h = hashlib.sha256()
    total = 0
    with open_regular(path, "sample file", InputError) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_SAMPLE_BYTES:
            raise over(size)
        try:
            while total <= MAX_SAMPLE_BYTES and (block := fh.read(1 << 20)):  # a file growing meanwhile: capped
                h.update(block)
                total += len(block)
        except OSError as e:
            raise InputError(f"cannot read sample file {path}: {e.strerror}", "check the file") from None
    if total > MAX_SAMPLE_BYTES:
        raise over(total)
    return h.hexdigest()


def checked(proto, sample: Sample, what: str = "sample") -> dict[str, np.ndarray]:
    """``sample``'s feed checked against the model (cast where lossless); an error names the sample."""
    from ..inputs import check_feeds

    try:
        return check_feeds(proto, [sample.feed])[0]
    except InputError as e:
        raise InputError(f"{what} {sample.index} ({sample.source}): {e.message}", e.hint) from None


class Prefetch:
    """``items`` read ahead by a background thread into a bounded queue (``depth`` items, so memory stays flat).
    The consumer waits in short steps calling ``check`` (Cancel), so a Cancel or Ctrl-C ends the run even while
    reading or preprocessing one sample blocks; the reader is then abandoned (a daemon thread) and stops at
    its next item. Errors of the reader are raised in the consumer, in order."""

    def __init__(self, items: Iterable, check: Callable[[], None], depth: int = 8):
        self._check, self._queue, self._stop = check, queue.Queue(depth), threading.Event()
        source = iter(items)  # here: a second read of a one-shot source fails in the caller, at once
        self._thread = threading.Thread(target=self._fill, args=(source,), daemon=True,
                                        name="workbench-dataset-reader")
        self._thread.start()

    def _fill(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put(("item", item)):
                    return
            self._put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put(("error", e))
        finally:
            close = getattr(source, "close", None)
            if close is not None and self._stop.is_set():
                close()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator:
        try:
            while True:
                self._check()
                try:
                    kind, value = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading ahead (the reader ends at its next item)."""
        self._stop.set()


def _name_of(fn: Any) -> str | None:
    if fn is None:
        return None
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _as_feed(item: Any, names: list[str], where: str) -> dict[str, np.ndarray]:
    """A feed dict from what a sample source or a preprocess function gives: a dict, an array (one input), a
    tuple/list of arrays (inputs in order; a DataLoader's ``(x, label)`` keeps the first ``len(inputs)``) or a
    torch tensor. ``where`` names the sample (and the preprocess) in errors."""
    if item is None or isinstance(item, (str, bytes)) or (isinstance(item, Iterator) and not isinstance(item, Mapping)):
        what = "None" if item is None else f"a {type(item).__name__}"
        raise InputError(f"{where} gave {what}, not an array or a feed dict",
                         "return a numpy array (one-input models), a tuple of arrays in input order, or a dict "
                         "{input name: array}")
    if isinstance(item, Mapping):
        return {str(k): _array(v, where, str(k)) for k, v in item.items()}
    if isinstance(item, (tuple, list)):
        if item and all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in item):
            raise InputError(f"{where} gave a {type(item).__name__} of {len(item)} number(s): a sequence is read as "
                             "one array per model input, in order", "return a numpy array (np.asarray(...)) for "
                             "one input, or a dict {input name: array}")
        if not names:
            raise InputError(f"{where}: a sequence of arrays needs the model's input names", "yield feed dicts")
        if len(item) < len(names):
            raise InputError(f"{where}: {len(item)} array(s) for {len(names)} model input(s) ({', '.join(names)})",
                             "yield one array per input, or feed dicts")
        return {n: _array(v, where, n) for n, v in zip(names, item)}
    if len(names) != 1:
        raise InputError(f"{where}: a single array for a model with {len(names)} inputs",
                         "return a feed dict {input name: array}")
    return {names[0]: _array(item, where, names[0])}


def _array(value: Any, where: str, name: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: input {name!r} is not array-like ({e})", "return numpy arrays") from None
    if array.dtype.kind in "OUSVM":  # objects, text, raw bytes, records, dates: no tensor of a model
        raise InputError(f"{where}: input {name!r} is not numeric ({_what(value, array)})",
                         "return numeric numpy arrays")
    return array


def _what(value: Any, array: np.ndarray) -> str:
    if array.dtype.kind == "O" and array.ndim == 0:
        return f"a {type(value).__name__}"
    return f"an array of dtype {array.dtype}"
