"""Hostile requests to `attnlab serve`'s OpenAI API, /v1/chat/completions and /v1/completions (issue 55).

Every request here gets a 200 or a 4xx whose body is OpenAI's error object with a one-line message
(never a 500), within SECONDS seconds and MIB MiB of the process's peak memory (the server runs in
it), and the server logs no error. The classes: odd roles, content of every shape (text parts
accepted, others refused), huge or mistyped n, max_tokens, temperature, top_p, stop, logit_bias and
seed, malformed bodies (not JSON, not UTF-8, nested 100,000 deep), bodies of 50 MB and a million
messages (413 before they are read), stream with n > 1, and a client that disconnects mid-stream
(its rows cancelled, the others served). Hypothesis adds random request bodies.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from attnlab.serve.app import create_app, running
from attnlab.serve.guard import Limits
from tests.conftest import REPEATABLE, extra, short_chat_lm
from tests.hostile import bounded, one_line

httpx = extra("httpx", "httpx (the client here) is a dev extra")
UNIQUE = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

SECONDS, MIB = 10.0, 200  # per request; a refusal takes 5-50 ms (the 50 MB body: its sending)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HI = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = short_chat_lm(tmp_path_factory.mktemp("hostile_serve"), steps=2, repeats=100)
    app = create_app([run], limits=Limits(max_streams=8, request_timeout=60))
    with running(app) as url:
        yield url, app


@pytest.fixture
def quiet_log():
    """The server's log (uvicorn's, where a failing request's traceback goes): no error in it."""
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    assert not errors, f"the server logged: {[r.getMessage() for r in errors][:3]}"


def post(url: str, path: str, body, **kw) -> httpx.Response:
    """A request of `body`: JSON of a Python value, or these bytes (or text) as they are."""
    if isinstance(body, str | bytes):
        kw |= {"content": body, "headers": {"Content-Type": "application/json"}}
    else:
        kw |= {"json": body}
    return httpx.post(url + path, timeout=30, **kw)


def answered(r: httpx.Response, status: int | None = None) -> str | None:
    """A 200, or a 4xx in OpenAI's error shape with one line: its message (None for a 200)."""
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert status is None or r.status_code == status, (r.status_code, r.text[:300])
    if r.status_code == 200:  # a stream ends with [DONE], not with an error event
        assert not r.headers["content-type"].startswith("text/event-stream") or r.text.endswith("data: [DONE]\n\n")
        return None
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return one_line(error["message"])


def chat(**kw) -> dict:
    return {"model": "lm", "messages": [HI], "max_tokens": 3, **kw}


def raw(fields: str) -> str:
    """A chat body with JSON that Python's json writes but cannot hold in a dict (NaN, 1e400): as text."""
    return '{"model": "lm", "messages": [{"role": "user", "content": "hi"}], ' + fields + "}"


def says(message: str, **fields) -> tuple[str, dict | str | bytes, str]:
    """A chat case: (path, body: HI with `fields`, what the one line says)."""
    return CHAT, chat(**fields), message


def messages(*given, message: str) -> tuple[str, dict, str]:
    return says(message, messages=list(given))


def content(value, message: str) -> tuple[str, dict, str]:
    return messages({"role": "user", "content": value}, message=message)


def completion(message: str, **fields) -> tuple[str, dict, str]:
    return COMPLETIONS, {"model": "lm", "prompt": "a", "max_tokens": 1, **fields}, message


