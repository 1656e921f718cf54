"""A server safe to expose (serve/guard.py): the key, the refusal to start beyond loopback without
one, the Host check, body limits before the body is read, slow clients dropped while others are
served, the limit on concurrent streams, the time limit, and CORS only when asked for. Every server
here listens on 127.0.0.1; the start-up check is tested as a function and through the CLI, which
refuses before it binds anything."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from attnlab.cli.main import main
from attnlab.errors import AttnlabError
from attnlab.serve.app import create_app, running
from attnlab.serve.guard import Access, Limits, allowed_hosts_for, check_exposure, host_allowed
from tests.conftest import cli_lm, extra, nano_flags

httpx = extra("httpx", "httpx (the client here, and TestClient's) is a dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TINY = nano_flags(1, 2, 5)
KEY = "s3cret-key-0123456789"  # 21 characters: beyond loopback a key needs 16
FAST = Limits(header_timeout=0.6, body_timeout=0.6, max_streams=3, request_timeout=30)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return cli_lm(tmp_path_factory.mktemp("guard"), TINY)


@pytest.fixture(scope="module")
def server(run_dir):
    """A keyed server answering only loopback Host names, with short read deadlines and 3 streams."""
    app = create_app([run_dir], access=Access(KEY, allowed_hosts_for("127.0.0.1")), limits=FAST)
    with running(app) as url:
        yield url, app


def openai_client():
    """The openai client, a dev extra: the tests that talk through it skip without it."""
    return pytest.importorskip("openai", reason="the openai client is a dev extra: pip install -e .[dev]")


def post(url: str, path: str, body: dict, key: str | None = KEY, **kw) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(url + path, json=body, headers={**headers, **kw.pop("headers", {})}, timeout=30, **kw)


COMPLETION = {"model": "lm", "prompt": "def ", "max_tokens": 8, "seed": 1}


# ---- the key -----------------------------------------------------------------------------------------


def test_without_the_key_or_with_a_wrong_one_is_401(server):
    url, _ = server
    openai = openai_client()
    for key in (None, "wrong", KEY + "x", KEY[:-1]):
        r = post(url, "/v1/completions", COMPLETION, key=key)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key" and set(r.json()["error"]) >= {"message", "type"}
        explorer = httpx.get(f"{url}/api/runs", headers={} if key is None else {"Authorization": f"Bearer {key}"})
        assert explorer.status_code == 401 and isinstance(explorer.json()["error"], str)
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/openapi.json").status_code == 401
    assert post(url, "/v1/completions", COMPLETION).status_code == 200
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # the one open endpoint (and the static page)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    models = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0).models.list()
    assert [m.id for m in models.data] == ["lm"]


def test_beyond_loopback_the_server_refuses_to_start_without_a_key():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposure(host, None)  # this machine only: no key needed
    for host in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"):
        with pytest.raises(AttnlabError, match=f"--host {host} lets other machines.*--api-key.*--insecure-no-key"):
            check_exposure(host, None)
        check_exposure(host, KEY)
        check_exposure(host, None, insecure_no_key=True)


def test_the_cli_refuses_before_binding_and_reads_the_key_from_the_environment(run_dir, capsys, monkeypatch):
    """`attnlab serve --host 0.0.0.0` without a key: exit 2 with one line, nothing bound; with the key
    in ATTNLAB_API_KEY the check passes (serve itself is stubbed: no socket is opened here)."""
    monkeypatch.delenv("ATTNLAB_API_KEY", raising=False)
    assert main(["serve", str(run_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key" in err and "Traceback" not in err
    started = {}
    monkeypatch.setattr("attnlab.serve.app.serve", lambda runs, **kw: started.update(kw))
    monkeypatch.setenv("ATTNLAB_API_KEY", KEY)
    assert main(["serve", str(run_dir), "--host", "0.0.0.0", "--max-streams", "5"]) == 0
    assert started["api_key"] == KEY and started["host"] == "0.0.0.0" and started["limits"].max_streams == 5
    assert main(["serve", str(run_dir), "--max-batch", "0"]) == 2


def test_the_explorer_page_asks_for_the_key_once_and_sends_it(server):
    """In a real browser (skipped without Debian's chromium and Playwright): the page's first call gets
    401, the page asks for the key, and every call after carries it."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.is_file():
        pytest.skip(f"no {chromium} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    url, _ = server
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=args)
        page = browser.new_page()
        asked: list[str] = []
        statuses: list[int] = []
        page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept(KEY)))
        page.on("response", lambda response: statuses.append(response.status) if "/api/" in response.url else None)
        with page.expect_response(lambda r: r.url.endswith("/api/runs/lm/metrics")) as metrics:
            page.goto(f"{url}/")
        assert metrics.value.status == 200  # a call made after the key was given carries it
        sync_api.expect(page.locator("#run option")).to_have_count(1)
        browser.close()
    assert statuses.count(401) == 1 and statuses.count(200) >= 2
    assert len(asked) == 1 and "API key" in asked[0]


# ---- Host, CORS ----------------------------------------------------------------------------------------


