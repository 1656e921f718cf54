"""The modern recipe's model options: rotary positions, QK-norm, RMSNorm, ReLU^2, zero-initialized
residual projections, logit soft-capping, the bigram embedding, an untied head, the wsd schedule."""

import math

import pytest
import torch
from torch import nn

from attnlab.decoding.sampling import stream
from attnlab.engine.config import TrainConfig
from attnlab.engine.optim import lr_at
from attnlab.errors import AttnlabError
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.vit import ViT, ViTConfig
from attnlab.nn import ACTIVATIONS, Context, KVCache, MultiHeadAttention
from attnlab.nn.norm import RMSNorm
from attnlab.nn.position import RotaryPositions, rotary_angles, rotate

MODERN = dict(
    positions="rope",
    qk_norm=True,
    activation="relu2",
    tie_weights=False,
    norm_kind="rmsnorm",
    logit_softcap=15.0,
    bigram_vocab=97,
)


def gpt(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=48, vocab_size=40, **kw)).eval()
    with torch.no_grad():  # away from the initialization, so every part is exercised
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


# ---- rotary positions ------------------------------------------------------------------------


def rope_loop(x: torch.Tensor, pos: int, theta: float = 10000.0) -> torch.Tensor:
    """The paper's formula (interleaved pairs as complex numbers): (x_2i + i x_2i+1) e^(i pos w_i)."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        w = theta ** (-2 * i / d)
        z = complex(float(x[2 * i]), float(x[2 * i + 1])) * complex(math.cos(pos * w), math.sin(pos * w))
        out[2 * i], out[2 * i + 1] = z.real, z.imag
    return out


def test_rotary_matches_the_paper_formula_and_keeps_lengths():
    x = torch.randn(5, 8, dtype=torch.float64)  # (T, Dh)
    angles = rotary_angles(5, 8).double()
    got = rotate(x, angles.cos(), angles.sin(), interleaved=True)
    want = torch.stack([rope_loop(x[t], t) for t in range(5)])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))
    # Half-split is the same rotation on the features reordered (2i, 2i+1) -> (i, i + Dh/2).
    order = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    half = rotate(x[:, order], angles.cos(), angles.sin())
    torch.testing.assert_close(half, got[:, order])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_scores_depend_only_on_the_distance(interleaved):
    rope = RotaryPositions(64, interleaved=interleaved)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> float:
        qm, _ = rope.qk_transform(q, q, m)
        _, kn = rope.qk_transform(k, k, n)
        return float((qm * kn).sum())

    for m, n in [(5, 2), (9, 0), (3, 3)]:
        assert score(m, n) == pytest.approx(score(m + 20, n + 20), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)  # but it does depend on the distance


def test_a_rotary_stack_reads_the_same_sequence_the_same_at_any_offset():
    """Rotary positions add nothing to the embeddings and attention sees only distances, so a
    whole sequence read at positions 7.. gives what it gives at 0.. (not so with learned ones)."""
    torch.manual_seed(0)
    for kind, same in (("rope", True), ("learned", False)):
        model = gpt(positions=kind)
        x = torch.randn(1, 10, 32)
        a, _ = model.blocks(model.pos(x), Context(positions=model.pos))
        b, _ = model.blocks(model.pos(x, 7), Context(positions=model.pos, offset=7))
        assert torch.allclose(a, b, atol=1e-4) == same


def test_encoder_takes_rotary_positions():
    cfg = EncoderConfig(n_layer=1, n_head=2, d_model=16, context=12, vocab_size=30, positions="rope")
    assert Encoder(cfg)(torch.randint(0, 30, (2, 12))).shape[0] == 2


def test_vit_takes_rotary_positions():
    cfg = ViTConfig(
        image_size=8, patch_size=4, channels=1, n_labels=3, n_layer=1, n_head=2, d_model=16, positions="rope"
    )
    assert ViT(cfg)(torch.rand(2, 1, 8, 8)).shape == (2, 3)


def test_every_modern_option_decodes_with_the_cache_as_without():
    model = gpt(**MODERN)
    ids = torch.randint(0, 40, (3, 20))
    full = model(ids)
    caches = model.new_caches()
    parts = [
        model(ids[:, :7], caches=caches),
        model(ids[:, 7:8], caches=caches, offset=7),
        model(ids[:, 8:], caches=caches, offset=8),
    ]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    cached = list(stream(model, [1, 2, 3], 60, temperature=0, use_cache=True, dtype="float32"))
    assert cached == list(stream(model, [1, 2, 3], 60, temperature=0, use_cache=False, dtype="float32"))


# ---- QK-norm, RMSNorm, ReLU^2 ----------------------------------------------------------------


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32)
    for qk_norm in (True, False):
        attn = MultiHeadAttention(32, 4, bias=False, qk_norm=qk_norm, causal=True).eval()
        if qk_norm:
            assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (8,)  # one gain per head feature
        before, _ = attn(x)
        with torch.no_grad():
            attn.qkv_proj.weight[:64] *= 30  # the W_Q and W_K rows
        after, _ = attn(x)
        assert torch.allclose(before, after, atol=1e-4) == qk_norm


def test_qk_norm_in_cross_attention_and_weights_path_agree():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, qk_norm=True, cross=True).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    fast, _ = attn(x, Context(memory=memory))
    slow, w = attn(x, Context(memory=memory, return_weights=True))
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 2, 3, 5)


def test_rmsnorm_matches_its_formula_and_torch():
    norm = RMSNorm(12, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 4, 12) * 5
    ref = nn.RMSNorm(12, eps=1e-6)
    ref.weight.data.copy_(norm.weight)
    torch.testing.assert_close(norm(x), norm.forward_math(x))
    torch.testing.assert_close(norm(x), ref(x))
    ms = (norm(x) / norm.weight).pow(2).mean(-1)
    torch.testing.assert_close(ms, torch.ones_like(ms), atol=1e-4, rtol=1e-4)


def test_relu_squared():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    assert ACTIVATIONS["relu2"](x).tolist() == [0.0, 0.0, 0.0, 0.25, 9.0]


# ---- initialization, head, soft-cap, bigram ----------------------------------------------------


def test_zero_init_starts_every_block_as_the_identity():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=16, vocab_size=40, zero_init=True))
    for block in model.blocks:
        assert not block.attn.out_proj.weight.any() and not block.ff.down.weight.any()
        assert block.attn.qkv_proj.weight.std() > 0.01  # the rest is initialized as usual
    ids = torch.randint(0, 40, (2, 9))
    x = model.pos(model.tok(ids))
    torch.testing.assert_close(model(ids), model.head(model.norm(x)))


def test_untied_head_has_its_own_matrix():
    untied, tied = gpt(tie_weights=False), gpt()
    assert untied.head.weight is not untied.tok.weight
    assert tied.head.weight is tied.tok.weight
    assert untied.num_params() == tied.num_params() + 40 * 32


def test_soft_cap_bounds_the_logits_and_keeps_small_ones():
    model = gpt(logit_softcap=5.0)
    with torch.no_grad():
        model.head.weight.mul_(1000)  # huge logits
    logits = model(torch.randint(0, 40, (2, 8)))
    assert 4.9 < logits.abs().max() <= 5.0
    z = torch.tensor([-0.05, 0.0, 0.05])
    assert torch.allclose(5.0 * torch.tanh(z / 5.0), z, atol=1e-4)  # the identity near zero
    with pytest.raises(ValueError, match="logit_softcap"):
        GPTConfig(logit_softcap=0.0)


def test_bigram_embedding_sees_the_previous_token():
    model = gpt(bigram_vocab=97)
    ids = torch.tensor([[3, 5, 5, 7]])
    rows = model.bigram_ids(ids)
    assert rows.tolist() == [[(40 * 41 + 3) % 97, (3 * 41 + 5) % 97, (5 * 41 + 5) % 97, (5 * 41 + 7) % 97]]
    # The same token after different ones reads different rows, so the outputs differ at it.
    a, b = model(torch.tensor([[1, 9]])), model(torch.tensor([[2, 9]]))
    assert not torch.allclose(a[0, 1], b[0, 1])
    loss = model(ids, targets=ids)[1]
    loss.backward()
    assert model.bigram.weight.grad.abs().sum() > 0
    assert model.num_params() - model.num_params(non_embedding=True) >= 97 * 32


def test_bigram_decoding_keeps_the_last_token_per_row_through_beam_reordering():
    cache = KVCache(8)
    cache.last_token = torch.tensor([[1], [2], [3]])
    cache.select(torch.tensor([2, 2, 0]))
    assert cache.last_token.tolist() == [[3], [3], [1]]


def test_modern_gpt_cannot_be_exported_to_gpt2_and_says_why():
    from attnlab.interop.hf.gpt2 import check_exportable

    with pytest.raises(AttnlabError) as e:
        check_exportable(GPTConfig(**MODERN, vocab_size=40))
    for word in ("rope", "qk_norm", "relu2", "rmsnorm", "logit_softcap", "bigram_vocab"):
        assert word in str(e.value)


# ---- warmup-stable-decay -------------------------------------------------------------------


def test_wsd_schedule_holds_then_decays_linearly():
    cfg = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110, schedule="wsd", cooldown=0.2)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert [lr_at(s, cfg) for s in (10, 50, 90)] == pytest.approx([1.0, 1.0, 1.0])  # stable until 80% of 100
    assert lr_at(100, cfg) == pytest.approx(0.5)  # halfway through the cooldown
    assert lr_at(110, cfg) == pytest.approx(0.0)
    timed = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, schedule="wsd", cooldown=0.5, time_budget="100s")
    assert lr_at(5, timed, elapsed=40.0) == pytest.approx(1.0)
    assert lr_at(5, timed, elapsed=75.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="cooldown"):
        TrainConfig(cooldown=0.0)
