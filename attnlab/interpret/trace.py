"""Run a model once and keep every named activation: `attnlab.trace`.

    t = attnlab.trace(run, "def add(a, b):")        # a run with a tokenizer reads text
    t.names()                                        # every point that fired, in order
    t["blocks.1.attn.hook_pattern"]                  # (1, H, T, T)
    t = attnlab.trace(model, src, tgt_in)            # any model and its own inputs
    with attnlab.hooks(run.model, {"blocks.1.attn.hook_head_out": zero_head(3)}):
        ...                                          # read or replace activations (nn/hooks.py)

The points live in the shared Block and attention (see nn/hooks.py for their names and shapes),
so every family has them: GPT, the encoder, the encoder-decoder (`encoder.`, `decoder.`), ViT.

As the last line of a notebook cell a trace shows its points and shapes, and the attention it
recorded as the head view and model view inline (`t.attention()`), labelled with the text's tokens
when it came from a run with a tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import ArgumentTypeError, AttnlabError, kind
from attnlab.interpret.views import token_labels
from attnlab.nn.hooks import Hook, hooks, taps
from attnlab.runs.run import Run
from attnlab.viz.cards import shapes_html, shapes_text
from attnlab.viz.html import AttentionView, Views, inline_attention_html

# Attention points: a stack's prefix ("blocks", "decoder.blocks") and kind ("attn", "cross") of layer 0.
_PATTERN = re.compile(r"^(.*)\.0\.(\w+)\.hook_pattern$")


@dataclass
class Trace:
    """What one forward pass produced: the model's output and each point's activation."""

    output: Any
    activations: dict[str, Tensor] = field(default_factory=dict)
    tokens: list[str] | None = None  # the input's tokens as text, when a run's tokenizer read it

    def names(self) -> list[str]:
        """The points that fired, in the order they did."""
        return list(self.activations)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.activations:
            raise AttnlabError(f"no activation {name!r} was recorded (see .names())")
        return self.activations[name]

    def __contains__(self, name: str) -> bool:
        return name in self.activations

    def patterns(self, stack: str = "blocks", kind: str = "attn") -> Tensor:
        """Every layer's attention probabilities of one stack, (B, L, H, Tq, Tk)."""
        found = []
        while f"{stack}.{len(found)}.{kind}.hook_pattern" in self.activations:
            found.append(self.activations[f"{stack}.{len(found)}.{kind}.hook_pattern"])
        if not found:
            raise AttnlabError(f"no attention patterns of {stack!r} were recorded (see .names())")
        return torch.stack(found, dim=1)

    def attention(self) -> Views:
        """Every attention pattern recorded, one view per stack and kind (batch row 0), labelled with
        the input's tokens where their count matches, else with positions."""
        out = Views()
        for name in self.activations:
            if m := _PATTERN.match(name):
                w = self.patterns(m[1], m[2])[0].float().cpu().numpy()  # (L, H, Tq, Tk)
                label = "self-attention" if m[2] == "attn" else f"{m[2]}-attention"
                title = f"{m[1]} {label}" if m[1] != "blocks" else label
                out.append(AttentionView(title, self._labels(w.shape[2]), self._labels(w.shape[3]), w))
        return out

    def _labels(self, n: int) -> list[str]:
        return self.tokens if self.tokens is not None and len(self.tokens) == n else [str(i) for i in range(n)]

    def _shapes(self) -> list[tuple[str, str]]:
        return [(n, " x ".join(map(str, a.shape))) for n, a in self.activations.items()]

    def _title(self) -> str:
        text = f" on {len(self.tokens)} tokens" if self.tokens is not None else ""
        return f"Trace of {len(self.activations)} points{text}"

    def __repr__(self) -> str:  # the dataclass's would print every tensor
        lines = [self._title() + ":", *shapes_text(self._shapes())]
        if any(_PATTERN.match(name) for name in self.activations):
            lines.append(".attention(): the attention patterns (a notebook shows them inline)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A notebook shows the points and shapes (folded), then the attention's head and model views."""
        views = self.attention()
        title = "".join(self.tokens) if self.tokens is not None else ""
        return shapes_html(self._title(), self._shapes()) + (inline_attention_html(views, title) if views else "")


def _model_and_inputs(target: Run | nn.Module, inputs: tuple) -> tuple[nn.Module, tuple, list[str] | None]:
    """A Run's model, with a text input encoded by its tokenizer (and its tokens' text); or a model
    and its inputs as given."""
    model = target.model if isinstance(target, Run) else target
    if not isinstance(model, nn.Module):
        raise AttnlabError("trace: give a run (attnlab.load) or a torch model")
    if len(inputs) == 1 and isinstance(inputs[0], str):
        if not isinstance(target, Run) or target.tokenizer is None:
            raise AttnlabError("trace: a text input needs a run with a tokenizer; give the model's tensors instead")
        device = next(model.parameters()).device
        ids = target.tokenizer.encode(inputs[0])
        return model, (torch.tensor([ids], device=device),), token_labels(target.tokenizer, ids)  # (1, T)
    for x in inputs:
        if not isinstance(x, Tensor):
            text = "a text, or " if isinstance(target, Run) and target.tokenizer is not None else ""
            raise ArgumentTypeError(
                f"trace: the input must be {text}the model's tensors (token ids (B, T)), got {kind(x)}"
            )
    return model, inputs, None


@torch.no_grad()
def trace(
    target: Run | nn.Module,
    *inputs: Any,
    extra_hooks: dict[str, Hook] | None = None,
    points: Iterable[str] | None = None,
    **kwargs: Any,
) -> Trace:
    """Run the model of `target` (a run or a module) on `inputs` once, in eval mode, recording every
    point's activation, or only those of `points` (after extra_hooks, if any, have read or replaced
    them). Only the points recorded are hooked: a hook on hook_pattern switches attention to its math
    path, whose last bits differ from the fused one's."""
    model, inputs, tokens = _model_and_inputs(target, inputs)
    found: dict[str, Tensor] = {}

    def recorder(name: str) -> Hook:
        def fn(x: Tensor) -> None:
            found[name] = x.detach().clone()

        return fn

    was_training = model.training
    model.eval()
    try:
        names = taps(model) if points is None else points
        with hooks(model, extra_hooks or {}), hooks(model, {name: recorder(name) for name in names}):
            output = model(*inputs, **kwargs)
    finally:
        model.train(was_training)
    return Trace(output, found, tokens)
