"""The building blocks in attnlab.nn against the lecture formulas and PyTorch's own modules.

Legend: B batch, H heads, Tq query length, Tk key length, Dh head size, C model width.
Masks are boolean with True = "may attend". Everything is float32 on CPU with tiny shapes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import (
    Block,
    BlockConfig,
    Context,
    FeedForward,
    KVCache,
    LayerNorm,
    LearnedPositions,
    MultiHeadAttention,
    NoPositions,
    SinusoidalPositions,
    attend,
    build_positions,
    causal_mask,
    sinusoidal_table,
)

# ----------------------------------------------------------------------------------------------
# helpers


def loop_attention(q, k, v, allowed):
    """The lecture formula with explicit loops, in float64 Python arithmetic.

    allowed(b, h, i, j) -> bool says whether query i may look at key j.
    score_ij = q_i . k_j / sqrt(d); alpha_i = softmax over the allowed j; out_i = sum_j alpha_ij v_j.
    A row with no allowed key gets zero weights and a zero output.
    """
    n_b, n_h, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[3]
    qq, kk, vv = q.tolist(), k.tolist(), v.tolist()
    out = torch.zeros(n_b, n_h, tq, dv, dtype=torch.float64)
    weights = torch.zeros(n_b, n_h, tq, tk, dtype=torch.float64)
    for b in range(n_b):
        for h in range(n_h):
            for i in range(tq):
                scores = {}
                for j in range(tk):
                    if allowed(b, h, i, j):
                        dot = 0.0
                        for c in range(d):
                            dot += qq[b][h][i][c] * kk[b][h][j][c]
                        scores[j] = dot / math.sqrt(d)
                if not scores:
                    continue
                m = max(scores.values())
                exps = {j: math.exp(s - m) for j, s in scores.items()}
                z = sum(exps.values())
                for j, e in exps.items():
                    alpha = e / z
                    weights[b, h, i, j] = alpha
                    for c in range(dv):
                        out[b, h, i, c] += alpha * vv[b][h][j][c]
    return out, weights


def randomize_(module: nn.Module) -> nn.Module:
    """Give every parameter (LayerNorm gains and biases included) random, non-trivial values."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
        for m in module.modules():
            if isinstance(m, LayerNorm):
                m.weight.add_(1.0)
    return module


def tiny_block(**kw) -> Block:
    cfg = BlockConfig(**{"d_model": 16, "n_head": 4, "d_ff": 32, "dropout": 0.0, **kw})
    return randomize_(Block(cfg)).eval()


# ----------------------------------------------------------------------------------------------
# 1. attend vs the formula written as loops


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 7)])
def test_attend_matches_loop_formula(causal, tq, tk):
    """attend computes softmax(q.k/sqrt(d)) v over the allowed keys; causal means j <= i (bottom-right)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, tq, 4), torch.randn(2, 2, tk, 4), torch.randn(2, 2, tk, 4)
    shift = tk - tq  # query i sits at absolute position shift + i

    def allowed(b, h, i, j):
        return (j <= i + shift) if causal else True

    ref_out, ref_w = loop_attention(q, k, v, allowed)
    out, w = attend(q, k, v, return_weights=True, causal=causal)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=0)
    fused, none = attend(q, k, v, causal=causal)
    assert none is None
    torch.testing.assert_close(fused.double(), ref_out, atol=1e-5, rtol=0)


def test_attend_matches_loop_formula_with_mask():
    """An explicit mask removes exactly the keys marked False from the softmax."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    mask = torch.rand(2, 1, 5, 5) > 0.4
    mask[..., 0] = True  # every row keeps at least one key
    ref_out, ref_w = loop_attention(q, k, v, lambda b, h, i, j: bool(mask[b, 0, i, j]))
    out, w = attend(q, k, v, mask, return_weights=True)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# 2. the math path and the fused path agree


