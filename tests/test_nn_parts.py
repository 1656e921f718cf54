"""The pluggable parts of a block: attention with an additive score bias (both paths against a loop),
norms and feed-forwards from their registries, and config choices taken from the registries."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig
from attnlab.nn import ACTIVATIONS, FEEDFORWARDS, NORM_PLACES, NORMS, POSITIONS, Block, BlockConfig, attend

pytestmark = pytest.mark.usefixtures("one_thread")

# ---- attend with an additive bias -----------------------------------------------------------------


def loop_attention(q, k, v, bias, mask):
    """softmax(q.k / sqrt(d) + bias) v, one query and one key at a time (masked keys skipped)."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                scores = [
                    float(q[b, h, i] @ k[b, h, j]) / math.sqrt(q.shape[-1]) + float(bias[b, h, i, j])
                    for j in range(k.shape[2])
                ]
                keep = [j for j in range(k.shape[2]) if mask is None or mask[b, 0, i, j]]
                if not keep:
                    continue
                top = max(scores[j] for j in keep)
                w = {j: math.exp(scores[j] - top) for j in keep}
                z = sum(w.values())
                out[b, h, i] = sum(w[j] / z * v[b, h, j] for j in keep)
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_attend_adds_a_bias_to_the_scores_in_both_paths(masked):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    bias = torch.randn(2, 3, 5, 5)
    mask = torch.rand(2, 1, 5, 5) > 0.3 if masked else None
    if masked:
        mask[0, 0, 2] = False  # a query that may see nothing: zeros, never NaN
    math_out, weights = attend(q, k, v, mask, return_weights=True, bias=bias)
    fused, _ = attend(q, k, v, mask, bias=bias)
    torch.testing.assert_close(math_out, loop_attention(q, k, v, bias, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused, math_out, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(fused).all()
    if masked:
        assert torch.equal(fused[0, :, 2], torch.zeros_like(fused[0, :, 2])) and weights[0, :, 2].sum() == 0


def test_a_bias_broadcast_over_the_batch_works_with_the_causal_mask():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    distance = torch.arange(4)[None, :] - torch.arange(4)[:, None]  # (Tq, Tk): j - i
    bias = (-0.5 * distance.abs().float())[None, None]  # (1, 1, Tq, Tk), ALiBi-like
    a, w = attend(q, k, v, return_weights=True, bias=bias, causal=True)
    b, _ = attend(q, k, v, bias=bias, causal=True)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert torch.equal(w.triu(1), torch.zeros_like(w))  # still causal
    _, plain = attend(q, k, v, return_weights=True, causal=True)
    assert not torch.allclose(w, plain)  # and the bias changed the weights


# ---- parts from the registries -------------------------------------------------------------------


class ScaleNorm(nn.Module):
    """A toy norm: x / ||x|| * g, one learned gain."""

    init_role = "norm"

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps, self.g = eps, nn.Parameter(torch.ones(1))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.g, math.sqrt(1.0))

    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps) * self.g


class Doubled(nn.Module):
    """A toy feed-forward: two position-wise maps added."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.a, self.b = nn.Linear(d_model, d_model, bias=bias), nn.Linear(d_model, d_model, bias=bias)
        self.b.init_role = "residual_out"

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_a_norm_and_a_feedforward_registered_outside_plug_into_every_block(monkeypatch):
    monkeypatch.setitem(NORMS, "scale", lambda c: ScaleNorm(c.d_model, c.ln_eps, c.bias))
    # a feed-forward is built from the block's config: here a function picks what Doubled takes
    monkeypatch.setitem(FEEDFORWARDS, "doubled", lambda c: Doubled(c.d_model, c.d_ff, c.activation, c.bias))
    block = Block(BlockConfig(d_model=8, n_head=2, d_ff=32, feedforward="doubled", norm_kind="scale"))
    assert isinstance(block.ff, Doubled) and isinstance(block.norm_attn, ScaleNorm)
    model = GPT(
        GPTConfig(n_layer=2, n_head=2, d_model=8, context=8, vocab_size=11, feedforward="doubled", norm_kind="scale")
    )
    assert isinstance(model.norm, ScaleNorm) and isinstance(model.blocks[1].ff, Doubled)
    # init roles reach the new parts: the residual output scaled, the norm reset
    assert model.blocks[0].ff.b.weight.std() < model.blocks[0].ff.a.weight.std()
    logits, loss = model(torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))
    loss.backward()
    assert model.blocks[0].ff.a.weight.grad is not None and model.norm.g.grad is not None


@pytest.mark.parametrize("config", [GPTConfig, EncoderConfig, ViTConfig, Seq2SeqConfig])
def test_allowed_values_come_from_the_registries(config):
    from dataclasses import fields

    choices = {f.name: f.metadata.get("choices") for f in fields(config)}
    assert choices["positions"] == tuple(POSITIONS) == ("learned", "sinusoidal", "rope", "alibi", "none")
    assert choices["activation"] == tuple(ACTIVATIONS) == ("relu", "gelu", "gelu_tanh", "relu2", "silu")
    assert choices["norm"] == NORM_PLACES == ("pre", "post")
    assert choices["feedforward"] == tuple(FEEDFORWARDS) == ("mlp", "swiglu", "geglu", "moe", "none")
    assert choices["norm_kind"] == tuple(NORMS)
