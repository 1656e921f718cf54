"""Tool calls: the tools a request offers, how a call is written in the model's text, the grammar that
lets a reply be only well-formed calls (or text, when the model may choose), and the calls read back.

Legend: a tool = a function the caller can run (name, description, JSON schema of its arguments);
a call = the model asking for one (name and arguments); the syntax = the fixed texts around a call's
name and arguments in the reply (the run's chat template's own, decoding/tool_prompt.py finds it).

    syntax = DEFAULT                               # <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    grammar = call_grammar(tools, syntax, "required", parallel=True, end="<|im_end|>", tokenizer=tok)
    calls = read_calls(reply_text, syntax, tools)  # [Call(name, arguments)] or None for a text reply

The constraint: each tool's arguments are that tool's schema read strictly (decoding/structured/schema.py: a
keyword the mask cannot enforce is refused, one line naming it), laid out as json.dumps lays JSON out,
as a template's `tojson` renders earlier calls; so every call parses and validates. With the choice
"auto" the reply is either calls or text that does not start as a call does and never writes the
template's end of turn (the grammar ends it with end-of-sequence instead, so that no stop text can
cut a call's arguments short).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.structured import Grammar, Lark, compile
from attnlab.decoding.structured import schema as schemas
from attnlab.decoding.structured.grammar import JSON_LAYOUT
from attnlab.errors import AttnlabError

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_TOOLS = 128
MAX_CALLS = 8  # calls in one reply, when parallel calls are allowed
FORCED = "function "  # call_grammar's choice of one named tool: FORCED + its name (no name has a space)
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` a JSON schema of its arguments object."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: dict(NO_PARAMETERS))

    def spec(self) -> dict:
        """As OpenAI's API and HuggingFace's chat templates take a tool."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Call:
    """A call the model made (or made in an earlier turn): the tool's name and its arguments."""

    name: str
    arguments: Any  # the parsed JSON (an object when the model wrote it)
    id: str = ""


@dataclass(frozen=True)
class Syntax:
    """How a reply writes calls: `before` name `between` arguments `after`, calls joined by `sep`
    (None: the template writes one call a reply).

    `native`: the run's template renders calls this way itself (given `tools` and `tool_calls`);
    otherwise attnlab writes the calls and tools into the conversation's text (tool_prompt.py)."""

    before: str
    between: str
    after: str
    sep: str | None = "\n"
    native: bool = False

    def write(self, call: Call) -> str:
        return f"{self.before}{call.name}{self.between}{json.dumps(call.arguments, ensure_ascii=False)}{self.after}"