NUMBER = r"Input should be a finite number"
REFUSED = {  # name: (path, body, what the one line says)
    "role tool": messages({"role": "tool", "content": "x"}, message=r"a tool message needs the tool_call_id"),
    "role function": messages({"role": "function", "content": "x", "name": "f"}, message=r"deprecated: use 'tool'"),
    "role unknown": messages(
        {"role": "wizard\n" * 100, "content": "x"},
        message=r"role 'wizard\\nwiz.*\.\.\. is not one of system, developer, user, assistant",
    ),
    "role a number": messages({"role": 5, "content": "x"}, message=r"messages.0.role: Input should be a valid string"),
    "role missing": messages({"content": "x"}, message=r"messages.0.role: Field required"),
    "tool_calls": messages(
        HI,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        message=r"messages\[1\].tool_calls\[0\] must be \{\"id\"",
    ),
    "content a number": content(5, r"^messages.0.content: must be a text, a list of text parts or null, got int$"),
    "content an object": content({"text": "x"}, r"got dict$"),
    "content an image": content(
        [{"type": "image_url", "image_url": {"url": "x"}}],
        r"part 0: only parts of type 'text' are supported, got type 'image_url'",
    ),
    "content parts of junk": content([{"type": "text", "text": "a"}, 7], r"part 1: only parts of type 'text'.*got int"),
    "content part text a number": content([{"type": "text", "text": 1}], r"part 0: its text must be a text, got int"),
    "no messages": messages(message=r"messages: List should have at least 1 item"),
    "10^4 messages": messages(*[HI] * 10_000, message=r"messages: List should have at most 256 items"),
    "messages a text": says(r"messages: Input should be a valid list", messages="hi"),
    "n 10^9": says(r"n: Input should be less than or equal to 16", n=10**9),
    "n 0": says(r"n: Input should be greater than or equal to 1", n=0),
    "n over the streams": completion(r"asks for 32 sequences; the server generates at most 8", prompt=["a", "b"], n=16),
    "max_tokens 10^12": says(r"max_tokens: Input should be less than or equal to 2048", max_tokens=10**12),
    "max_tokens 10^400": says(r"max_tokens: Input should be less than or equal to 2048", max_tokens=10**400),
    "max_tokens -1": says(r"max_tokens: Input should be greater than or equal to 0", max_tokens=-1),
    "max_tokens 2.5": says(
        r"max_tokens: Input should be a valid integer, got a number with a fractional part", max_tokens=2.5
    ),
    "max_tokens a word": says(r"max_tokens: Input should be a valid integer", max_tokens="many"),
    "max_completion_tokens 10^12": says(r"less than or equal to 2048", max_completion_tokens=10**12),
    "temperature NaN": (CHAT, raw('"temperature": NaN'), rf"temperature: {NUMBER}"),
    "temperature Infinity": (CHAT, raw('"temperature": Infinity'), rf"temperature: {NUMBER}"),
    "temperature 1e400": (CHAT, raw('"temperature": 1e400'), rf"temperature: {NUMBER}"),
    "temperature -1": says(r"temperature: Input should be greater than or equal to 0", temperature=-1),
    "temperature 1e308": says(r"temperature: Input should be less than or equal to 2", temperature=1e308),
    "top_p 0": says(r"top_p: Input should be greater than 0", top_p=0),
    "top_p 1.5": says(r"top_p: Input should be less than or equal to 1", top_p=1.5),
    "top_p NaN": (CHAT, raw('"top_p": NaN'), rf"top_p: {NUMBER}"),
    "top_k -5": says(r"top_k: Input should be greater than or equal to -1", top_k=-5),
    "stop 10^5 texts": says(r"^stop takes at most 4 texts$", stop=["x"] * 100_000),
    "stop a number": says(r"^stop: must be a text or a list of up to 4 texts, got int$", stop=5),
    "stop too long": says(r"^stop: a stop text has at most 100 characters$", stop="x" * 1000),
    "logit_bias a bias": says(r"logit_bias is not supported \(only empty\)", logit_bias={"1": 5}),
    "logit_bias a word": says(r"logit_bias.x: Input should be a valid number", logit_bias={"x": "y"}),
    "logit_bias a list": says(r"logit_bias: Input should be a valid dictionary", logit_bias=[1, 2]),
    "logit_bias NaN": (CHAT, raw('"logit_bias": {"1": NaN}'), r"logit_bias is not supported"),
    "seed 10^30": says(r"seed: Input should be less than 4611686018427387904", seed=10**30),
    "seed -1": says(r"seed: Input should be greater than or equal to 0", seed=-1),
    "top_logprobs 10^9": says(
        r"top_logprobs: Input should be less than or equal to 20", logprobs=True, top_logprobs=10**9
    ),
    "presence_penalty NaN": (CHAT, raw('"presence_penalty": NaN'), r"presence_penalty is not supported"),
    "fifty unknown fields": says(
        r"^Unrecognized request argument supplied: 'x0\\n', .* and 45 more$", **{f"x{i}\n": 1 for i in range(50)}
    ),
    "tools": says(r"tools\[0\] must be \{\"type\": \"function\"", tools=[{"type": "function"}]),
    "response_format xml": says(r"^response_format type 'xml' is not one of text, ", response_format={"type": "xml"}),
    "response_format uniqueItems": says(
        r"^JSON-schema keyword 'uniqueItems' at #/properties/a is not supported",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE}},
    ),
    "an unknown model": says(r"^the model 'm\\nm\\n.*\.\.\. does not exist; serving: lm$", model="m\n" * 10_000),
    "the body a list": (CHAT, [1, 2], r"Input should be a valid dictionary"),
    "the body not JSON": (CHAT, "{not json", r"the body is not valid JSON \(Expecting property name"),
    "the body nested 10^5 deep": (CHAT, "[" * 100_000 + "]" * 100_000, r"the body's JSON nests too deeply"),
    "the body not UTF-8": (
        CHAT,
        b'{"model": "lm", "messages": [{"role": "user", "content": "\xff"}]}',
        r"the body is not UTF-8 \(byte 0xff at byte 59\)",
    ),
    "the body a 5,000-digit number": (CHAT, raw('"n": 1' + "0" * 5000), r"not valid JSON \(a number of over 4,300"),
    "prompt ids out of range": completion(r"prompt: token ids must be 0\.\.", prompt=[10**30]),
    "prompt 10^5 prompts": completion(r"prompt takes at most 16 prompts", prompt=["a"] * 100_000),
    "prompt an object": completion(
        r"^prompt: must be a text, a list of texts, token ids or .*, got dict$", prompt={"a": 1}
    ),
    "prompt ids of floats": completion(r"^prompt: must be a text, .* got list$", prompt=[1.5, 2]),
    "prompt too long": completion(r"^prompt: a prompt has at most 100,000 characters$", prompt=["a" * 100_001]),
    "best_of 10^9": completion(r"best_of is not supported", best_of=10**9),
    "prompt over the context": completion(
        r"this model's context is 32 tokens, but the prompt takes 99,000 tokens; shorten it$", prompt="a" * 99_000
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_hostile_request_is_a_4xx_with_one_line(server, quiet_log, case):
    path, body, says = REFUSED[case]
    with bounded(SECONDS, MIB):
        r = post(server[0], path, body)
    message = answered(r)
    assert r.status_code in (400, 404) and message is not None, r.text[:300]
    one_line(message, says)


ACCEPTED = {  # OpenAI's own forms, and what a lenient server reads as the client meant
    "role developer": chat(messages=[{"role": "developer", "content": "x"}, HI]),
    "a name field": chat(messages=[{**HI, "name": "bob"}]),
    "content null": chat(messages=[{"role": "user", "content": None}]),
    "content text parts": chat(messages=[{"role": "user", "content": [{"type": "text", "text": "h"}] * 2}]),
    "max_tokens 0": chat(max_tokens=0),
    "max_tokens 2.0": chat(max_tokens=2.0),
    "max_tokens as a text of digits": chat(max_tokens="2"),
    "top_k 10^12": chat(top_k=10**12),
    "seed 2^62 - 1": chat(seed=2**62 - 1, n=2),
    "n 8, as many as the server runs": chat(n=8),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_openai_s_own_forms_are_answered(server, quiet_log, case):
    with bounded(SECONDS, MIB):
        r = post(server[0], CHAT, ACCEPTED[case])
    assert answered(r, 200) is None and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_a_stream_with_n_choices_sends_each_to_its_end(server, quiet_log):
    with bounded(SECONDS, MIB):
        r = post(server[0], CHAT, chat(n=3, stream=True, max_tokens=4, ignore_eos=True))
    events = [e[6:] for e in r.text.split("\n\n") if e]
    chunks = [json.loads(e) for e in events[:-1]]
    assert answered(r, 200) is None and events[-1] == "[DONE]"
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1, 2}
    ends = {
        c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    }
    assert sorted(ends) == [0, 1, 2] and set(ends.values()) <= {"stop", "length"}  # (stop: the end of turn)


def chunks_of(body: bytes, size: int = 1 << 16):
    """`body` as a client sends it without a Content-Length: in chunks, as long as the server reads."""
    for i in range(0, len(body), size):
        yield body[i : i + size]


@pytest.mark.parametrize("what", ["a 50 MB text", "a million messages"])
def test_a_body_over_the_limit_is_413_before_it_is_read(server, quiet_log, what):
    one = json.dumps(HI).encode() + b","
    if what == "a million messages":
        body = b'{"model": "lm", "messages": [' + one * 1_000_000 + b'{"role": "user", "content": "x"}]}'
    else:
        body = json.dumps(chat(messages=[{"role": "user", "content": "a" * 50_000_000}])).encode()
    with bounded(SECONDS, MIB + len(body) // 2**20):  # (the body itself is this process's: the client's)
        try:
            r = post(server[0], CHAT, None, content=chunks_of(body), headers={"Content-Type": "application/json"})
        except httpx.TransportError:  # the server answered and closed while the client was still sending
            return
    assert answered(r, 413) == "the request body is over 1 MB"


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_client_that_disconnects_mid_stream_frees_its_rows_and_others_are_served(
    server, quiet_log, monkeypatch, path
):
    """Two choices of 2048 tokens streamed, the client gone after the first event: both rows leave the
    engine and their streams are given back while another request is answered. A completion ignoring
    the end-of-text token has no other way to end early: its rows were cut short, not finished."""
    url, app = server
    batcher, rows = app.state.engines["lm"], []
    submit = batcher.submit
    monkeypatch.setattr(batcher, "submit", lambda *a, **kw: rows.append(submit(*a, **kw)) or rows[-1])
    long = {"model": "lm", "n": 2, "stream": True, "max_tokens": 2048, "ignore_eos": True}
    long |= {"prompt": "def "} if path == COMPLETIONS else {"messages": [HI]}
    with bounded(SECONDS, MIB), httpx.Client(timeout=30) as client:
        with client.stream("POST", url + path, json=long) as gone:
            first = next(gone.iter_lines())  # it is generating: both rows are in the engine
            assert first.startswith("data: ") and len(rows) == 2
        other = client.post(url + CHAT, json=chat(max_tokens=4))  # the client has gone; another is served
        assert other.status_code == 200 and 1 <= other.json()["usage"]["completion_tokens"] <= 4
        deadline = time.monotonic() + 5
        while (app.state.streams.active or set(rows) & set(batcher.rows)) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert app.state.streams.active == 0 and not set(rows) & set(batcher.rows)
    if path == COMPLETIONS:
        assert all(r.cancelled and r.left > 0 for r in rows[:2]), [r.left for r in rows[:2]]


# ---- random request bodies: a 200 or a 4xx with one line, never a 500 -------------------------------------


def hypothesis():
    """hypothesis is a dev extra: without it the property-based test skips, the rest run."""
    return pytest.importorskip("hypothesis", reason="hypothesis is a dev extra: pip install -e .[dev]")


def bodies(st):
    """Chat and completion bodies: each field absent, one of its edge values, or any JSON value."""
    scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
    any_json = st.recursive(
        scalar,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=6,
    )
    number = st.sampled_from([0, 1, 2, -1, 2.5, 2**62, 10**12, "2", True, None, 1e308]) | st.floats()
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=4)})
    roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "x", ""])
    contents = st.text(max_size=8) | st.lists(part, max_size=2) | any_json
    message = st.fixed_dictionaries(
        {}, optional={"role": roles | any_json, "name": st.text(max_size=4), "content": contents}
    )
    texts = st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6)
    fields = {
        "model": st.sampled_from(["lm", "nope", ""]) | any_json,
        "messages": st.lists(message, max_size=3) | any_json,
        "prompt": st.text(max_size=8) | st.lists(st.integers(-2, 40), max_size=4) | any_json,
        "n": st.sampled_from([1, 2, 0, 17, 10**9, None]),
        "temperature": number,
        "top_p": number,
        "top_k": number,
        "seed": number,
        "stop": texts | any_json,
        "stream": st.booleans() | any_json,
        "logit_bias": any_json,
        "logprobs": st.booleans() | number,
        "top_logprobs": number,
        "echo": st.booleans(),
        "ignore_eos": st.booleans(),
        "stream_options": any_json,
        "response_format": any_json,
        "tools": any_json,
        "user": any_json,
        "other": any_json,
    }
    # max_tokens always given (a chat's default is 256 tokens): the valid ones short, so that 100 cases take seconds
    lengths = st.sampled_from([0, 1, 4, -1, 2.5, 10**12, "3", None]) | any_json
    return st.fixed_dictionaries({"max_tokens": lengths}, optional=fields)


def test_random_request_bodies_are_answered_or_refused_in_one_line(server, quiet_log):
    h = hypothesis()
    st = h.strategies

    @h.settings(max_examples=100, suppress_health_check=[h.HealthCheck.too_slow], **REPEATABLE)
    @h.given(bodies(st), st.sampled_from([CHAT, COMPLETIONS]))
    def check(body, path):
        with bounded(SECONDS, MIB):
            r = post(server[0], path, json.dumps(body, allow_nan=True))
            answered(r)

    check()
