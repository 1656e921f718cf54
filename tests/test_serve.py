"""`attnlab serve`: every endpoint's answers and errors, streamed generation equal to generate_text,
and 20 concurrent generations through a real server, each equal to its seed's single answer."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

import attnlab.serve.app
from attnlab import load
from attnlab.cli.main import main
from attnlab.decoding.sampling import generate_text, stream
from attnlab.errors import AttnlabError
from attnlab.interpret.views import token_labels, views
from attnlab.serve.app import create_app, finite, listen, running
from attnlab.serve.requests import MAX_INPUT_CHARS, MAX_NEW_TOKENS
from attnlab.tasks.image import load_image, predict_image
from attnlab.tasks.text_predict import predict
from attnlab.viz.curves import read_metrics
from attnlab.viz.html import views_json

httpx = pytest.importorskip("httpx", reason="httpx (the client here, and TestClient's) is a dev extra")
TestClient = pytest.importorskip("fastapi.testclient").TestClient
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TINY = ("--max-steps 5 --batch-size 4 --eval-interval 5 --eval-batches 1 --device cpu --n-layer 1 --d-model 32").split()
TASKS = {
    "lm": ["--preset", "gpt-nano", "--n-head", "2", "--context", "32", "--tokenizer", "char"],
    "classify": ["--data", "sentiment"],
    "tag": ["--data", "tagging"],
    "image": ["--data", "digits"],
}
SAMPLING = {"max_new_tokens": 24, "temperature": 1.0, "top_k": 20, "top_p": 0.95}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny run per kind the tests need, trained for 5 steps: {kind: path}."""
    root = tmp_path_factory.mktemp("serve")
    (root / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 200)
    paths = {}
    with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test cache
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        for kind, args in TASKS.items():
            data = ["--data", str(root / "corpus.txt")] if kind == "lm" else []
            paths[kind] = root / kind
            assert main(["train", kind, "--out", str(paths[kind]), *data, *args, *TINY]) == 0
    return paths


@pytest.fixture(scope="module")
def client(runs):
    return TestClient(create_app(list(runs.values())), raise_server_exceptions=False)


