"""Checks for lesson 7 (modern blocks): RMSNorm, the rotary turn, ALiBi's bias, top-k routing, a KV cache's size."""

from __future__ import annotations

import torch

from attnlab.nn.moe import MixtureOfExperts
from attnlab.nn.norm import LayerNorm, RMSNorm
from attnlab.nn.position import ALiBiPositions, rotary_angles, rotate
from checks._common import WrongAnswer, as_tensor, compare, correct, exercise


def _x(seed: int = 0, shape: tuple[int, ...] = (3, 5, 16)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2 + 1  # an offset, so that a mean taken away shows


@exercise
def check_rmsnorm(my_rmsnorm) -> None:
    """my_rmsnorm(x (..., C), gain (C,), eps) -> x / sqrt(mean(x^2) + eps) * gain."""
    x = _x()
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
    got = as_tensor(my_rmsnorm(x, norm.weight.detach(), 1e-5), "my_rmsnorm(x, gain, eps)")
    want = norm(x).detach()
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        layer = LayerNorm(16, eps=1e-5, bias=False)
        with torch.no_grad():
            layer.weight.copy_(norm.weight)
        if torch.allclose(got, layer(x).detach(), atol=1e-5):
            raise WrongAnswer(
                "that is LayerNorm: RMSNorm does not subtract the mean, it divides by the root "
                "mean square sqrt(mean(x^2) + eps)"
            )
        if torch.allclose(got, want / norm.weight.detach(), atol=1e-5):
            raise WrongAnswer("the gain is missing: multiply the normalized x by gain")
        if torch.allclose(got, x / x.norm(dim=-1, keepdim=True) * norm.weight.detach(), atol=1e-5):
            raise WrongAnswer("divided by the norm sqrt(sum(x^2)), not the root mean square sqrt(mean(x^2) + eps)")
    compare("my_rmsnorm(x, gain, eps)", got, want)
    correct("RMSNorm = x / sqrt(mean(x^2) + eps) * gain: no mean taken away, no bias")


@exercise
def check_rotate(my_rotate) -> None:
    """my_rotate(x (T, Dh), positions (T,), theta) -> each pair (i, i + Dh/2) of x turned by pos * theta^(-2i/Dh)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=g)
    positions = torch.tensor([0, 1, 2, 5, 9, 30])
    got = as_tensor(my_rotate(x, positions, 10000.0), "my_rotate(x, positions, 10000)")
    angles = rotary_angles(31, 8, 10000.0)[positions]  # (T, Dh/2)
    want = rotate(x, angles.cos(), angles.sin())
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
        if torch.allclose(got, rotate(x, angles.cos(), angles.sin(), interleaved=True), atol=1e-5):
            raise WrongAnswer(
                "that pairs neighbours (2i, 2i+1), the RoFormer paper's layout; attnlab (like "
                "Llama's checkpoints) pairs feature i with feature i + Dh/2"
            )
        if torch.allclose(got, rotate(x, angles.cos(), -angles.sin()), atol=1e-5):
            raise WrongAnswer("the pairs turn the wrong way: (a, b) -> (a cos - b sin, b cos + a sin)")
        if torch.allclose(got[0], x[0], atol=1e-5) and not torch.allclose(got[1], want[1], atol=1e-5):
            raise WrongAnswer(
                "position 0 is right (no turn) but later ones are not: pair i turns by "
                "pos * theta ** (-2i / Dh), i = 0 .. Dh/2 - 1"
            )
    compare("my_rotate(x, positions, 10000)", got, want)
    correct("each pair (i, i + Dh/2) turned by pos * theta^(-2i/Dh)")


@exercise
def check_alibi(my_alibi) -> None:
    """my_alibi(n_heads, t) -> (H, T, T) bias -slope_h * |i - j| with slopes 2^(-8/H), 2^(-16/H), ..."""
    heads, t = 4, 6
    got = as_tensor(my_alibi(heads, t), f"my_alibi({heads}, {t})")
    want = ALiBiPositions(t, n_heads=heads).score_bias(t, t)[0]  # (H, T, T)
    if got.shape == want.shape and not torch.allclose(got, want, atol=1e-6):
        if torch.allclose(got, -want, atol=1e-6):
            raise WrongAnswer("the sign is flipped: the bias is a penalty, -slope * |i - j|, so far keys score lower")
        if torch.allclose(got, want.flip(0), atol=1e-6):
            raise WrongAnswer("the slopes are in reverse order: head 0 gets the steepest, 2^(-8/H)")
    compare(f"my_alibi({heads}, {t})", got, want)
    correct("head h adds -2^(-8(h+1)/H) * |i - j| to its scores")


@exercise
def check_top_k(my_top_k) -> None:
    """my_top_k(logits (N, E), k) -> (gates (N, k), experts (N, k)): softmax, the k largest, renormalised."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(7, 4, generator=g) * 2
    moe = MixtureOfExperts(d_model=4, d_ff=8, n_experts=4, k=2)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(4))  # so the router's logits are the input itself
        want_gates, want_experts, _ = moe.route(logits)
    got = my_top_k(logits, 2)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise WrongAnswer("return a pair (gates, experts), each of shape (N, k)")
    gates, experts = as_tensor(got[0], "gates"), as_tensor(got[1], "experts")
    if experts.shape == want_experts.shape and not torch.equal(experts.long(), want_experts):
        raise WrongAnswer("the experts are not the k most probable per token, best first: use probs.topk(k, dim=-1)")
    if gates.shape == want_gates.shape and torch.allclose(gates, logits.softmax(-1).topk(2, -1).values, atol=1e-6):
        raise WrongAnswer("the gates are not renormalised: divide the k chosen probabilities by their sum")
    compare("gates", gates, want_gates)
    correct("softmax over the experts, the top k, gates renormalised to sum to 1")


@exercise
def check_kv_cache_bytes(my_kv_bytes) -> None:
    """my_kv_bytes(n_layer, n_kv_head, d_head, tokens, bytes_per_number) -> bytes a KV cache holds."""
    cases = [(32, 32, 128, 4096, 2), (32, 8, 128, 4096, 2), (2, 1, 16, 10, 4)]
    for case in cases:
        got = my_kv_bytes(*case)
        want = 2 * case[0] * case[1] * case[2] * case[3] * case[4]  # keys and values: two tensors
        if got == want // 2:
            raise WrongAnswer("that is half the answer: the cache keeps keys and values, two tensors per layer")
        if got != want:
            raise WrongAnswer(
                f"my_kv_bytes{case} = {got:,}, expected {want:,}: keys and values, per layer, "
                "per key/value head, per token, d_head numbers each"
            )
    correct("2 (keys and values) x layers x kv heads x tokens x d_head x bytes: GQA divides it by H / n_kv_head")
