"""Instruction and preference data in the formats people already have, read from JSON or JSONL and
told apart by their fields, into one shape: a conversation of messages, or a preference pair.

    {"text": "..."}                                            plain text (every token trained)
    {"prompt": "...", "completion": "..."}                     one user turn, one assistant turn
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}    multi-turn
    {"instruction": "...", "input": "...", "output": "..."}    Alpaca ("input" may be empty or absent)
    {"prompt": ..., "chosen": ..., "rejected": ...}            a preference pair; each a text or messages

A row that fits none of them, or whose field has the wrong type, is one line naming the file, the row
(1-based, as an editor counts lines of a JSONL file) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    role: str  # system, user or assistant
    content: str


@dataclass(frozen=True)
class Conversation:
    """Messages in order; `plain` for a {"text"} row (no roles: every token is trained)."""

    messages: tuple[Message, ...]
    plain: bool = False


@dataclass(frozen=True)
class Preference:
    """One prompt (the turns before the answer) and two answers to it, the chosen one better."""

    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]


class RowError(AttnlabError):
    """A row that cannot be read: the message names the file, row and field."""


def rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(row number, parsed row) of a JSON file holding a list, or of a JSONL file, one object a line."""
    p = Path(path)
    if not p.is_file():
        raise AttnlabError(f"{p}: no such file")
    text = p.read_text(encoding="utf-8")
    start = text.lstrip()[:1]
    if start == "[":  # one JSON document: a list of rows
        try:
            data = json.loads(text)
        except ValueError as e:
            raise AttnlabError(f"{p}: not valid JSON ({e})") from None
        yield from enumerate(data, 1)
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except ValueError as e:
                raise RowError(f"{p}: row {n} is not valid JSON ({e.msg})") from None


def kind_of(row: Any) -> str:
    """Which format a row is in, by its fields: text, completion, messages, alpaca or preference."""
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with fields, got {type(row).__name__}")
    keys = set(row)
    if {"chosen", "rejected"} <= keys:
        return "preference"
    if "messages" in keys:
        return "messages"
    if {"instruction", "output"} <= keys:
        return "alpaca"
    if {"prompt", "completion"} <= keys:
        return "completion"
    if "text" in keys:
        return "text"
    raise ValueError(f"fields {sorted(keys)} fit no format: give text, prompt+completion, messages, "
                     "instruction+output (Alpaca) or prompt+chosen+rejected")  # fmt: skip


def _text(row: dict, field: str, optional: bool = False) -> str:
    value = row.get(field, "" if optional else None)
    if not isinstance(value, str):
        raise ValueError(f"field {field!r} must be a text, got {type(value).__name__}")
    return value


def _messages(value: Any, field: str) -> tuple[Message, ...]:
    if isinstance(value, str):
        return (Message("user" if field == "prompt" else "assistant", value),)
    if not isinstance(value, list) or not value:
        raise ValueError(f"field {field!r} must be a text or a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"field {field!r}, message {i + 1}: needs a role ({', '.join(ROLES)}) and a text content")
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


def conversation(row: Any) -> Conversation:
    """A text, completion, messages or Alpaca row as a conversation."""
    kind = kind_of(row)
    if kind == "text":
        return Conversation((Message("assistant", _text(row, "text")),), plain=True)
    if kind == "completion":
        return Conversation((Message("user", _text(row, "prompt")), Message("assistant", _text(row, "completion"))))
    if kind == "alpaca":
        extra = _text(row, "input", optional=True)
        ask = _text(row, "instruction") + (f"\n\n{extra}" if extra else "")
        return Conversation((Message("user", ask), Message("assistant", _text(row, "output"))))
    if kind == "messages":
        messages = _messages(row["messages"], "messages")
        if not any(m.role == "assistant" for m in messages):
            raise ValueError("field 'messages' has no assistant turn to learn from")
        return Conversation(messages)
    raise ValueError("a preference pair (chosen/rejected) is DPO data: train it with attnlab train dpo")


def preference(row: Any) -> Preference:
    """A {"prompt", "chosen", "rejected"} row; prompt and answers each a text or a list of messages."""
    if kind_of(row) != "preference":
        raise ValueError("needs the fields prompt, chosen and rejected")
    prompt = _messages(row["prompt"], "prompt") if "prompt" in row else ()
    return Preference(prompt, _messages(row["chosen"], "chosen"), _messages(row["rejected"], "rejected"))


def read_conversations(path: str | Path) -> list[Conversation]:
    return _read(path, conversation)


def read_preferences(path: str | Path) -> list[Preference]:
    return _read(path, preference)


def _read(path: str | Path, parse) -> list:
    out = []
    for n, row in rows(path):
        try:
            out.append(parse(row))
        except ValueError as e:
            raise RowError(f"{path}: row {n}: {e}") from None
    if not out:
        raise AttnlabError(f"{path}: no rows")
    return out
