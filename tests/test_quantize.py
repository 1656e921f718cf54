"""Quantized frozen linears (quant/quantize.py): the NF4 table against the QLoRA paper's, error bounds of
int8 and NF4 from their definitions, the layer against nn.Linear, a quantized GPT against the float one,
the bytes from the formula, gradients, and a safetensors round trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.io import read_safetensors
from attnlab.models import FAMILIES
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.quant.quantize import (
    NF4_LEVELS,
    QuantizedLinear,
    dequantize_int8,
    dequantize_nf4,
    load_quantized,
    pack_nibbles,
    quantize_int8,
    quantize_model,
    quantize_nf4,
    quantized_bytes,
    unpack_nibbles,
)
from attnlab.runs.weights import save_weights

# QLoRA (Dettmers et al. 2023), appendix E, as bitsandbytes ships it.
PAPER_NF4 = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
]


def test_nf4_levels_are_the_papers():
    levels = NF4_LEVELS.double()
    assert torch.allclose(levels, torch.tensor(PAPER_NF4, dtype=torch.float64), atol=1e-7, rtol=0)
    assert torch.equal(levels, levels.sort().values) and len(levels.unique()) == 16
    assert {-1.0, 0.0, 1.0} <= set(levels.tolist())


def test_nf4_levels_are_the_normal_quantiles_of_the_construction():
    # The paper's construction: 8 positive and 7 negative quantiles of N(0, 1) between 1 - offset and
    # offset (offset = 1/2 (1/32 + 1 - 1/30) ~ 0.9677), the zero, all scaled by the largest to [-1, 1].
    offset = 0.9677083
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1])
    levels = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values
    assert torch.allclose(NF4_LEVELS.double(), levels / levels.max(), atol=2e-7, rtol=0)  # float32 rounding


def test_int8_error_is_at_most_half_a_step_per_row():
    torch.manual_seed(0)
    w = torch.randn(96, 200) * torch.rand(96, 1) * 3  # rows of different ranges
    w[5] = 0  # an all-zero row codes to zeros, not NaN
    codes, scale = quantize_int8(w)
    assert codes.dtype == torch.int8 and scale.shape == (96,)
    assert torch.allclose(scale, w.abs().amax(dim=1) / 127)
    err = (dequantize_int8(codes, scale) - w).abs().amax(dim=1)
    assert (err <= scale / 2 * (1 + 1e-5) + 1e-12).all()
    assert torch.equal(dequantize_int8(codes, scale)[5], torch.zeros(200))
    # Each row's absmax is a code of +-127 exactly: the full range is used.
    assert torch.equal(codes.abs().amax(dim=1)[scale > 0], torch.full((95,), 127, dtype=torch.int8))


def test_nf4_error_is_at_most_half_the_widest_gap_per_block():
    torch.manual_seed(0)
    w = torch.randn(70, 90)  # 6300 weights: not a multiple of 64, the last block is padded
    packed, scale = quantize_nf4(w)
    blocks = -(-w.numel() // 64)
    assert packed.dtype == torch.uint8 and packed.shape == (blocks * 32,) and scale.shape == (blocks,)
    back = dequantize_nf4(packed, scale, w.shape)
    assert back.shape == w.shape
    half_gap = (NF4_LEVELS[1:] - NF4_LEVELS[:-1]).max() / 2
    flat_err = torch.nn.functional.pad((back - w).abs().reshape(-1), (0, blocks * 64 - w.numel()))
    assert (flat_err.view(blocks, 64).amax(dim=1) <= half_gap * scale * (1 + 1e-5)).all()
    # Each code is the nearest level: no other level is closer to w / absmax.
    x = torch.nn.functional.pad(w.reshape(-1), (0, blocks * 64 - w.numel())).view(blocks, 64) / scale[:, None]
    dist = (x.reshape(-1, 1) - NF4_LEVELS).abs()  # (N, 16)
    chosen = dist.gather(1, unpack_nibbles(packed)[:, None])
    assert (chosen <= dist.min(dim=1, keepdim=True).values + 1e-7).all()


def test_nf4_beats_a_uniform_4bit_grid_on_normal_weights():
    # Why NormalFloat: on normal weights, levels at the normal's quantiles err less than the uniform
    # absmax int4 grid (round(x * 7) / 7, 15 levels) with the same blocks of 64.
    torch.manual_seed(0)
    w = torch.randn(512, 512) * 0.02
    nf4 = (dequantize_nf4(*quantize_nf4(w), w.shape) - w).abs().mean()
    blocks = w.reshape(-1, 64)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    uniform = ((torch.round(blocks / absmax * 7) / 7 * absmax).reshape(w.shape) - w).abs().mean()
    assert nf4 < 0.95 * uniform, (nf4, uniform)


def test_packing_round_trips_every_pair_of_codes():
    codes = torch.cartesian_prod(torch.arange(16), torch.arange(16)).reshape(-1)  # all 256 (hi, lo) pairs
    packed = pack_nibbles(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (256,)
    assert torch.equal(packed.sort().values, torch.arange(256, dtype=torch.uint8))  # every byte used once
    assert torch.equal(unpack_nibbles(packed), codes)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_nn_linear_with_the_dequantized_weight(kind, bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    q = QuantizedLinear.from_linear(linear, kind)
    assert (q.in_features, q.out_features) == (96, 40)
    ref = nn.Linear(96, 40, bias=bias)
    with torch.no_grad():
        ref.weight.copy_(q.dequantize())
        if bias:
            ref.bias.copy_(linear.bias)
    x = torch.randn(3, 5, 96)
    assert torch.equal(q(x), ref(x))  # bit for bit: the same F.linear on the same float32 weight
    want = x @ q.dequantize().T + (linear.bias if bias else 0)
    assert torch.allclose(q(x), want, atol=1e-6, rtol=1e-6)
    assert not torch.equal(q.dequantize(), linear.weight)  # quantized indeed: the weight moved a little
    assert q(x.to(torch.bfloat16)).dtype == torch.bfloat16  # computed in the input's dtype


def test_a_cast_model_keeps_its_scales_in_float32():
    model = _tiny_gpt()
    quantize_model(model, "nf4")
    q = model.blocks[0].ff.up
    scales = q.scales.clone()
    model.to(torch.bfloat16)
    assert q.scales.dtype == torch.float32 and torch.equal(q.scales, scales)  # not rounded to bfloat16
    assert q.bias.dtype == torch.bfloat16  # the bias casts as nn.Linear's would
    with torch.no_grad():
        assert model(torch.randint(0, 97, (1, 8))).dtype == torch.bfloat16


def test_gradients_reach_the_input_never_the_codes():
    q = QuantizedLinear.from_linear(nn.Linear(64, 32), "nf4")
    assert list(q.parameters()) == []  # frozen: nothing for an optimizer
    x = torch.randn(4, 64, requires_grad=True)
    q(x).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(not b.requires_grad and b.grad is None for b in q.buffers())
    # The input's gradient is that of the dequantized weight: dL/dx = dL/dy @ W_deq.
    x2 = x.detach().clone().requires_grad_(True)
    (x2 @ q.dequantize().T + q.bias).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_backward_keeps_no_float_weight_alive(kind):
    # What autograd saves between forward and backward: the input, never a (O, I) float weight,
    # so a quantized base stays small while an adapter on top trains.
    q = QuantizedLinear.from_linear(nn.Linear(256, 512), kind)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = q(torch.randn(3, 256, requires_grad=True))
    assert all(t.numel() < 512 * 256 for t in saved), [tuple(t.shape) for t in saved]
    y.sum().backward()


def _tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=64, context=32, vocab_size=97)).eval()
    with torch.no_grad():  # away from the init (zero biases, small residual weights): like a trained model
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize(("kind", "bound"), [("int8", 1e-2), ("nf4", 0.15)])
def test_a_quantized_gpt_stays_close_to_the_float_one(kind, bound):
    model = _tiny_gpt()
    idx = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        want = model(idx)
        report = quantize_model(model, kind)
        got = model(idx)
    assert len(report.replaced) == 8  # 2 blocks x (qkv, out, up, down)
    assert all(
        isinstance(m, QuantizedLinear)
        for m in model.blocks[0].modules()
        if m is not model.blocks[0] and isinstance(m, (nn.Linear, QuantizedLinear))
    )
    outside = [n for n, m in model.named_modules() if isinstance(m, QuantizedLinear) and not n.startswith("blocks.")]
    assert outside == [] and type(model.head) is nn.Linear  # embeddings and the head stay float
    rel = ((got - want).norm() / want.norm()).item()
    assert 0 < rel < bound, rel  # measured: int8 7.1e-3, nf4 0.109 (per-weight rms ~0.6%, ~10%)


def test_every_stack_is_quantized_cross_attention_included():
    # The encoder-decoder has two Stacks, and cross-attention reads row slices of its projection's
    # weight (nn/attention.py _project): the dequantized weight answers there.
    cfg, cls = FAMILIES["seq2seq"]
    torch.manual_seed(0)
    model = cls(cfg(n_head=2, d_model=32, n_layer=2, n_dec_layer=2, context=16, src_vocab=30, tgt_vocab=30)).eval()
    src, tgt = torch.randint(3, 30, (2, 10)), torch.randint(3, 30, (2, 8))
    with torch.no_grad():
        want = model(src, tgt)
        report = quantize_model(model, "int8")
        got = model(src, tgt)
    assert len(report.replaced) == 20 and "decoder.1.cross.qkv_proj" in report.replaced  # 2 x 4 + 2 x 6
    assert 0 < ((got - want).norm() / want.norm()).item() < 1e-2


def test_skip_keeps_named_layers_float():
    model = _tiny_gpt()
    report = quantize_model(model, "int8", skip=("ff.down", "qkv_proj"))
    assert report.replaced == ["blocks.0.attn.out_proj", "blocks.0.ff.up", "blocks.1.attn.out_proj", "blocks.1.ff.up"]
    assert type(model.blocks[1].ff.down) is nn.Linear and type(model.blocks[0].attn.qkv_proj) is nn.Linear


@pytest.mark.parametrize("shape", [(768, 768), (3072, 768), (50, 30)])
def test_nf4_bytes_are_an_eighth_of_float32_plus_the_scales(shape):
    out, inp = shape
    q = QuantizedLinear.from_linear(nn.Linear(inp, out, bias=False), "nf4")
    blocks = -(-out * inp // 64)  # (50 x 30 = 1500 weights: 24 blocks, the last one padded)
    assert q.codes.nbytes == blocks * 32 and q.scales.nbytes == blocks * 4
    assert q.codes.nbytes + q.scales.nbytes == quantized_bytes(out, inp, "nf4")
    if out * inp % 64 == 0:  # exactly 1/8 of float32 for the codes, + 4 bytes per 64 weights
        assert q.codes.nbytes * 8 == out * inp * 4 and q.scales.nbytes * 64 == out * inp * 4


def test_quantize_model_reports_the_bytes():
    model = _tiny_gpt()
    before = sum(p.nbytes for b in model.blocks for p in b.parameters() if p.dim() == 2)
    report = quantize_model(model, "nf4")
    shapes = [(192, 64), (64, 64), (256, 64), (64, 256)] * 2
    biases = sum(o for o, _ in shapes) * 4
    assert report.bytes_before == before + biases
    assert report.bytes_after == sum(quantized_bytes(o, i, "nf4") for o, i in shapes) + biases


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_safetensors_round_trip(tmp_path, kind):
    model = _tiny_gpt()
    quantize_model(model, kind)
    save_weights(model, tmp_path / "model.safetensors")  # plain tensors: safetensors refuses anything else
    tensors, _ = read_safetensors(tmp_path / "model.safetensors")
    codes = tensors["blocks.0.ff.up.codes"]
    assert codes.dtype == (torch.int8 if kind == "int8" else torch.uint8)
    fresh = _tiny_gpt(seed=1)  # other weights, float
    rebuilt = load_quantized(fresh, tensors)
    assert len(rebuilt) == 8 and fresh.blocks[1].attn.qkv_proj.kind == kind
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert torch.equal(fresh(idx), model(idx))
    with pytest.raises(AttnlabError, match="do not fit"):  # another model's shapes: one line
        load_quantized(GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=32, vocab_size=97)), tensors)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="int8, nf4"):
        QuantizedLinear.from_linear(nn.Linear(4, 4), "int4")
