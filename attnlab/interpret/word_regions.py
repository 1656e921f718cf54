"""Does each word of a caption look where it comes from? Checked on digits-strips, where it is known.

Legend: B strips, L layers, H heads, T words, N patches.

For each test strip whose generated caption is right (so its words line up with the generator's),
each word's cross-attention in the last decoder layer, averaged over the heads, is read again by
teacher forcing on that caption; the word counts as looking at the right place when its most
attended patch lies within a digit it depends on (data/strips.py: caption_words says which digits,
patch_of_box which patches). The measure is over the digit words, the words that name a digit's
value: "seventy" must look at the tens digit, "four" at the units, "fourteen" at the tens or the
units. The other words ("hundred", "thousand", the hyphen) follow from how many digits there are
and where the writing is, so a model need not look at one digit to write them; they are reported
apart, with the same rule ("hundred" on the hundreds digit, "-" on the tens or the units). The
Show-Attend-Tell RNN has one attention (L = H = 1), read the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.data import strips as S
from attnlab.data.batches import BOS_ID, PAD_ID, pad
from attnlab.data.numbers import ONES, TENS
from attnlab.data.shifted import pieces
from attnlab.data.tokenizers import Tokenizer

DIGIT_WORDS = frozenset(w for w in ONES + TENS if w and w != "zero")  # one..nineteen, twenty..ninety


def _matched(tok: Tokenizer, found: list[S.Strip], hyps: list[list[int]]) -> list[tuple[S.Strip, list[int]]]:

    return [(s, h) for s, h in zip(found, hyps) if pieces(tok, h) == [w for w, _ in S.caption_words(s.digits)]]


@torch.no_grad()
def digit_attention(
    model: nn.Module, tok: Tokenizer, found: list[S.Strip], hyps: list[list[int]], batch_size: int = 256
) -> dict[str, float | int]:
    """The share of words whose most attended patch is on a digit they depend on, over the strips
    captioned right; and how many words and strips that is."""
    model.eval()
    device = next(model.parameters()).device
    matched = _matched(tok, found, hyps)
    hits, words = {True: 0, False: 0}, {True: 0, False: 0}  # by "is a digit word"
    for start in range(0, len(matched), batch_size):
        part = matched[start : start + batch_size]
        images = torch.from_numpy(S.as_arrays([s for s, _ in part])[0]).to(device)  # (B, 1, H, W)
        tgt_in = pad([torch.tensor([BOS_ID, *h]) for _, h in part], PAD_ID).to(device)  # (B, T)
        where = model.alignment(images, tgt_in)[:, -1].float().mean(1).argmax(-1).cpu()  # (B, L, H, T, N) -> (B, T)
        for (strip, _), top in zip(part, where):
            for t, (word, region) in enumerate(S.word_patches(strip, model.cfg.patch)):
                digit_word = word in DIGIT_WORDS
                hits[digit_word] += int(top[t]) in region
                words[digit_word] += 1
    return {
        "attention_on_digit": hits[True] / max(words[True], 1),
        "attention_words": words[True],
        "attention_other_words": hits[False] / max(words[False], 1),
        "attention_others": words[False],
        "attention_strips": len(matched),
    }
