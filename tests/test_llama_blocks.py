"""Today's blocks (issue 17): ALiBi, grouped-query and multi-query attention, gated feed-forwards,
the presets and sizes of Llama 2 and Mixtral; every family trains with every position scheme.
Rotary positions, RMSNorm and QK-norm: tests/test_modern_blocks.py. Mixtures of experts: tests/test_moe.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, PAPER_ACTIVE_PARAMS, PAPER_PARAMS, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.models.size import estimate
from attnlab.models.vit import ViT, ViTConfig
from attnlab.nn import POSITIONS, Context, GatedFeedForward, KVCache, MultiHeadAttention, default_width
from attnlab.nn.position import ALiBiPositions, alibi_slopes
from tests.conftest import decode_stepwise, perturb, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- ALiBi -------------------------------------------------------------------------------------


def test_alibi_slopes_are_the_papers():
    # Press et al. 2022: 8 heads -> 1/2, 1/4, ..., 1/256; 12 heads -> the 8-head slopes, then every
    # other one of the 16-head sequence 2^(-0.5), 2^(-1.5), ...
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    twelve = [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(twelve))


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = ALiBiPositions(16, 8, n_heads=4)
    bias = alibi.score_bias(5, 5)  # (1, H, Tq, Tk)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[0, h, i, j] == pytest.approx(-float(slopes[h]) * abs(i - j))
    # With a cache: 1 query at position 7 over keys 0..7.
    torch.testing.assert_close(alibi.score_bias(1, 8, offset=7)[0, :, 0], -slopes[:, None] * torch.arange(7, -1, -1))


def test_alibi_gpt_decodes_with_the_cache_as_without():
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig(n_layer=2, n_head=4, d_model=32, context=16, vocab_size=23, positions="alibi")))
    ids = torch.randint(0, 23, (2, 9))
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(decode_stepwise(model, ids, 4)[0], full, atol=1e-5, rtol=1e-5)


def test_alibi_model_sees_distances_not_absolute_positions():
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig(n_layer=2, n_head=4, d_model=32, context=32, vocab_size=23, positions="alibi")))
    ids = torch.randint(0, 23, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, offset=20), model(ids), atol=1e-5, rtol=0)


# ---- grouped-query attention ---------------------------------------------------------------------


def test_grouped_query_attention_is_mha_with_repeated_key_value_heads():
    torch.manual_seed(0)
    h, hkv, dh, c = 6, 2, 4, 16
    gqa = perturb(MultiHeadAttention(c, h, dh, n_kv_heads=hkv))
    mha = MultiHeadAttention(c, h, dh).eval()
    w, b = gqa.qkv_proj.weight, gqa.qkv_proj.bias
    # Query head i reads key/value head i // 3: repeat each K/V head's rows 3 times, in order.
    q_rows, k_rows, v_rows = w.split([h * dh, hkv * dh, hkv * dh])
    qb, kb, vb = b.split([h * dh, hkv * dh, hkv * dh])
    rep = lambda t: t.view(hkv, dh, *t.shape[1:]).repeat_interleave(h // hkv, 0).reshape(h * dh, *t.shape[1:])
    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q_rows, rep(k_rows), rep(v_rows)]))
        mha.qkv_proj.bias.copy_(torch.cat([qb, rep(kb), rep(vb)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 7, c)
    for causal in (False, True):
        for weights in (False, True):
            gqa.causal = mha.causal = causal  # the same weights as a decoder's self-attention and an encoder's
            a, wa = gqa(x, Context(return_weights=weights))
            m, wm = mha(x, Context(return_weights=weights))
            torch.testing.assert_close(a, m, atol=1e-5, rtol=1e-5)
            if weights:
                torch.testing.assert_close(wa, wm)
    # cross-attention: the memory's keys/values through the K/V rows
    mem = torch.randn(2, 5, c)
    gqa.cross = mha.cross = True
    torch.testing.assert_close(gqa(x, Context(memory=mem))[0], mha(x, Context(memory=mem))[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kv_heads", "ff", "positions"), [(1, "mlp", "rope"), (2, "swiglu", "alibi"), (2, "geglu", "rope")]
)
def test_the_cache_holds_only_the_key_value_heads(kv_heads, ff, positions):
    torch.manual_seed(0)
    cfg = tiny_model(n_head=4, context=16, vocab_size=23, n_kv_head=kv_heads, positions=positions, feedforward=ff)
    model = perturb(GPT(cfg))
    assert model.blocks[0].attn.qkv_proj.weight.shape == ((4 + 2 * kv_heads) * 8, 32)
    ids = torch.randint(0, 23, (2, 10))
    with torch.no_grad():
        full = model(ids)
    stepwise, caches = decode_stepwise(model, ids, 3)
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)
    assert all(isinstance(c, KVCache) and c.k.shape[1] == kv_heads and c.v.shape[1] == kv_heads for c in caches)


def test_kv_heads_must_divide_the_heads():
    with pytest.raises(ValueError, match="n_kv_head"):
        GPTConfig(n_head=4, d_model=32, n_kv_head=3)


# ---- gated feed-forwards -------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "gate"), [("swiglu", F.silu), ("geglu", lambda z: F.gelu(z, approximate="tanh"))])
def test_gated_feedforward_is_its_formula(kind, gate):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=1, n_head=2, d_model=12, context=4, vocab_size=5, feedforward=kind))
    ff = perturb(gpt).blocks[0].ff
    assert isinstance(ff, GatedFeedForward)
    x = torch.randn(2, 3, 12)
    hand = torch.empty_like(x)
    for b in range(2):
        for t in range(3):  # one position at a time, the formula as written: (gate(x W_g) * x W_1) W_2
            g = gate(ff.gate.weight @ x[b, t] + ff.gate.bias)
            u = ff.up.weight @ x[b, t] + ff.up.bias
            hand[b, t] = ff.down.weight @ (g * u) + ff.down.bias
    torch.testing.assert_close(ff(x), hand, atol=1e-5, rtol=1e-5)


def test_gated_width_follows_the_two_thirds_rule():
    assert default_width("mlp", 128) == 512
    assert default_width("swiglu", 128) == 344  # 2/3 of 512 = 341.3, up to a multiple of 8
    assert default_width("moe", 96, expert="geglu") == 256
    plain = GPT(GPTConfig(n_layer=1, n_head=2, d_model=96, context=4, vocab_size=5, bias=False))
    gated = GPT(GPTConfig(n_layer=1, n_head=2, d_model=96, context=4, vocab_size=5, bias=False, feedforward="swiglu"))
    ff_params = lambda m: sum(p.numel() for p in m.blocks[0].ff.parameters())
    assert ff_params(gated) == 3 * 96 * 256 == ff_params(plain)


# ---- every family, every position scheme --------------------------------------------------------

FAMILIES = {
    "gpt": lambda **kw: GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, **kw)),
    "encoder": lambda **kw: Encoder(
        EncoderConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=11, n_labels=3, **kw)
    ),
    "vit": lambda **kw: ViT(
        ViTConfig(n_layer=2, n_head=2, d_model=16, image_size=8, channels=1, patch_size=4, n_labels=3, **kw)
    ),
    "seq2seq": lambda **kw: Seq2Seq(
        Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, context=8, src_vocab=11, tgt_vocab=11, dropout=0.0, **kw)
    ),
}


def batch(family: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    if family == "vit":
        return torch.rand(4, 1, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    ids = torch.randint(3, 11, (4, 7), generator=g)
    if family == "encoder":
        return ids, torch.randint(0, 3, (4,), generator=g)
    return (ids, ids, ids.roll(-1, 1)) if family == "seq2seq" else (ids, ids.roll(-1, 1))


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_with_every_position_scheme(family, positions):
    torch.manual_seed(0)
    model = FAMILIES[family](positions=positions, n_kv_head=1).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, losses = batch(family), []
    for _ in range(3):
        _, loss = model(*data)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


# ---- presets and their sizes ---------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["llama2-7b", "mixtral-8x7b"])
def test_size_presets_match_their_papers(preset):
    e = estimate(GPTConfig.from_preset(preset), preset)
    assert e["params"] == pytest.approx(PAPER_PARAMS[preset], rel=0.005)
    if preset in PAPER_ACTIVE_PARAMS:
        assert e["active_params"] == pytest.approx(PAPER_ACTIVE_PARAMS[preset], rel=0.005)
    else:
        assert e["active_params"] == e["params"]


def test_small_presets_build_and_moe_nano_uses_gpt_nanos_compute():
    nano, moe = (estimate(GPTConfig.from_preset(p), p) for p in ("gpt-nano", "moe-nano"))
    assert moe["params"] > 1.5 * nano["params"]
    # 2 experts of half the width per token: gpt-nano's feed-forward FLOPs, plus the router's
    # (4 layers x 128 x 4 experts x 2) and one more output bias per layer.
    assert moe["flops_per_token_forward"] == nano["flops_per_token_forward"] + 2 * 4 * (128 * 4 + 128)
    llama = GPT(GPTConfig.from_preset("llama-nano"))
    assert llama.blocks[0].attn.n_kv_heads == 2 and isinstance(llama.blocks[0].ff, GatedFeedForward)
