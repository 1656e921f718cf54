"""The shared Stack in every family: parameter names and initial weights kept (init roles), the
positions' hooks inside attention, a score bias with and without a cache, activation checkpointing.
The parts themselves (attention's bias, the norm and feed-forward registries): tests/test_nn_parts.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.vit import ViT, ViTConfig
from attnlab.nn import (
    POSITIONS,
    BlockConfig,
    Context,
    GridPositions,
    LayerNorm,
    Positions,
    SinusoidalPositions,
    Stack,
    build_positions,
    set_grad_checkpoint,
)
from tests.conftest import decode_stepwise

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {
    "gpt": lambda **kw: GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, **kw)),
    "encoder": lambda **kw: Encoder(EncoderConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, **kw)),
    "vit": lambda **kw: ViT(
        ViTConfig(n_layer=2, n_head=2, d_model=16, image_size=8, channels=1, patch_size=4, n_labels=3, **kw)
    ),
    "seq2seq": lambda **kw: Seq2Seq(
        Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, context=8, src_vocab=11, tgt_vocab=11, **{"dropout": 0.0, **kw})
    ),
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


# ---- the Stack keeps every family's names and initial weights ---------------------------------------


def test_every_family_keeps_its_parameter_names():
    """Run directories and the HuggingFace mappings name weights this way."""
    names = {family: set(make().state_dict()) for family, make in FAMILIES.items()}
    block = {
        "attn.qkv_proj.weight",
        "attn.qkv_proj.bias",
        "attn.out_proj.weight",
        "attn.out_proj.bias",
        "ff.up.weight",
        "ff.up.bias",
        "ff.down.weight",
        "ff.down.bias",
        "norm_attn.weight",
        "norm_attn.bias",
        "norm_ff.weight",
        "norm_ff.bias",
    }
    blocks = {f"blocks.{i}.{n}" for i in range(2) for n in block}
    assert names["gpt"] == blocks | {"tok.weight", "pos.embedding.weight", "norm.weight", "norm.bias", "head.weight"}
    assert names["encoder"] == blocks | {
        "tok.weight",
        "pos.embedding.weight",
        "norm.weight",
        "norm.bias",
        "out.weight",
        "out.bias",
    }
    assert names["vit"] == blocks | {
        "cls",
        "patches.proj.weight",
        "patches.proj.bias",
        "pos.embedding.weight",
        "norm.weight",
        "norm.bias",
        "out.weight",
        "out.bias",
    }
    cross = {
        "cross.qkv_proj.weight",
        "cross.qkv_proj.bias",
        "cross.out_proj.weight",
        "cross.out_proj.bias",
        "norm_cross.weight",
        "norm_cross.bias",
    }
    assert names["seq2seq"] == (
        {f"encoder.{i}.{n}" for i in range(2) for n in block}
        | {f"decoder.{i}.{n}" for i in range(2) for n in block | cross}
        | {"src_tok.weight", "tgt_tok.weight", "out.weight"}  # post-norm: no final norms
    )
    bert = FAMILIES["encoder"](norm="post", head="mlm", type_vocab_size=2).state_dict()
    assert set(bert) == blocks | {
        "tok.weight",
        "pos.embedding.weight",
        "token_type.weight",
        "embed_norm.weight",
        "embed_norm.bias",
        "transform.weight",
        "transform.bias",
        "transform_norm.weight",
        "transform_norm.bias",
        "out.weight",
        "out.bias",
    }
    pre = set(FAMILIES["seq2seq"](norm="pre", share_embeddings=True).state_dict())
    assert pre == names["seq2seq"] | {"enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias"}
    assert isinstance(FAMILIES["gpt"]().blocks, Stack) and len(FAMILIES["seq2seq"]().blocks) == 4


def init_by_names(model: nn.Module, n_layer: int, std: float = 0.02, zero_out: bool = False) -> None:
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
        same = torch.arange(tq)[:, None] + (tk - tq) == torch.arange(tk)[None, :]  # keys end at the last query
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


@pytest.mark.parametrize("how", ["function", "attribute"])
@pytest.mark.parametrize("family", FAMILIES)
def test_activation_checkpointing_reaches_every_family(family, how):
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
    if how == "function":
        set_grad_checkpoint(model, True)
    else:
        model.grad_checkpoint = True  # what the training engine may set on any model
    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    assert model.grad_checkpoint and all(s.grad_checkpoint for s in stacks)
    n = len(calls)
    loss().backward()
    assert len(calls) - n == 2 * n  # the first block ran again in backward
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, again))


class Distance(Positions):
    """Toy ALiBi: a penalty growing with the distance between query and key, nothing added to x."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__(max_len)

    def score_bias(self, tq, tk, offset=0):
        q = torch.arange(tq)[:, None] + offset  # (Tq, 1) absolute positions
        k = torch.arange(tk)[None, :] + offset + tq - tk  # (1, Tk): the last Tk positions
        return -0.5 * (q - k).abs().float()[None, None]  # (1, 1, Tq, Tk)


def test_a_score_bias_decodes_the_same_with_and_without_a_cache(monkeypatch):
    monkeypatch.setitem(POSITIONS, "distance", Distance)
    torch.manual_seed(0)
    model = FAMILIES["gpt"](positions="distance").eval()
    ids = torch.randint(0, 11, (2, 7))
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
        stepwise, _ = decode_stepwise(model, ids, 3)  # a prompt of 3, then one token at a time
        torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)
        # without a cache the keys are the queries' own: only distances count, not the offset
        torch.testing.assert_close(model(ids[:, 3:], offset=3), model(ids[:, 3:]), atol=1e-6, rtol=0)


def test_a_stack_adds_a_bias_argument_to_the_positions_bias():
    torch.manual_seed(0)
    stack = Stack(BlockConfig(d_model=8, n_head=2, d_ff=16, causal=True), 2).eval()
    x = torch.randn(2, 5, 8)
    bias = Distance(5, 8).score_bias(5, 5)
    by_positions, _ = stack(x, Context(positions=Distance(5, 8)))
    by_argument, _ = stack(x, Context(bias=bias))
    torch.testing.assert_close(by_argument, by_positions, atol=0, rtol=0)
    _, w = stack(x, Context(bias=bias, return_weights=True))
    doubled, _ = stack(x, Context(bias=bias, positions=Distance(5, 8)))
    torch.testing.assert_close(doubled, stack(x, Context(bias=2 * bias))[0], atol=1e-6, rtol=0)
    assert len(w["self"]) == 2 and w["cross"] == []


def test_vit_builds_its_grid_positions_through_the_registry():
    model = FAMILIES["vit"](positions="sinusoidal")
    assert isinstance(model.pos, GridPositions) and model.pos.table.shape == (1 + 4, 16)
    assert isinstance(build_positions("sinusoidal", 5, 16), SinusoidalPositions)
