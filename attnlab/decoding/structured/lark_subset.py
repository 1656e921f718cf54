"""The part of llguidance's Lark dialect a request's `grammar` may use, checked before it is compiled.

llguidance reads more than Lark (`%json` schemas, `@` references to other grammars, special tokens
`<[id]>`, lexeme operators `&` and `~`, `[max_tokens=...]` attributes) and less (no priorities, no
templates, no `%declare`). A request gets the subset below, each part tested
(tests/test_structured_grammar.py), and anything else is refused in one line naming it, so that
what a client may write does not depend on what one llguidance version happens to accept:

    start: expr                        rules (lower case) and terminals (UPPER case); `start` is the value
    expr: term (("+" | "-") term)*     alternatives |, groups ( ), repetition * + ?, optional [ ]
    term: NUMBER | "(" expr ")"        literals "..." (flag i: any case), ranges "a".."z"
    NUMBER: /[0-9]+/                   regular expressions /.../ (flags i s)
    ROW: FIELD{1,3}                    counted repetition {n} {n,m}
    %ignore " "                        text skipped between terminals; // comments
"""

from __future__ import annotations

import re

from attnlab.errors import AttnlabError

MAX_CHARS = 20_000  # a grammar's text: an arithmetic or CSV grammar takes a few hundred
WHERE = "docs/structured-outputs.md#grammars"
# One alternative per kind of piece; the first that matches at a position names it.
PIECES = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>//[^\n]*)
      | (?P<literal>"(?:\\.|[^"\\\n])*"i?)
      | (?P<regex>/(?:\\.|[^/\\\n])+/[is]*(?![A-Za-z]))
      | (?P<directive>%[A-Za-z_]+)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<count>\{\s*\d+\s*(?:,\s*\d*\s*)?\})
      | (?P<range>\.\.)
      | (?P<punct>[:|()\[\]?*+])""",
    re.VERBOSE,
)
# What llguidance reads beyond the subset, said in words (a piece's first character -> the feature).
OUTSIDE = {
    "@": "references to other grammars (@name)",
    "<": "special tokens (<...>)",
    "&": "the lexeme operator &",
    "~": "the operator ~",
    "{": "templates ({...} other than a count {n} or {n,m})",
    ".": "rule priorities (name.N)",
    "-": "aliases (-> name)",
    "=": "attributes ([name=value])",
}
DIRECTIVES = {"%ignore"}


def outside(what: str, line: int) -> AttnlabError:
    return AttnlabError(f"grammar line {line}: {what} is outside attnlab's Lark subset ({WHERE})")


def check(text: str) -> None:
    """Raise a one-line AttnlabError on the first thing `text` uses outside the subset, or when it
    has no `start` rule."""
    if not isinstance(text, str) or not text.strip():
        raise AttnlabError("grammar must be a non-empty Lark text")
    if len(text) > MAX_CHARS:
        raise AttnlabError(f"grammar has {len(text):,} characters; at most {MAX_CHARS:,}")
    at = 0
    while at < len(text):
        m = PIECES.match(text, at)
        line = text.count("\n", 0, at) + 1
        if m is None:
            char = text[at]
            raise outside(OUTSIDE.get(char, f"the character {char!r}"), line)
        if m.lastgroup == "directive" and m.group() not in DIRECTIVES:
            hint = " (for a JSON schema use response_format json_schema)" if m.group() == "%json" else ""
            raise outside(f"the directive {m.group()}{hint}", line)
        at = m.end()
    if not re.search(r"(?m)^\s*start\s*:", text):
        raise AttnlabError("grammar has no rule named start: the value a reply must be")
