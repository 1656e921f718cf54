"""A conversation as supervised fine-tuning reads it: token ids and, for each, whether the loss counts
it. By default only the assistant's turns are trained (`train_on="assistant"`; "all": every token,
as plain pretraining would), and a {"text"} row trains every token whatever the setting.

The text is cut at the assistant spans the template gives (data/chat.py) and each piece encoded on its
own, so a token never straddles a boundary between what is trained and what is not. For a character
tokenizer this is the whole text's encoding; for BPE a merge across a boundary is given up, as when a
prompt and its answer are tokenized apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnlab.data.batches import LengthGroups, draw_rows, rank_slice
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation, Message, Preference
from attnlab.data.tokenizers import Tokenizer

TRAIN_ON = ("assistant", "all")  # "last" (the final answer alone) is what preference pairs train
# No tokenizer attnlab trains or converts averages more than a few characters per token on real text
# (GPT-2's BPE about 4, a character tokenizer 1): a row with 32 per token of the context cannot fit.
# (A word tokenizer reads an unknown word of any length as one token: it alone could beat this.)
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class Example:
    ids: np.ndarray  # (T,) int64 token ids
    trained: np.ndarray  # (T,) bool: the loss counts the prediction of this token


def pieces(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    """The text cut at the spans' edges: (piece, inside a span), in order, empty pieces left out."""
    out, at = [], 0
    for start, end in spans:
        out += [(text[at:start], False), (text[start:end], True)]
        at = end
    out.append((text[at:], False))
    return [(p, inside) for p, inside in out if p]


def encode(conv: Conversation, template: ChatTemplate, tok: Tokenizer, train_on: str = "assistant") -> Example:
    """The conversation's ids and which of them are trained."""
    if train_on not in (*TRAIN_ON, "last"):
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
    if conv.plain:  # a {"text"} row: the text itself, every token trained
        text, spans = conv.messages[0].content, [(0, len(conv.messages[0].content))]
    else:
        text, spans = template.assistant_spans(conv.messages)
        spans = spans[-1:] if train_on == "last" else spans
    cut = pieces(text, spans)
    # numpy arrays, not lists: a list of ints costs 8 bytes a token more, and as much again to convert
    ids = [tok.encode_array(piece) for piece, _ in cut]
    trained = [
        (np.ones if inside or train_on == "all" else np.zeros)(len(a), dtype=bool)
        for a, (_, inside) in zip(ids, cut, strict=True)
    ]
    if len(cut) == 1:  # a {"text"} row: one piece, nothing to join
        return Example(ids[0].astype(np.int64, copy=False), trained[0])
    empty = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)  # (int64 first: the ids come out int64)
    return Example(np.concatenate([empty[0], *ids]), np.concatenate([empty[1], *trained]))


def surely_longer(row: Conversation | Preference, tokens: int) -> bool:
    """Whether the row's messages alone hold more than MAX_CHARS_PER_TOKEN characters per token of
    `tokens`, so it cannot fit (and is left out without being rendered or tokenized: a 100 MB row
    would cost gigabytes to tokenize, only to be left out)."""
    if isinstance(row, Preference):
        answer = max(_chars(row.chosen), _chars(row.rejected))
        return _chars(row.prompt) + answer > tokens * MAX_CHARS_PER_TOKEN
    return _chars(row.messages) > tokens * MAX_CHARS_PER_TOKEN


def _chars(messages: tuple[Message, ...]) -> int:
    return sum(len(m.content) for m in messages)


def show(example: Example, tok: Tokenizer, mark: tuple[str, str] = ("\x1b[1;32m", "\x1b[0m")) -> str:
    """The example's text with the trained tokens between the two marks (green on a terminal;
    `--show-masks` prints one example this way, so a user sees what the loss reads)."""
    out, inside = [], False
    for token, trained in zip(example.ids.tolist(), example.trained.tolist(), strict=True):
        if trained != inside:
            out.append(mark[0] if trained else mark[1])
            inside = trained
        out.append(tok.decode([token]))
    return "".join(out) + (mark[1] if inside else "")


