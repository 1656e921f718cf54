"""The Transformer block every attnlab model family is built from.

Legend: B batch, T time, S source (memory) length, C model width, H heads.

    sublayer(x) = self-attention | cross-attention | feed-forward
    post-norm ("Attention Is All You Need", the lectures):  x = LayerNorm(x + Dropout(sublayer(x)))
    pre-norm  (GPT-2 and later):                            x = x + Dropout(sublayer(LayerNorm(x)))

Pre-norm keeps an un-normalized residual path from input to output, which makes deep stacks
train stably without careful warmup; post-norm is the original design.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.context import NO_CONTEXT, Context
from attnlab.nn.feedforward import build_feedforward
from attnlab.nn.hooks import Tap
from attnlab.nn.norm import build_norm
from attnlab.nn.options import NORM_PLACES, BlockConfig, BlockOptions

__all__ = ["NORM_PLACES", "Block", "BlockConfig", "BlockOptions"]


class Block(nn.Module):
    """Self-attention, optional cross-attention, and feed-forward, each with a residual."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_norm = cfg.norm == "pre"
        norm = lambda: build_norm(cfg)
        attention = lambda **kind: MultiHeadAttention(
            cfg.d_model, cfg.n_head, cfg.d_head, cfg.bias, cfg.dropout, cfg.qk_norm, cfg.n_kv_head, **kind
        )
        self.attn = attention(causal=cfg.causal)  # the causal mask comes from the config
        self.norm_attn = norm()
        if cfg.cross_attention:
            self.cross = attention(cross=True)
            self.norm_cross = norm()
        self.ff = build_feedforward(cfg)
        self.norm_ff = norm()
        self.drop = nn.Dropout(cfg.dropout)
        # Where activations can be read or replaced (nn/hooks.py); the identity when no hook is set.
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = Tap(), Tap(), Tap()
        self.hook_cross_out, self.hook_resid_cross = Tap(), Tap()
        self.hook_ff_out, self.hook_resid_post = Tap(), Tap()

    def _in(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_norm else x

    def _out(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        if self.training and self.drop.p > 0:  # else dropout is the identity: skip its call
            y = self.drop(y)
        x = x + y  # the residual connection
        return x if self.pre_norm else norm(x)

    def forward(self, x: Tensor, ctx: Context = NO_CONTEXT, layer: int = 0) -> tuple[Tensor, dict[str, Tensor] | None]:
        """x (B, T, C) -> (B, T, C), and {"self": (B, H, T, Tk), "cross": (B, H, T, S)} when
        ctx.return_weights. ctx: the pass's mask, bias, positions, offset, caches and memory
        (nn/context.py); layer: this block's place in its stack, which picks its caches."""
        x = self.hook_resid_pre(x)
        a, w_self = self.attn(self._in(x, self.norm_attn), ctx, ctx.cache(layer))
        x = self.hook_resid_mid(self._out(x, self.hook_attn_out(a), self.norm_attn))
        w_cross = None
        if self.cfg.cross_attention:
            c, w_cross = self.cross(self._in(x, self.norm_cross), ctx, ctx.cross_cache(layer))
            x = self.hook_resid_cross(self._out(x, self.hook_cross_out(c), self.norm_cross))
        f = self.ff(self._in(x, self.norm_ff))
        x = self.hook_resid_post(self._out(x, self.hook_ff_out(f), self.norm_ff))
        if not ctx.return_weights:
            return x, None
        return x, {"self": w_self} if w_cross is None else {"self": w_self, "cross": w_cross}
