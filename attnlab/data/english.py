"""English prose that needs no download: the docstrings and comments of Python's standard library.

The standard library's source is code with a good deal of English in it: module, class and
function docstrings, and comments. `english_paragraphs(files)` reads each file with `tokenize`
(never by importing or running it) and keeps
- docstrings: a string literal standing alone as a statement (the first thing in a module, class
  or function body, or any other bare string), its value read with `ast.literal_eval` and its
  indentation removed with `inspect.cleandoc`;
- comments: runs of consecutive `#` lines joined into one paragraph, the `#` marks removed;
and drops what is code more than prose: a paragraph with fewer than MIN_WORDS words, or in which
fewer than MIN_LETTERS of the characters are letters or spaces (doctest sessions, tables,
commented-out code). Files that do not tokenize (a stray syntax in an old file) are skipped.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from attnlab.data.text import read_text, stdlib_files

MIN_WORDS = 4  # "Return the value." is prose; "noqa" or "XXX" is not
MIN_LETTERS = 0.8  # share of letters and spaces: below it, a paragraph is mostly code or numbers
_CODE = re.compile(r"^\s*(>>>|\.\.\.|[$%])|[{};]|==|\w\(.*\)\s*$|^\s*\w+\s*=")  # lines that look like code
_WORDS = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_STANDALONE = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.ENCODING}


def prose(paragraph: str) -> str | None:
    """The paragraph with its code lines dropped and whitespace tidied, or None if too little prose is left."""
    lines = [line.strip() for line in paragraph.splitlines() if line.strip() and not _CODE.search(line)]
    text = " ".join(lines)
    if len(_WORDS.findall(text)) < MIN_WORDS:
        return None
    letters = sum(c.isalpha() or c == " " for c in text)
    return text if letters >= MIN_LETTERS * len(text) else None


def _docstring(token: str) -> str | None:
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError):
        return None
    return inspect.cleandoc(value) if isinstance(value, str) else None  # not bytes


def source_paragraphs(source: str) -> Iterator[str]:
    """The docstring and comment paragraphs of one Python source text, in order (unfiltered)."""
    previous, comments = tokenize.NEWLINE, []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments.append(tok.string.lstrip("#").strip())
            previous = tok.type  # the NL after it ends the line, not the run
            continue
        if comments and tok.type != tokenize.NL:  # a run of comment lines ends at the first code
            yield "\n".join(comments)
            comments = []
        elif tok.type == tokenize.NL and comments and previous == tokenize.NL:
            yield "\n".join(comments)  # a blank line also ends it
            comments = []
        if tok.type == tokenize.STRING and previous in _STANDALONE:
            doc = _docstring(tok.string)
            if doc:
                yield from doc.split("\n\n")  # one paragraph per blank-line-separated block
        previous = tok.type
    if comments:
        yield "\n".join(comments)


def english_paragraphs(files: list[Path] | None = None) -> Iterator[str]:
    """Prose paragraphs of `files` (default: the standard library's sources, as the stdlib corpus reads them)."""
    for path in stdlib_files() if files is None else files:
        try:
            found = list(source_paragraphs(read_text(path)))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            continue
        for paragraph in found:
            text = prose(paragraph)
            if text:
                yield text


def english_text(files: list[Path] | None = None, max_chars: int | None = None) -> str:
    """The prose of `files` as one text, a paragraph per line; at most max_chars characters."""
    out, size = [], 0
    for text in english_paragraphs(files):
        if max_chars is not None and size + len(text) + 1 > max_chars:
            break
        out.append(text)
        size += len(text) + 1
    return "\n".join(out)
