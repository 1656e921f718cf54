"""A language-model run's own data, as the inspections that read it (head ablation on the validation
split, sparse autoencoders) need it: the token splits its training made, and its window length."""

from __future__ import annotations

from attnlab.data import TokenData, build_token_cache, resolve_sources
from attnlab.runs.run import Run


def own_tokens(run: Run) -> TokenData:
    """The run's training data (config.json's source, glob and validation share), tokenized and split
    as its training split it. The caller checks that config.json names a source."""
    data = run.config["data"]
    files = resolve_sources(data["data"], data.get("glob", "*"))
    return TokenData(build_token_cache(files, run.tokenizer, data.get("val_fraction", 0.05), False))


def block_of(run: Run) -> int:
    """The windows the run trained on: its block size, at most its context."""
    return min(run.config.get("train", {}).get("block_size") or run.model.cfg.context, run.model.cfg.context)
