"""Instruction and preference data in the formats people already have, read from JSON or JSONL and
told apart by their fields, into one shape: a conversation of messages, or a preference pair.

    {"text": "..."}                                            plain text (every token trained)
    {"prompt": "...", "completion": "..."}                     one user turn, one assistant turn
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}    multi-turn
    {"instruction": "...", "input": "...", "output": "..."}    Alpaca ("input" may be empty or absent)
    {"prompt": ..., "chosen": ..., "rejected": ...}            a preference pair; each a text or messages

A file is UTF-8 (a byte-order mark at its start is allowed); a JSONL file's rows end at "\\n" only
(a U+2028 inside a text is part of it). Anything else is one line naming the file, the row (1-based,
as an editor counts lines of a JSONL file) and what is wrong with it: bytes that are not UTF-8, JSON
that does not parse or nests too deeply, a row that fits no format, a field of the wrong type, an
empty conversation or one with no assistant turn, a pair whose answer does not end with the
assistant's turn. What is usable but suspicious is one warning line, counted over the file: pairs
whose chosen answer is the rejected one are left out (they teach nothing; all of them: an error),
conversations that open with the assistant are trained as given.
"""

from __future__ import annotations

import gc
import json
import warnings
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from attnlab.errors import AttnlabError, one_line

ROLES = ("system", "user", "assistant")
BOM = b"\xef\xbb\xbf"
# A row parses into a Python object per JSON object or list: ~60 bytes each for as little as 2 bytes
# of text ("[]"), so a line of nothing but brackets would grow 30x in memory. No fine-tuning row
# needs a million (a conversation of a million turns fits no model's context).
MAX_CONTAINERS = 1_000_000
T = TypeVar("T")
_decode = json.JSONDecoder().decode  # json.loads less its per-call checks: a million rows, a million calls


@dataclass(frozen=True, slots=True)  # slots: a million rows are a million of these
class Message:
    role: str  # system, user or assistant
    content: str


@dataclass(frozen=True, slots=True)
class Conversation:
    """Messages in order; `plain` for a {"text"} row (no roles: every token is trained)."""

    messages: tuple[Message, ...]
    plain: bool = False


@dataclass(frozen=True, slots=True)
class Preference:
    """One prompt (the turns before the answer) and two answers to it, the chosen one better."""

    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]


class RowError(AttnlabError):
    """A row that cannot be read: the message names the file, row and field."""


# ---- the file: rows of JSON ------------------------------------------------------------------------


def rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(row number, parsed row) of a JSON file holding a list, or of a JSONL file, one value a line."""
    p = Path(path)
    if not p.is_file():
        raise AttnlabError(f"{p}: no such file" if not p.exists() else f"{p}: not a file: give a JSON or JSONL file")
    with p.open("rb") as f:
        if _first_byte(f) == b"[":  # one JSON document: a list of rows
            yield from enumerate(_document(p, f), 1)
            return
        for n, raw in enumerate(f, 1):  # a binary file's lines end at b"\n" and nowhere else
            line = _decoded(p, raw, n)
            del raw  # a long line: its text and its row, not its bytes too
            if line and not line.isspace():  # (strip() would copy the line)
                yield n, _parsed(p, line, f"row {n}")


def _first_byte(f: IO[bytes]) -> bytes:
    """The file's first byte past a byte-order mark and whitespace (b"" if none); rewinds the file."""
    head = f.read(65536).removeprefix(BOM).lstrip()
    while not head and (more := f.read(65536)):
        head = more.lstrip()
    f.seek(0)
    return head[:1]


def _document(p: Path, f: IO[bytes]) -> list:
    data = f.read()
    try:
        text = data.decode("utf-8-sig")  # strict; a byte-order mark at the start is dropped
    except UnicodeDecodeError as e:
        at = e.start + len(BOM) * data.startswith(BOM)
        line = data.count(b"\n", 0, at) + 1
        raise AttnlabError(f"{p}: line {line} is not UTF-8 (byte 0x{data[at]:02x}): save the file as UTF-8") from None
    del data  # the text alone from here: the bytes, the text and the rows never all at once
    rows = _parsed(p, text, "the file")
    if not isinstance(rows, list):  # e.g. "[1] [2]" parses as nothing; this is a guard for the future
        raise AttnlabError(f"{p}: not a JSON list of rows")
    return rows


