"""One sequence being decoded by the engine (engine.py), and each token it hands over.

Legend: V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.decoding.draw import Draw, seed_of


@dataclass
class Step:
    """A drawn token; with logprobs asked, its log-probability under the model (before temperature
    and filtering) and the `top` most likely tokens' [(id, log-probability)]; with attention asked,
    where the query that produced it looked (the decoder's rows: adapters.py)."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    attention: Any = None


Emit = Callable[[Step | Exception | None], None]


@dataclass
class Ask:
    """What a request asks of the engine besides its tokens (Engine.submit): `logprobs` top
    alternatives with each Step; a failure after `seconds`; on_exit() once when it leaves, however it
    ends; wake() once after each turn in which it emitted (rows sharing a wake: once for all of them),
    so that a reader can collect a turn's steps in one go; `attention`: each Step says where its query
    looked; `source`: an encoder-decoder's input (1, ...); `tag`: who asked, for statistics;
    `matcher`: a structured output's constraint (structured.Matcher, one per row): every draw is
    masked by it, and the row ends when its value closes; `speculate`: draft tokens and verify them in
    one pass when the row is decoded alone (speculate.Speculate)."""

    logprobs: int | None = None
    seconds: float | None = None
    on_exit: Callable[[], None] | None = None
    wake: Callable[[], None] | None = None
    attention: bool = False
    source: Tensor | None = None
    tag: str = ""
    matcher: Any = None
    speculate: Any = None


class Row:
    """One sequence: its window of tokens (as stream_rows keeps it), how it draws, what it asked for
    besides tokens (its Ask, kept whole), and where its keys/values are (a slot, or a state of its own)."""

    def __init__(self, ids: list[int], draw: Draw, max_tokens: int, emit: Emit, device, ask: Ask | None = None):
        self.ask = ask or Ask()
        # time.monotonic() past which the row fails (TimeoutError)
        self.deadline = None if self.ask.seconds is None else time.monotonic() + self.ask.seconds
        self.window = list(ids)
        self.base = len(ids)  # tokens run at once at the last (re)fill: a replay starts there
        self.draw, self.left, self.emit = draw, max_tokens, emit
        self.generator = torch.Generator(device=device).manual_seed(seed_of(draw.seed))
        self.exact: Tensor | None = None  # (1, V) the next token's logits, computed as alone
        self.sure: int | None = None  # the token drawn from them already (a batched prefill's sure draw)
        self.approx = False  # its own caches hold reused keys (prefix_cache.py): decoded in a slot, draws checked
        self.twins: list[Row] = []  # rows with the same prompt, admitted with it: they take copies of its caches
        self.seen: Any = None  # with them, where the query looked (attention rows, when asked)
        self.state: Any = None  # its own caches (or encoded source), while it is not in a slot
        self.slot: int | None = None
        self.replays = 0
        self.solo = False  # decoded alone to the end
        self.cancelled = False
        self.exited = False  # ask.on_exit has run
        self.hooks: dict = {}  # hooks its caller set on the model, run on its forward passes (alone)
        # speculate.Drafting: the row's drafts and how well they do, when it asked for them
        self.spec: Any = None if self.ask.speculate is None else self.ask.speculate.start()

    @property
    def matcher(self) -> Any:
        """structured.Matcher: masks each draw; the row ends when its value closes (ask.matcher)."""
        return self.ask.matcher

    def cancel(self) -> None:
        """The reader is gone (or has what it needs): the engine drops the row at its next step."""
        self.cancelled = True

    def tell(self, end: Exception | None) -> None:
        """The row's end (None, or what stopped it) to its reader, then its wake-up."""
        quietly(lambda: self.emit(end))
        if self.ask.wake is not None:
            quietly(self.ask.wake)

    def exit(self) -> None:
        """ask.on_exit, once, however the row leaves."""
        if self.ask.on_exit is not None and not self.exited:
            self.exited = True
            self.ask.on_exit()

    def overdue(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline and not self.cancelled


def quietly(call: Callable[[], None]) -> None:
    """Call a reader's callback; a reader whose event loop has closed has nobody to tell."""
    try:
        call()
    except Exception:
        pass


def step_of(token: int, logits: Tensor, logprobs: int | None, seen: Any = None) -> Step:
    """The Step of a token drawn from (1, V) logits, with log-probabilities when asked."""
    if logprobs is None:
        return Step(token, attention=seen)
    lp = torch.log_softmax(logits[0].float(), dim=-1)  # (V,) the model's own distribution
    top = lp.topk(min(logprobs, lp.shape[-1])) if logprobs else None
    alternatives = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))
    return Step(token, float(lp[token]), alternatives, seen)
