"""Tool calls through the real `openai` client against a live server on random-weight character GPTs
(so that only the constraint makes their replies calls): a round trip (tools -> tool_calls -> a tool
message -> the answer), each tool_choice, streamed and not, every call's arguments valid JSON that
validates against its tool's schema (jsonschema); the run's own template's tool syntax read and used
(a Qwen-like one with parallel calls, a Llama-3.1-like one with a call a reply); invalid tool fields
are one-line 400s naming the field."""

from __future__ import annotations

import json
import re

import pytest

from attnlab.data.chat import ChatTemplate
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.tool_prompt import Turn, syntax_of, tool_prompt
from attnlab.decoding.tools import DEFAULT, FORCED, Call, Syntax, call_grammar, read_calls, tools_of
from attnlab.io import write_json
from attnlab.runs.adapted import CHAT_TEMPLATE
from attnlab.runs.marker import record
from attnlab.serve.app import create_app, running
from tests.conftest import extra, make_run, tiny_model
from tests.test_structured_grammar import takes

openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the reference validator) comes with the dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "maximum": 9}},
    "required": ["a"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "the weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
# A Qwen-like template (its own tags, tools listed in the system turn, calls joined by a new line) and
# a Llama-3.1-like one (a bare JSON object, one call a reply), written for these tests.
TAGGED = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools:\\n' }}{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{ '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    '{{ \'<call>{"name": "\' + c.function.name + \'", "arguments": \' }}{{ c.function.arguments | tojson }}'
    "{{ '}</call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ONE_CALL = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{% set c = m.tool_calls[0].function %}"
    "{%- if m.tool_calls | length > 1 %}{{ raise_exception('one call at a time') }}{% endif %}"
    '[A]{"name": "{{ c.name }}", "parameters": {{ c.arguments | tojson }}}[E]'
    "{%- else %}[{{ m.role[0] | upper }}]{{ m.content }}[E]{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}[A]{% endif %}"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Two runs of one random-weight character GPT: "lm" with attnlab's ChatML (the default tool
    syntax), "tagged" with TAGGED."""
    root, tok = tmp_path_factory.mktemp("tools"), CharTokenizer(CHARS)
    runs = [make_run(root / name, tiny_model(context=1024), tok) for name in ("lm", "tagged")]
    record(runs[1], CHAT_TEMPLATE)
    write_json(runs[1] / CHAT_TEMPLATE, ChatTemplate(TAGGED).to_dict())
    with running(create_app(runs)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, model="lm", messages=ASK, **kw):
    kw = {"tools": TOOLS, "max_tokens": 800, "seed": 0, **kw}  # room for 8 parallel calls
    return client.chat.completions.create(model=model, messages=messages, **kw).choices[0]


def valid_calls(choice) -> list[tuple[str, dict]]:
    """A reply of calls: finish_reason tool_calls, ids, each call's arguments valid under its tool's schema."""
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    out = []
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, {**SCHEMAS[call.function.name], "additionalProperties": False})
        out.append((call.function.name, arguments))
    return out


@pytest.mark.parametrize(("model", "template"), [("lm", ChatTemplate()), ("tagged", ChatTemplate(TAGGED))])
def test_a_round_trip_tools_calls_a_tool_message_and_the_answer(client, model, template):
    first = ask(client, model, tool_choice="required")
    calls = valid_calls(first)
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": f"result {i}"} for i, c in enumerate(first.message.tool_calls)
    ]
    messages = [*ASK, first.message, *results]  # the reply as the client gives it, as OpenAI's guide does
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=30, seed=1)
    reply = answer.choices[0]
    assert reply.finish_reason in ("stop", "length", "tool_calls")  # auto: the model chooses
    if reply.finish_reason != "tool_calls":
        assert reply.message.content and not reply.message.tool_calls
    # The server read the call and the results back through the template: the prompt it counted is
    # this conversation as tool_prompt renders it, the call in the template's syntax (ChatML: DEFAULT's).
    turns = [
        Turn("user", ASK[0]["content"]),
        Turn("assistant", "", tuple(Call(n, a, c.id) for (n, a), c in zip(calls, first.message.tool_calls))),
        *(Turn("tool", r["content"], call_id=r["tool_call_id"]) for r in results),
    ]
    text = tool_prompt(template, turns, tools_of(TOOLS))
    assert syntax_of(template).write(Call(*calls[0])) in text and "result 0" in text
    assert answer.usage.prompt_tokens == len(text)  # one token a character


@pytest.mark.parametrize("model", ["lm", "tagged"])
def test_required_and_a_named_tool_always_call_with_valid_arguments(client, model):
    for seed, temperature in [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.3), (4, 1.3)]:
        assert valid_calls(ask(client, model, tool_choice="required", seed=seed, temperature=temperature))
        named = {"type": "function", "function": {"name": "add"}}
        calls = valid_calls(ask(client, model, tool_choice=named, seed=seed, temperature=temperature))
        assert [name for name, _ in calls] == ["add"]


def test_none_answers_in_text_and_auto_may_do_either(client):
    for seed in range(3):
        none = ask(client, tool_choice="none", seed=seed, max_tokens=20)
        assert none.finish_reason in ("stop", "length") and none.message.tool_calls is None
        auto = ask(client, seed=seed, max_tokens=20)
        assert auto.finish_reason == "tool_calls" or not auto.message.content.startswith(DEFAULT.before)
    tok = CharTokenizer(CHARS)
    grammar = call_grammar(tools_of(TOOLS), DEFAULT, "auto", True, "<|im_end|>", tok)
    call = DEFAULT.write(Call("add", {"a": 5}))
    for text in ["It is sunny.", call, f"{call}\n{call}", "<tool_call>\nhello"]:  # the last: text, not a call's start
        assert takes(grammar, tok, text), text
    for text in ['<tool_call>\n{"name": "hello', "Done.<|im_end|>", call[:-1]]:
        assert not takes(grammar, tok, text), text


def test_a_stream_sends_the_calls_whole_in_its_last_chunk(client):
    whole = ask(client, tool_choice="required", seed=5, temperature=1.0)
    chunks = [
        c.choices[0]
        for c in client.chat.completions.create(
            model="lm", messages=ASK, tools=TOOLS, tool_choice="required", seed=5, temperature=1.0, stream=True
        )
        if c.choices
    ]
    assert chunks[-1].finish_reason == "tool_calls" and all(c.delta.content in (None, "") for c in chunks)
    assert len(chunks) == 2  # the role, then the calls: nothing sent while they were drawn
    streamed = [(d.function.name, d.function.arguments) for d in chunks[-1].delta.tool_calls]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    text = ask(client, tool_choice="none", seed=6, max_tokens=20)
    pieces = list(
        client.chat.completions.create(
            model="lm", messages=ASK, tools=TOOLS, tool_choice="none", seed=6, max_tokens=20, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == text.message.content


def test_parallel_calls_off_means_one_call(client):
    for seed in range(4):
        assert len(valid_calls(ask(client, tool_choice="required", seed=seed, parallel_tool_calls=False))) == 1


def test_the_template_s_own_syntax_is_read_from_it():
    tagged = syntax_of(ChatTemplate(TAGGED, where="a test"))
    assert tagged == Syntax('<call>{"name": "', '", "arguments": ', "}</call>", "\n", native=True)
    one = syntax_of(ChatTemplate(ONE_CALL, where="a test"))
    assert one == Syntax('{"name": "', '", "parameters": ', "}", None, native=True)
    assert syntax_of(ChatTemplate()) == DEFAULT  # attnlab's ChatML has none: the default
    no_tools = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert syntax_of(ChatTemplate(no_tools, where="a test")) == DEFAULT
    calls = [Call("add", {"a": 1}), Call("get_weather", {"city": "Oslo", "unit": "c"})]
    tools = tools_of(TOOLS)
    assert read_calls("\n".join(map(tagged.write, calls)), tagged, tools) == calls
    assert read_calls(one.write(calls[0]), one, tools) == calls[:1]
    assert read_calls(one.write(calls[0]) + "\n" + one.write(calls[1]), one, tools) is None  # one a reply
    assert read_calls("hello", tagged, tools) is None


BAD = [  # (fields, the param named, what the one line says)
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", r"tools\[0\].function.name must be"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "'get_weather' twice"),
    ({"tools": [{"type": "retrieval"}]}, "tools", r'tools\[0\] must be \{"type": "function"'),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]},
        "tools",
        r"'not' at tools\[0\].function.parameters is not supported in a tool's parameters",
    ),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "must name one of the tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", "must be auto, none, required"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "has no tools"),
    ({"stop": "x"}, "stop", "stop is not taken together with tools"),
    ({"response_format": {"type": "json_object"}}, "response_format", "not taken together with tools"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "x", "content": "1"}]}, "messages[1]", "names no earlier"),
    (
        {
            "messages": [
                *ASK,
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "a", "arguments": "{x"}}]},
            ]
        },
        "messages[1].tool_calls[0]",
        "arguments must be a JSON object's text",
    ),
]


@pytest.mark.parametrize(("fields", "param", "says"), BAD)
def test_invalid_tool_fields_are_one_line_400s(client, fields, param, says):
    body = {"model": "lm", "messages": ASK, "tools": TOOLS, "max_tokens": 5, **fields}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**body)
    error = e.value.body
    assert error["param"] == param and "\n" not in error["message"]
    assert re.search(says, error["message"]), error["message"]


def test_a_tool_named_auto_or_required_can_be_the_one_called():
    """A named tool_choice is that tool's call even when the tool is called "auto" or "required" (the
    words of the other two choices): the grammar takes its call alone, never text or another tool."""
    tok = CharTokenizer(CHARS)
    tools = tools_of(
        [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("auto", "b")]
    )
    grammar = call_grammar(tools, DEFAULT, FORCED + "auto", True, "<|im_end|>", tok)
    assert takes(grammar, tok, DEFAULT.write(Call("auto", {})))
    for text in ["It is sunny.", DEFAULT.write(Call("b", {}))]:
        assert not takes(grammar, tok, text), text
