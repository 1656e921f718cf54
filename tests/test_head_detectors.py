"""Head detectors on patterns whose answer is known, and on a model traced through the hooks."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.interpret.detectors import head_scores, repeated_tokens
from attnlab.models import build_model
from attnlab.models.gpt import GPTConfig


def _pattern(T: int, where) -> torch.Tensor:
    """A causal (T, T) pattern with all of query t's weight on key where(t)."""
    p = torch.zeros(T, T)
    for t in range(T):
        p[t, where(t)] = 1
    return p


def test_each_detector_finds_the_head_built_to_do_its_job():
    ids, half = repeated_tokens(vocab=50, n=6, batch=1, seed=1)
    T = ids.shape[1]
    heads = torch.stack(
        [
            _pattern(T, lambda t: max(t - 1, 0)),  # previous token
            _pattern(T, lambda t: 0),  # first token
            _pattern(T, lambda t: t - half + 1 if t >= half else 0),  # induction
            torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None],  # uniform over the past
        ]
    )[None, None]  # fmt: skip  (B=1, L=1, H=4, T, T)
    scores = head_scores(heads[:, 0][:, None], ids, half)
    assert scores["previous-token"][0].tolist()[:2] == pytest.approx([1.0, 1 / (T - 1)])  # t=1 looks at 0
    assert scores["first-token"][0, 1] == 1.0 and float(scores["first-token"][0, 0]) == pytest.approx(1 / (T - 1))
    assert scores["induction"][0, 2] == 1.0 and scores["induction"][0, 0] < 0.2
    assert scores["duplicate-token"][0, 2] == 0.0  # it looks one past the earlier copy, not at it
    # The uniform head spreads itself: no detector gives it much.
    assert all(s[0, 3] < 0.35 for name, s in scores.items() if name != "first-token")


def test_scores_of_a_traced_model_are_shares_of_attention():
    torch.manual_seed(0)
    model = build_model("gpt", GPTConfig(vocab_size=50, context=32, n_layer=2, n_head=2, d_model=16)).eval()
    ids, half = repeated_tokens(50, 10, batch=3)
    t = attnlab.trace(model, ids)
    patterns = torch.stack([t[f"blocks.{i}.attn.hook_pattern"] for i in range(2)], dim=1)  # (B, L, H, T, T)
    scores = head_scores(patterns, ids, half)
    assert set(scores) == {"previous-token", "first-token", "duplicate-token", "induction"}
    for s in scores.values():
        assert s.shape == (2, 2) and torch.all((s >= 0) & (s <= 1 + 1e-6))


def test_head_ablation_measures_each_heads_share_of_the_loss():
    from attnlab.interpret.ablation import head_ablation

    torch.manual_seed(0)
    model = build_model("gpt", GPTConfig(vocab_size=50, context=32, n_layer=2, n_head=2, d_model=16)).eval()
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight[:, :8] = 0  # head 0 of block 0 writes nothing
    ids = torch.randint(0, 50, (4, 12))
    loss = lambda: model(ids[:, :-1], ids[:, 1:])[1]
    for mode in ("zero", "mean"):
        table = head_ablation(model, loss, (ids[:, :-1],), mode)
        assert table.shape == (2, 2) and table[0, 0] == 0 and torch.all(table.flatten()[1:] != 0)
    with torch.no_grad(), attnlab.hooks(model, {"blocks.1.attn.hook_head_out": attnlab.zero_head(1)}):
        manual = float(loss())
    with torch.no_grad():
        manual -= float(loss())
    assert head_ablation(model, loss)[1, 1] == pytest.approx(manual)
