"""Safe reading of .npy data: the header is checked (no object dtype, size matching the bytes present)
before numpy allocates anything, and nothing is ever unpickled."""

from __future__ import annotations

import io
from typing import IO

import numpy as np
from numpy.lib import format as npy_format

from ..errors import InputError

_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


def check_npy_header(fp: IO[bytes], available: int, where: str) -> None:
    """Read the header at ``fp`` and check it describes at most ``available`` bytes of plain (non-object) data."""
    start = fp.tell()
    try:
        version = npy_format.read_magic(fp)
        reader = _READERS.get(version)
        if reader is None:  # newer header versions: np.load still refuses pickles and checks sizes itself
            return
        shape, _, dtype = reader(fp)
    except ValueError as e:
        raise InputError(f"{where} is not .npy data ({e})", "save arrays with np.save / np.savez") from None
    if dtype.hasobject:
        raise InputError(f"{where} holds pickled (object) data; refusing to unpickle it",
                         "store plain numeric or bool arrays")
    declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    present = available - (fp.tell() - start)
    if declared > present:
        raise InputError(f"{where} declares shape {list(shape)} {dtype} ({declared} bytes) but holds {present} bytes",
                         "the file is truncated or forged; re-save the array with np.save")


def load_npy_bytes(data: bytes, where: str) -> np.ndarray:
    """np.load of in-memory .npy bytes with ``allow_pickle=False``, after :func:`check_npy_header`."""
    if not data.startswith(b"\x93NUMPY"):
        raise InputError(f"{where} is not .npy data (pickled or unknown payload); refusing to load it",
                         "save arrays with np.save / polygraphy's save_json, never with pickle")
    buf = io.BytesIO(data)
    check_npy_header(buf, len(data), where)
    buf.seek(0)
    try:
        return np.load(buf, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise InputError(f"{where} holds pickled (object) data; refusing to unpickle it",
                             "store plain numeric or bool arrays") from None
        raise InputError(f"{where}: unreadable .npy data ({e})", "re-save the array with np.save") from None
    except (OSError, EOFError, MemoryError) as e:
        raise InputError(f"{where}: unreadable .npy data ({type(e).__name__})",
                         "re-save the array with np.save") from None
