"""Reading the inputs JSON that ``polygraphy run --save-inputs`` writes, without Polygraphy and without pickle.

The file is a JSON list of ``{input name: encoded array}``; an array is encoded as
``{"array": base64 of np.save bytes, "polygraphy_class": "ndarray"}`` (older files mark it with
``"__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type"``).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from ..errors import InputError
from .npy import load_npy_bytes

_TYPE_KEY = "polygraphy_class"
_LEGACY_KEY = "__polygraphy_encoded_ndarray"


def decode_feeds(text: str, source: str) -> list[dict[str, np.ndarray]]:
    """Decode Polygraphy inputs JSON text (a list of feeds, or one feed) into feeds of numpy arrays."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{source} is not valid JSON ({e.msg} at line {e.lineno})",
                         "pass a file written by `polygraphy run --save-inputs`, or an .npz") from None
    except RecursionError:
        raise InputError(f"{source} nests too deeply to be an inputs file",
                         "pass a file written by `polygraphy run --save-inputs`, or an .npz") from None
    items = obj if isinstance(obj, list) else [obj]
    feeds = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or _is_encoded(item):
            raise InputError(f"{source}: entry {i} is not a feed (a JSON object of input name -> array)",
                             "pass a file written by `polygraphy run --save-inputs`")
        feeds.append({name: decode_array(value, f"{source}: feed {i}, input '{name}'") for name, value in
                      item.items()})
    if not feeds:
        raise InputError(f"{source} holds no feeds", "save at least one feed")
    return feeds


def _is_encoded(d: dict) -> bool:
    return _TYPE_KEY in d or _LEGACY_KEY in d


def decode_array(value: Any, where: str) -> np.ndarray:
    """One Polygraphy-encoded ndarray; pickled payloads and other classes are refused."""
    if not isinstance(value, dict) or not _is_encoded(value):
        raise InputError(f"{where} is not a Polygraphy-encoded array",
                         "values must be {\"array\": <base64 .npy>, \"polygraphy_class\": \"ndarray\"}")
    kind = value.get(_TYPE_KEY, "ndarray")
    if kind != "ndarray" or not isinstance(value.get("array"), str):
        raise InputError(f"{where} is a serialized {kind!s}, which is stored with pickle; refusing to load it",
                         "save the inputs as numpy arrays (np.ndarray), not torch tensors or other objects")
    try:
        data = base64.b64decode(value["array"].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InputError(f"{where}: the array payload is not base64",
                         "re-save the inputs with a current Polygraphy (base64 .npy encoding)") from None
    return load_npy_bytes(data, where)