# The default (Hermes' and Qwen 2.5's layout): one JSON object a call, in tags a reader can find.
DEFAULT = Syntax('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>")


def tool_of(spec: Any, where: str = "tools[0]") -> Tool:
    """A Tool from OpenAI's {"type": "function", "function": {name, description, parameters}}; its
    parameters checked as a strict schema. Raises one line naming the field at fault."""
    if not isinstance(spec, dict) or spec.get("type") != "function" or not isinstance(spec.get("function"), dict):
        raise AttnlabError(f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
    f = spec["function"]
    name = f.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise AttnlabError(f"{where}.function.name must be 1-64 letters, digits, _ or -, got {name!r:.60}")
    description = f.get("description") or ""
    if not isinstance(description, str):
        raise AttnlabError(f"{where}.function.description must be a text")
    parameters = f.get("parameters", NO_PARAMETERS)
    try:
        schemas.check(parameters, f"{where}.function.parameters")
        schemas.strict(parameters)
    except AttnlabError as e:
        raise AttnlabError(str(e).replace("structured output", "tool's parameters")) from None
    except RecursionError:  # a hostile request's schema, nested thousands deep
        raise AttnlabError(f"{where}.function.parameters nests too deeply") from None
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise AttnlabError(f'{where}.function.parameters must be an object schema ({{"type": "object", ...}})')
    return Tool(name, description, parameters)


def tools_of(specs: Any) -> list[Tool]:
    """The Tools of a request's `tools`, each checked; names must differ."""
    if not isinstance(specs, list) or not 1 <= len(specs) <= MAX_TOOLS:
        raise AttnlabError(f"tools must be a list of 1 to {MAX_TOOLS} tools")
    tools = [tool_of(s, f"tools[{i}]") for i, s in enumerate(specs)]
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise AttnlabError(f"tools name {twice!r} twice: each tool needs its own name")
    return tools


def literal(text: str) -> str:
    """`text` as a Lark string literal (JSON's escapes, which llguidance reads)."""
    return json.dumps(text)


def exact(text: str) -> str:
    """`text` as a regular expression matching it alone: every character not a letter or digit escaped."""
    return "".join(c if c.isalnum() and c.isascii() else f"\\x{{{ord(c):x}}}" for c in text)


def call_grammar(
    tools: Sequence[Tool], syntax: Syntax, choice: str, parallel: bool, end: str, tokenizer: Tokenizer
) -> Grammar:
    """The constraint of a reply: `choice` "required" (calls of any tool), "auto" (calls or text) or
    FORCED + a tool's name (one call of it: a tool may be called "auto"); `parallel`: up to MAX_CALLS
    calls; `end`: the template's end of turn, which a text reply may not write. Compiled once per text
    (structured.compile's cache)."""
    forced = choice[len(FORCED) :] if choice.startswith(FORCED) else None
    choice = "forced" if forced is not None else choice
    offered = [t for t in tools if forced is None or t.name == forced]
    if not offered:
        raise AttnlabError(f"tool_choice names {forced!r}, which tools does not list")
    rules = [
        f"call_{i}: {literal(syntax.before + t.name + syntax.between)} args_{i} {literal(syntax.after)}"
        for i, t in enumerate(offered)
    ]
    for i, t in enumerate(offered):
        layout = {**schemas.strict(t.parameters), "x-guidance": {**JSON_LAYOUT}}
        rules.append(f"args_{i}: %json {json.dumps(layout)}")
    many = parallel and syntax.sep is not None and choice in ("auto", "required")
    calls = f"call ({literal(syntax.sep)} call){{0,{MAX_CALLS - 1}}}" if many else "call"
    lines = [
        "start: calls | TEXT" if choice == "auto" else "start: calls",
        f"calls: {calls}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(offered))),
        *rules,
    ]
    if choice == "auto":  # text that is not the start of a call and holds no end of turn
        ends = f" & ~/(?s:.*{exact(end)}.*)/" if end else ""
        lines.append(f"TEXT: /(?s:.+)/ & ~/(?s:{exact(syntax.before)}.*)/{ends}")
    return compile(Lark("\n".join(lines) + "\n"), tokenizer)


def read_calls(text: str, syntax: Syntax, tools: Sequence[Tool]) -> list[Call] | None:
    """The calls `text` is made of, in `syntax`; None when it is anything else (a text reply, or a
    call cut short by max_tokens)."""
    names = sorted((t.name for t in tools), key=len, reverse=True)  # the longest first: "get" is in "get_all"
    decode, calls, at = json.JSONDecoder().raw_decode, [], 0
    while True:
        if not text.startswith(syntax.before, at):
            return None
        at += len(syntax.before)
        name = next((n for n in names if text.startswith(n + syntax.between, at)), None)
        if name is None:
            return None
        at += len(name) + len(syntax.between)
        try:
            arguments, at = decode(text, at)
        except ValueError:
            return None
        if not text.startswith(syntax.after, at):
            return None
        at += len(syntax.after)
        calls.append(Call(name, arguments))
        if at == len(text):
            return calls
        if syntax.sep is None or not text.startswith(syntax.sep, at):
            return None
        at += len(syntax.sep)


class Reading:
    """A reply read as it grows: `add(piece)` returns the text that can go out as content now (none
    while the reply may still be a call); `calls()` once it has ended."""

    def __init__(self, syntax: Syntax, tools: Sequence[Tool]):
        self.syntax, self.tools = syntax, tools
        self.text, self.sent = "", 0

    def add(self, piece: str) -> str:
        self.text += piece
        if self.text.startswith(self.syntax.before) or self.syntax.before.startswith(self.text):
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out

    def calls(self) -> list[Call] | None:
        return read_calls(self.text, self.syntax, self.tools)

    def rest(self) -> str:
        """The content not sent yet, once the reply has ended and is not calls."""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
