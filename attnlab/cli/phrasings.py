"""The table at the end of `attnlab chat --help`: what a run fine-tuned on the built-in instructions
understands (data/instructions.py's PHRASINGS), and how to write a message of several lines. Apart
from cli/chat.py, which loads models, so that the help starts without torch."""

from __future__ import annotations

from attnlab.data.instructions import PHRASINGS

BLOCK = '"""'  # as decoding/dialogue.py reads it (tests/test_chat_terminal.py checks they agree)


def phrasings_help() -> str:
    """Each kind, a question of the test split and its answer; then the ways to write several lines."""
    lines = [
        "A run fine-tuned on the built-in instructions (train sft --data instructions, demo --chat)",
        "learned these phrasings, with other words (a few lowercase letters) and numbers (to 999):",
        "",
    ]
    for p in PHRASINGS:
        asked = "  then  ".join(f"{q}  -> {a}" for q, a in zip(p.asks, p.answers, strict=True))
        lines.append(f"  {p.kind:<13} {asked}")
    lines += [
        "",
        "Asked otherwise, a model this small guesses.",
        f"Several lines in one message: paste them, type {BLOCK} before and after them, or end a line with \\.",
    ]
    return "\n".join(lines)
