"""Where a speculative step's drafted tokens come from (speculate.py): the row's own text (prompt lookup)
or a small model with the same tokenizer (a draft model).

Legend: V vocabulary, k tokens drafted, C a model's context.

    PromptLookup  the tokens that followed the last time the row's newest n tokens (n = NGRAM down to
                  MIN_NGRAM) occurred in its window (prompt and output): free to make, right where an
                  answer copies from its input (a summary, an edit, code that repeats a name)
    use_draft     a served model's draft model (one per model, as its engine is one per model)
    DraftModel    k tokens the draft model decodes from the row's window on caches of its own, kept
                  between turns and cut back to the tokens the target kept; a sampled row's drafts are
                  drawn from the draft's distribution q, which the rejection rule needs (k, V)
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.draw import filter_logits
from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM

NGRAM = 3  # the longest suffix looked up
MIN_NGRAM = 2  # a single token matches nearly everywhere in open-ended text: its drafts mostly fail


_DRAFTS: weakref.WeakKeyDictionary[nn.Module, LMDecoder] = weakref.WeakKeyDictionary()
PROBE = "Speculative decoding: def f(x):\n    return x + 1  # 12,345 \u00e9t\u00e9"  # tokenizers that agree on it


def use_draft(
    model: nn.Module, draft: nn.Module, dtype: str = "auto", compiled: bool = False, tokenizers: tuple | None = None
) -> None:
    """Make `draft` the draft model of `model`'s rows that speculate (draft or auto): a language model
    with the same vocabulary; tokenizers (the model's, the draft's): checked to agree on a probe text."""
    if not isinstance(draft, CausalLM):
        raise AttnlabError(f"a draft model is a language model; this is a {type(draft).__name__}")
    if tokenizers is not None and tokenizers[0].encode(PROBE) != tokenizers[1].encode(PROBE):
        raise AttnlabError("the draft run's tokenizer is not the model's: a draft model needs the same tokenizer")
    if draft.cfg.vocab_size != model.cfg.vocab_size:
        raise AttnlabError(
            f"the draft model's vocabulary ({draft.cfg.vocab_size}) is not the model's ({model.cfg.vocab_size}): "
            "a draft model needs the same tokenizer"
        )
    _DRAFTS[model] = LMDecoder(draft, dtype, compiled)


def draft_of(model: nn.Module) -> LMDecoder | None:
    """The decoder of `model`'s draft model (use_draft), or None."""
    return _DRAFTS.get(model)


class PromptLookup:
    """Each n-gram of a row's window (n = 1..NGRAM) and where it last ended, filled as the window grows."""

    def __init__(self):
        self.window: list[int] | None = None  # the window indexed (a jump ahead makes a new one)
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self.done = 0  # n-grams ending at positions up to here are in `ends`

    def propose(self, window: list[int], most: int) -> list[int]:
        """Up to `most` tokens that followed the latest earlier occurrence of the window's longest
        suffix found (NGRAM tokens down to MIN_NGRAM); [] when none occurs."""
        if window is not self.window:
            self.window, self.ends, self.done = window, {}, 0
        last = len(window) - 1  # n-grams ending before the newest position: the suffix itself is not one
        for end in range(self.done + 1, last + 1):
            for n in range(1, min(NGRAM, end) + 1):
                self.ends[tuple(window[end - n : end])] = end
        self.done = max(self.done, last)
        for n in range(min(NGRAM, len(window)), MIN_NGRAM - 1, -1):
            end = self.ends.get(tuple(window[-n:]))
            if end is not None:
                return overlapped(window, end, most)
        return []


def overlapped(window: list[int], start: int, most: int) -> list[int]:
    """`most` tokens copied from window[start:] on, a copy that runs past the window's end reading its
    own tokens (as LZ77 copies): a repeating stretch (indentation, a row of dashes) continues repeating."""
    out = window[start : start + most]
    while len(out) < most:
        out += out[: most - len(out)]  # the copy reads itself: period len(window) - start
    return out


class DraftModel:
    """A draft model's caches for one row: the tokens in them, and where in the row's window they start."""

    def __init__(self, decoder):
        self.decoder = decoder  # adapters.LMDecoder of the draft model
        self.state: list | None = None
        self.fed: list[int] = []  # the tokens in the caches, from window[start]
        self.window: list[int] | None = None
        self.start = 0

    def propose(self, window: list[int], k: int, draw, generator: torch.Generator) -> tuple[list[int], Tensor | None]:
        """k drafted tokens after the window, and (sampled rows) the draft's distributions they were
        drawn from (k, V); greedy rows draft the draft model's argmax."""
        view = self._view(window, k)
        logits = self._catch_up(view)
        tokens, qs = [], []
        for i in range(k):
            z = logits.float()  # (1, V)
            if draw.temperature <= 0:
                token = int(z.argmax(-1))
            else:
                q = torch.softmax(filter_logits(z / draw.temperature, draw.top_k, draw.top_p), -1)
                token = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q[0])
            tokens.append(token)
            if i < k - 1:  # the last draft is never fed: its logits are not needed
                logits, _ = self.decoder.feed(self.state, [token], len(self.fed))
                self.fed.append(token)
        return tokens, torch.stack(qs) if qs else None

    def _view(self, window: list[int], k: int) -> list[int]:
        """The part of the window the draft model reads: from `start`, which jumps ahead (the last half
        of its context) when the window and k drafts would not fit, or when the row's own window jumped."""
        context = self.decoder.context
        if window is not self.window or len(window) - self.start + k > context:
            self.window, self.state, self.fed = window, None, []
            self.start = max(0, len(window) - max(1, context // 2)) if len(window) + k > context else 0
        return window[self.start :]

    def _catch_up(self, view: list[int]) -> Tensor:
        """The draft's logits after the view (1, V): its caches cut back to what they share with the
        view (at least one token is fed again, for the logits), then the rest fed in one pass (a few
        tokens, the target's kept drafts: the draft's compiled verify pass where it has one)."""
        if self.state is None:
            self.state, self.fed = self.decoder.start(None), []
        kept = min(len(self.fed), len(view) - 1)
        while kept > 0 and self.fed[:kept] != view[:kept]:
            kept -= 1
        if kept:
            self.decoder.rollback(self.state, kept, view[kept - 1])
        else:
            self.state = self.decoder.start(None)
        rest = view[kept:]
        if len(rest) > 1:
            logits = self.decoder.verify(self.state, rest, kept)[-1:]
        else:
            logits, _ = self.decoder.feed(self.state, rest, kept)
        self.fed = list(view)
        return logits
