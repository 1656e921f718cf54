""" "Did you mean": the closest flag or command to a mistyped one, named in the one-line error.

argparse of Python 3.11 names neither (3.12 added suggestions for choices only), and a mistyped flag
(`--temprature`) is found by the parser of the sub-command but reported by the top one, which does
not know the sub-command's flags: so each parser that leaves arguments over notes itself on the
namespace (`UNRECOGNIZED_BY`), and the report asks that parser for its flags.
"""

from __future__ import annotations

import argparse
import difflib
import re

UNRECOGNIZED_BY = "_unrecognized_by"  # namespace attribute: the innermost parser that left arguments over
CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def closest(word: str, candidates: list[str]) -> str | None:
    """The candidate nearest to `word` by spelling, if any is near enough."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def flags_of(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's message for arguments left over, with the flag nearest to each unknown one."""
    hints = []
    for arg in extras:
        if arg.startswith("--"):
            near = closest(arg.split("=", 1)[0], flags_of(parser))
            if near:
                hints.append((near, arg.split("=", 1)[0]))
    message = f"unrecognized arguments: {' '.join(extras)}"
    if len(hints) == 1:
        return f"{message}; did you mean {hints[0][0]}?"
    return message + (f"; did you mean {', '.join(f'{a} for {b}' for a, b in hints)}?" if hints else "")


def with_suggestion(message: str) -> str:
    """An 'invalid choice' message (a command, a --what) with the nearest choice added."""
    m = CHOICE.search(message)
    if m:
        near = closest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        if near:
            return f"{message}; did you mean {near!r}?"
    return message
