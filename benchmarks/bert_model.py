"""A BERT-base-like encoder in plain torch (no `transformers`), exported to ONNX for the compare benchmark.

    python benchmarks/bert_model.py [--layers 2 12 24]     # builds (or reuses) the cached models and the feed

Architecture (BERT-base sizes): word 30522x768 + position 512x768 embeddings + LayerNorm, then N layers of
[q/k/v Linear 768->768, attention with the softmax written out (matmul, /sqrt(64), + additive mask from the
input mask, softmax, matmul), output Linear + residual + LayerNorm, FFN 768->3072 GELU ->768 + residual +
LayerNorm]. Sequence 128, batch 1; inputs ``input_ids`` and ``attention_mask`` (int64 [1,128]); output
``last_hidden_state`` (float32 [1,128,768]). Random weights from ``torch.manual_seed(0)``.

Models are exported with the legacy (TorchScript) exporter at opset 17 to ``<cache>/bench/bert-L{N}.onnx``
(``<cache>`` is $WORKBENCH_CACHE or <repo>/.cache), reused when present, written atomically (temp file, then
os.replace). A model over 2 GB would be saved with its weights in ``bert-L{N}.onnx.data`` (external data); the
models the benchmark uses (2, 12, 24 layers) are below that.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

VOCAB = 30522
MAX_POS = 512
HIDDEN = 768
HEADS = 12
HEAD_DIM = HIDDEN // HEADS  # 64
FFN = 3072
SEQ = 128
BATCH = 1
MASKED_TAIL = 16  # the feed's attention_mask is zero on the last 16 positions
FEED_SEED = 0
PROTOBUF_LIMIT = 2 * 1024**3


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE") or REPO / ".cache") / "bench"


def param_count(layers: int) -> int:
    """Parameters of the encoder with ``layers`` layers (no pooler, no token-type embeddings)."""
    ln = 2 * HIDDEN
    layer = 4 * (HIDDEN * HIDDEN + HIDDEN) + (HIDDEN * FFN + FFN) + (FFN * HIDDEN + HIDDEN) + 2 * ln
    return VOCAB * HIDDEN + MAX_POS * HIDDEN + ln + layers * layer


def _build_module(layers: int):
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(HIDDEN, HIDDEN)
            self.k = nn.Linear(HIDDEN, HIDDEN)
            self.v = nn.Linear(HIDDEN, HIDDEN)
            self.out = nn.Linear(HIDDEN, HIDDEN)
            self.ln1 = nn.LayerNorm(HIDDEN, eps=1e-12)
            self.ffn_in = nn.Linear(HIDDEN, FFN)
            self.act = nn.GELU()
            self.ffn_out = nn.Linear(FFN, HIDDEN)
            self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12)

        def heads(self, x):  # [B, S, H] -> [B, heads, S, head_dim]
            return x.view(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)

        def forward(self, x, additive_mask):
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
            probs = torch.softmax(scores + additive_mask, dim=-1)
            ctx = torch.matmul(probs, v).transpose(1, 2).reshape(BATCH, SEQ, HIDDEN)
            x = self.ln1(x + self.out(ctx))
            return self.ln2(x + self.ffn_out(self.act(self.ffn_in(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(VOCAB, HIDDEN)
            self.position = nn.Embedding(MAX_POS, HIDDEN)
            self.ln = nn.LayerNorm(HIDDEN, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.register_buffer("position_ids", torch.arange(SEQ).unsqueeze(0), persistent=False)

        def forward(self, input_ids, attention_mask):
            x = self.ln(self.word(input_ids) + self.position(self.position_ids))
            # [B, S] -> [B, 1, 1, S]: 0 where attended, -10000 where masked (BERT's convention)
            # the mask follows the activations' dtype, so module.half() runs it too (the FP32 export is unchanged)
            additive_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, additive_mask)
            return x

    torch.manual_seed(0)
    return Encoder().eval()


def model_path(layers: int) -> Path:
    return cache_dir() / f"bert-L{layers}.onnx"


def build_model(layers: int) -> Path:
    """The cached ONNX file for an encoder with ``layers`` layers, exported on first use."""
    final = model_path(layers)
    if final.exists():
        return final
    import torch

    final.parent.mkdir(parents=True, exist_ok=True)
    module = _build_module(layers)
    dummy = (torch.zeros(BATCH, SEQ, dtype=torch.int64), torch.ones(BATCH, SEQ, dtype=torch.int64))
    external = param_count(layers) * 4 > PROTOBUF_LIMIT * 0.9
    with tempfile.TemporaryDirectory(prefix=f".{final.name}.", dir=final.parent) as tmp:
        tmp_model = Path(tmp) / final.name
        with torch.no_grad():
            torch.onnx.export(module, dummy, str(tmp_model), dynamo=False, opset_version=17,
                              input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                              do_constant_folding=True)
        if external:
            # The legacy exporter writes one file per tensor past 2 GB; gather them into one file next to the model.
            import onnx

            proto = onnx.load(str(tmp_model), load_external_data=True)
            packed = Path(tmp) / "packed"
            packed.mkdir()
            onnx.save_model(proto, str(packed / final.name), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=f"{final.name}.data", size_threshold=1024)
            del proto
            os.replace(packed / f"{final.name}.data", final.parent / f"{final.name}.data")
            tmp_model = packed / final.name
        os.replace(tmp_model, final)  # last: the .onnx exists only once everything it needs does
    return final


def feed_path() -> Path:
    return cache_dir() / f"bert-feed-s{SEQ}.npz"


def make_feed(seed: int = FEED_SEED) -> dict[str, np.ndarray]:
    """The benchmark's one feed (another ``seed``: another sequence): token ids uniform in [0, 30522), mask ones
    except the last 16 positions."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    attention_mask = np.ones((BATCH, SEQ), dtype=np.int64)
    attention_mask[:, SEQ - MASKED_TAIL:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def build_feed(path: Path | None = None) -> Path:
    """Write the deterministic feed as .npz (atomically) and return its path."""
    path = path or feed_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **make_feed())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_polygraphy_inputs(path: Path) -> Path:
    """The same feed as a Polygraphy inputs JSON (a list of one feed), for ``polygraphy run --load-inputs``."""
    from polygraphy.json import save_json

    save_json([make_feed()], str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 12, 24])
    args = parser.parse_args(argv)
    for n in args.layers:
        path = build_model(n)
        print(f"bert-L{n}: {param_count(n) / 1e6:.1f}M params, {path.stat().st_size / 2**20:.0f} MiB -> {path}")
    print(f"feed -> {build_feed()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
