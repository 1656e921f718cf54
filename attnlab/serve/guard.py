"""What makes `attnlab serve` safe to expose: who may call it, from where, how much and how slowly.

Legend: the key = the API key a client sends as a Bearer token; Host = the HTTP Host header; a
stream = one sequence being generated (a request with n choices of p prompts is p x n streams).

- A key (`--api-key KEY`, or ATTNLAB_API_KEY): every request but /health and the explorer's static
  page must carry `Authorization: Bearer KEY` (compared in constant time), else 401. The page holds
  no data (a browser cannot send a header when it opens a URL); the calls it makes carry the key.
- `check_exposure`: a server bound to anything but loopback refuses to start without a key, unless
  told `--insecure-no-key`.
- The Host header must name this server (`allowed_hosts`: the loopback names and the bound host,
  unless `--allowed-hosts`): a loopback server that answers any Host can be reached from a web page
  through DNS rebinding (the attacker's name resolves to 127.0.0.1, the browser sends its Host).
- Request bodies over their limit get 413 from the Content-Length, before a byte is read (or as
  soon as a body sent without one passes it).
- Slow clients are dropped: the headers must arrive within `header_timeout` seconds of a
  request's first byte (or of the connection), the body within `body_timeout` of the headers
  (`timed_h11`, uvicorn's h11 protocol with those deadlines); idle keep-alive connections close after
  `keep_alive`; a header block over `max_header_bytes` is refused by h11.
- At most `max_streams` sequences are generated at once (429 beyond), each for at most
  `request_timeout` seconds.
- CORS is off (browsers refuse other sites' pages the answers) unless `--cors-origin` names some.

Errors are JSON: {"error": {"message", "type", "code"}} under /v1 (the OpenAI shape), {"error":
"one line"} for the explorer's routes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
import threading
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from attnlab.decoding.settings import PREFILL_BUDGET
from attnlab.decoding.speculate import Speculate
from attnlab.errors import AttnlabError

OPEN_PATHS = ("/health", "/", "/favicon.ico")  # no key needed: nothing in them but the static page
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass
class Access:
    """Who may call: the key, the Host names answered (None: any), the browser origins allowed."""

    api_key: str | None = None
    allowed_hosts: list[str] | None = None
    cors_origins: list[str] = field(default_factory=list)


@dataclass
class Limits:
    """How much a client may ask of the server, and how long it may take to ask."""

    max_streams: int = 32  # sequences generated at once over all requests (429 beyond)
    max_batch: int = 16  # sequences of one run decoded in one forward pass (more wait their turn)
    prefill: int = PREFILL_BUDGET  # prompt tokens prefilled together a turn (decoding/prefill.py; 0: alone)
    prefix_cache_mb: float = 0  # earlier prompts' keys kept for reuse (decoding/prefix_cache.py; 0: none)
    request_timeout: float = 300.0  # seconds a generation may run
    header_timeout: float = 10.0  # seconds to send a request's headers
    body_timeout: float = 30.0  # seconds to send its body, once the headers are in
    keep_alive: float = 5.0  # seconds an idle connection stays open
    max_header_bytes: int = 16_384
    speculate: Speculate | None = None  # a lone row's drafts checked in one pass (decoding/speculate.py)
    draft: str | None = None  # the draft model's run, for speculate draft or auto


# ---- start-up checks ---------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MIN_KEY_LENGTH = 16  # beyond loopback: a key a client on the network cannot guess in a few tries


def check_exposure(host: str, api_key: str | None, insecure_no_key: bool = False) -> None:
    """Refuse to listen beyond this machine without a key (unless told to), or with a key that is
    blank, holds spaces (no client can send it in a Bearer header) or is short enough to guess."""
    if api_key is not None and (not api_key.strip() or any(c.isspace() for c in api_key)):
        raise AttnlabError(
            "--api-key (or ATTNLAB_API_KEY) is blank or holds spaces: give a key of letters, digits "
            "and symbols, e.g. python -c 'import secrets; print(secrets.token_urlsafe())'"
        )
    if not is_loopback(host) and api_key and len(api_key) < MIN_KEY_LENGTH:
        raise AttnlabError(
            f"--host {host} lets other machines reach the server: its key must have at least "
            f"{MIN_KEY_LENGTH} characters, not {len(api_key)} (e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe())')"
        )
    if not is_loopback(host) and not api_key and not insecure_no_key:
        raise AttnlabError(
            f"--host {host} lets other machines reach the server: give it a key (--api-key KEY, or the "
            "ATTNLAB_API_KEY environment variable), or pass --insecure-no-key to serve without one"
        )


def allowed_hosts_for(host: str, extra: list[str] | None = None) -> list[str]:
    """The Host names a server bound to `host` answers: the loopback names, the bound host (for a
    wildcard, this machine's name and addresses) and `extra` ("*" in it: any)."""
    names = set(LOOPBACK_NAMES)
    if host in WILDCARDS:
        names.update({socket.gethostname(), socket.getfqdn()})
        try:
            names.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
        except OSError:  # a machine whose own name does not resolve
            pass
    else:
        names.add(host)
    names.update(extra or [])
    return sorted(n.lower() for n in names if n)


def host_allowed(header: bytes | None, allowed: list[str]) -> bool:
    """Whether a Host header (name or address, with or without a port) is one of `allowed`."""
    if "*" in allowed:
        return True
    if not header:
        return False
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):  # [::1]:8765
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        host = host.split(":")[0]
    return host in allowed