def pair_examples(pair: Preference, template: ChatTemplate, tok: Tokenizer) -> tuple[Example, Example]:
    """A preference pair as two examples, prompt + chosen and prompt + rejected, each training only its
    final answer (an earlier assistant turn of the prompt is context, the same in both)."""
    return tuple(
        encode(Conversation((*pair.prompt, *answer)), template, tok, "last") for answer in (pair.chosen, pair.rejected)
    )


def shifted(examples: list[Example], pad: int = 0) -> tuple[Tensor, Tensor]:
    """Inputs (B, T - 1) and targets (B, T - 1) of examples padded to the longest: the target of
    position t is token t + 1, -1 where it is not trained or is padding (GPT's ignored label)."""
    t = max(len(e.ids) for e in examples)
    x = torch.full((len(examples), t - 1), pad, dtype=torch.long)
    y = torch.full((len(examples), t - 1), -1, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.ids)
        x[i, : n - 1] = torch.from_numpy(e.ids[:-1])
        y[i, : n - 1] = torch.from_numpy(np.where(e.trained[1:], e.ids[1:], -1))
    return x, y


def padded(examples: list[Example], pad: int = 0) -> tuple[Tensor, Tensor]:
    """Whole rows padded to the longest (B, T), and each row's last position (B,)."""
    t = max(len(e.ids) for e in examples)
    x = torch.full((len(examples), t), pad, dtype=torch.long)
    for i, e in enumerate(examples):
        x[i, : len(e.ids)] = torch.from_numpy(e.ids)
    return x, torch.tensor([len(e.ids) - 1 for e in examples])


def trained_mask(examples: list[Example]) -> Tensor:
    """Each row's trained tokens (a pair's: its answer), padded with False to the longest: (B, T)."""
    t = max(len(e.ids) for e in examples)
    return torch.stack([torch.from_numpy(np.pad(e.trained, (0, t - len(e.ids)))) for e in examples])


class Supervised:
    """Supervised fine-tuning: conversations padded per batch, loss on their trained tokens."""

    def __init__(self, examples: dict[str, list[Example]], batch: int = 0):
        self.examples = examples
        self.per_example = (round(float(np.mean([len(e.ids) for e in examples["train"]]))), "tokens")
        # Training batches of like length (batch: the global batch size; 0 draws uniformly).
        self.groups = LengthGroups([len(e.ids) for e in examples["train"]], batch) if batch else None

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, Tensor]:
        groups = self.groups if split == "train" else None  # held-out loss: drawn as the data is
        rows = rank_slice(draw_rows(len(self.examples[split]), n, rng, groups), part)
        return shifted([self.examples[split][i] for i in rows])

    def has(self, split: str) -> bool:
        return bool(self.examples.get(split))

    def describe(self) -> str:
        return f"{len(self.examples['train']):,} training conversations"


class Pairs:
    """Preference pairs: the chosen answers' rows then the rejected ones', padded alike, with (for DPO)
    each answer's log-probability under the reference model, or (a reward model) each row's last token."""

    def __init__(
        self, pairs: dict[str, list[tuple[Example, Example]]], refs: dict[str, np.ndarray] | None = None, batch: int = 0
    ):
        self.pairs, self.refs = pairs, refs  # refs[split]: (N, 2) float, chosen and rejected
        lengths = [max(len(c.ids), len(r.ids)) for c, r in pairs["train"]]
        self.per_example = (round(float(np.mean([len(c.ids) + len(r.ids) for c, r in pairs["train"]]))), "tokens")
        self.groups = LengthGroups(lengths, batch) if batch else None  # as in Supervised

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, ...]:
        groups = self.groups if split == "train" else None
        rows = rank_slice(draw_rows(len(self.pairs[split]), n, rng, groups), part)
        chosen, rejected = zip(*[self.pairs[split][i] for i in rows], strict=True)
        if self.refs is None:  # a reward model reads whole rows: each one's last token and its answer's
            return (*padded([*chosen, *rejected]), trained_mask([*chosen, *rejected]))
        x, y = shifted([*chosen, *rejected])  # (2B, T - 1)
        ref = torch.from_numpy(self.refs[split][rows].T.reshape(-1).astype(np.float32))  # (2B,) chosen, rejected
        return x, y, ref

    def has(self, split: str) -> bool:
        return bool(self.pairs.get(split))

    def describe(self) -> str:
        return f"{len(self.pairs['train']):,} preference pairs"
