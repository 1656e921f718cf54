"""Does each word of a caption look where it comes from? Checked on digits-strips, where it is known.

Legend: B strips, L layers, H heads, T words, N patches.

For each test strip whose generated caption is right (so its words line up with the generator's),
each word's cross-attention in the last decoder layer, averaged over the heads, is read again by
teacher forcing on that caption; the word counts as looking at the right place when its most
attended patch lies within a digit it depends on (data/strips.py: caption_words says which digits,
patch_of_box which patches). "seventy" must look at the tens digit, "fourteen" at the tens or the
units, "hundred" at the hundreds digit, "-" at the tens or the units. The Show-Attend-Tell RNN has
one attention (L = H = 1), read the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.data import strips as S
from attnlab.data.batches import BOS_ID, PAD_ID, pad
from attnlab.data.tokenizers import Tokenizer


def _matched(tok: Tokenizer, found: list[S.Strip], hyps: list[list[int]]) -> list[tuple[S.Strip, list[int]]]:
    from attnlab.tasks.translate import pieces

    return [(s, h) for s, h in zip(found, hyps) if pieces(tok, h) == [w for w, _ in S.caption_words(s.digits)]]


@torch.no_grad()
def digit_attention(model: nn.Module, tok: Tokenizer, found: list[S.Strip], hyps: list[list[int]],
                    batch_size: int = 256) -> dict[str, float | int]:  # fmt: skip
    """The share of words whose most attended patch is on a digit they depend on, over the strips
    captioned right; and how many words and strips that is."""
    model.eval()
    device = next(model.parameters()).device
    matched = _matched(tok, found, hyps)
    hits = words = 0
    for start in range(0, len(matched), batch_size):
        part = matched[start : start + batch_size]
        images = torch.from_numpy(S.as_arrays([s for s, _ in part])[0]).to(device)  # (B, 1, H, W)
        tgt_in = pad([torch.tensor([BOS_ID, *h]) for _, h in part], PAD_ID).to(device)  # (B, T)
        where = model.alignment(images, tgt_in)[:, -1].float().mean(1).argmax(-1).cpu()  # (B, L, H, T, N) -> (B, T)
        for (strip, _), top in zip(part, where):
            for t, (_, deps) in enumerate(S.caption_words(strip.digits)):
                region = set().union(*(S.patch_of_box(strip.boxes[i]) for i in deps))
                hits += int(top[t]) in region
                words += 1
    return {"attention_on_digit": hits / max(words, 1), "attention_words": words, "attention_strips": len(matched)}
