"""A language model's evaluation: loss in nats per token, perplexity, and bits per character.

The text is cut into consecutive windows of the model's block size; every token after the
first is predicted once, from the tokens before it in its window.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.data import TokenData, build_token_cache, read_texts, resolve_sources
from attnlab.data.batches import windows
from attnlab.data.unknown import unknown_share, warn_unknown
from attnlab.errors import AttnlabError
from attnlab.progress import tqdm
from attnlab.runtime.device import autocast, pick_dtype

if TYPE_CHECKING:
    from attnlab.runs.run import Run

SPLITS = ("val", "train", "all")


@torch.no_grad()
def evaluate(
    run: Run,
    data: str,
    glob: str = "*",
    split: str = "val",
    max_tokens: int | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> dict:
    """Loss of `run` on a data source. split: the held-out part ('val', the same split as in
    training), 'train', or 'all' of it."""
    if split not in SPLITS:
        raise AttnlabError(f"unknown split {split!r}: use {', '.join(SPLITS)}")
    files = resolve_sources(data, glob)
    tok = run.tokenizer
    share = unknown_share(tok, read_texts(files, "counting unknown tokens" if progress else None))
    warn_unknown(tok, share, data, f"the loss is the model's on {tok.unk_name}, not on this text")
    val_fraction = run.config.get("data", {}).get("val_fraction", 0.05)
    tokens = TokenData(build_token_cache(files, run.tokenizer, val_fraction, progress))
    if split == "all":
        arr = np.concatenate([tokens.splits["train"], tokens.splits["val"]])
    else:
        arr = np.asarray(tokens.splits[split])
    if max_tokens:
        arr = arr[: max_tokens + 1]
    if len(arr) < 2:
        raise AttnlabError(f"the {split} split of {data} has too few tokens to evaluate")
    model, device = run.model.eval(), run.device
    dtype = pick_dtype("auto", device, model.cfg.d_model)
    block = run.config.get("train", {}).get("block_size") or model.cfg.context
    total, count = 0.0, 0
    n_full = (len(arr) - 1) // block
    n_batches = math.ceil(n_full / batch_size) + bool((len(arr) - 1) % block)
    for xy in tqdm(windows(arr, block, batch_size), total=n_batches, desc="evaluating", disable=not progress):
        xy = torch.from_numpy(xy).to(device)  # (B, T+1)
        with autocast(device, dtype):
            logits = model(xy[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1).float(), xy[:, 1:].flatten(), reduction="sum").item()
        count += xy[:, 1:].numel()
    chars = run.tokenizer.n_chars(arr[1 : count + 1])
    nats = total / count
    return {
        "data": data,
        "split": split,
        "tokens": count,
        "characters": chars,
        "loss": nats,
        "perplexity": math.exp(nats),
        "bits_per_char": total / (chars * math.log(2)),
    }