# ---- errors ------------------------------------------------------------------------------------------


def error_type(status: int) -> str:
    """OpenAI's error types by status."""
    if status >= 500:
        return "server_error"
    if status == 429:
        return "requests"
    if status == 401:
        return "authentication_error"
    return "invalid_request_error"


def error_response(
    path: str, status: int, message: str, code: str | None = None, param: str | None = None, headers=None
) -> JSONResponse:
    """The error as its route speaks: OpenAI's object under /v1, the explorer's one line elsewhere."""
    if path.startswith("/v1"):
        body = {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    else:
        body = {"error": message}
    return JSONResponse(body, status_code=status, headers=headers)


# ---- the middleware ----------------------------------------------------------------------------------


class HostCheck:
    """Answer only requests whose Host header names this server (400 otherwise)."""

    def __init__(self, app, allowed: list[str]):
        self.app, self.allowed = app, [h.lower() for h in allowed]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not host_allowed(dict(scope["headers"]).get(b"host"), self.allowed):
            message = "the Host header does not name this server (see attnlab serve --allowed-hosts)"
            return await error_response(scope["path"], 400, message, "invalid_host")(scope, receive, send)
        return await self.app(scope, receive, send)


class Gate:
    """The key (401 without it) and the body's size (413 past `limit_of(path)` bytes), both decided
    from the headers before the body is read."""

    def __init__(self, app, api_key: str | None, limit_of):
        self.app, self.limit_of = app, limit_of
        self.key = None if not api_key else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, headers = scope["path"], dict(scope["headers"])
        if self.key is not None and path not in OPEN_PATHS:
            given = headers.get(b"authorization")
            if given is None or not hmac.compare_digest(given, self.key):
                message = "no API key: send Authorization: Bearer KEY" if given is None else "incorrect API key"
                reply = error_response(path, 401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                return await reply(scope, receive, send)
        limit = self.limit_of(path)
        what = f"{limit / 1e6:g} MB" if limit >= 1e6 else f"{limit / 1e3:g} KB"
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > limit:
            return await error_response(path, 413, f"the request body is over {what}", "request_too_large")(
                scope, receive, send
            )
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise StarletteHTTPException(413, f"the request body is over {what}")
            return message

        return await self.app(scope, limited, send)


# ---- slow clients ------------------------------------------------------------------------------------


def timed_h11(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with read deadlines: a connection whose request headers are not in
    `header_timeout` seconds after its first byte (or after it opened), or whose body is not in
    `body_timeout` seconds after them, is closed. uvicorn alone waits for them forever."""

    class TimedH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._deadline: asyncio.TimerHandle | None = None
            self._arm(limits.header_timeout)

        def data_received(self, data: bytes) -> None:
            between = self.cycle is None or self.cycle.response_complete
            if between and self._deadline is None:  # a new request starts: its headers have a deadline
                self._arm(limits.header_timeout)
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # headers in: now the body's deadline, if a body is coming
                self._arm(limits.body_timeout) if self.cycle.more_body else self._disarm()
            elif self.cycle is not None and not self.cycle.more_body:
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if getattr(self, "_deadline", None) is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return TimedH11


# ---- streams -----------------------------------------------------------------------------------------


class StreamLimit:
    """How many sequences are being generated, against the limit (thread-safe)."""

    def __init__(self, limit: int):
        self.limit, self.active = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Reserve n streams; False (nothing reserved) when that would pass the limit."""
        with self._lock:
            if self.active + n > self.limit:
                return False
            self.active += n
            return True

    def give(self, n: int = 1) -> None:
        with self._lock:
            self.active -= n