def test_only_this_server_s_host_names_are_answered(server):
    url, _ = server
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 200
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        r = httpx.get(f"{url}/health", headers={"Host": host})
        assert r.status_code == 400 and "Host" in r.json()["error"]
    r = post(url, "/v1/completions", COMPLETION, headers={"Host": "rebound.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    assert host_allowed(b"[::1]:8765", ["::1"]) and host_allowed(b"::1", ["::1"]) and not host_allowed(None, ["x"])
    assert host_allowed(b"anything", ["*"]) and "myhost" in allowed_hosts_for("127.0.0.1", ["myhost"])


def test_cors_is_off_unless_an_origin_is_named(server, run_dir):
    url, _ = server
    origin = {"Origin": "http://page.example", "Authorization": f"Bearer {KEY}"}
    assert "access-control-allow-origin" not in httpx.get(f"{url}/v1/models", headers=origin).headers
    app = create_app([run_dir], access=Access(cors_origins=["http://page.example"]))
    with running(app) as other:
        assert httpx.get(f"{other}/v1/models", headers=origin).headers["access-control-allow-origin"] == (
            "http://page.example"
        )
        preflight = httpx.options(
            f"{other}/v1/completions",
            headers={"Origin": "http://page.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        other_page = httpx.get(f"{other}/v1/models", headers={"Origin": "http://elsewhere.example"})
        assert "access-control-allow-origin" not in other_page.headers


# ---- bodies and slow clients ------------------------------------------------------------------------------


def raw_request(url: str, head: str, body: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head.encode() + body)
    return sock


def reply(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data and b'"}' in data:
            break
    return data


def test_an_oversized_body_is_refused_before_it_is_read(server):
    """A request announcing 200 MB gets 413 at once, with only 10 bytes of it sent: the server read the
    headers only. A body sent without a length is cut off once it passes the limit."""
    url, _ = server
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n"
    )
    answer = reply(raw_request(url, head, b'{"model": '))  # a server that waited for the body: 10 s, TimeoutError
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
    chunked = post(
        url,
        "/v1/completions",
        {},
        content=(b"x" * 65536 for _ in range(40)),
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert post(url, "/api/generate", {"run": "lm", "prompt": "x" * 2_000_000}).status_code == 413


def test_slow_clients_are_dropped_and_do_not_block_others(server):
    """Six connections trickle their request (three the headers, three the body, a byte every 0.1 s);
    meanwhile ordinary requests are answered at once, and after the deadlines (0.6 s) every trickling
    connection has been closed by the server."""
    url, _ = server
    slow_head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    full_head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    socks = [raw_request(url, slow_head[:10]) for _ in range(3)] + [raw_request(url, full_head) for _ in range(3)]
    closed = [False] * len(socks)

    def trickle(i: int, sock: socket.socket) -> None:
        rest = (slow_head[10:] + "X-Slow: " + "a" * 100).encode() if i < 3 else b" " * 1000
        try:
            for byte in rest:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
        except OSError:  # the server closed it
            closed[i] = True

    threads = [threading.Thread(target=trickle, args=(i, s), daemon=True) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    for _ in range(3):  # served while the slow ones trickle
        assert post(url, "/v1/completions", COMPLETION).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200
    for t in threads:
        t.join(timeout=15)
    for i, sock in enumerate(socks):
        sock.settimeout(1)
        try:
            gone = closed[i] or sock.recv(1) == b""
        except TimeoutError:  # nothing came: still open
            gone = False
        except OSError:  # reset by the server
            gone = True
        assert gone, f"connection {i} is still open"


# ---- streams and time ---------------------------------------------------------------------------------------


def test_concurrent_streams_are_limited_and_freed(server):
    url, app = server
    openai = openai_client()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    streams = [
        client.completions.create(
            model="lm", prompt="def ", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        for _ in range(3)
    ]
    for s in streams:
        next(iter(s))  # each is generating
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model="lm", prompt="def ", max_tokens=4)
    assert caught.value.body["code"] == "rate_limit_exceeded"
    explorer = post(url, "/api/generate", {"run": "lm", "prompt": "def"})  # the explorer's streams count too
    assert explorer.status_code == 429 and "retry later" in explorer.json()["error"]
    too_many = post(url, "/v1/completions", {**COMPLETION, "n": 4})  # more than the server ever runs at once
    assert too_many.status_code == 400 and "at most 3" in too_many.json()["error"]["message"]
    for s in streams:
        s.close()  # the client goes away: its row is dropped and its stream freed
    deadline = time.monotonic() + 10
    while app.state.streams.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.streams.active == 0
    assert client.completions.create(model="lm", prompt="def ", max_tokens=4).choices[0].finish_reason


def test_a_generation_past_its_time_limit_is_stopped(run_dir):
    app = create_app([run_dir], limits=Limits(request_timeout=0.3))
    with running(app) as url:
        body = {**COMPLETION, "max_tokens": 2000, "ignore_eos": True}
        r = post(url, "/v1/completions", body, key=None)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        events = post(url, "/v1/completions", {**body, "stream": True}, key=None).text.strip().split("\n\n")
        assert '"code": "timeout"' in events[-1] and "[DONE]" not in events[-1]
        assert app.state.streams.active == 0
