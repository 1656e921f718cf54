"""Named points inside the forward pass where an activation can be read or replaced.

Legend: B batch, T time, H heads, Tq/Tk query and key lengths, Dh head size, C model width.

Every block of every family has the same points, so one name works for GPT, the encoder, both
halves of the encoder-decoder and ViT. A point is named by its module path:

    blocks.{i}.hook_resid_pre      (B, T, C)  the block's input (the residual stream)
    blocks.{i}.attn.hook_pattern   (B, H, Tq, Tk) self-attention probabilities
    blocks.{i}.attn.hook_head_out  (B, H, T, Dh) each head's output, before the output projection
    blocks.{i}.hook_attn_out       (B, T, C)  the attention sublayer's output (after W_O)
    blocks.{i}.hook_resid_mid      (B, T, C)  the stream after attention's residual
    blocks.{i}.cross.hook_pattern, .cross.hook_head_out, hook_cross_out, hook_resid_cross
                                              the same for cross-attention (decoder blocks)
    blocks.{i}.hook_ff_out         (B, T, C)  the feed-forward (or mixture of experts) output
    blocks.{i}.ff.hook_router      (B*T, E)   a mixture of experts' router probabilities (routing
                                              follows a replaced one)
    blocks.{i}.hook_resid_post     (B, T, C)  the block's output

(the encoder-decoder's stacks are `encoder.` and `decoder.`; see Trace.names() for a model's own).
With no hook set a point is one attribute test: nothing a benchmark can see. A hook returns a
replacement tensor, or None to leave the activation as it is; setting one on `hook_pattern` makes
that attention take the path that writes its probabilities out, so that a replaced pattern is the
one applied to the values. Hooks fire only in the thread that set them: a server answering several
requests from one model can ablate a head for one request while another generates untouched.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Callable, Iterator

from torch import Tensor, nn

from attnlab.errors import ArgumentTypeError, ArgumentValueError, AttnlabError, kind

Hook = Callable[[Tensor], Tensor | None]


class Tap(nn.Module):
    """The identity, unless hooks are set: each may read the tensor or return a replacement."""

    def __init__(self, heads: int | None = None) -> None:
        super().__init__()
        self.fns: list[Hook] = []
        self.heads = heads  # a point of attention heads (B, H, ...): H, so zero_head(99) is refused at once

    def __call__(self, x: Tensor) -> Tensor:  # not Module.__call__: a point with no hook costs one test
        if not self.fns:
            return x
        for fn in self.fns:
            y = fn(x)
            x = x if y is None else y
        return x

    @property
    def active(self) -> bool:
        return bool(self.fns)


def taps(model: nn.Module) -> dict[str, Tap]:
    """Every point of the model, by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Tap)}


@contextlib.contextmanager
def hooks(model: nn.Module, fns: dict[str, Hook]) -> Iterator[nn.Module]:
    """Run the model with `fns` on the named points; they are removed on leaving, even on error.

    with hooks(model, {"blocks.1.attn.hook_head_out": zero_head(3)}):
        logits = model(ids)
    """
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(f"hooks: expected a torch model (run.model), got {kind(model)}")
    if not isinstance(fns, dict):
        raise ArgumentTypeError(f"hooks: expected a dict of point name -> function, got {kind(fns)}")
    if not fns:  # nothing to set: no walk over the model's modules (the decoding engine asks every step)
        yield model
        return
    points = taps(model)
    unknown = [name for name in fns if name not in points]
    if unknown:
        close = [n for n in points if n.rsplit(".", 1)[-1] == unknown[0].rsplit(".", 1)[-1]][:3]
        raise AttnlabError(
            f"no hook point {unknown[0]!r} in this model"
            + (f" (e.g. {', '.join(close)})" if close else "; see trace(...).names()")
        )
    for name, fn in fns.items():
        if not callable(fn):
            raise ArgumentTypeError(f"hooks: the hook of {name!r} must be a function of the tensor, got {kind(fn)}")
        if isinstance(fn, HeadMask):
            fn.check(name, points[name].heads)
    added = []
    try:
        for name, fn in fns.items():
            scoped = _this_thread(fn)
            points[name].fns.append(scoped)
            added.append((points[name], scoped))
        yield model
    finally:
        for point, fn in added:
            point.fns.remove(fn)


def _this_thread(fn: Hook) -> Hook:
    """fn, for forward passes run by the calling thread; other threads' pass through untouched."""
    owner = threading.get_ident()

    def scoped(x: Tensor) -> Tensor | None:
        return fn(x) if threading.get_ident() == owner else None

    scoped.owner, scoped.hook = owner, fn  # what thread_hooks hands to a thread that computes for this one
    return scoped


def thread_hooks(model: nn.Module) -> dict[str, Hook]:
    """The hooks the calling thread has set on the model, by point, each point's in the order they run:
    what a decoder that computes in another thread (decoding/engine.py) runs for this thread's requests."""
    me, out = threading.get_ident(), {}
    for name, tap in taps(model).items():
        mine = [fn.hook for fn in tap.fns if fn.owner == me]
        if mine:
            out[name] = mine[0] if len(mine) == 1 else _chain(mine)
    return out


def _chain(fns: list[Hook]) -> Hook:
    """Several hooks of one point as one, each given what the one before returned."""

    def run(x: Tensor) -> Tensor | None:
        for fn in fns:
            y = fn(x)
            x = x if y is None else y
        return x

    return run


class HeadMask:
    """A hook for `...attn.hook_head_out` (or `hook_pattern`) that zeroes these heads (0-based): head
    ablation. `heads`: what it removes, for messages. hooks() checks them against the point's heads."""

    def __init__(self, heads: list[int]):
        for h in heads:
            if not isinstance(h, numbers.Integral) or isinstance(h, bool):
                raise ArgumentTypeError(f"zero_head: a head is a whole number (0: the first head), got {kind(h)}")
            if h < 0:
                raise ArgumentValueError(f"zero_head: heads are numbered from 0 (the first head), got {h}")
        self.heads = [int(h) for h in heads]

    def check(self, point: str, n_heads: int | None) -> None:
        if n_heads is None:
            raise ArgumentValueError(f"zero_head: {point!r} has no heads; use an ...attn.hook_head_out point")
        if max(self.heads, default=0) >= n_heads:
            raise ArgumentValueError(
                f"zero_head({max(self.heads)}): {point} has {n_heads} heads, numbered 0 to {n_heads - 1}"
            )

    def __call__(self, x: Tensor) -> Tensor:
        self.check("this attention", x.shape[1])  # a hook set on a Tap directly, without hooks()
        x = x.clone()
        x[:, self.heads] = 0  # x (B, H, T, Dh)
        return x


def zero_heads(heads: list[int]) -> Hook:
    """A HeadMask: these heads' outputs zeroed (0-based)."""
    return HeadMask(list(heads))


def zero_head(head: int) -> Hook:
    """zero_heads([head])."""
    return zero_heads([head])
