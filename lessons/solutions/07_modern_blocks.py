"""Worked answers to lesson 7's exercises, and a wrong answer each check must reject (lessons/README.md)."""

import torch


def rmsnorm(x, gain, eps):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * gain


def layernorm_instead(x, gain, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps) * gain


def rotate(x, positions, theta):
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))  # (Dh/2,)
    angles = (positions[:, None].double() * freqs).float()  # (T, Dh/2)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()], dim=-1)


def rotate_interleaved(x, positions, theta):
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
    angles = (positions[:, None].double() * freqs).float()
    a, b = x[..., 0::2], x[..., 1::2]  # neighbours paired: RoFormer's layout
    return torch.stack([a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()], -1).flatten(-2)


def alibi(n_heads, t):
    slopes = torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])
    distance = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs()
    return -slopes[:, None, None] * distance


def alibi_positive(n_heads, t):
    return -alibi(n_heads, t)


def top_k(logits, k):
    gates, experts = logits.softmax(-1).topk(k, dim=-1)
    return gates / gates.sum(-1, keepdim=True), experts


def top_k_not_renormalised(logits, k):
    return logits.softmax(-1).topk(k, dim=-1)


def kv_bytes(n_layer, n_kv_head, d_head, tokens, bytes_per_number):
    return 2 * n_layer * n_kv_head * d_head * tokens * bytes_per_number


def kv_bytes_keys_only(n_layer, n_kv_head, d_head, tokens, bytes_per_number):
    return n_layer * n_kv_head * d_head * tokens * bytes_per_number


ANSWERS = {
    "blocks.check_rmsnorm": (rmsnorm, layernorm_instead, "LayerNorm"),
    "blocks.check_rotate": (rotate, rotate_interleaved, "neighbours"),
    "blocks.check_alibi": (alibi, alibi_positive, "sign"),
    "blocks.check_top_k": (top_k, top_k_not_renormalised, "renormalised"),
    "blocks.check_kv_cache_bytes": (kv_bytes, kv_bytes_keys_only, "half"),
}