def _decoded(p: Path, raw: bytes, n: int) -> str:
    try:
        return raw.decode("utf-8-sig" if n == 1 else "utf-8")  # strict: bad bytes are an error
    except UnicodeDecodeError as e:
        at = e.start + len(BOM) * (n == 1 and raw.startswith(BOM))
        raise RowError(
            f"{p}: row {n} is not UTF-8 (byte 0x{raw[at]:02x} at byte {at + 1} of the line): save the file as UTF-8"
        ) from None


def _parsed(p: Path, text: str, where: str) -> Any:
    """JSON `text`, or one line saying why not (`where`: "row N" or "the file")."""
    if where != "the file" and len(text) > MAX_CONTAINERS and text.count("{") + text.count("[") > MAX_CONTAINERS:
        raise RowError(
            f"{p}: {where} holds over {MAX_CONTAINERS:,} objects and lists: no fine-tuning row needs that many"
        )
    if text.startswith("\ufeff"):  # (json.loads says so too; the decoder it wraps, only "Expecting value")
        raise RowError(f"{p}: {where} is not valid JSON (it starts with a byte-order mark: only the file may)")
    try:
        return _decode(text)
    except RecursionError:  # Python's JSON reader recurses once per level: ~1000 levels end the stack
        raise RowError(
            f"{p}: {where} nests JSON too deeply for Python's reader (about 1,000 levels): a fine-tuning row needs 4"
        ) from None
    except json.JSONDecodeError as e:
        at = f"line {e.lineno} column {e.colno}" if where == "the file" else f"column {e.colno}"
        raise RowError(f"{p}: {where} is not valid JSON ({e.msg} at {at})") from None
    except ValueError as e:  # e.g. an integer of over 4,300 digits
        raise RowError(f"{p}: {where} is not valid JSON ({one_line(e)})") from None


# ---- a row: which format, its fields ---------------------------------------------------------------


def kind_of(row: Any) -> str:
    """Which format a row is in, by its fields: text, completion, messages, alpaca or preference."""
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with fields, got {_name(row)}")
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
    shown = [k[:30] for k in sorted(keys)[:8]]  # keys are the file's: a few, short, escaped by repr
    raise ValueError(
        f"fields {shown} fit no format: give text, prompt+completion, messages, "
        "instruction+output (Alpaca) or prompt+chosen+rejected"
    )


def _name(value: Any) -> str:
    """A value's type for a message (Python's name: str, int, list, dict), null for None."""
    return "null" if value is None else type(value).__name__


def _text(row: dict, field: str, optional: bool = False) -> str:
    value = row.get(field, "" if optional else None)
    if not isinstance(value, str):
        raise ValueError(f"field {field!r} must be a text, got {_name(value)}")
    return value


def _messages(value: Any, field: str, text_is: str | None = None) -> tuple[Message, ...]:
    """A list of {role, content} messages; a text is one message of role `text_is`, where allowed."""
    if isinstance(value, str) and text_is is not None:
        return (Message(text_is, value),)
    if not isinstance(value, list) or not value:
        what = "a text or a non-empty list" if text_is else "a non-empty list"
        raise ValueError(
            f"field {field!r} must be {what} of messages, got {'an empty list' if value == [] else _name(value)}"
        )
    return tuple(_message(m, field, i) for i, m in enumerate(value, 1))


