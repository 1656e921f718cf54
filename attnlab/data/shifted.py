"""The token ids of the encoder-decoders (translation, captioning): the tokenizer's ids shifted above
the special ids PAD, BOS and EOS (data/batches.py), and back to text."""

from __future__ import annotations

import numpy as np

from attnlab.data.batches import BOS_ID, EOS_ID, N_SPECIAL
from attnlab.data.tokenizers import Tokenizer


def to_ids(tok: Tokenizer, text: str) -> np.ndarray:
    """Model ids of a text: the tokenizer's ids shifted above PAD, BOS and EOS."""
    return tok.encode_array(text).astype(np.int64) + N_SPECIAL


def to_text(tok: Tokenizer, ids: list[int]) -> str:
    return tok.decode([i - N_SPECIAL for i in ids if i >= N_SPECIAL])


def pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Each model id as readable text, for picture axes."""
    out = []
    for i in ids:
        piece = tok.decode([i - N_SPECIAL]) if i >= N_SPECIAL else {BOS_ID: "<s>", EOS_ID: "</s>"}.get(i, "<pad>")
        out.append(piece.strip() or piece.replace(" ", "·"))
    return out
