"""What --dtype auto times: one block's training step and one block's decoding steps, at a width.

Legend: B rows, T tokens, H heads, Dh head width, W width (d_model), Tc cached positions.

A bare matrix product (what was timed before) is not what a run spends its time on: training adds
the backward pass, the softmax, the norms and the casts autocast inserts between them, and decoding
multiplies (B, 1, W) rows by the weights, which reads every weight for a few rows' work. So each
is timed on its own shapes, and each has its own cached answer (precision.py):
    train   a pre-norm block (attention + 4x MLP) forward and backward on (4, 64, W)
    decode  8 tokens, one at a time, of 4 rows through the same block over a cache of 128 keys
Both are built once per measurement from a fixed seed, and each call runs the work once in the
dtype it is given and returns when the device is done (.item()).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROWS, TOKENS = 4, 64  # training: a small batch of a block's input, 256 positions
DECODE_ROWS, CACHED, DECODE_STEPS = 4, 128, 8  # decoding: few rows, one token at a time


def _autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """As runs use it (device.autocast): float32 is plain float32, bf16 is autocast."""
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32)


class _Block(nn.Module):
    """A pre-norm Transformer block in plain torch (runtime stands below nn/: it cannot import it)."""

    def __init__(self, width: int):
        super().__init__()
        self.heads = max(1, width // 64)
        while width % self.heads:  # heads of 64 where the width allows, whole heads always
            self.heads -= 1
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def heads_of(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)  # 3 x (B, T, H, Dh)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, Dh)

    def rest(self, x: Tensor, att: Tensor) -> Tensor:
        x = x + self.proj(att.transpose(1, 2).flatten(2))  # (B, T, W)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.heads_of(x)
        return self.rest(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def train_step(device: torch.device, width: int) -> Callable[[torch.dtype], None]:
    """One forward and backward of a block on (ROWS, TOKENS, width), as a training step runs it."""
    g = torch.Generator().manual_seed(0)
    block = _Block(width).to(device)
    x = torch.randn(ROWS, TOKENS, width, generator=g).to(device)  # (B, T, W)

    def run(dtype: torch.dtype) -> None:
        for p in block.parameters():
            p.grad = None
        with torch.enable_grad(), _autocast(device, dtype):  # callers may measure from inside no_grad (eval)
            loss = block(x).float().square().mean()
            loss.backward()
        loss.item()  # wait for the device

    return run


def decode_steps(device: torch.device, width: int) -> Callable[[torch.dtype], None]:
    """DECODE_STEPS tokens of DECODE_ROWS rows, one at a time, each attending to a cache of CACHED
    keys kept in the dtype decoding runs in (as the KV cache keeps what autocast produced)."""
    g = torch.Generator().manual_seed(0)
    block = _Block(width).to(device).eval()
    dh = width // block.heads
    x0 = torch.randn(DECODE_ROWS, 1, width, generator=g).to(device)  # (B, 1, W)
    cache = torch.randn(2, DECODE_ROWS, block.heads, CACHED + DECODE_STEPS, dh, generator=g).to(device)
    caches = {torch.float32: cache, torch.bfloat16: cache.bfloat16()}  # (2, B, H, Tc, Dh): keys, values

    @torch.no_grad()
    def run(dtype: torch.dtype) -> None:
        keys, values = caches.get(dtype, cache)
        x = x0
        with _autocast(device, dtype):
            for i in range(DECODE_STEPS):
                q, k, v = block.heads_of(x)  # (B, H, 1, Dh)
                n = CACHED + i
                keys[:, :, n : n + 1], values[:, :, n : n + 1] = k, v  # written in place, as a KV cache
                att = F.scaled_dot_product_attention(q, keys[:, :, : n + 1], values[:, :, : n + 1])
                x = block.rest(x, att)  # (B, 1, W)
        x.sum().item()

    return run


WORKLOADS: dict[str, Callable[[torch.device, int], Callable[[torch.dtype], None]]] = {
    "train": train_step,
    "decode": decode_steps,
}
