"""The user's cache folder (never the working directory): saved runs, remembered fingerprints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP = "onnx-drift-workbench"


def user_cache_dir() -> Path:
    """The user's cache folder on this platform: ``$XDG_CACHE_HOME`` or ``~/.cache``; ``%LOCALAPPDATA%`` on
    Windows, ``~/Library/Caches`` on macOS."""
    if sys.platform.startswith("win"):
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
