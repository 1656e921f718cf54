"""The shared Stack and the pluggable parts: attention with an additive bias, norm and feed-forward
registries, init roles, position hooks and activation checkpointing in every family."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import ViT, ViTConfig
from attnlab.nn import FEEDFORWARDS, NORMS, POSITIONS, Block, BlockConfig, LayerNorm, Stack, attend, set_grad_checkpoint
from attnlab.nn.position import Positions

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {
    "gpt": lambda **kw: GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, **kw)),
    "encoder": lambda **kw: Encoder(EncoderConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, **kw)),
    "vit": lambda **kw: ViT(
        ViTConfig(n_layer=2, n_head=2, d_model=16, image_size=8, channels=1, patch_size=4, n_labels=3, **kw)
    ),  # fmt: skip
    "seq2seq": lambda **kw: Seq2Seq(
        Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, context=8, src_vocab=11, tgt_vocab=11, **{"dropout": 0.0, **kw})
    ),  # fmt: skip
}


def inputs(family: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    if family == "vit":
        return (torch.rand(2, 1, 8, 8, generator=g),)
    ids = torch.randint(3, 11, (2, 6), generator=g)
    return (ids, ids) if family == "seq2seq" else (ids,)


def attention_of(model: nn.Module, family: str) -> list[torch.Tensor]:
    x = inputs(family)
    return model.attention(*x)["encoder"] if family == "seq2seq" else model.attention(*x)


# ---- attend with an additive bias -----------------------------------------------------------------


def loop_attention(q, k, v, bias, mask):
    """softmax(q.k / sqrt(d) + bias) v, one query and one key at a time (masked keys skipped)."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                scores = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(q.shape[-1]) + float(bias[b, h, i, j])
                          for j in range(k.shape[2])]  # fmt: skip
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


# ---- the Stack keeps every family's names and initial weights ---------------------------------------


def test_every_family_keeps_its_parameter_names():
    """Run directories and the HuggingFace mappings name weights this way."""
    names = {family: set(make().state_dict()) for family, make in FAMILIES.items()}
    block = {"attn.qkv_proj.weight", "attn.qkv_proj.bias", "attn.out_proj.weight", "attn.out_proj.bias",
             "ff.up.weight", "ff.up.bias", "ff.down.weight", "ff.down.bias",
             "norm_attn.weight", "norm_attn.bias", "norm_ff.weight", "norm_ff.bias"}  # fmt: skip
    blocks = {f"blocks.{i}.{n}" for i in range(2) for n in block}
    assert names["gpt"] == blocks | {"tok.weight", "pos.embedding.weight", "norm.weight", "norm.bias", "head.weight"}
    assert names["encoder"] == blocks | {"tok.weight", "pos.embedding.weight", "norm.weight", "norm.bias",
                                         "out.weight", "out.bias"}  # fmt: skip
    assert names["vit"] == blocks | {"cls", "patches.proj.weight", "patches.proj.bias", "pos.embedding.weight",
                                     "norm.weight", "norm.bias", "out.weight", "out.bias"}  # fmt: skip
    cross = {"cross.qkv_proj.weight", "cross.qkv_proj.bias", "cross.out_proj.weight", "cross.out_proj.bias",
             "norm_cross.weight", "norm_cross.bias"}  # fmt: skip
    assert names["seq2seq"] == (
        {f"encoder.{i}.{n}" for i in range(2) for n in block}
        | {f"decoder.{i}.{n}" for i in range(2) for n in block | cross}
        | {"src_tok.weight", "tgt_tok.weight", "out.weight"}  # post-norm: no final norms
    )
    assert isinstance(FAMILIES["gpt"]().blocks, Stack) and len(FAMILIES["seq2seq"]().blocks) == 4


def init_by_names(model: nn.Module, n_layer: int, std: float = 0.02) -> None:
    """The initialization as it was written before init roles: residual projections found by name."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            scale = 1 / math.sqrt(2 * n_layer) if name.endswith(("out_proj", "ff.down")) else 1.0
            nn.init.normal_(module.weight, mean=0.0, std=std * scale)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


@pytest.mark.parametrize("family", FAMILIES)
def test_init_roles_give_the_weights_name_matching_gave(family, monkeypatch):
    torch.manual_seed(3)
    by_role = FAMILIES[family]().state_dict()
    monkeypatch.setattr(f"attnlab.models.{family}.init_weights", init_by_names)
    torch.manual_seed(3)
    by_name = FAMILIES[family]().state_dict()
    assert all(torch.equal(by_role[k], by_name[k]) for k in by_role)


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
    monkeypatch.setitem(NORMS, "scale", ScaleNorm)
    monkeypatch.setitem(FEEDFORWARDS, "doubled", Doubled)
    block = Block(BlockConfig(d_model=8, n_heads=2, d_ff=32, feedforward="doubled", norm_kind="scale"))
    assert isinstance(block.ff, Doubled) and isinstance(block.norm_attn, ScaleNorm)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=8, context=8, vocab_size=11, feedforward="doubled",
                          norm_kind="scale"))  # fmt: skip
    assert isinstance(model.norm, ScaleNorm) and isinstance(model.blocks[1].ff, Doubled)
    # init roles reach the new parts: the residual output scaled, the norm reset
    assert model.blocks[0].ff.b.weight.std() < model.blocks[0].ff.a.weight.std()
    logits, loss = model(torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))
    loss.backward()
    assert model.blocks[0].ff.a.weight.grad is not None and model.norm.g.grad is not None


def test_allowed_values_come_from_the_registries():
    from dataclasses import fields

    choices = {f.name: f.metadata.get("choices") for f in fields(GPTConfig)}
    assert choices["positions"] == tuple(POSITIONS) == ("learned", "sinusoidal", "none")
    assert choices["activation"] == ("relu", "gelu", "gelu_tanh")
    assert choices["feedforward"] == tuple(FEEDFORWARDS) and choices["norm_kind"] == tuple(NORMS)


# ---- positions' hooks and checkpointing reach every family ---------------------------------------


class OnlySelf(Positions):
    """Toy positions that act only inside attention: a score bias that lets each token see just
    itself, and a qk_transform that counts its calls."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__(max_len)
        self.calls = 0

    def qk_transform(self, q, k, offset):
        self.calls += 1
        return q, k

    def score_bias(self, tq, tk, offset=0):
        same = torch.arange(tq)[:, None] + offset == torch.arange(tk)[None, :]
        return torch.where(same, 0.0, -1e4)[None, None]  # (1, 1, Tq, Tk)


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_inside_attention_reach_every_family(family, monkeypatch):
    monkeypatch.setitem(POSITIONS, "only-self", OnlySelf)
    model = FAMILIES[family](positions="only-self").eval()
    weights = attention_of(model, family)
    for w in weights:  # (B, H, T, T): all weight on the diagonal
        eye = torch.eye(w.shape[-1]).expand_as(w)
        torch.testing.assert_close(w, eye, atol=1e-3, rtol=0)
    pos = model.src_pos if family == "seq2seq" else model.pos
    assert pos.calls >= 2  # once per layer at least


@pytest.mark.parametrize("family", FAMILIES)
def test_activation_checkpointing_reaches_every_family(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().train()
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    x = inputs(family)

    def loss():
        out = model(*x)
        return out.float().pow(2).mean()

    loss().backward()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    set_grad_checkpoint(model, True)
    n = len(calls)
    loss().backward()
    assert len(calls) - n == 2 * n  # the first block ran again in backward
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, again))
