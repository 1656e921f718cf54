"""Head detectors: how much each head does one of the well-known jobs, as a score in [0, 1].

Legend: L layers, H heads, T tokens.

Each score is the attention a head puts, on average over the query positions where the job is
defined, on the key position that job points at (Olsson et al. 2022, "In-context learning and
induction heads"; Elhage et al. 2021):
    previous-token   query t -> key t - 1
    first-token      query t -> key 0 (the "sink" many heads park unused attention on)
    duplicate-token  query t -> earlier positions holding the same token (summed)
    induction        query t -> the position just after the previous occurrence of token t:
                     on a random sequence repeated twice, t - n + 1 in the second half
The induction score is measured on random tokens repeated (nothing but the repetition can predict
the second half); the others on any input.
"""

from __future__ import annotations

import torch
from torch import Tensor

DETECTORS = ("previous-token", "first-token", "duplicate-token", "induction")


def _mean_over_queries(weights: Tensor, keys: Tensor, queries: Tensor) -> Tensor:
    """patterns (L, H, T, T), a key-selection mask (T, T) and the query rows (T,) that count ->
    (L, H): the attention on the selected keys, summed per query, averaged over the queries."""
    on = (weights * keys).sum(-1)  # (L, H, T)
    return on[..., queries].mean(-1) if queries.any() else torch.zeros(weights.shape[:2])


def previous_token(patterns: Tensor) -> Tensor:
    T = patterns.shape[-1]
    keys = torch.diag(torch.ones(T - 1), -1)  # (T, T): query t looks at t - 1
    return _mean_over_queries(patterns, keys, torch.arange(T) >= 1)


def first_token(patterns: Tensor) -> Tensor:
    T = patterns.shape[-1]
    keys = torch.zeros(T, T)
    keys[:, 0] = 1
    return _mean_over_queries(patterns, keys, torch.arange(T) >= 1)


def duplicate_token(patterns: Tensor, ids: Tensor) -> Tensor:
    """ids (T,): the tokens of the input the patterns were taken on."""
    same = (ids[:, None] == ids[None, :]).float().tril(-1)  # (T, T): earlier copies of the query's token
    return _mean_over_queries(patterns, same, same.sum(-1) > 0)


def induction(patterns: Tensor, half: int) -> Tensor:
    """Patterns on a sequence whose second half (from position `half`) repeats the first."""
    T = patterns.shape[-1]
    keys = torch.zeros(T, T)
    queries = torch.arange(T) >= half
    for t in range(half, T):
        keys[t, t - half + 1] = 1  # the token after the previous occurrence
    return _mean_over_queries(patterns, keys, queries)


def repeated_tokens(vocab: int, n: int, batch: int = 8, seed: int = 0, first: int = 0) -> tuple[Tensor, int]:
    """Random token sequences repeated twice, (batch, 2n) ids, and where the repeat starts. Within
    a half no token repeats (when the vocabulary allows), so only the repeat can predict it.
    `first`: ids below it are never drawn (special tokens)."""
    g = torch.Generator().manual_seed(seed)
    if vocab - first >= n:
        half = torch.stack([torch.randperm(vocab - first, generator=g)[:n] for _ in range(batch)]) + first
    else:
        half = torch.randint(first, vocab, (batch, n), generator=g)
    return torch.cat([half, half], dim=1), n


def head_scores(patterns: Tensor, ids: Tensor, half: int | None = None) -> dict[str, Tensor]:
    """Every detector's (L, H) scores from patterns (B, L, H, T, T) on ids (B, T), averaged over
    the batch; `half`: where the repeat starts if ids are repeated sequences (for induction)."""
    out: dict[str, list[Tensor]] = {name: [] for name in DETECTORS}
    for p, x in zip(patterns, ids):
        out["previous-token"].append(previous_token(p))
        out["first-token"].append(first_token(p))
        out["duplicate-token"].append(duplicate_token(p, x))
        if half is not None:
            out["induction"].append(induction(p, half))
    return {name: torch.stack(scores).mean(0) for name, scores in out.items() if scores}