def _message(m: Any, field: str, i: int) -> Message:
    where = f"field {field!r}, message {i}"
    if not isinstance(m, dict):
        raise ValueError(f"{where}: must be an object with a role and a content, got {_name(m)}")
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str) or role not in ROLES:
        got = repr(role[:20]) if isinstance(role, str) else _name(role)
        raise ValueError(f"{where}: needs a role ({', '.join(ROLES)}), got {got}")
    if not isinstance(content, str):
        raise ValueError(f"{where}: needs a role ({', '.join(ROLES)}) and a text content, got {_name(content)}")
    return Message(role, content)


def conversation(row: Any) -> Conversation:
    """A text, completion, messages or Alpaca row as a conversation."""
    kind = kind_of(row)
    if kind == "text":
        if not _text(row, "text"):
            raise ValueError("field 'text' is empty: nothing to train")
        return Conversation((Message("assistant", row["text"]),), plain=True)
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
    """A {"prompt", "chosen", "rejected"} row; prompt and answers each a text or a list of messages,
    an answer ending with the assistant's turn (the one its loss reads)."""
    if kind_of(row) != "preference":
        raise ValueError("needs the fields prompt, chosen and rejected")
    prompt = _messages(row["prompt"], "prompt", "user") if "prompt" in row else ()
    answers = [_messages(row[field], field, "assistant") for field in ("chosen", "rejected")]
    for field, answer in zip(("chosen", "rejected"), answers, strict=True):
        if answer[-1].role != "assistant":
            last = answer[-1].role
            raise ValueError(f"field {field!r} must end with the assistant's turn (the answer), not the {last}'s")
    return Preference(prompt, *answers)


def opens_with_assistant(c: Conversation) -> bool:
    """Its first turn past the system's is the assistant's: an answer to no question."""
    if c.plain:
        return False
    return next((m.role for m in c.messages if m.role != "system"), None) == "assistant"


# ---- a file's rows, checked ------------------------------------------------------------------------------


def read_conversations(path: str | Path) -> list[Conversation]:
    """The file's conversations; those that open with the assistant's turn (an answer to no question,
    as a bot that greets first) are trained as given, and counted in one warning."""
    convs, numbers = _read(path, conversation)
    first = [n for n, c in zip(numbers, convs, strict=True) if opens_with_assistant(c)]
    if first:
        warnings.warn(
            f"{path}: {len(first)} of {len(convs)} conversations open with the assistant's turn (first: "
            f"row {first[0]}), an answer to no question; trained as given",
            stacklevel=2,
        )
    return convs


def read_preferences(path: str | Path) -> list[Preference]:
    """The file's pairs; a pair whose chosen answer is its rejected one is left out (its DPO and reward
    losses are constant, ln 2: it teaches nothing), and said so; all of them is an error."""
    pairs, numbers = _read(path, preference)
    same = [n for n, p in zip(numbers, pairs, strict=True) if p.chosen == p.rejected]
    if len(same) == len(pairs):
        raise AttnlabError(
            f"{path}: in every pair the chosen answer is the rejected one: they teach nothing; give "
            "pairs whose answers differ"
        )
    if same:
        warnings.warn(
            f"{path}: left out {len(same)} of {len(pairs)} pairs whose chosen answer is the rejected one "
            f"(first: row {same[0]}): they teach nothing",
            stacklevel=2,
        )
        pairs = [p for p in pairs if p.chosen != p.rejected]
    return pairs


def _read(path: str | Path, parse: Callable[[Any], T]) -> tuple[list[T], array]:
    """Every row parsed, and its row number (an array: 8 bytes a row)."""
    out, numbers = [], array("q")
    with _collector_paused():
        for n, row in rows(path):
            try:
                out.append(parse(row))
            except ValueError as e:
                raise RowError(f"{path}: row {n}: {e}") from None
            numbers.append(n)
    if not out:
        raise AttnlabError(f"{path}: no rows")
    return out, numbers


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while rows are read: each row is new containers that are kept, so
    the collector would walk all that were read, again and again (it doubled the reading of a million
    rows: docs/log.md, "Data"). Rows of JSON hold no cycles, so nothing is left for it to find. (Not
    while they are encoded: a template's rendering may leave cycles, and the collector costs less
    there.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
