"""Hostile chat templates (issue 55): a template is a program from somebody else's folder, and rendering
it is bounded in time, in what it writes and builds, and in call depth (data/template_limits.py).

Every case asserts, through tests/hostile.py: one AttnlabError line naming the limit (or what failed),
no traceback, within SECONDS seconds and MIB MiB of peak memory growth. The time cases run under a
0.2 s limit (set_template_limits), so that each takes 0.2 s, not the default 2. Hypothesis adds random
templates from a small grammar (text, {{ }}, loops, ifs, sets, filters, operators with large numbers):
each renders within the cap or is refused in one line, within the same bounds. Real templates (ChatML,
and ones written here in Llama 3.1's and Qwen 2.5's and Qwen 3's layouts) render exactly as Jinja2's
plain sandbox renders them.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

import attnlab
from attnlab.data.chat import BUILTIN, ChatTemplate, hf_template
from attnlab.data.conversations import Message
from attnlab.data.template_limits import TemplateLimits, set_template_limits, template_limits, template_limits_set
from attnlab.errors import AttnlabError
from attnlab.io import write_json
from attnlab.runs.adapted import CHAT_TEMPLATE, run_template
from attnlab.runs.marker import record
from tests.conftest import REPEATABLE, TEXT, flags, run_cli, tiny_data, tiny_model, tiny_train
from tests.hostile import bounded, cli_refuses, one_line, refused

pytestmark = pytest.mark.usefixtures("one_thread")

SECONDS, MIB = 5.0, 100  # per case: refusals take 0.2 s at most (the time limit below) and a few MiB
FAST = 0.2  # the time limit of the cases that run into it
CONV = [Message("user", "What is 2 + 2?"), Message("assistant", "4"), Message("user", "Thanks!")]
GROWTH, SECS, DEPTH, COMPILE = r"--template-growth", r"--template-seconds", r"--template-depth", "does not compile"
BIG = "{% set s = 'x' * 100000 %}"  # a text half the cap of a short conversation (about 200,000 characters)

HOSTILE = {
    # one step that would allocate gigabytes: refused before it is made
    "repeat": ("{{ 'x' * 1000000000 }}", r"1,000,000,000 characters \('\*'\).*" + GROWTH),
    "repeat, number first": ("{{ 1000000000 * 'x' }}", GROWTH),
    "repeat a list": ("{{ [1, 2] * 1000000000 }}", GROWTH),
    "repeat by a variable": ("{% set n = 10 ** 9 %}{{ 'ab' * n }}", GROWTH),
    "% width": ("{{ '%999999999s' % 'x' }}", r"\('%'\).*" + GROWTH),
    "% width from the arguments": ("{{ '%*s' % (999999999, 'x') }}", GROWTH),
    "% precision": ("{{ '%.999999999f' % 1.5 }}", GROWTH),
    "% of one name many times": (BIG + "{{ ('%(a)s' * 1000) % {'a': s} }}", GROWTH),
    "format width": ("{{ '{:999999999}'.format('x') }}", r"\.format\(\).*" + GROWTH),
    "format width from an argument": ("{{ '{:{w}}'.format('x', w=999999999) }}", GROWTH),
    "format of one field many times": (BIG + "{{ ('{0}' * 1000).format(s) }}", GROWTH),
    "format_map": ("{{ '{a:>999999999}'.format_map({'a': 1}) }}", GROWTH),
    "the format filter": ("{{ '%999999999s'|format('x') }}", GROWTH),
    "ljust": ("{{ 'x'.ljust(10 ** 9) }}", r"\.ljust\(\)"),
    "rjust": ("{{ 'x'.rjust(10 ** 9) }}", r"\.rjust\(\)"),
    "center": ("{{ 'x'.center(10 ** 9) }}", r"\.center\(\)"),
    "zfill": ("{{ '1'.zfill(10 ** 9) }}", r"\.zfill\(\)"),
    "expandtabs": ("{{ ('\t' * 1000).expandtabs(1000000) }}", r"\.expandtabs\(\)"),
    "replace empty": ("{% set s = 'x' * 1000 %}{{ s.replace('', s) }}", r"\.replace\(\)"),
    "join itself": ("{% set s = 'x' * 1000 %}{{ s.join(s) }}", r"\.join\(\)"),
    "translate": ("{{ ('x' * 1000).translate({120: 'y' * 1000}) }}", r"\.translate\(\)"),
    "to_bytes": ("{{ (1).to_bytes(10 ** 9, 'big') }}", r"\.to_bytes\(\)"),
    "the center filter": ("{{ 'x'|center(1000000000) }}", "the filter center"),
    "the indent filter": ("{{ ('\n' * 1000)|indent(1000000) }}", "the filter indent"),
    "the replace filter": ("{{ ('x' * 1000)|replace('x', 'y' * 1000) }}", "the filter replace"),
    "the join filter": ("{{ ('x' * 1000)|join('y' * 1000) }}", "the filter join"),
    "batch": ("{{ [1]|batch(1000000000, 'x')|list }}", "the filter batch"),
    "slice": ("{{ [1]|slice(1000000000, 'x')|list }}", "the filter slice"),
    "sum of lists": ("{{ ([[1]] * 10000)|sum(start=[]) }}", "sum adds numbers only"),
    "tojson indent": ("{{ messages|tojson(indent=1000000000) }}", "tojson's indent"),
    "a power": ("{{ 2 ** 100000000 }}", r"bits with '\*\*'"),
    "squaring in a loop": (
        "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
        r"bits with '\*'",
    ),
    "a list's text": (BIG + "{% set l = [s, s, s, s, s, s, s, s, s, s] %}{{ l }}", GROWTH),
    "a list's text via string": (BIG + "{{ [s, s, s, s, s, s, s, s, s, s]|string }}", "the filter string"),
    "dict.fromkeys": ("{{ dict.fromkeys(range(100000), 'x' * 1000) }}", GROWTH),
    # growing a little at a time: each step measured
    "doubling with ~": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        r"\(~\).*" + GROWTH,
    ),
    "doubling with +": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        GROWTH,
    ),
    "accumulating in {% set %} blocks": (
        "{% set ns = namespace(s='x' * 1000) %}{% for i in range(1000) %}{% set t %}"
        "{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
        GROWTH,
    ),
    "a macro's output": (
        "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}{% endmacro %}{{ m()|length }}",
        "writes more than its cap.*" + GROWTH,
    ),
    "a macro's own text in a loop": (
        "{% macro m() %}{% for i in range(100000) %}" + "A" * 64 + "{% endfor %}{% endmacro %}{{ m()|length }}",
        "writes more than its cap",
    ),
    "top-level text in a loop": ("{% for i in range(100000) %}0123456789{% endfor %}", "writes more than its cap"),
    "a list grown in a loop": (
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}",
        f"{GROWTH}|{SECS}",
    ),
    "a list nested 5,000 deep": (
        "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
        "deeper than Python can follow",
    ),
    "a namespace holding itself": ("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", GROWTH),
    "joiner": ("{% set j = joiner('x' * 100000) %}{% for i in range(100) %}{{ j() }}{% endfor %}", GROWTH),
    "cycler": ("{% set c = cycler('x' * 100000) %}{% for i in range(100) %}{{ c.next() }}{% endfor %}", GROWTH),
    # time
    "nested loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        r"more than 0\.2 s.*" + SECS,
    ),
    "nested loops over a variable": (
        "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        SECS,
    ),
    "a huge range": ("{{ range(100000000)|length }}", "MAX_RANGE"),
    # depth
    "a macro calling itself": ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", r"more than 50 deep.*" + DEPTH),
    "two macros calling each other": (
        "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
        DEPTH,
    ),
    "a recursive loop": ("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", DEPTH),
    "a block calling itself": ("{% block b %}{{ self.b() }}{% endblock %}", DEPTH),
    # failures of the template itself
    "1/0": ("{{ 1 / 0 }}", r"failed on this conversation \(ZeroDivisionError"),
    "1 // 0": ("{{ 1 // 0 }}", "ZeroDivisionError"),
    "a type error": ("{{ 'a' - 1 }}", "TypeError"),
    "include": ("{% include 'other.jinja' %}", COMPILE + r".*cannot read other files"),
    "import": ("{% import 'other.jinja' as o %}", "cannot read other files"),
    "from import": ("{% from 'other.jinja' import m %}", "cannot read other files"),
    "extends": ("{% extends 'base.jinja' %}", "cannot read other files"),
    "an undefined variable's attribute": ("{{ foo.bar }}", "'foo' is undefined"),
    "an undefined attribute's attribute": ("{{ messages[0].nope.deeper }}", "has no attribute 'nope'"),
    "calling an undefined name": ("{{ lipsum(1000000) }}", "'lipsum' is undefined"),
    "the class's subclasses": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "cycler's globals": ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    "joiner's globals": ("{{ joiner.__init__.__globals__.os }}", "unsafe"),
    "namespace's globals": ("{{ namespace.__init__.__globals__ }}", "unsafe"),
    "a message's class": ("{{ messages.__class__.__base__.__subclasses__() }}", "unsafe"),
    "changing the messages": ("{% set x = messages.append(1) %}", "unsafe"),
    "a syntax error": ("{% for %}", COMPILE + r" \(Expected an expression"),
    "an unclosed block": ("{% if 1 %}", COMPILE),
    "deeply nested ifs": ("{% if 1 %}" * 1000 + "x" + "{% endif %}" * 1000, COMPILE),
    "deeply nested loops": ("{% for i in [1] %}" * 30 + "x" + "{% endfor %}" * 30, COMPILE),
    "deeply nested parentheses": ("{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}", COMPILE),
    "an HTML filter left out": ("{{ 'x'|wordwrap(1) }}", COMPILE + ".*wordwrap"),
    "a long template": ("x" * 200_000, r"200,000 characters long, more than 100,000.*" + GROWTH),
    "a multi-line message": ("{{ raise_exception('first line\nsecond line') }}", "first line second line"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_refused_in_one_line_within_bounds(name):
    source, match = HOSTILE[name]
    with template_limits_set(seconds=FAST):
        refused(lambda: ChatTemplate(source).render(CONV), match, SECONDS, MIB)


def test_every_refusal_names_where_the_template_came_from(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'x' * 1000000000 }}"}))
    message = refused(lambda: hf_template(tmp_path), None, SECONDS, MIB)
    assert f"the chat template in {tmp_path / 'tokenizer_config.json'} would make" in message
    assert "three-turn test conversation, tried as it is read" in message and GROWTH in message
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for %}"}))
    refused(lambda: hf_template(tmp_path), f"in {tmp_path}.*does not compile", SECONDS, MIB)
    message = refused(lambda: ChatTemplate.from_dict({"template": "{{ 1 / 0 }}"}, "RUN/chat_template.json"))
    assert message.startswith("the chat template in RUN/chat_template.json failed on a three-turn")


def test_a_template_that_refuses_some_conversations_is_still_read(tmp_path):
    """The probe is a conversation the strictest templates accept; a template's own raise_exception()
    on it (one that wants a system turn first) is its rule, not a fault: it is read, and says so later."""
    strict = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}"
        "{% endfor %}"
    )
    wants_system = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system turn first') }}{% endif %}x"
    for source in (strict, wants_system):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
        assert hf_template(tmp_path).source == source
    with pytest.raises(AttnlabError, match="a system turn first"):
        hf_template(tmp_path).render(CONV)


def test_the_output_cap_grows_with_the_conversation_and_the_option():
    ten_times = "{% for i in range(10) %}{% for m in messages %}{{ m['content'] }}{% endfor %}{% endfor %}"
    long = [Message("user", "x" * 50_000), Message("assistant", "y" * 50_000)]
    assert len(ChatTemplate(ten_times).render(long)) == 1_000_000  # 10 x, over the floor: the cap is 20 x
    hundred_times = ten_times.replace("range(10)", "range(100)")
    refused(lambda: ChatTemplate(hundred_times).render(long), "writes more than its cap.*" + GROWTH, SECONDS, 200)
    with template_limits_set(growth=200):  # a template the user trusts
        assert len(ChatTemplate(hundred_times).render(long)) == 10_000_000


def test_the_time_and_depth_limits_can_be_raised_for_a_trusted_template():
    slow = "{% for i in range(300) %}{% for j in range(300) %}{% endfor %}{% endfor %}ok"  # 90,000 steps
    deep = "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{% else %}ok{% endif %}{% endmacro %}{{ m(60) }}"
    with template_limits_set(seconds=0.001):
        refused(lambda: ChatTemplate(slow).render(CONV), SECS, SECONDS, MIB)
    assert ChatTemplate(slow).render(CONV) == "ok"
    refused(lambda: ChatTemplate(deep).render(CONV), DEPTH, SECONDS, MIB)
    with template_limits_set(depth=100):
        assert ChatTemplate(deep).render(CONV) == "ok"


def test_the_limits_api():
    before = template_limits()
    assert before == TemplateLimits() and (before.seconds, before.growth, before.depth) == (2.0, 20.0, 50)
    with template_limits_set(seconds=30, growth=1000) as limits:
        assert (limits.seconds, limits.growth, limits.depth) == (30, 1000, 50) and template_limits() == limits
    assert template_limits() == before
    assert set_template_limits(depth=80) == before and template_limits().depth == 80
    set_template_limits(depth=before.depth)
    for bad in ({"seconds": 0}, {"growth": -1}, {"depth": 2.5}, {"seconds": float("inf")}, {"depth": True}):
        with pytest.raises(AttnlabError, match=f"TemplateLimits.{next(iter(bad))}"):
            TemplateLimits(**bad)


SANDBOXED_CHATML = BUILTIN + "{# a template from a file: rendered in the sandbox #}"


def test_the_assistant_spans_of_a_10000_turn_conversation_are_refused_in_one_line():
    """Finding the spans renders every prefix (quadratic); all of one conversation's renders share one
    deadline, so 10,000 turns are refused by it (they took 33 s before on a quiet 2-core machine)."""
    turns = [Message("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(10_000)]
    with template_limits_set(seconds=0.5):
        says = r"more than 0\.5 s to find the assistant turns of a 10,000-turn conversation.*" + SECS
        refused(lambda: ChatTemplate(SANDBOXED_CHATML).assistant_spans(turns), says, 3.0, MIB)
    text, spans = ChatTemplate(SANDBOXED_CHATML).assistant_spans(turns[:100])  # a real size: found
    assert len(spans) == 50 and all(text[a:b] == f"message {2 * k + 1}<|im_end|>\n" for k, (a, b) in enumerate(spans))


def test_attnlab_s_own_template_is_rendered_by_python_as_jinja_renders_it():
    """BUILTIN skips the sandbox (a million rows took minutes there): the same texts and spans as the
    sandboxed template on random conversations of odd characters, and 10,000 turns in one pass."""
    rng, alphabet = random.Random(0), "ab \n\t{}%<|>\u00e9\u2028'\"\\"
    fast, jinja = ChatTemplate(), ChatTemplate(SANDBOXED_CHATML)
    for _ in range(200):
        text = lambda: "".join(rng.choices(alphabet, k=rng.randint(0, 12)))  # noqa: E731
        turns = [Message(rng.choice(["system", "user", "assistant"]), text()) for _ in range(rng.randint(0, 8))]
        for generation in (False, True):
            assert fast.render(turns, generation) == jinja.render(turns, generation)
        assert fast.assistant_spans(turns) == jinja.assistant_spans(turns)
    turns = [Message("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(10_000)]
    with bounded(1.0, MIB):
        text, spans = fast.assistant_spans(turns)
    assert len(spans) == 5_000 and text[slice(*spans[-1])] == "message 9999<|im_end|>\n"


# ---- real templates render as before ----------------------------------------------------------------------

# Written here in the layouts of Llama 3.1's, Qwen 2.5's and Qwen 3's templates: a date header, roles,
# tools tested with `is defined`, namespace(), loop.last, reversed loops, split/strip, raise_exception.
LLAMA31 = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is defined and tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role in ['ipython', 'tool'] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping %}{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""  # noqa: E501
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "<|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""  # noqa: E501
QWEN3 = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "system") %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('unknown role ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}
"""  # noqa: E501
REAL = {"chatml": BUILTIN, "llama31": LLAMA31, "qwen25": QWEN25, "qwen3": QWEN3}


