"""Render a dataset of text-line images that a real OCR recognizer reads, and the preprocessing that feeds them.

    python scripts/ocr_dataset.py OUT_DIR [--count 64] [--seed 0]

writes ``OUT_DIR/00000.png ...``: dark text (words, dates, prices, codes) on light backgrounds in the DejaVu fonts.
``rec_image(path)`` turns one image into the PP-OCR recognizer's input exactly as rapidocr-onnxruntime does
(height 48, aspect kept, width >= 320, (x/255-0.5)/0.5), for ``--preprocess scripts/ocr_dataset.py:rec_image``.
The rendering and preprocessing live in tests/ocr_truth.py (independent of the workbench).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ocr_truth  # noqa: E402 - the test helpers hold the reference rendering/preprocessing

WORDS = ["invoice", "total", "amount", "date", "order", "model", "runtime", "latency", "batch", "price", "room",
         "phone", "quick", "brown", "fox", "lazy", "dog", "hello", "world", "ONNX", "engine", "drift", "layer",
         "tensor", "Paris", "Berlin", "Tokyo", "report", "number", "street"]


def text_for(seed: int) -> str:
    """A short line: words, a number, a date or a price, chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 0:
        return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
    if kind == 1:
        return str(int(rng.integers(10, 10**6)))
    if kind == 2:
        return f"{int(rng.integers(1990, 2030))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
    return f"{rng.choice(WORDS).title()}: ${int(rng.integers(1, 9999)):,}.{int(rng.integers(0, 100)):02d}"


def render(folder: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` PNG text lines into ``folder`` (created); returns their paths in order."""
    from PIL import Image

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        s = seed * 100_003 + i
        rgb = ocr_truth.render_text_image(text_for(s), None, None, int(24 + s % 12), s)
        path = out / f"{i:05d}.png"
        Image.fromarray(rgb).save(path)
        paths.append(path)
    return paths


def rec_image(path: str) -> np.ndarray:
    """The PP-OCR recognizer's input (1, 3, 48, W) for the image at ``path``."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"))
    return ocr_truth.rec_preprocess(rgb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder to write the images into")
    p.add_argument("--count", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = render(args.out, args.count, args.seed)
    print(f"wrote {len(paths)} images to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
