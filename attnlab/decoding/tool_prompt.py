"""A conversation with tools as the text a model reads: through the run's chat template's own tool
syntax when it has one, else through attnlab's default (tools.DEFAULT, written into the turns).

Legend: a turn = one message (system, user, assistant with its calls, or a tool's result); the probe
= a render of a made-up call, from which the template's syntax is read.

Which syntax: a converted checkpoint's template (Qwen 2.5's, Llama 3.1's, Hermes') reads `tools`
and each assistant message's `tool_calls` in Jinja, as HuggingFace's apply_chat_template passes
them. `syntax_of` renders a conversation whose answer is a call of a made-up tool, once with one call
and once with two, and reads off the fixed texts around the name and the arguments (and between two
calls); a template that writes no such call, or one attnlab cannot find again, gets DEFAULT. The
template is untrusted: it renders in the sandbox (data/template_sandbox.py) as every chat does.

The default, for attnlab's own ChatML and any template without tool syntax: the tools are listed in
the system turn (TOOLS_INTRO, one JSON object a line), an assistant's calls are written into its
text in DEFAULT's syntax, and tool results go back as a user turn of <tool_response> blocks (so a
template that wants user and assistant turns in turn takes them).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from attnlab.data.chat import BUILTIN, ChatTemplate
from attnlab.data.conversations import Message
from attnlab.decoding.tools import DEFAULT, Call, Syntax, Tool
from attnlab.errors import AttnlabError

TOOLS_INTRO = (
    "You can call these tools; each line is one, as a JSON schema:\n<tools>\n{tools}\n</tools>\n"
    "To call tools, reply with nothing but one block a call:\n"
    '<tool_call>\n{{"name": "<tool name>", "arguments": {{<its arguments>}}}}\n</tool_call>'
)
PROBE_NAME, PROBE_ARGUMENTS = "attnlab_probe_tool", {"attnlab_probe": 1}


@dataclass(frozen=True)
class Turn:
    """One message of a conversation with tools: `calls` an assistant's; `call_id` a tool result's."""

    role: str  # system, user, assistant or tool
    content: str
    calls: tuple[Call, ...] = ()
    call_id: str = ""


def row(turn: Turn) -> dict:
    """A turn as HuggingFace's templates read a message (a call's arguments as an object)."""
    out: dict = {"role": turn.role, "content": turn.content}
    if turn.calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls
        ]
    if turn.role == "tool":
        out["tool_call_id"] = turn.call_id
    return out


def probe_call(i: int) -> Call:
    return Call(f"{PROBE_NAME}{i}", PROBE_ARGUMENTS, f"call_{i}")


def answered(template: ChatTemplate, calls: tuple[Call, ...]) -> str:
    """The made-up conversation, its answer `calls`, as the template renders it with tools on offer."""
    tools = [Tool(f"{PROBE_NAME}{i}").spec() for i in (1, 2)]
    turns = [Turn("user", "Hello.")] + ([Turn("assistant", "", calls)] if calls else [])
    return template.render_rows([row(t) for t in turns], not calls, tools)


def probe(template: ChatTemplate) -> Syntax | None:
    """The template's own syntax for calls, read from renders of made-up ones; None if it has none."""
    try:
        start, one, end = answered(template, ()), answered(template, (probe_call(1),)), template.end_of_turn()
    except AttnlabError:  # it refuses such a conversation: it does not take tool calls
        return None
    if not one.startswith(start):
        return None
    reply, arguments, name = one[len(start) :], json.dumps(PROBE_ARGUMENTS), probe_call(1).name
    at = reply.find(name)
    args_at = reply.find(arguments, at)
    if at <= 0 or args_at < 0:  # no call written, or none before the name to tell a call from text
        return None
    rest = reply[args_at + len(arguments) :]
    after = rest[: rest.find(end)] if end and end in rest else rest.rstrip()
    before, between = reply[:at], reply[at + len(name) : args_at]
    sep = separator(template, start + reply[: args_at + len(arguments)] + after, before)
    return Syntax(before, between, after, sep, native=True)


def separator(template: ChatTemplate, first: str, before: str) -> str | None:
    """What the template writes between two calls of one reply; None when it takes one call a reply
    (Llama 3.1's refuses two) or writes two in a way this cannot read."""
    try:
        two = answered(template, (probe_call(1), probe_call(2)))
    except AttnlabError:
        return None
    split = two.find(before + probe_call(2).name, len(first))
    return two[len(first) : split] if two.startswith(first) and split >= 0 else None


_SYNTAX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def syntax_of(template: ChatTemplate) -> Syntax:
    """The syntax a reply writes calls in: the template's own, else DEFAULT (found once per template)."""
    if template not in _SYNTAX:
        _SYNTAX[template] = (probe(template) if template.source != BUILTIN else None) or DEFAULT
    return _SYNTAX[template]


def tool_prompt(template: ChatTemplate, turns: Sequence[Turn], tools: Sequence[Tool]) -> str:
    """The text the model continues to answer `turns` with `tools` on offer (none: left out)."""
    syntax = syntax_of(template)
    if syntax.native:
        return template.render_rows([row(t) for t in turns], True, [t.spec() for t in tools] or None)
    return template.prompt(plain(turns, tools, syntax))


def plain(turns: Sequence[Turn], tools: Sequence[Tool], syntax: Syntax) -> list[Message]:
    """The default: the turns as role and content alone, tools and calls written into their text."""
    out: list[Message] = []
    intro = TOOLS_INTRO.format(tools="\n".join(json.dumps(t.spec(), ensure_ascii=False) for t in tools))
    if tools and turns and turns[0].role == "system":
        out.append(Message("system", f"{turns[0].content}\n\n{intro}"))
        turns = turns[1:]
    elif tools:
        out.append(Message("system", intro))
    for t in turns:
        if t.role == "tool":
            result = f"<tool_response>\n{t.content}\n</tool_response>"
            if out and out[-1].role == "user" and out[-1].content.startswith("<tool_response>"):
                out[-1] = Message("user", f"{out[-1].content}\n{result}")  # results of one reply: one turn
            else:
                out.append(Message("user", result))
        elif t.calls:
            written = (syntax.sep or "\n").join(map(syntax.write, t.calls))
            out.append(Message("assistant", f"{t.content}\n{written}" if t.content else written))
        else:
            out.append(Message(t.role, t.content))
    return out