def plain(source: str, messages, generation: bool) -> str:
    """What rendering was before limits: Jinja2's immutable sandbox with HuggingFace's settings."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    rows = [{"role": m.role, "content": m.content} for m in messages]
    return env.from_string(source).render(
        messages=rows, add_generation_prompt=generation, bos_token="<s>", eos_token="</s>"
    )


def hundred_turns() -> list[Message]:
    answers = ["<think>\nadding\n</think>\n\n4", "Sure: " + "long answer " * 200, "ok", "  padded  "]
    turns = [Message("system", "You are terse.")]
    for i in range(50):
        turns += [Message("user", f"question {i} " + "é" * i), Message("assistant", answers[i % len(answers)])]
    return turns


@pytest.mark.parametrize("name", REAL)
def test_real_templates_render_as_before_and_fast(name):
    turns = hundred_turns()
    template = ChatTemplate(REAL[name], "<s>", "</s>", where="a folder")  # read from a file: the probe runs
    start = time.perf_counter()
    for generation in (False, True):
        assert template.render(turns, generation) == plain(REAL[name], turns, generation)
    assert time.perf_counter() - start < 1.0  # milliseconds on a quiet machine
    if name != "qwen3":  # Qwen 3 drops an earlier answer's thinking once a later question follows
        text, spans = template.assistant_spans(turns)
        assert len(spans) == 50 and text == plain(REAL[name], turns, False)


# Jinja features the hooks sit in (loops, outputs, ~, calls, filters): each renders as before.
FEATURES = [
    "{% for m in messages if m.role != 'assistant' %}{{ loop.index }}/{{ loop.length }}{{ loop.revindex }}"
    "{{ loop.first }}{{ loop.last }}{{ loop.previtem is defined }}{{ loop.cycle('a', 'b') }}{{ loop.changed(m.role) }}"
    "{% else %}none{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %}{% for i in range(9) %}{% if i == 2 %}{% continue %}{% endif %}"
    "{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for x in [[1, [2]], [3]] recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}@{{ loop.depth }}"
    "{% endif %}]{% endfor %}",
    "{% for k, v in {'b': 1, 'a': 2}|dictsort %}{{ k ~ '=' ~ v }};{% endfor %}{% for k, v in messages[0].items() %}"
    "{{ k }}{% endfor %}",
    "{% macro box(x, sep='|') %}{{ sep }}{{ x }}{{ caller() if caller is defined else '' }}{{ sep }}{% endmacro %}"
    "{{ box('a') }}{% call box('b', sep='#') %}inside{% endcall %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.s = ns.s + m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}"
    "{% set block %}B{{ ns.n * 2 }}{% endset %}{{ block }}",
    "{% filter upper %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfilter %}{{ '%s-%03d' % ('x', 7) }}"
    "{{ '{}:{:>4}'.format('a', 5) }}{{ 'a,b'.split(',')|join('+') }}{{ messages|map(attribute='role')|join(' ') }}",
    "{% autoescape true %}{{ '<b>' ~ messages[0].content }}{% endautoescape %}{{ messages|tojson }}"
    "{{ messages[0]|tojson(indent=2) }}{{ [3, 1, 2]|sort|list }}{{ 'x'|center(7) }}{{ 'a\nb'|indent(2) }}",
    "{% set j = joiner(', ') %}{% for m in messages %}{{ j() }}{{ m.role|title }}{% endfor %}"
    "{% set c = cycler('odd', 'even') %}{% for m in messages %}{{ c.next() }}{% endfor %}{{ (2 ** 10) // 3 }}",
]


@pytest.mark.parametrize("source", FEATURES)
def test_jinja_features_render_as_before(source):
    assert ChatTemplate(source).render(CONV) == plain(source, CONV, False)


# ---- through the command line --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny language model run (one step on a little code), to hold chat templates."""
    root = tmp_path_factory.mktemp("templates")
    (root / "corpus.txt").write_text(TEXT * 20)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        model, train = tiny_model(n_layer=1, d_model=16, context=64), tiny_train(max_steps=1, warmup_steps=0)
        attnlab.train(root / "run", model, train, tiny_data(root / "corpus.txt"), progress=False)
    return root / "run"


