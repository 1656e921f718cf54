"""How the next token is drawn from a model's logits: greedy, temperature, top-k and top-p (nucleus).

Legend: B rows, V vocabulary, C the model's context.

Every decoder of attnlab draws with `next_tokens`, whether a sequence is decoded alone (sampling.py
stream_rows) or in a batch with others (engine.py): a Draw (settings.py) says how, and its seed
makes the draws of one sequence the same wherever it is decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.decoding.settings import Draw
from attnlab.decoding.structured import apply_masks

__all__ = ["Draw", "constrained", "filter_logits", "jump_keep", "next_token", "next_tokens", "seed_of"]


def seed_of(seed: int | None) -> int:
    """The seed of a sequence: the given one, or one drawn from torch's random state (so that
    torch.manual_seed still makes an unseeded generation repeatable)."""
    return int(torch.randint(0, 2**62, ())) if seed is None else seed


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top k, and outside the smallest set of tokens
    whose probabilities add up to at least top_p. logits: (V,) or (B, V)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Mass of the tokens ranked above each one; keep a token while that is < top_p, so
        # the most likely token is always kept.
        before = torch.cumsum(probs, dim=-1) - probs
        drop = (before >= top_p).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def constrained(logits: Tensor, matchers: Sequence) -> Tensor:
    """(B, V) logits with each constrained row's forbidden tokens at -inf (structured outputs: one
    structured.Matcher or None per row): a copy, so that logprobs stay the model's own; the logits
    themselves when no row is constrained. Adding 0 or -inf is exact, so a row's masked logits are
    the same numbers batched or alone, and exact.py's checks hold for them."""
    if all(m is None for m in matchers):
        return logits
    return apply_masks(logits.clone(), matchers)


def next_tokens(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """The next token of each row of (B, V) logits, (B,); temperature 0 is greedy."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def next_token(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> int:
    """Pick the next token from (V,) logits (next_tokens on one row: the same draws)."""
    return int(next_tokens(logits[None], temperature, top_k, top_p, generator)[0])


def jump_keep(context: int) -> int:
    """How many tokens the window keeps when the sequence outgrows the context: the last half."""
    return context // 2