def _key_padding(n_b, tk):
    lengths = torch.tensor([tk, max(1, tk // 2)])[:n_b]
    return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)


MASK_CASES = {
    "none": (6, 6, False, lambda b, tq, tk: None),
    "causal": (6, 6, True, lambda b, tq, tk: None),
    "key_padding": (6, 6, False, lambda b, tq, tk: _key_padding(b, tk)),
    "key_padding+causal": (6, 6, True, lambda b, tq, tk: _key_padding(b, tk)),
    "full_random": (6, 6, False, lambda b, tq, tk: torch.rand(b, 1, tq, tk) > 0.5),
    "cross_causal": (3, 7, True, lambda b, tq, tk: None),
    "cross_causal+key_padding": (3, 7, True, lambda b, tq, tk: _key_padding(b, tk)),
    "cross_no_mask": (3, 7, False, lambda b, tq, tk: None),
}


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_math_and_fused_paths_agree(case):
    """The written-out softmax formula and the fused SDPA kernel compute the same attention."""
    torch.manual_seed(2)
    tq, tk, causal, make_mask = MASK_CASES[case]
    n_b, n_h, dh = 2, 2, 8
    q, k, v = torch.randn(n_b, n_h, tq, dh), torch.randn(n_b, n_h, tk, dh), torch.randn(n_b, n_h, tk, dh)
    mask = make_mask(n_b, tq, tk)
    out_math, w = attend(q, k, v, mask, return_weights=True, causal=causal)
    out_fused, w_fused = attend(q, k, v, mask, return_weights=False, causal=causal)
    assert w_fused is None
    assert out_math.shape == out_fused.shape == (n_b, n_h, tq, dh)
    torch.testing.assert_close(out_math, out_fused, atol=1e-5, rtol=0)

    # The weights put no mass where attending is forbidden, and each live row sums to 1.
    allowed = torch.ones(n_b, 1, tq, tk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        for i in range(tq):
            for j in range(tk):
                if j > i + (tk - tq):
                    allowed[:, :, i, j] = False
    allowed = allowed.expand(n_b, n_h, tq, tk)
    assert torch.all(w[~allowed] == 0)
    live = allowed.any(dim=-1)
    torch.testing.assert_close(w.sum(-1)[live], torch.ones(int(live.sum())), atol=1e-6, rtol=0)
    assert torch.all(w.sum(-1)[~live] == 0)


# ----------------------------------------------------------------------------------------------
# 3. a query with no visible key


@pytest.mark.parametrize("return_weights", [True, False])
@pytest.mark.parametrize("kind", ["row", "key_padding+causal"])
def test_fully_masked_row_is_zero_not_nan(return_weights, kind):
    """A query that may attend to nothing outputs zeros, and neither forward nor backward makes NaN."""
    torch.manual_seed(3)
    n_b, n_h, t, dh = 2, 2, 5, 4
    q, k, v = (torch.randn(n_b, n_h, t, dh, requires_grad=True) for _ in range(3))
    if kind == "row":
        mask = torch.ones(n_b, 1, t, t, dtype=torch.bool)
        mask[0, 0, 2] = False  # query 2 of batch 0 sees nothing
        causal, dead = False, (0, 2)
    else:
        mask = torch.ones(n_b, 1, 1, t, dtype=torch.bool)
        mask[1, ..., 0] = False  # batch 1 pads key 0, so its query 0 (causal: sees key 0 only) is dead
        causal, dead = True, (1, 0)
    out, w = attend(q, k, v, mask, return_weights=return_weights, causal=causal)
    assert torch.isfinite(out).all()
    assert torch.all(out[dead[0], :, dead[1]] == 0)
    others = torch.ones(n_b, t, dtype=torch.bool)
    others[dead] = False
    assert (out.detach().abs().sum(-1).permute(0, 2, 1)[others] > 0).all()  # live rows are not zeroed
    if return_weights:
        assert torch.isfinite(w).all()
        assert torch.all(w[dead[0], :, dead[1]] == 0)
    (out.square().sum() + (w.sum() if w is not None else 0)).backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.all(q.grad[dead[0], :, dead[1]] == 0)  # the dead query does not influence anything
    assert q.grad.abs().sum() > 0


# ----------------------------------------------------------------------------------------------
# 4. causal_mask alignment


def test_causal_mask_bottom_right():
    """causal_mask(tq, tk) puts the queries at the last tq positions: query i sees keys j <= tk - tq + i."""
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(3, 3).tolist() == torch.tril(torch.ones(3, 3, dtype=torch.bool)).tolist()
    assert causal_mask(1, 4).tolist() == [[True] * 4]
    m = causal_mask(3, 7)
    assert m.dtype == torch.bool and m.shape == (3, 7)
    assert m.tolist() == [[j <= 4 + i for j in range(7)] for i in range(3)]


# ----------------------------------------------------------------------------------------------
# 5. causality of a block stack


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causal_stack_ignores_the_future(norm):
    """With causal self-attention, output i of a block stack depends on inputs 0..i only."""
    torch.manual_seed(5)
    blocks = [tiny_block(norm=norm, causal=True) for _ in range(2)]
    open_blocks = [tiny_block(norm=norm, causal=False) for _ in range(2)]

    def run(stack, x):
        for blk in stack:
            x, _ = blk(x)
        return x

    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        out = run(blocks, x)
        out_open = run(open_blocks, x)
        for i in (0, 3, 6):
            x2 = x.clone()
            x2[:, i + 1 :] = torch.randn(2, 8 - i - 1, 16)
            out2 = run(blocks, x2)
            torch.testing.assert_close(out2[:, : i + 1], out[:, : i + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(out2[:, i + 1 :], out[:, i + 1 :], atol=1e-3)
            # Sanity: without the causal mask the past does see the change.
            assert not torch.allclose(run(open_blocks, x2)[:, : i + 1], out_open[:, : i + 1], atol=1e-3)


# ----------------------------------------------------------------------------------------------
# 6. permutation equivariance


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_is_permutation_equivariant(norm):
    """Without positions or a causal mask, attention treats the sequence as a set: block(x P) = block(x) P."""
    torch.manual_seed(6)
    block = tiny_block(norm=norm, causal=False)
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    assert not torch.equal(perm, torch.arange(7))
    with torch.no_grad():
        out, _ = block(x)
        out_perm, _ = block(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# 7. LayerNorm


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(bias):
    """LayerNorm normalizes each position over its C features (biased variance), then scales and shifts."""
    torch.manual_seed(7)
    c = 10
    ours = LayerNorm(c, eps=1e-5, bias=bias)
    ref = nn.LayerNorm(c, eps=1e-5, bias=bias)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(c) + 1.0)
        ref.weight.copy_(ours.weight)
        if bias:
            ours.bias.copy_(torch.randn(c))
            ref.bias.copy_(ours.bias)
    assert (ours.bias is None) == (not bias)
    x = torch.randn(3, 4, c) * 3.0 + 2.0
    expected = ref(x)
    torch.testing.assert_close(ours(x), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.forward_math(x), expected, atol=1e-6, rtol=0)
    # And the formula itself, in float64.
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    by_hand = (xd - mean) / torch.sqrt(var + 1e-5) * ours.weight.double()
    if bias:
        by_hand = by_hand + ours.bias.double()
    torch.testing.assert_close(ours.forward_math(x).double(), by_hand, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# 8. MultiHeadAttention vs torch.nn.MultiheadAttention


def _torch_copy(ours: MultiHeadAttention, d_model: int, n_heads: int) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    with torch.no_grad():
        # Both stack [W_q; W_k; W_v] as rows of one (3C, C) matrix.
        ref.in_proj_weight.copy_(ours.qkv_proj.weight)
        ref.in_proj_bias.copy_(ours.qkv_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_attention_matches_torch(padding, causal, cross):
    """MHA = concat_h softmax(Q_h K_h^T / sqrt(Dh)) V_h, then W_O; the same numbers as torch's module."""
    torch.manual_seed(8)
    c, n_h, n_b, t = 16, 4, 2, 5
    s = 7 if cross else t
    ours = randomize_(MultiHeadAttention(c, n_h, causal=causal, cross=cross)).eval()
    ref = _torch_copy(ours, c, n_h)
    x = torch.randn(n_b, t, c)
    mem = torch.randn(n_b, s, c) if cross else None
    src = mem if cross else x

    keep = torch.ones(n_b, s, dtype=torch.bool)  # True = may attend
    if padding:
        keep[1, s - 2 :] = False
    our_mask = keep[:, None, None, :] if padding else None
    torch_kpm = ~keep if padding else None  # torch: True = ignore
    torch_attn_mask = ~causal_mask(t, s) if causal else None  # torch: True = not allowed

    with torch.no_grad():
        mask = dict(memory_mask=our_mask) if cross else dict(mask=our_mask)
        out_w, w = ours(x, Context(memory=mem, **mask, return_weights=True))
        out_f, none = ours(x, Context(memory=mem, **mask))
        ref_out, ref_w = ref(
            x,
            src,
            src,
            key_padding_mask=torch_kpm,
            attn_mask=torch_attn_mask,
            need_weights=True,
            average_attn_weights=True,
        )
    assert none is None
    assert w.shape == (n_b, n_h, t, s)
    torch.testing.assert_close(out_w, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(out_f, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.mean(dim=1), ref_w, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# 9. the key/value cache


CHUNKS = (4, 1, 3)


@pytest.mark.parametrize("max_len", [None, 8, 12])
@pytest.mark.parametrize("return_weights", [False, True])
def test_kv_cache_matches_full_pass(max_len, return_weights):
    """Causal attention over chunks with cached keys/values equals one pass over the whole sequence."""
    torch.manual_seed(9)
    mha = randomize_(MultiHeadAttention(16, 4, causal=True)).eval()
    x = torch.randn(2, sum(CHUNKS), 16)
    with torch.no_grad():
        full, _ = mha(x)
        cache, offset, parts = KVCache(max_len=max_len), 0, []
        for n in CHUNKS:
            out, w = mha(x[:, offset : offset + n], Context(offset=offset, return_weights=return_weights), cache)
            if return_weights:
                assert w.shape == (2, 4, n, offset + n)
            parts.append(out)
            offset += n
    assert cache.length == sum(CHUNKS)
    assert cache.k.shape[2] == (max_len or sum(CHUNKS))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_kv_cache_full_raises():
    """A preallocated cache refuses more positions than max_len."""
    cache = KVCache(max_len=4)
    k = torch.randn(1, 2, 3, 4)
    cache.update(k, k)
    with pytest.raises(ValueError):
        cache.update(k, k)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("max_len", [None, 8])
def test_block_kv_cache_matches_full_pass(norm, max_len):
    """A causal block fed chunk by chunk through its cache gives the same outputs as one full pass."""
    torch.manual_seed(10)
    block = tiny_block(norm=norm, causal=True)
    x = torch.randn(2, sum(CHUNKS), 16)
    with torch.no_grad():
        full, _ = block(x)
        cache, offset, parts = KVCache(max_len=max_len), 0, []
        for n in CHUNKS:
            out, _ = block(x[:, offset : offset + n], Context(offset=offset, caches=[cache]))
            parts.append(out)
            offset += n
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_decoder_block_static_cross_cache():
    """A decoder block caches the encoder's keys/values once (static cache) and reuses them."""
    torch.manual_seed(11)
    block = tiny_block(causal=True, cross_attention=True)
    x, mem = torch.randn(2, sum(CHUNKS), 16), torch.randn(2, 6, 16)
    with torch.no_grad():
        full, _ = block(x, Context(memory=mem))
        cache, cross_cache, offset, parts = KVCache(max_len=8), KVCache(static=True), 0, []
        for n in CHUNKS:
            first = mem if offset == 0 else None  # the memory's keys/values are made on the first chunk only
            ctx = Context(offset=offset, caches=[cache], memory=first, cross_caches=[cross_cache])
            out, _ = block(x[:, offset : offset + n], ctx)
            parts.append(out)
            offset += n
    assert cross_cache.length == 6
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# 10. positions


@pytest.mark.parametrize("n,d", [(6, 8), (5, 7), (4, 1), (50, 6)])
def test_sinusoidal_table_matches_paper(n, d):
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)) and PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""
    expected = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for col in range(d):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d)
            expected[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    table = sinusoidal_table(n, d)
    assert table.shape == (n, d)
    torch.testing.assert_close(table.double(), expected, atol=1e-5, rtol=0)


def test_absolute_positions_add_the_right_rows():
    """Position modules add row offset+t to the embedding at t, and refuse positions past max_len."""
    torch.manual_seed(12)
    x = torch.randn(2, 3, 6)
    sin = SinusoidalPositions(10, 6)
    torch.testing.assert_close(sin(x, offset=4), x + sinusoidal_table(10, 6)[4:7], atol=0, rtol=0)
    torch.testing.assert_close(sin(x), x + sinusoidal_table(10, 6)[:3], atol=0, rtol=0)
    assert "table" not in sin.state_dict()  # a function of the shape, not a weight

    learned = LearnedPositions(10, 6)
    torch.testing.assert_close(learned(x, offset=4), x + learned.embedding.weight[4:7], atol=0, rtol=0)
    torch.testing.assert_close(learned(x, offset=7), x + learned.embedding.weight[7:10], atol=0, rtol=0)

    for pos in (sin, learned):
        with pytest.raises(ValueError):
            pos(x, offset=8)  # positions 8..10, but the context is 10
        with pytest.raises(ValueError):
            pos(torch.randn(1, 11, 6))

    none = NoPositions(4)
    assert torch.equal(none(torch.randn(1, 9, 6).fill_(1.5), offset=3), torch.full((1, 9, 6), 1.5))


def test_build_positions():
    """build_positions maps config names to position modules and rejects unknown ones."""
    assert isinstance(build_positions("sinusoidal", 10, 6), SinusoidalPositions)
    assert isinstance(build_positions("learned", 10, 6), LearnedPositions)
    assert isinstance(build_positions("none", 10, 6), NoPositions)
    for bad in ("rotary-typo", "", "Learned"):
        with pytest.raises(ValueError):
            build_positions(bad, 10, 6)


# ----------------------------------------------------------------------------------------------
# 11. feed-forward


def test_feedforward_relu_by_hand():
    """FFN(x) = max(0, x W1^T + b1) W2^T + b2, the same for every position."""
    torch.manual_seed(13)
    ff = FeedForward(8, 32, activation="relu")
    x = torch.randn(2, 5, 8)
    w1, b1, w2, b2 = ff.up.weight, ff.up.bias, ff.down.weight, ff.down.bias
    assert w1.shape == (32, 8) and w2.shape == (8, 32)
    hidden = torch.clamp(x @ w1.T + b1, min=0.0)
    assert (hidden == 0).any() and (hidden > 0).any()
    with torch.no_grad():
        out = ff(x)
        torch.testing.assert_close(out, hidden @ w2.T + b2, atol=1e-6, rtol=0)
        torch.testing.assert_close(ff(x[:, 2:3]), out[:, 2:3], atol=1e-6, rtol=0)  # position-wise


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_feedforward_gelu_variants(activation):
    """gelu is x Phi(x) (exact, erf); gelu_tanh is GPT-2's tanh approximation."""
    torch.manual_seed(14)
    ff = FeedForward(8, 16, activation=activation)
    x = torch.randn(2, 5, 8)
    h = ff.up(x)
    if activation == "gelu":
        act = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        torch.testing.assert_close(act, F.gelu(h), atol=1e-6, rtol=0)
    else:
        act = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
        torch.testing.assert_close(act, F.gelu(h, approximate="tanh"), atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(ff(x), ff.down(act), atol=1e-6, rtol=0)


def test_feedforward_options():
    """Unknown activations are refused; bias=False drops b1 and b2."""
    with pytest.raises(ValueError):
        FeedForward(8, 16, activation="swish")
    ff = FeedForward(8, 16, bias=False)
    assert ff.up.bias is None and ff.down.bias is None


# ----------------------------------------------------------------------------------------------
# 12. the block wiring, post-norm and pre-norm


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("cross", [False, True])
def test_block_formula(norm, cross):
    """post-norm: x = LN(x + sublayer(x)); pre-norm: x = x + sublayer(LN(x)); sublayers SA, [CA], FF."""
    torch.manual_seed(15)
    block = tiny_block(norm=norm, causal=cross, cross_attention=cross)
    x = torch.randn(2, 5, 16)
    mem = torch.randn(2, 6, 16) if cross else None
    b = block

    def sa(h):
        return b.attn(h)[0]  # causal when the block is (its config says)

    def ca(h):
        return b.cross(h, Context(memory=mem))[0]

    with torch.no_grad():
        out, none = block(x, Context(memory=mem))
        if norm == "post":
            h = b.norm_attn(x + sa(x))
            if cross:
                h = b.norm_cross(h + ca(h))
            expected = b.norm_ff(h + b.ff(h))
        else:
            h = x + sa(b.norm_attn(x))
            if cross:
                h = h + ca(b.norm_cross(h))
            expected = h + b.ff(b.norm_ff(h))
        out_w, weights = block(x, Context(memory=mem, return_weights=True))
    assert none is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out_w, expected, atol=1e-5, rtol=0)
    assert weights["self"].shape == (2, 4, 5, 5)
    if cross:
        assert weights["cross"].shape == (2, 4, 5, 6)
        with pytest.raises(ValueError):
            block(x)  # cross-attention needs memory
    else:
        assert "cross" not in weights


def test_block_config_rejects_unknown_norm():
    """Only pre-norm and post-norm exist."""
    with pytest.raises(ValueError):
        BlockConfig(d_model=16, n_head=4, d_ff=32, norm="sandwich")


def test_static_cache_with_max_len_returns_only_the_source():
    """A cross-attention cache holds exactly the source's keys/values, whatever max_len says."""
    cache = KVCache(max_len=8, static=True)
    k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    ck, cv = cache.update(k, v)
    assert ck.shape == (1, 2, 6, 4) and torch.equal(ck, k) and torch.equal(cv, v)
    assert cache.filled and cache.length == 6
