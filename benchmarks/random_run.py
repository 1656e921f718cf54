"""A run folder holding a GPT with random weights and a byte-level BPE tokenizer of exactly its
vocabulary: what the speed benchmarks load, quantize and export to GGUF. Random weights decode as fast
as trained ones (the same products, the same bytes read), and the seed makes them the same every run.

SHAPES: the 6 x 384 GPT-2-block model of the earlier measurements (vocabulary 257: the 256 bytes and
<|endoftext|>) and GPT-2 small's shape (12 x 768, vocabulary 50,257: the bytes, <|endoftext|> and
50,000 merges of two byte symbols, a real BPE that llama.cpp's tokenizer reads).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from pathlib import Path

import torch
from common import gpt2_like
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from attnlab.data import DataConfig
from attnlab.data.tokenizers import EOT, BPETokenizer
from attnlab.engine.config import TrainConfig
from attnlab.io import write_json, write_text
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, fresh_dir
from attnlab.runs.marker import record
from attnlab.runs.weights import save_weights

SHAPES = {
    "6x384": gpt2_like(GPTConfig(n_layer=6, n_head=6, d_model=384, context=1024, vocab_size=257)),
    "gpt2-small": gpt2_like(GPTConfig.from_preset("gpt2-small")),
}


def byte_bpe(vocab_size: int) -> BPETokenizer:
    """A byte-level BPE of exactly `vocab_size` tokens: GPT-2's 256 byte symbols, <|endoftext|>, then
    merges of two byte symbols ("a b" -> "ab") until the vocabulary is full."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(alphabet)}
    vocab[EOT] = len(vocab)
    merges = []
    for a, b in itertools.product(alphabet, repeat=2):
        if len(vocab) >= vocab_size:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = HFTokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    return BPETokenizer(tok)


def random_run(folder: Path, shape: str, seed: int = 0) -> Path:
    """folder/<shape>: a run of SHAPES[shape] with weights drawn from `seed` (made once, reused)."""
    out = Path(folder) / shape
    if (out / WEIGHTS).is_file():
        return out
    cfg = replace(SHAPES[shape], dropout=0.0)
    torch.manual_seed(seed)
    model = GPT(cfg)
    tok = byte_bpe(cfg.vocab_size)
    assert tok.vocab_size == cfg.vocab_size, (tok.vocab_size, cfg.vocab_size)
    fresh_dir(out)
    record(out, CONFIG, WEIGHTS, TOKENIZER)
    data = DataConfig(tokenizer="bpe", vocab_size=cfg.vocab_size)
    write_json(
        out / CONFIG, {"family": "gpt", "model": asdict(cfg), "train": asdict(TrainConfig()), "data": asdict(data)}
    )
    write_text(out / TOKENIZER, tok.to_json())
    save_weights(model, out / WEIGHTS, {"step": "0"})
    return out