def png(size: int = 8, seed: int = 0) -> bytes:
    buffer = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((size, size)) * 255).astype("uint8")
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def lines(response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def expect_error(response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"], body
    for word in words:
        assert word in body["error"], body
    return body["error"]


# ---- runs and metrics ---------------------------------------------------------------------------


def test_runs_lists_each_run_with_its_size_and_settings(client, runs):
    listed = {r["name"]: r for r in client.get("/api/runs").json()}
    assert set(listed) == set(TASKS)
    assert {name: r["kind"] for name, r in listed.items()} == {k: k for k in TASKS}
    assert [n for n, r in listed.items() if r["generates"]] == ["lm"]
    assert {n for n, r in listed.items() if r["reads_images"]} == {n for n in TASKS if n in ("image", "caption")}
    for name, r in listed.items():
        run = load(runs[name], "cpu")
        assert r["parameters"] == sum(p.numel() for p in run.model.parameters())
        assert r["step"] == 5 and r["family"] == run.config["family"] and r["config"] == run.config
        assert r["path"] == str(runs[name].resolve())
        # what the page asks instead of the task's name: where inputs go, and what the run does with them
        assert (r["endpoint"], r["generates"], r["reads_images"]) == (
            run.task.endpoint,
            run.task.generates,
            run.task.reads_images,
        )


def test_runs_are_named_by_directory_duplicates_numbered(runs, tmp_path):
    other = tmp_path / "lm"
    shutil.copytree(runs["lm"], other)
    app = create_app([runs["lm"], other, runs["lm"]])  # the same path twice is served once
    names = [r["name"] for r in TestClient(app).get("/api/runs").json()]
    assert names == ["lm", "lm-2"]


def test_a_run_that_fails_to_load_stops_the_server_naming_it(runs, tmp_path):
    with pytest.raises(AttnlabError, match=f"cannot serve {tmp_path / 'missing'}: run directory not found"):
        create_app([runs["lm"], tmp_path / "missing"])
    broken = tmp_path / "broken"
    shutil.copytree(runs["lm"], broken)
    (broken / "model.safetensors").write_bytes(b"cut short")
    with pytest.raises(AttnlabError, match=f"cannot serve {broken}"):
        create_app([broken])
    with pytest.raises(AttnlabError, match="at least one run"):
        create_app([])


def test_a_port_in_use_is_one_line():
    with listen("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        taken.listen()
        with pytest.raises(AttnlabError, match=f"cannot listen on 127.0.0.1:{port}: .*choose another --port"):
            listen("127.0.0.1", port)


def test_answers_on_a_kept_alive_connection_wait_for_nothing(runs, monkeypatch):
    """Nagle's algorithm is off on the server's connections: listen() makes a socket that says it is
    TCP, so asyncio sets TCP_NODELAY on each connection. Before, every answer after the first on a
    kept-alive connection waited for the client's delayed ACK: 40 ms each, on Linux (measured in
    benchmarks, not here: the test reads the connection's socket option)."""
    with listen("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
    nodelay, real = [], asyncio.base_events._set_nodelay

    def recorded(sock):  # asyncio calls it on each new connection's socket
        real(sock)
        nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(asyncio.base_events, "_set_nodelay", recorded)
    with running(create_app([runs["lm"]])) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = socket.create_connection((host, int(port)))
        for _ in range(7):
            conn.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while not answer.endswith(b"]"):
                answer += conn.recv(65536)
        conn.close()
    assert nodelay and all(nodelay), nodelay  # the connection's socket: TCP_NODELAY on


def test_metrics_are_the_rows_of_metrics_jsonl(client, runs):
    rows = client.get("/api/runs/lm/metrics").json()
    assert rows == read_metrics(runs["lm"] / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5] and any("val_loss" in r for r in rows)
    assert finite({"step": 3, "loss": float("nan"), "lr": float("inf")}) == {"step": 3, "loss": None, "lr": None}
    expect_error(client.get("/api/runs/nope/metrics"), 404, "unknown run 'nope'", "lm")


# ---- generate -----------------------------------------------------------------------------------


def test_generate_streams_the_text_generate_text_returns(client, runs):
    run = load(runs["lm"], "cpu")
    prompt = "def add("
    request = {"run": "lm", "prompt": prompt, "seed": 7, **SAMPLING}
    with client.stream("POST", "/api/generate", json=request) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
        got = [json.loads(line) for line in response.iter_lines() if line]
    pieces, (last,) = got[:-1], got[-1:]
    assert len(pieces) == SAMPLING["max_new_tokens"] and all(set(p) == {"text"} for p in pieces)
    expected = generate_text(run.model, run.tokenizer, prompt, seed=7, **SAMPLING)[len(prompt) :]
    assert "".join(p["text"] for p in pieces) == expected
    assert last["done"] is True and last["tokens"] == len(pieces) and last["seed"] == 7 and last["seconds"] > 0
    stop = expected[3:5]  # text it will generate
    got = lines(client.post("/api/generate", json={**request, "stop": stop}))
    with_stop = generate_text(run.model, run.tokenizer, prompt, seed=7, stop=stop, **SAMPLING)[len(prompt) :]
    assert "".join(line.get("text", "") for line in got) == with_stop and len(with_stop) < len(expected)


def test_generate_with_attention_sends_each_tokens_row_and_the_same_text(client, runs):
    """Each piece comes with the attention of the query that produced it: one row per layer over the
    tokens before it, equal to the last row of the model's own attention on that text."""
    run = load(runs["lm"], "cpu")
    prompt, request = "def add(", {"run": "lm", "prompt": "def add(", "seed": 7, **SAMPLING}
    plain = lines(client.post("/api/generate", json=request))
    got = lines(client.post("/api/generate", json={**request, "attention": True}))
    head, pieces, last = got[0], got[1:-1], got[-1]
    assert head == {"prompt_tokens": token_labels(run.tokenizer, run.tokenizer.encode(prompt))}
    assert [p["text"] for p in pieces] == [p["text"] for p in plain[:-1]] and last["tokens"] == len(pieces)
    ids = run.tokenizer.encode(prompt)
    for p, token in zip(pieces, stream(run.model, ids, seed=7, **SAMPLING)):
        expected = [w[0, :, -1].mean(0) for w in run.model.attention(torch.tensor([ids]))]  # (T,) per layer
        assert len(p["attention"]) == len(expected) and len(p["attention"][0]) == len(ids)
        for row, want in zip(p["attention"], expected):
            assert torch.allclose(torch.tensor(row), want, atol=2e-3)
        assert p["tokens"] == token_labels(run.tokenizer, [token])
        ids = [*ids, token]


def test_inspect_answers_the_library_s_numbers(client, runs):
    from attnlab.interpret.report import inspect

    run = load(runs["lm"], "cpu")
    for what in ("lens", "heads", "ablate", "rollout"):
        answer = client.post("/api/inspect", json={"run": "lm", "text": "def add(a", "what": what}).json()
        assert answer == json.loads(json.dumps(inspect(run, "def add(a", what))), what
    rollout = client.post("/api/inspect", json={"run": "classify", "text": "a fine film", "what": "rollout"}).json()
    assert rollout["views"][0]["name"] == "self-attention rollout"
    expect_error(client.post("/api/inspect", json={"run": "lm", "text": "x", "what": "lens"}), 400, "two tokens")
    expect_error(client.post("/api/inspect", json={"run": "lm", "text": "ab", "what": "x"}), 422, "what")
    expect_error(
        client.post("/api/inspect", json={"run": "classify", "text": "ab", "what": "lens"}), 400, "language-model run"
    )
    expect_error(client.post("/api/inspect", json={"run": "image", "text": "ab", "what": "rollout"}), 400, "image")


def test_generate_without_a_seed_returns_the_one_it_drew(client):
    first = lines(client.post("/api/generate", json={"run": "lm", "prompt": "def", **SAMPLING}))
    seed = first[-1]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**53
    again = lines(client.post("/api/generate", json={"run": "lm", "prompt": "def", "seed": seed, **SAMPLING}))
    assert again[:-1] == first[:-1] and again[-1]["seed"] == seed


def test_generate_rejects_bad_requests_with_one_line(client):
    post = lambda **body: client.post("/api/generate", json={"run": "lm", **body})
    expect_error(post(prompt="x" * (MAX_INPUT_CHARS + 1)), 422, "prompt", f"at most {MAX_INPUT_CHARS} characters")
    expect_error(post(max_new_tokens=MAX_NEW_TOKENS + 1), 422, "max_new_tokens", str(MAX_NEW_TOKENS))
    expect_error(post(temperature=-1), 422, "temperature")
    expect_error(post(top_p=0), 422, "top_p")
    expect_error(post(top_k=0), 422, "top_k")
    expect_error(client.post("/api/generate", json={"prompt": "x"}), 422, "run: Field required")
    bad_json = client.post("/api/generate", content=b'{"run": "lm",', headers={"content-type": "application/json"})
    expect_error(bad_json, 422, "not valid JSON")
    expect_error(client.post("/api/generate", json={"run": "nope"}), 404, "unknown run")
    expect_error(client.post("/api/generate", json={"run": "classify"}), 400, "classifier run", "/api/predict")
    expect_error(client.post("/api/generate", json={"run": "image"}), 400, "image run", "/api/predict_image")


def test_an_error_midway_is_the_last_line_and_before_the_first_piece_a_status(client, monkeypatch):
    def failing(model, tokenizer, prompt, *args, **kw):
        yield "a"
        raise RuntimeError("the model fell over\nwith a second line")

    monkeypatch.setattr(attnlab.serve.app, "stream_text", failing)
    response = client.post("/api/generate", json={"run": "lm", "seed": 1})
    assert response.status_code == 200
    assert lines(response) == [{"text": "a"}, {"error": "the model fell over"}]

    def refusing(*args, **kw):
        raise AttnlabError("no tokens to start from")
        yield  # a generator, as stream_text is

    monkeypatch.setattr(attnlab.serve.app, "stream_text", refusing)
    expect_error(client.post("/api/generate", json={"run": "lm"}), 400, "no tokens to start from")


def test_twenty_concurrent_generations_each_equal_their_seed_alone(runs):
    """Through a real uvicorn server: 20 requests at once, each seed's text as when it runs alone,
    so no request sees another's random state (or anything else of another's)."""
    run = load(runs["lm"], "cpu")
    seeds = range(20)
    alone = {s: generate_text(run.model, run.tokenizer, "def ", seed=s, **SAMPLING)[4:] for s in seeds}
    assert len(set(alone.values())) > 10  # the seeds matter, so a mix-up would show
    start = threading.Barrier(len(seeds))

    def ask(url: str, seed: int) -> tuple[str, float, float]:
        start.wait()
        t0 = time.perf_counter()
        body = {"run": "lm", "prompt": "def ", "seed": seed, **SAMPLING}
        response = httpx.post(f"{url}/api/generate", json=body, timeout=60)
        assert response.status_code == 200, response.text
        got = lines(response)
        assert got[-1]["done"] and got[-1]["seed"] == seed
        return "".join(line["text"] for line in got[:-1]), t0, time.perf_counter()

    with running(create_app([runs["lm"]])) as url, ThreadPoolExecutor(len(seeds)) as pool:
        answers = dict(zip(seeds, pool.map(lambda s: ask(url, s), seeds)))
    assert {s: text for s, (text, _, _) in answers.items()} == alone
    intervals = [(t0, t1) for _, t0, t1 in answers.values()]
    assert max(sum(t0 <= t < t1 for t0, t1 in intervals) for t, _ in intervals) >= 2  # they did overlap


# ---- predict, images, attention ---------------------------------------------------------------------


def test_predict_gives_the_library_s_answer(client, runs):
    text = "a wonderful film with a dull ending"
    answer = client.post("/api/predict", json={"run": "classify", "text": text}).json()
    expected = predict(load(runs["classify"], "cpu"), text)
    assert answer["kind"] == "classify" and answer["label"] == expected["label"]
    assert answer["probabilities"] == pytest.approx(expected["probabilities"])
    assert sum(answer["probabilities"].values()) == pytest.approx(1, abs=1e-5)
    tagged = client.post("/api/predict", json={"run": "tag", "text": "the dog runs fast"}).json()
    assert tagged["kind"] == "tag" and [t["token"] for t in tagged["tokens"]] == ["the", "dog", "runs", "fast"]
    assert all(t["tag"] in load(runs["tag"], "cpu").config["task"]["labels"] for t in tagged["tokens"])


def test_predict_rejects_the_wrong_run_and_long_text(client):
    post = lambda **body: client.post("/api/predict", json=body)
    expect_error(post(run="lm", text="def"), 400, "language-model run", "/api/generate")
    expect_error(post(run="image", text="x"), 400, "/api/predict_image")
    expect_error(post(run="nope", text="x"), 404, "unknown run")
    expect_error(post(run="classify", text="x" * (MAX_INPUT_CHARS + 1)), 422, "text", str(MAX_INPUT_CHARS))
    expect_error(post(run="classify"), 422, "text: Field required")


def test_predict_image_labels_an_upload_with_its_cls_attention(client, runs, tmp_path):
    run = load(runs["image"], "cpu")
    (tmp_path / "digit.png").write_bytes(png())
    expected = predict_image(run, tmp_path / "digit.png", top=3)
    answer = client.post("/api/predict_image", data={"run": "image"}, files={"image": ("digit.png", png())}).json()
    assert [t["label"] for t in answer["top"]] == [t["label"] for t in expected["top"]]
    assert [t["probability"] for t in answer["top"]] == pytest.approx([t["probability"] for t in expected["top"]])
    assert len(answer["top"]) == 3 and answer["image"] == "digit.png"
    rows, cols = run.model.cfg.grid
    weights = np.array(answer["attention"]["weights"])  # (L, H, rows, cols): [CLS]'s row over the patches
    assert answer["attention"]["grid"] == [rows, cols]
    assert weights.shape == (run.model.cfg.n_layer, run.model.cfg.n_head, rows, cols)
    x = torch.from_numpy(load_image(run, tmp_path / "digit.png"))[None]  # (1, C, H, W)
    cls_row = torch.stack([w[0, :, 0, 1:] for w in run.model.attention(x)])  # (L, H, patches)
    np.testing.assert_allclose(weights.reshape(cls_row.shape), cls_row.numpy(), atol=1e-6)


def test_predict_image_errors(client, monkeypatch):
    image = png()
    upload = lambda run="image", data=image: client.post(
        "/api/predict_image", data={"run": run}, files={"image": ("mine.png", data)}
    )
    error = expect_error(upload(data=b"not an image"), 400, "mine.png", "cannot identify image file")
    assert "/tmp" not in error  # the user's file name, not the server's temporary path
    expect_error(upload(run="classify"), 400, "classifier run", "/api/predict")
    expect_error(upload(run="nope"), 404, "unknown run")
    expect_error(client.post("/api/predict_image", data={"run": "image"}), 422, "image: Field required")
    monkeypatch.setattr(attnlab.serve.app, "MAX_IMAGE_BYTES", 100)
    expect_error(upload(), 413, "over")


def test_attention_is_views_json_of_the_library_s_views(client, runs):
    for name, text in [("lm", "def add(a"), ("classify", "a fine film")]:
        answer = client.post("/api/attention", json={"run": name, "text": text}).json()
        expected = views_json(views(load(runs[name], "cpu"), text))
        assert answer == expected and answer["views"][0]["name"] == "self-attention"
    expect_error(client.post("/api/attention", json={"run": "image", "text": "x"}), 400, "/api/predict_image")
    expect_error(client.post("/api/attention", json={"run": "lm", "text": ""}), 400, "no tokens")
    expect_error(client.post("/api/attention", json={"run": "lm", "text": "x" * 2001}), 422, "at most 2000")
    expect_error(client.post("/api/attention", json={"run": "nope", "text": "x"}), 404, "unknown run")


# ---- the server itself -------------------------------------------------------------------------------


def test_an_unexpected_error_is_a_500_and_the_server_goes_on(client, monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(attnlab.serve.app, "predict", broken)
    expect_error(client.post("/api/predict", json={"run": "classify", "text": "x"}), 500, "RuntimeError: a bug")
    monkeypatch.undo()
    assert client.post("/api/predict", json={"run": "classify", "text": "x"}).status_code == 200
    expect_error(client.get("/api/nothing"), 404, "Not Found")
    expect_error(client.get("/api/generate"), 405)


def test_the_page_is_self_contained_and_has_its_hooks(client, tmp_path):
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    for reference in ("http://", "https://", "//cdn", "<link", "@import", "url("):
        assert reference not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    for hook in ("run", "prompt", "go", "output", "attention-go", "view", "layer", "head", "enlarged", "curve"):
        assert f'id="{hook}"' in page
    assert f'maxlength="{MAX_INPUT_CHARS}"' in page and f'max="{MAX_NEW_TOKENS}"' in page
    if shutil.which("node"):
        (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
        (tmp_path / "page.js").write_text(script)
        result = subprocess.run(["node", "--check", str(tmp_path / "page.js")], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_openapi_documents_the_requests(client):
    schema = client.get("/openapi.json").json()
    assert {
        "/api/runs",
        "/api/runs/{name}/metrics",
        "/api/generate",
        "/api/predict",
        "/api/predict_image",
        "/api/attention",
    } <= set(schema["paths"])
    generate = schema["components"]["schemas"]["GenerateRequest"]["properties"]
    assert generate["prompt"]["maxLength"] == MAX_INPUT_CHARS
    assert generate["max_new_tokens"]["maximum"] == MAX_NEW_TOKENS
