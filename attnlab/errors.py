"""User-facing errors.

An `AttnlabError` is a mistake a user can fix (bad path, unknown preset, ...). The command
line prints its message on one line and exits with status 2, without a traceback. `Interrupted`
is Ctrl-C on work that was saved: no error, one line saying how to continue, exit status 130
(128 + SIGINT, what a shell reports for a program Ctrl-C ended).

A library call given a value of the wrong kind raises `ArgumentTypeError` (or `ArgumentValueError`),
which is both an AttnlabError and the TypeError (ValueError) a Python caller expects; its message
names the argument and what it takes: "TrainConfig.max_steps: expected int, got '5' (str)".
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


class AttnlabError(Exception):
    """A problem with the user's input, reported as one line by the CLI (exit code 2)."""

    status = 2  # the command line's exit status
    heading = "error: "  # what the command line's line says before the message


class Interrupted(AttnlabError):
    """Ctrl-C, with the work saved: `what` happened, `again` is the command that continues it. An
    AttnlabError, so that a caller who catches those still catches this; the command line prints
    "attnlab: WHAT. Continue with: AGAIN" and exits 130."""

    status = 130
    heading = ""

    def __init__(self, what: str, again: str) -> None:
        super().__init__(f"{what}. Continue with: {again}")
        self.what, self.again = what, again


class ArgumentTypeError(AttnlabError, TypeError):
    """A library argument of the wrong type, named in the message."""


class ArgumentValueError(AttnlabError, ValueError):
    """A library argument of the right type but an impossible value, named in the message."""


def one_line(e: BaseException) -> str:
    """An error's first line (a library's messages can be pages long), or its type's name if it has none."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def kind(value: object) -> str:
    """A value and its type for a message: "'5' (str)"."""
    text = repr(value)
    return f"{text[:40]}{'...' if len(text) > 40 else ''} ({type(value).__name__})"


def path_argument(value: object, name: str) -> Path:
    """A path argument (str or os.PathLike) as a Path, or an ArgumentTypeError naming `name`."""
    if not isinstance(value, str | os.PathLike):
        raise ArgumentTypeError(f"{name}: expected a path (str or pathlib.Path), got {kind(value)}")
    return Path(value)


def _is_command_line() -> bool:
    """Whether this process is the `attnlab` command (its script, or python -m attnlab[.cli.main])."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1].startswith("attnlab"):
        return True
    return Path(sys.argv[0]).name == "attnlab"


@contextlib.contextmanager
def interrupt_quietly_at_start() -> Iterator[None]:
    """Ctrl-C while the command line starts (importing torch takes seconds): one line and exit
    status 130, not a traceback through the imports. A program that imports attnlab still gets
    its KeyboardInterrupt."""
    try:
        yield
    except KeyboardInterrupt:
        if not _is_command_line():
            raise
        print("attnlab: interrupted while starting", file=sys.stderr)
        raise SystemExit(130) from None
