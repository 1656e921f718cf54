"""Structured outputs through the engine and the OpenAI API: response_format json_object and json_schema
with the real `openai` client against a live server (a random-weight character GPT, so that only the
mask makes its text JSON): every reply parses and validates (jsonschema) greedy and sampled, alone and
batched, streamed or not; a seeded constrained request gets its lone text when batched beside others,
and free requests beside constrained ones are unchanged; a refused keyword is a 400 naming it."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor

import pytest

from attnlab import load
from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.rows import Ask
from attnlab.decoding.structured import compile
from attnlab.serve.openai_schema import BadField, CompletionRequest
from tests import test_openai_api
from tests.conftest import extra, make_run, tiny_model

openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the reference validator) comes with the dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

CHARS = "".join(chr(c) for c in range(32, 127))  # printable ASCII: every character JSON needs here
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "pos": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "ok": {"type": "boolean"}},
            "required": ["x", "ok"],
        },
    },
    "required": ["name", "age", "tags", "pos"],
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
STRICT = {**SCHEMA, "additionalProperties": False}  # what strict mode validates against
server, client = test_openai_api.server, test_openai_api.client  # its fixtures: a live server on our run_dir
FREE = {"temperature": 1.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-layer character GPT with random weights, context 256."""
    return make_run(tmp_path_factory.mktemp("structured") / "lm", tiny_model(context=256), CharTokenizer(CHARS))


def constrained(client, seed: int, temperature: float = 1.0, fmt=AS_SCHEMA, **kw):
    """A completion under `fmt`: (its text, finish_reason)."""
    r = client.completions.create(
        model="lm",
        prompt="Answer: ",
        max_tokens=200,
        seed=seed,
        temperature=temperature,
        extra_body={"response_format": fmt},
        **kw,
    )
    return r.choices[0].text, r.choices[0].finish_reason


def valid(text: str, schema: dict = STRICT) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_json_schema_reply_parses_and_validates(client, temperature):
    texts = set()
    for seed in range(3):
        text, finish = constrained(client, seed, temperature)
        assert finish == "stop", text  # the value closed, well before max_tokens
        valid(text)
        texts.add(text)
    assert len(texts) == (1 if temperature == 0 else 3)  # sampled seeds differ, greedy does not


def test_json_object_and_chat_and_a_stream(client):
    text, finish = constrained(client, 0, fmt={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(text), dict)
    r = client.chat.completions.create(
        model="lm",
        messages=[{"role": "user", "content": "Who?"}],
        max_tokens=200,
        seed=1,
        response_format=AS_SCHEMA,
    )
    assert r.choices[0].finish_reason == "stop"
    valid(r.choices[0].message.content)
    chunks = list(
        client.chat.completions.create(
            model="lm",
            messages=[{"role": "user", "content": "Who?"}],
            max_tokens=200,
            seed=1,
            response_format=AS_SCHEMA,
            stream=True,
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == r.choices[0].message.content and chunks[-1].choices[0].finish_reason == "stop"


def test_batched_requests_each_get_their_lone_text(client, server):
    """Constrained (greedy and sampled) and free requests at once: each the text it gets alone, every
    constrained one valid, and the engine did decode them together."""
    asks = [dict(seed=s, temperature=t) for s in range(4) for t in (0.0, 1.0)]

    def constrained_one(a):
        return constrained(client, a["seed"], a["temperature"])

    def free_one(seed):
        r = client.completions.create(model="lm", prompt="Answer: ", max_tokens=40, seed=seed, **FREE)
        return r.choices[0].text

    alone = [constrained_one(a) for a in asks]
    free_alone = [free_one(s) for s in range(4)]
    engine = server[1].state.engines["lm"]
    before = engine.stats["batched rows"]
    with ThreadPoolExecutor(len(asks) + 4) as pool:
        together = pool.map(constrained_one, asks)
        free_together = pool.map(free_one, range(4))
        together, free_together = list(together), list(free_together)
    assert engine.stats["batched rows"] > before  # they shared steps
    assert together == alone and free_together == free_alone
    for text, finish in together:
        assert finish == "stop"
        valid(text)


def test_a_refused_keyword_is_a_400_naming_it(client):
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as e:
        constrained(client, 0, fmt=fmt)
    assert e.value.status_code == 400
    error = e.value.body
    assert "'uniqueItems' at #/properties/a" in error["message"] and "\n" not in error["message"]
    assert error["param"] == "response_format"
    for _ in range(20):  # more than the server's streams: a refused request holds none
        with pytest.raises(openai.BadRequestError, match="response_format type 'xml'"):
            constrained(client, 0, fmt={"type": "xml"})
    assert constrained(client, 0)[1] == "stop"


def test_a_tokenizer_that_cannot_be_constrained_is_a_one_line_error():
    req = CompletionRequest(model="lm", response_format={"type": "json_object"})
    with pytest.raises(BadField, match="^structured outputs need a char or BPE tokenizer, not a word one$"):
        req.constraint(WordTokenizer.train(["a b c"], 10))


def test_the_engine_masks_a_lone_and_a_batched_row_alike(run_dir):
    """In process: the same seeded constrained rows, each alone, then all submitted at once (prefilled
    together, their first tokens drawn from the batch's logits, then batched steps): the same tokens."""
    run = load(run_dir, "cpu")
    grammar = compile(SCHEMA, run.tokenizer)
    draws = [Draw(t, k, None, seed) for seed in range(3) for t, k in ((0.0, None), (1.0, None), (0.8, 20))]
    prompts = [run.tokenizer.encode(f"Answer {'?' * i}: ") for i in range(len(draws))]  # not twins: prefilled
    engine = Engine(run.model, max_batch=16)
    alone = [[s.token for s in engine.generate(p, d, 200, matcher=grammar.matcher())] for p, d in zip(prompts, draws)]
    queues = [queue.SimpleQueue() for _ in draws]
    for i, (p, d, q) in enumerate(zip(prompts, draws, queues)):  # the thread starts at the last: admits all at once
        engine.submit(p, d, 200, q.put, Ask(matcher=grammar.matcher()), start=i == len(draws) - 1)
    together = [[step.token for step in iter(q.get, None)] for q in queues]
    engine.close(wait=5)
    assert engine.stats["prefill passes"] > 0 and engine.stats["batched rows"] > 0
    assert together == alone
    for tokens in together:
        valid(run.tokenizer.decode(tokens))
