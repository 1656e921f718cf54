"""Answers to conversations: a chat template's prompt, decoded by the one engine until the template's
end-of-turn marker (ChatML's "<|im_end|>", Llama 3's "<|eot_id|>").

    answers(model, tok, template, [[Message("user", "What is 2 + 3?")]])   -> ["5"]

Many conversations are decoded together (the engine batches their rows), each cut at its own end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation, Message
from attnlab.data.tokenizers import Tokenizer
from attnlab.data.verifiable import graded, question_of
from attnlab.decoding.sampling import read_together, seed_of, stream_text
from attnlab.models.protocols import CausalLM
from attnlab.progress import tqdm


def stream_answer(
    model: CausalLM, tok: Tokenizer, template: ChatTemplate, messages: Sequence[Message], **kw: Any
) -> Iterator[str]:
    """The assistant's next turn, piece by piece (keyword arguments as in stream_text, but stop: the
    template's end of turn, or the tokenizer's end of text)."""
    kw.setdefault("max_new_tokens", 256)
    return stream_text(model, tok, template.prompt(messages), stop=template.end_of_turn(), stop_token=tok.eot_id, **kw)


def answers(
    model: CausalLM,
    tok: Tokenizer,
    template: ChatTemplate,
    conversations: Sequence[Sequence[Message]],
    seed: int | None = None,
    progress: str | None = None,
    **kw: Any,
) -> list[str]:
    """The next assistant turn of each conversation, decoded together; conversation i samples with
    seed + i (greedy with temperature=0). progress: a bar of that name counts the finished answers
    (200 answers of a small model took minutes on a busy 2-core CPU)."""
    base = seed_of(seed)
    streams = [stream_answer(model, tok, template, m, seed=base + i, **kw) for i, m in enumerate(conversations)]
    with tqdm(total=len(streams), desc=progress, unit=" answers", disable=progress is None, leave=False) as bar:
        texts = read_together([_counted(s, bar) for s in streams])
    return [t.strip() for t in texts]


ANSWER_ROOM = 16  # tokens an answer may write past the longest expected one (its end of turn, slack)


def answer_room(tok: Tokenizer, expected: Sequence[str]) -> int:
    """max_new_tokens for answers checked against `expected`: the longest of them, ANSWER_ROOM more."""
    return max(len(tok.encode(e)) for e in expected) + ANSWER_ROOM


def greedy_answers(
    model: CausalLM,
    tok: Tokenizer,
    template: ChatTemplate,
    conversations: Sequence[Conversation],
    progress: str | None = None,
) -> list[str]:
    """The model's greedy answer to each conversation (all but its last message, the expected answer,
    which sets the room it has)."""
    if not conversations:
        return []
    room = answer_room(tok, [c.messages[-1].content.strip() for c in conversations])
    asked = [c.messages[:-1] for c in conversations]
    return answers(model, tok, template, asked, temperature=0.0, max_new_tokens=room, seed=0, progress=progress)


def right_answers(
    model: CausalLM,
    tok: Tokenizer,
    template: ChatTemplate,
    conversations: Sequence[Conversation],
    progress: str | None = None,
) -> list[bool]:
    """Whether the model's greedy answer to each conversation (all but its last message) is right: that
    last message's text exactly, or for a verifiable question any answer its checker accepts
    (data/verifiable.graded): how every held-out chat figure is scored."""
    got = greedy_answers(model, tok, template, conversations, progress)
    return [
        graded(question_of(c.messages[:-1]), g, c.messages[-1].content.strip())
        for c, g in zip(conversations, got, strict=True)
    ]


def _counted(stream: Iterator[str], bar: tqdm) -> Iterator[str]:
    """The stream's pieces; the bar moves on when it ends."""
    yield from stream
    bar.update(1)
