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

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.tokenizers import Tokenizer

TRAIN_ON = ("assistant", "all")


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
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
    if conv.plain:  # a {"text"} row: the text itself, every token trained
        text, spans = conv.messages[0].content, [(0, len(conv.messages[0].content))]
    else:
        text, spans = template.assistant_spans(conv.messages)
    ids, trained = [], []
    for piece, inside in pieces(text, spans):
        piece_ids = tok.encode(piece)
        ids += piece_ids
        trained += [inside or train_on == "all"] * len(piece_ids)
    return Example(np.asarray(ids, dtype=np.int64), np.asarray(trained, dtype=bool))


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
