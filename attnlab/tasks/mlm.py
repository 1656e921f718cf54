"""Masked-language pretraining of the encoder (BERT's objective) on any corpus the lm task reads.

train_mlm("runs/mlm", data=DataConfig(data="stdlib", tokenizer="word"))
  -> word tokenizer with [PAD] [UNK] [CLS] [SEP] [MASK], token cache (shared with lm)
  -> blocks of tokens, 15% chosen: 80% [MASK], 10% random, 10% kept; loss on the chosen only
  -> training.start + training.loop, as for every task
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from attnlab.engine import distributed
from attnlab.engine import loop as training
from attnlab.data import DataConfig, resolve_sources
from attnlab.data.batches import MaskedWindows
from attnlab.errors import AttnlabError
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.data.tokenizers import WORD_SPECIALS
from attnlab.engine.loop import TrainConfig

# An encoder-small on the standard library's words, in a few minutes on a laptop CPU.
MLM_TRAIN = dict(max_steps=4000, batch_size=32, block_size=64, lr=2e-3, warmup_steps=200, eval_interval=500)
MLM_DATA = dict(data="stdlib", tokenizer="word", vocab_size=8192)


def train_mlm(
    out: str | Path,
    model: EncoderConfig | None = None,
    train: TrainConfig | None = None,
    data: DataConfig | None = None,
    force: bool = False,
    progress: bool = True,
) -> dict:
    """Pretrain an encoder with masked-language modelling into run directory `out`; returns final losses."""
    data = data or DataConfig(**MLM_DATA)
    train = train or TrainConfig(**MLM_TRAIN)
    model = replace(model or EncoderConfig.from_preset("encoder-small"), head="mlm")
    if data.tokenizer != "word":
        raise AttnlabError("masked-LM training needs the word tokenizer (it has [MASK]): use --tokenizer word")
    block = training.checked_block_size(train, model.context)
    d, device = distributed.init(train.device)
    run = Path(out)
    training._check_dir(run, False, force)
    files = resolve_sources(data.data, data.glob)
    training.new_run(run, files, data, d, progress, lambda tok: _config(replace(model, vocab_size=tok.vocab_size),
                                                                        train, data))  # fmt: skip
    tok, tokens = training.run_tokens(run, files, data, d, progress)
    tokens.check(block)
    model = replace(model, vocab_size=tok.vocab_size)
    batches = MaskedWindows(tokens, block, tok.mask_id, n_special=len(WORD_SPECIALS))
    config = _config(model, train, data)
    s = training.start(run, lambda: Encoder(model), batches, train, config, d, device, resume=False, command="mlm")
    try:
        return training.loop(s, progress)
    finally:
        distributed.shutdown(d)


def _config(model: EncoderConfig, train: TrainConfig, data: DataConfig) -> dict:
    return {"family": "encoder", "model": asdict(model), "train": asdict(train), "data": asdict(data),
            "task": {"kind": "mlm"}}  # fmt: skip
