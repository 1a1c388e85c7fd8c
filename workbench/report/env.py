"""What a result depends on besides the model: package versions, platform, GPU. Nothing heavy is imported:
versions come from package metadata (or the module, when it is already loaded)."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
import sys
from importlib import metadata

log = logging.getLogger(__name__)

#: distribution name -> module name; recorded when installed
PACKAGES = {
    "onnx-drift-workbench": "workbench",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnxruntime-gpu": "onnxruntime",
    "numpy": "numpy",
    "openvino": "openvino",
    "torch": "torch",
    "tensorrt": "tensorrt",
    "polygraphy": "polygraphy",
    "onnxconverter-common": "onnxconverter_common",
    "onnxscript": "onnxscript",
}
_SHORT = {"onnx-drift-workbench": "workbench"}


def package_versions() -> dict[str, str]:
    """``{name: version}`` of the installed packages that can change a result."""
    out = {}
    for dist, module in PACKAGES.items():
        loaded = sys.modules.get(module)
        version = None
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        running = str(getattr(loaded, "__version__", "") or "") if loaded is not None else ""
        if running and module != "onnxruntime" and not running.startswith(version):
            version = running  # the module this process runs differs from what is installed now (upgraded since)
        # else the installed version as the package states it: OpenVINO's __version__ adds its build string, so a
        # run that had imported it would differ from one that had not on the same install
        out[_SHORT.get(dist, dist)] = version
    if "workbench" not in out:
        from .. import __version__

        out["workbench"] = __version__
    return out


def gpu_info() -> list[dict] | None:
    """NVIDIA GPUs as ``nvidia-smi`` lists them; None without nvidia-smi (or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log.info("nvidia-smi failed: %s", e)
        return None
    if proc.returncode != 0:
        return None
    gpus = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus or None


def environment() -> dict:
    """Versions, platform, Python and GPU of this machine."""
    return {
        "versions": package_versions(),
        "python": platform.python_version(),
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "platform": platform.platform(), "implementation": platform.python_implementation()},
        "gpu": gpu_info(),
    }


def diff_versions(before: dict, after: dict) -> dict[str, list]:
    """``{package: [before, after]}`` for packages whose version differs (None: not installed)."""
    names = sorted(set(before) | set(after))
    return {n: [before.get(n), after.get(n)] for n in names if not _same_release(before.get(n), after.get(n))}


def _same_release(a: str | None, b: str | None) -> bool:
    """Equal versions, or one the other plus a build string (OpenVINO's ``2026.4.1-22982-...``, which bundles
    written before :func:`package_versions` kept the installed version recorded when openvino was imported)."""
    if a == b:
        return True
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    short, long = sorted((a, b), key=len)
    return long.startswith(short + "-")
