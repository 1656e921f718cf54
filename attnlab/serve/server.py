"""Running an app: a socket bound (or one line saying why not), uvicorn's settings, and a server in a
background thread for notebooks and tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from attnlab.errors import AttnlabError
from attnlab.serve.guard import Limits, timed_h11


def server_config(app: FastAPI):
    """uvicorn's settings for the app: its read deadlines, keep-alive and header size (guard.Limits)."""
    limits: Limits = app.state.limits
    return uvicorn.Config(
        app,
        log_level="warning",
        http=timed_h11(limits),
        timeout_keep_alive=limits.keep_alive,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


@contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a background thread for the with-block (a notebook, a test); yields its URL.
    Port 0 takes a free port."""
    sock = listen(host, port)
    server = uvicorn.Server(server_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting; see its log")
            time.sleep(0.01)
        yield address(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or an AttnlabError that says why not (e.g. the port is taken)."""
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # that say they are TCP; with it on, every answer on a kept-alive connection waited 40 ms for an ACK.
    if not 0 <= port <= 65535:  # socket.bind's OverflowError otherwise
        raise AttnlabError(f"--port must be from 0 to 65535 (0: any free port), got {port}")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait for TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise AttnlabError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port") from None
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
