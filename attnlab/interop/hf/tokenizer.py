"""A run's tokenizer as HuggingFace's tokenizer.json, and what a checkpoint's tokenizer.json covers.

export: BPE and WordPiece runs already keep HuggingFace's own tokenizer.json. A character-level run's
tokenizer is written as a `tokenizers` WordLevel model over its characters: every character is its
own piece (a Split on each code point), an unseen one is <unk>, and the pieces are joined back with
nothing between them (the Fuse decoder), so ids and text are the run's own both ways and the
exported folder converts back. Word-level runs (masked LMs) have no such file: export says so.
convert: the largest id a tokenizer.json can give, which must lie inside the model's vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from attnlab.data.tokenizers import CharTokenizer, Tokenizer
from attnlab.runs.folder import TOKENIZER


def char_json(tok: CharTokenizer, run: Path) -> str:
    """A character tokenizer as a `tokenizers` WordLevel model with the same ids and text."""
    vocab = {piece: i for i, piece in enumerate(tok.itos)}  # <unk>, <|endoftext|>, then the characters
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=tok.itos[tok.unk_id]))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per code point
    hf.decoder = decoders.Fuse()  # "a", "b" -> "ab", not "a b"
    return hf.to_str()


def own_json(tok: Tokenizer, run: Path) -> str:
    """A tokenizer that already is HuggingFace's tokenizer.json (BPE, WordPiece)."""
    return (run / TOKENIZER).read_text(encoding="utf-8")


# What each kind of run tokenizer becomes in an exported folder; a kind not here is not exported.
HF_TOKENIZERS: dict[str, Callable[[Tokenizer, Path], str]] = {"bpe": own_json, "wordpiece": own_json, "char": char_json}


def hf_tokenizer_json(tok: Tokenizer, run: Path) -> str | None:
    """The run's tokenizer as a tokenizer.json HuggingFace reads, or None where it has no format."""
    to_json = HF_TOKENIZERS.get(tok.kind)
    return None if to_json is None else to_json(tok, run)


def largest_id(text: str, count: int) -> int:
    """The largest id a tokenizer.json gives (`count`: its size): its vocabulary's and its added
    tokens' ids, which need not be 0..count-1."""
    data = json.loads(text)
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data, dict) else None
    ids = [i for i in vocab.values() if isinstance(i, int)] if isinstance(vocab, dict) else []
    ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return max([count - 1, *ids])


__all__ = ["HF_TOKENIZERS", "char_json", "hf_tokenizer_json", "largest_id"]