def with_template(run, source: str):
    record(run, CHAT_TEMPLATE)
    write_json(run / CHAT_TEMPLATE, {"template": source, "bos_token": "", "eos_token": ""})
    return run


def test_a_run_with_a_hostile_template_is_refused_by_sample_and_chat(tiny_run, capsys):
    with_template(tiny_run, "{{ 'x' * 1000000000 }}")
    try:
        where = tiny_run / CHAT_TEMPLATE
        argv = ["sample", tiny_run, "--chat", "hi", "--dtype", "float32"]
        message = cli_refuses(argv, capsys, GROWTH, SECONDS, MIB, keep=(tiny_run,))
        assert f"the chat template in {where}" in message
        with_template(tiny_run, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
        cli_refuses(
            ["--template-seconds", FAST, "chat", tiny_run],
            capsys,
            rf"{where}.*more than 0\.2 s.*{SECS}",
            SECONDS,
            MIB,
            keep=(tiny_run,),
        )
        with template_limits_set(seconds=FAST):  # the library's call, as `chat` makes it
            refused(lambda: run_template(tiny_run), SECS, SECONDS, MIB)
    finally:
        (tiny_run / CHAT_TEMPLATE).unlink()


def test_the_top_level_options_set_the_limits_for_the_command(tiny_run, capsys):
    before, chatml = template_limits(), with_template(tiny_run, BUILTIN)
    try:
        cli_refuses(
            ["--template-growth", "0.01", "sample", chatml, "--chat", "hi", "--dtype", "float32"],
            capsys,
            f"{CHAT_TEMPLATE} is 155 characters long, more than 50 .*{GROWTH}",
            SECONDS,
            MIB,
        )
        assert template_limits() == before  # put back after the command
        rc, out, err = run_cli(
            [
                "--template-growth",
                "1000",
                "--template-depth",
                "80",
                "sample",
                chatml,
                *flags(chat="hi", max_new_tokens=2, dtype="float32"),
            ],
            capsys,
        )
        assert rc == 0, err
    finally:
        (tiny_run / CHAT_TEMPLATE).unlink()
    for bad in (["--template-seconds", "0"], ["--template-growth", "inf"], ["--template-depth", "2.5"]):
        rc, _, err = run_cli([*bad, "size", "gpt-nano"], capsys)
        assert rc == 2 and "expected a positive" in one_line(err.strip())
    help_text = " ".join(run_cli(["--help"], capsys)[1].split())
    assert "--template-seconds N" in help_text and "only for a folder you trust" in help_text


# ---- random templates ------------------------------------------------------------------------------------------

NUMBERS = [0, 1, 3, 7, 100, 1000, 10**5, 10**6, 10**9, 2**31, 10**18]
FILTERS = [
    "upper",
    "trim",
    "length",
    "string",
    "list",
    "first",
    "last",
    "reverse",
    "tojson",
    "center({n})",
    "indent({n})",
    "replace('a', {s})",
    "join({s})",
    "format({s})",
    "batch({n})|list",
    "slice({n})|list",
    "default({s})",
    "int",
    "title",
    "e",
    "unique|list",
    "sort",
]
METHODS = [
    "ljust({n})",
    "rjust({n})",
    "center({n})",
    "zfill({n})",
    "replace('', {s})",
    "join({s})",
    "format({s})",
    "expandtabs({n})",
    "split()",
    "upper()",
    "strip()",
]


def hypothesis():
    return pytest.importorskip("hypothesis", reason="hypothesis is a dev extra: pip install -e .[dev]")


def grammar(st):
    """Random templates: text, {{ expr }}, loops, ifs, sets and macros over expressions that mix
    texts, the messages, large numbers, operators, filters and methods."""
    text = st.text(alphabet="ab%{}:* \n", max_size=6).map(repr)
    number = st.sampled_from(NUMBERS).map(str)
    leaf = st.one_of(text, number, st.just("messages[0]['content']"), st.just("x"), st.just("messages"))

    def grow(inner):
        def call(patterns: list[str], form: str):  # a filter or a method, its number and text filled in
            filled = st.builds(lambda p, n, s: p.format(n=n, s=s), st.sampled_from(patterns), number, inner)
            return st.tuples(inner, filled).map(lambda t: form.format(*t))

        ops = st.sampled_from(["*", "+", "~", "%", "**", "//"])
        op = st.tuples(inner, ops, inner).map("({0[0]} {0[1]} {0[2]})".format)
        return st.one_of(op, call(FILTERS, "({}|{})"), call(METHODS, "({}).{}"), number.map("range({})".format))

    expr = st.recursive(leaf, grow, max_leaves=6)

    def statements(inner):
        body = st.lists(inner, min_size=1, max_size=3).map("".join)
        return st.one_of(
            st.tuples(expr, body).map(lambda t: f"{{% for x in {t[0]} %}}{t[1]}{{% endfor %}}"),
            st.tuples(expr, body, body).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% else %}}{t[2]}{{% endif %}}"),
            st.tuples(expr, body).map(lambda t: f"{{% set x = {t[0]} %}}{t[1]}"),
            body.map(lambda b: f"{{% macro m() %}}{b}{{% endmacro %}}{{{{ m() }}}}{{{{ m() }}}}"),
        )

    simple = st.one_of(text.map(lambda t: t[1:-1]), expr.map(lambda e: f"{{{{ {e} }}}}"))
    return st.recursive(simple, statements, max_leaves=5)


def test_random_templates_render_within_the_cap_or_are_refused_in_one_line():
    h = hypothesis()
    cap = TemplateLimits().cap(sum(len(m.role) + len(m.content) + 50 for m in CONV))

    @h.settings(
        max_examples=80, suppress_health_check=[h.HealthCheck.too_slow, h.HealthCheck.filter_too_much], **REPEATABLE
    )
    @h.given(grammar(h.strategies))
    def check(source):
        with template_limits_set(seconds=0.1), bounded(SECONDS, MIB):
            try:
                assert len(ChatTemplate("{% set x = 'ab' %}" + source).render(CONV)) <= cap
            except AttnlabError as e:
                one_line(str(e))

    check()
