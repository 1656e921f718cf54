"""/v1/embeddings through the real `openai` client against a live server over a character GPT, a
[CLS]-pooling classifier and a masked-LM encoder: float and base64 vectors equal the in-process
`attnlab.embed` within 1e-6 for a batch of texts of different lengths, token ids read as the text they
spell, dimensions, usage, /v1/models listing the encoders too, errors in OpenAI's shape, the key."""

from __future__ import annotations

import base64
from dataclasses import asdict

import numpy as np
import pytest
import torch

from attnlab import load
from attnlab.data import DataConfig
from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.engine.config import TrainConfig
from attnlab.io import write_json, write_text
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.runs.embed import embed, model_ids
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, fresh_dir
from attnlab.runs.marker import record
from attnlab.runs.weights import save_weights
from attnlab.serve.app import create_app, running
from attnlab.serve.guard import Access
from tests.conftest import extra, make_run, perturb, tiny_model

httpx = extra("httpx", "httpx (the client here) is a dev extra")
openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

WORDS = ["the", "cat", "sat", "on", "a", "mat", ".", "dog", "ran", "far"]
TEXTS = ["the cat", "a dog ran far on the mat . the cat sat", "on", "the dog sat on a mat ."]
KEY = "k" * 24


def encoder_run(out, cfg: EncoderConfig, kind: str):
    """An encoder run of task `kind` written as training writes one, its weights moved off their start."""
    torch.manual_seed(1)
    tok = WordTokenizer(WORDS)
    cfg.vocab_size = tok.vocab_size
    model = perturb(Encoder(cfg), 0.3)
    fresh_dir(out)
    record(out, CONFIG, WEIGHTS, TOKENIZER)
    task = {"kind": kind, "labels": ["no", "yes"]} if kind == "classify" else {"kind": kind}
    config = {"family": "encoder", "model": asdict(cfg), "task": task, "train": asdict(TrainConfig())}
    write_json(out / CONFIG, {**config, "data": asdict(DataConfig(tokenizer="word", vocab_size=tok.vocab_size))})
    save_weights(model, out / WEIGHTS, {"step": "0"})
    write_text(out / TOKENIZER, tok.to_json())
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings")
    size = dict(n_layer=2, n_head=2, d_model=32, context=24)
    return {
        "lm": make_run(root / "lm", tiny_model(context=48), CharTokenizer("abcdefghijklmnopqrstuvwxyz .")),
        "classifier": encoder_run(root / "classifier", EncoderConfig(**size, head="classify"), "classify"),
        "bert": encoder_run(root / "bert", EncoderConfig(**size, head="mlm", norm="post"), "mlm"),
    }


@pytest.fixture(scope="module")
def client(runs):
    with running(create_app(list(runs.values()))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def loaded(runs):
    return {name: load(path, "cpu") for name, path in runs.items()}


def vectors(response) -> torch.Tensor:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    rows = [
        np.frombuffer(base64.b64decode(d.embedding), "<f4") if isinstance(d.embedding, str) else d.embedding
        for d in response.data
    ]
    return torch.tensor(np.array(rows, dtype=np.float32))


@pytest.mark.parametrize("name", ["lm", "classifier", "bert"])
def test_float_and_base64_are_the_library_s_vectors(client, loaded, name):
    run = loaded[name]
    expected = embed(run, TEXTS)  # (4, 32): the family's default pooling
    for fmt in ("float", "base64", None):  # None: the client asks for base64 and decodes it itself
        kw = {} if fmt is None else {"encoding_format": fmt}
        r = client.embeddings.create(model=name, input=TEXTS, **kw)
        assert isinstance(r.data[0].embedding, str) == (fmt == "base64")
        got = vectors(r)
        assert got.shape == expected.shape and (got - expected).abs().max() < 1e-6, fmt
        assert r.model == name and r.object == "list" and r.data[0].object == "embedding"
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, model_ids(run, TEXTS)))
    lone = vectors(client.embeddings.create(model=name, input=TEXTS[2], extra_body={"encoding_format": None}))
    assert (lone[0] - expected[2]).abs().max() < 1e-6  # alone or beside longer texts: the same vector


def test_token_ids_read_as_the_text_they_spell_and_dimensions_cut(client, loaded):
    run = loaded["bert"]
    ids = [run.tokenizer.encode(t) for t in TEXTS]
    by_text = vectors(client.embeddings.create(model="bert", input=TEXTS, encoding_format="float"))
    by_ids = vectors(client.embeddings.create(model="bert", input=ids, encoding_format="float"))
    one = vectors(client.embeddings.create(model="bert", input=ids[1], encoding_format="float"))
    assert (by_ids - by_text).abs().max() < 1e-6 and (one[0] - by_text[1]).abs().max() < 1e-6
    short = vectors(client.embeddings.create(model="bert", input=TEXTS, dimensions=8, encoding_format="float"))
    assert short.shape == (4, 8) and (short - embed(run, TEXTS, dimensions=8)).abs().max() < 1e-6


def test_models_lists_the_encoders_beside_the_language_model(client):
    assert [m.id for m in client.models.list().data] == ["lm", "classifier", "bert"]
    assert client.models.retrieve("bert").id == "bert"


def test_errors_are_openai_s_error_object(client):
    cases = [
        (dict(model="nope", input="a"), openai.NotFoundError, "model_not_found", "the model 'nope' does not exist"),
        (dict(model="lm", input="a" * 60), openai.BadRequestError, "context_length_exceeded", "context is 48 tokens"),
        (dict(model="lm", input=["a", ""]), openai.BadRequestError, "invalid_value", "input"),
        (dict(model="bert", input=[[1, 999]]), openai.BadRequestError, "invalid_value", "token ids must be 0..14"),
        (
            dict(model="lm", input="a", extra_body={"pooling": "x"}),
            openai.BadRequestError,
            "unknown_parameter",
            "pooling",
        ),
        (
            dict(model="lm", input="a", dimensions=33),
            openai.BadRequestError,
            "invalid_value",
            "dimensions must be 1..32",
        ),
    ]
    cases.append(
        (
            dict(model="lm", input="a", encoding_format="int8"),
            openai.BadRequestError,
            "invalid_value",
            "'float' or 'base64'",
        )
    )
    for kw, error, code, words in cases:
        with pytest.raises(error) as e:
            client.embeddings.create(**{"encoding_format": "float", **kw})
        assert e.value.body["code"] == code and words in e.value.body["message"], e.value.body
        assert "\n" not in e.value.body["message"]


def test_the_key_guards_embeddings_as_every_route(runs):
    with running(create_app([runs["bert"]], access=Access(api_key=KEY))) as url:
        body = {"model": "bert", "input": "the cat"}
        assert httpx.post(f"{url}/v1/embeddings", json=body).status_code == 401
        ok = httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 32
