"""Tool calling on /v1/chat/completions: a request's `tools`, `tool_choice` and tool messages read into
decoding/tools.py's terms, and a reply's calls written back as OpenAI's `tool_calls`.

Legend: a plan = what a request with tools asks for (the prompt, the syntax of a call, the constraint).

The request: `tools` [{"type": "function", "function": {name, description, parameters}}] (up to
128, names of 1-64 letters, digits, _ and -, parameters an object schema the mask can enforce:
decoding/structured/schema.py, read strictly); `tool_choice` "auto" (the default with tools: text or calls),
"none" (text; the tools are left out of the prompt), "required" (one or more calls) or
{"type": "function", "function": {"name": ...}} (one call of it); `parallel_tool_calls` false: one
call a reply. Messages: an assistant's `tool_calls` [{"id", "type": "function", "function": {name,
arguments: a JSON object's text}}], and role "tool" with the `tool_call_id` of an earlier call.
Refused in one line each (a 400 naming the field): anything else in these fields, the deprecated
`functions`/`function_call` and role "function", and tools together with `stop` (a stop text
could cut a call's arguments; the constraint ends the reply), `grammar` or a `response_format`
other than text.

The reply: calls come back as message.tool_calls [{"id": "call_...", "type": "function",
"function": {"name", "arguments"}}] with content null and finish_reason "tool_calls"; a stream holds
back text that may still become a call, and sends the calls whole in the choice's last chunk.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from attnlab.data.chat import ChatTemplate
from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.structured import Grammar
from attnlab.decoding.tool_prompt import Turn, syntax_of, tool_prompt
from attnlab.decoding.tools import FORCED, Call, Reading, Syntax, Tool, call_grammar, read_calls, tools_of
from attnlab.errors import AttnlabError
from attnlab.serve.openai_schema import ROLES, BadField, ChatRequest, Message, clip


@dataclass(frozen=True)
class ToolPlan:
    """A chat with tools or tool turns: its prompt, and (unless tool_choice is none) the constraint."""

    prompt: str
    tools: list[Tool]
    syntax: Syntax
    grammar: Grammar | None


def tool_plan(req: ChatRequest, template: ChatTemplate, tokenizer: Tokenizer) -> ToolPlan | None:
    """The plan of a request; None for one with neither tools nor tool turns (a plain chat)."""
    tools = checked(tools_of, req.tools) if req.tools else []  # [] as none, as clients send it
    choice = choice_of(req.tool_choice, tools)
    turns = [turn_of(m, i) for i, m in enumerate(req.messages)]
    results_follow_calls(turns)
    if not tools and all(t.role in ROLES.values() and not t.calls for t in turns):
        return None
    if choice is not None:
        together = [f for f in ("stop", "grammar") if getattr(req, f)]
        together += ["response_format"] if (req.response_format or {}).get("type", "text") != "text" else []
        if together:
            raise BadField(f"{together[0]} is not taken together with tools (tool_choice none excepted)", together[0])
    syntax = syntax_of(template)
    prompt = tool_prompt(template, turns, tools if choice is not None else [])
    if choice is None:
        return ToolPlan(prompt, tools, syntax, None)
    parallel = req.parallel_tool_calls is not False
    grammar = checked(call_grammar, tools, syntax, choice, parallel, template.end_of_turn(), tokenizer, param="tools")
    return ToolPlan(prompt, tools, syntax, grammar)


def checked(f, *args: Any, param: str = "tools") -> Any:
    """f(*args), its one-line error a 400 naming `param`."""
    try:
        return f(*args)
    except AttnlabError as e:
        raise BadField(str(e), param) from None


def choice_of(value: Any, tools: list[Tool]) -> str | None:
    """tool_choice as call_grammar takes it ("auto", "required", FORCED + a tool's name), None for text."""
    if value is None or value == "auto":
        return "auto" if tools else None
    if value == "none":
        return None
    if value == "required" or isinstance(value, dict):
        if not tools:
            raise BadField("tool_choice asks for a call, but the request has no tools", "tool_choice")
        if value == "required":
            return value
        function = value.get("function") if value.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise BadField(f"tool_choice must name one of the tools, got {clip(value)}", "tool_choice")
        return FORCED + name
    raise BadField(f"tool_choice must be auto, none, required or a function, got {clip(value)}", "tool_choice")


def turn_of(m: Message, i: int) -> Turn:
    """A message as a Turn, its tool fields checked."""
    extra = m.model_extra or {}
    where = f"messages[{i}]"
    if m.role == "tool":
        call_id = extra.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadField(f"{where}: a tool message needs the tool_call_id of the call it answers", where)
        return Turn("tool", m.text(), call_id=call_id)
    calls = extra.get("tool_calls")
    if calls is not None and (m.role != "assistant" or not isinstance(calls, list)):
        raise BadField(f"{where}.tool_calls: a list, on an assistant message only", f"{where}.tool_calls")
    return Turn(
        ROLES[m.role], m.text(), tuple(call_of(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls or []))
    )


def call_of(value: Any, where: str) -> Call:
    f = value.get("function") if isinstance(value, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(value.get("id"), str):
        raise BadField(f'{where} must be {{"id": ..., "type": "function", "function": {{"name", "arguments"}}}}', where)
    try:
        arguments = json.loads(f.get("arguments") or "{}")
    except (TypeError, ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        raise BadField(f"{where}.function.arguments must be a JSON object's text", where)
    return Call(f["name"], arguments, value["id"])


def results_follow_calls(turns: list[Turn]) -> None:
    """Each tool message answers a call made before it."""
    made: set[str] = set()
    for i, t in enumerate(turns):
        made |= {c.id for c in t.calls}
        if t.role == "tool" and t.call_id not in made:
            raise BadField(f"messages[{i}].tool_call_id {clip(t.call_id)} names no earlier call", f"messages[{i}]")


def wire(calls: list[Call], indexed: bool = False) -> list[dict]:
    """Calls as OpenAI writes them (a stream's delta numbers them), each with a new id."""
    out = []
    for k, c in enumerate(calls):
        function = {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}
        call = {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": function}
        out.append({"index": k, **call} if indexed else call)
    return out


class ToolReplies:
    """Each choice's reply read as text or calls, whole or chunk by chunk."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.readings: dict[int, Reading] = {}

    def message(self, text: str, finish: str | None) -> tuple[dict, str | None]:
        """A whole reply's message and finish_reason."""
        calls = read_calls(text, self.plan.syntax, self.plan.tools)
        if calls is None:
            return {"role": "assistant", "content": text, "refusal": None}, finish
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": wire(calls)}, "tool_calls"

    def delta(self, index: int, text: str, finish: str | None, first: bool) -> tuple[dict, str | None]:
        """A chunk's delta and finish_reason: the text that cannot be a call any more, the calls at the end."""
        reading = self.readings.setdefault(index, Reading(self.plan.syntax, self.plan.tools))
        out, delta = reading.add(text), {"role": "assistant"} if first else {}
        if finish is not None:
            calls = reading.calls()
            if calls is not None:
                return {**delta, "tool_calls": wire(calls, indexed=True)}, "tool_calls"
            out += reading.rest()
        return delta | ({"content": out} if out or first else {}), finish
