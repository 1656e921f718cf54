"""The OpenAI-compatible API, through the real `openai` client against a live uvicorn server on
127.0.0.1: models, completions and chat completions (streamed and not), n, stop texts, seeds,
logprobs, usage, echo, errors in OpenAI's shape, a seeded stream equal to `attnlab sample`, and 8
concurrent seeded requests each equal to its text alone."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from attnlab import load
from attnlab.cli.main import main
from attnlab.data.conversations import Message
from attnlab.decoding.sampling import generate_text
from attnlab.runs.adapted import run_template
from attnlab.serve.app import create_app, running
from tests.conftest import extra, flags, short_chat_lm

httpx = extra("httpx", "httpx (the client here, and TestClient's) is a dev extra")
openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

PLAIN = {"temperature": 1.0, "extra_body": {"ignore_eos": True}}  # a plain draw: what `attnlab sample` does


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return short_chat_lm(tmp_path_factory.mktemp("openai"))


@pytest.fixture(scope="module")
def server(run_dir):
    app = create_app([run_dir])
    with running(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def run(run_dir):
    return load(run_dir, "cpu")


def complete(client, prompt="def ", **kw):
    return client.completions.create(**{"model": "lm", "prompt": prompt, "max_tokens": 20, "seed": 7, **PLAIN, **kw})


def streamed(client, **kw) -> tuple[list, str]:
    chunks = list(
        client.completions.create(
            model="lm", prompt="def ", stream=True, **{"max_tokens": 20, "seed": 7, **PLAIN, **kw}
        )
    )
    return chunks, "".join(c.choices[0].text for c in chunks if c.choices)


# ---- models, completions ----------------------------------------------------------------------------------


def test_models_lists_every_gpt_run(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["lm"] and models[0].object == "model" and models[0].owned_by == "attnlab"
    assert client.models.retrieve("lm").id == "lm"


def test_a_completion_is_the_library_s_text_with_its_usage(client, run):
    r = complete(client, max_tokens=24)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == "lm" and r.created > 0
    (choice,) = r.choices
    drawn = []
    expected = generate_text(
        run.model, run.tokenizer, "def ", max_new_tokens=24, temperature=1.0, seed=7, on_token=drawn.append
    )[4:]
    assert choice.text == expected == run.tokenizer.decode(drawn) and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(run.tokenizer.encode("def "))
    assert r.usage.completion_tokens == len(drawn) == 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert complete(client, max_tokens=24, n=None, stop=None).choices[0].text == expected  # null: the default
    stop = expected[5:7]  # a stop text: the tokens that spell it were drawn, and count
    cut, counted = complete(client, max_tokens=24, stop=stop), []
    generate_text(
        run.model, run.tokenizer, "def ", max_new_tokens=24, temperature=1.0, seed=7, stop=stop, on_token=counted.append
    )
    assert cut.choices[0].text == expected[: expected.index(stop)] and cut.usage.completion_tokens == len(counted)


def test_a_seeded_stream_is_what_attnlab_sample_prints(client, run_dir, capsys):
    settings = {"max_tokens": 30, "top_p": 0.9, "extra_body": {"ignore_eos": True, "top_k": 12}}
    chunks, text = streamed(client, **settings)
    assert (
        main(
            [
                "sample",
                str(run_dir),
                *flags(
                    prompt="def ", seed=7, temperature="1.0", top_k=12, top_p="0.9", max_new_tokens=30, device="cpu"
                ),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "def " + text + "\n"
    assert len(chunks) > 1 and all(c.object == "text_completion" for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert (
        text == complete(client, max_tokens=30, top_p=0.9, extra_body={"ignore_eos": True, "top_k": 12}).choices[0].text
    )


def test_the_stream_is_server_sent_events_ending_in_done_with_usage(server):
    body = {
        "model": "lm",
        "prompt": "def ",
        "max_tokens": 5,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(f"{server[0]}/v1/completions", json=body, timeout=30)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])  # include_usage: null until the last chunk
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_n_choices_draw_with_seed_plus_i(client):
    r = complete(client, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [complete(client, seed=7 + i).choices[0].text for i in range(3)]
    assert r.usage.completion_tokens == 60 and r.usage.prompt_tokens == 4
    several = complete(client, prompt=["def ", "ret"], n=2)  # prompt i's choice j is number 2 i + j
    assert [c.text for c in several.choices[:2]] == [c.text for c in r.choices[:2]]
    assert several.choices[3].text == complete(client, prompt="ret", seed=8).choices[0].text


def test_stop_texts_single_and_listed_cut_the_text(client):
    full = complete(client, max_tokens=30).choices[0].text
    stop = full[6:8]
    cut = full[: full.index(stop)]
    for given in (stop, ["zzz", stop], [stop, "\x00"]):
        r = complete(client, max_tokens=30, stop=given)
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
        assert streamed(client, max_tokens=30, stop=given)[1] == cut
    assert complete(client, max_tokens=30, stop="never there").choices[0].finish_reason == "length"


def test_a_seed_gives_the_same_text_and_seeds_differ(client):
    texts = {s: complete(client, seed=s).choices[0].text for s in range(5)}
    assert complete(client, seed=3).choices[0].text == texts[3]
    assert len(set(texts.values())) > 2
    unseeded = {complete(client, seed=None).choices[0].text for _ in range(3)}
    assert len(unseeded) > 1


def test_logprobs_are_the_model_s_and_count_the_tokens(client, run):
    r = complete(client, logprobs=3, max_tokens=12)
    lp = r.choices[0].logprobs
    ids = run.tokenizer.encode("def " + r.choices[0].text)
    with torch.no_grad():
        model_lp = torch.log_softmax(run.model(torch.tensor([ids]))[0], -1)  # (T, V)
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens == 12
    for t, (token, value, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        row = model_lp[3 + t]
        assert token == run.tokenizer.decode([ids[4 + t]])
        assert value == pytest.approx(float(row[ids[4 + t]]), abs=1e-4)
        assert len(top) == 3 and max(top.values()) == pytest.approx(float(row.max()), abs=1e-4)
    assert lp.text_offset == list(range(12))
    echo = complete(client, logprobs=1, max_tokens=3, echo=True)
    assert echo.choices[0].text.startswith("def ") and echo.choices[0].logprobs.token_logprobs[0] is None
    assert len(echo.choices[0].logprobs.tokens) == 4 + 3


def test_chat_is_the_completion_of_the_run_s_template(client, run_dir):
    messages = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    r = client.chat.completions.create(model="lm", messages=messages, max_tokens=25, seed=7, **PLAIN)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    (choice,) = r.choices
    template = run_template(run_dir)
    prompt = template.prompt([Message(**m) for m in messages])
    assert prompt == "s:a\nu:b\na:" and template.end_of_turn() == "\n"
    plain = complete(client, prompt=prompt, max_tokens=25, seed=7, stop="\n")
    assert choice.message.role == "assistant" and choice.message.content == plain.choices[0].text
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens == len(prompt)  # a character tokenizer
    uncut = complete(client, prompt=prompt, max_tokens=25, seed=7).choices[0].text
    assert "\n" in uncut and choice.message.content == uncut[: uncut.index("\n")]  # the end of turn was drawn
    assert choice.finish_reason == "stop"
    stream = list(
        client.chat.completions.create(model="lm", messages=messages, max_tokens=25, seed=7, stream=True, **PLAIN)
    )
    assert all(c.object == "chat.completion.chunk" for c in stream) and stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == choice.message.content
    assert stream[-1].choices[0].finish_reason == choice.finish_reason
    with_lp = client.chat.completions.create(
        model="lm", messages=messages, max_tokens=5, seed=7, logprobs=True, top_logprobs=2, **PLAIN
    )
    content = with_lp.choices[0].logprobs.content
    assert len(content) == with_lp.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)


# ---- errors ---------------------------------------------------------------------------------------------


def expect(error_class, status: int, code: str, call) -> dict:
    with pytest.raises(error_class) as caught:
        call()
    body = caught.value.body
    assert caught.value.status_code == status and body["code"] == code, body
    assert {"message", "type", "code"} <= set(body) and "\n" not in body["message"]
    return body


def test_errors_are_openai_error_objects(client):
    body = expect(openai.NotFoundError, 404, "model_not_found", lambda: complete(client, model="nope"))
    assert "nope" in body["message"] and body["type"] == "invalid_request_error"
    body = expect(openai.BadRequestError, 400, "invalid_value", lambda: complete(client, temperature=5))
    assert body["param"] == "temperature"
    expect(openai.BadRequestError, 400, "invalid_value", lambda: complete(client, n=0))
    expect(openai.BadRequestError, 400, "invalid_value", lambda: complete(client, presence_penalty=1))
    body = expect(openai.BadRequestError, 400, "unknown_parameter", lambda: complete(client, extra_body={"foo": 1}))
    assert "foo" in body["message"]
    body = expect(openai.BadRequestError, 400, "context_length_exceeded", lambda: complete(client, prompt="x" * 40))
    assert body["message"] == "this model's context is 32 tokens, but the prompt takes 40 tokens; shorten it"
    body = expect(
        openai.BadRequestError, 400, "context_length_exceeded", lambda: complete(client, prompt=["x", "x" * 40])
    )
    assert "but prompt 1 (from 0) takes 40 tokens" in body["message"]
    chat = lambda **kw: client.chat.completions.create(model="lm", **kw)  # noqa: E731
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 20}]  # 28 characters
    body = expect(openai.BadRequestError, 400, "context_length_exceeded", lambda: chat(messages=system))
    took = int(body["message"].split(" take ")[1].split()[0])  # the template's markers counted: more than 28
    assert took > 32 and body["message"] == (
        f"this model's context is 32 tokens, but the messages take {took} "
        "tokens (the chat template included); shorten them or leave out "
        "earlier turns"
    )
    expect(openai.BadRequestError, 400, "invalid_value", lambda: chat(messages=[{"role": "tool", "content": "x"}]))
    expect(openai.BadRequestError, 400, "invalid_value", lambda: chat(messages=[]))
    expect(openai.NotFoundError, 404, "not_found", lambda: client.get("/nothing", cast_to=object))


# ---- batching through the server ------------------------------------------------------------------------


def test_eight_concurrent_seeded_streams_each_get_their_text_alone(client, server, run):
    """8 streamed requests at once with their own settings: each text is its seed's text alone
    (generate_text, one request, no batch), and the server decoded them together."""
    draws = [(1.0, 1.0, 0), (0.0, 1.0, 0), (0.7, 0.9, 0), (1.2, 1.0, 5)] * 2  # temperature, top_p, top_k
    settings = [
        dict(temperature=t, top_p=p, seed=s, extra_body={"ignore_eos": True, "top_k": k})
        for s, (t, p, k) in enumerate(draws)
    ]
    lengths = [40 + 3 * i for i in range(8)]  # past the context of 32: every row jumps ahead at its own step
    alone = [
        generate_text(
            run.model,
            run.tokenizer,
            "def ",
            max_new_tokens=n,
            temperature=kw["temperature"],
            top_k=kw["extra_body"]["top_k"] or None,
            top_p=kw["top_p"] if kw["top_p"] < 1 else None,
            seed=kw["seed"],
        )[4:]
        for n, kw in zip(lengths, settings)
    ]
    batcher = server[1].state.engines["lm"]
    before = dict(batcher.stats)
    start = threading.Barrier(8)

    def ask(i: int) -> str:
        start.wait()
        chunks = client.completions.create(model="lm", prompt="def ", stream=True, max_tokens=lengths[i], **settings[i])
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == alone
    rows = batcher.stats["batched rows"] - before.get("batched rows", 0)
    steps = batcher.stats["steps"] - before.get("steps", 0)
    assert rows > 2 * steps > 0  # several sequences per forward pass


def test_serve_compiled_decodes_a_lone_request_through_the_compiled_step(run_dir, client, compiled_steps):
    """create_app(compiled=True) (serve --compile): a request alone in the engine takes the compiled
    step (conftest's compiled_steps: no compilation), and its greedy completion is the one the server
    without it gives."""
    fed = compiled_steps
    want = complete(client, temperature=0.0).choices[0].text
    assert not fed  # the plain server has no compiled step
    app = create_app([run_dir], compiled=True)
    warmed = len(fed)
    assert warmed > 0  # the compiled steps were taken before the server listens (Engine.warm), not at a request
    with running(app) as url:
        fast = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert complete(fast, temperature=0.0).choices[0].text == want
    assert len(fed) - warmed >= 19  # each of the 20 tokens after the first
