"""Two "machines" on one: Linux network namespaces joined by a veth pair, and torchrun launched in them.

    with namespace_pair() as (a, b):       # skips the test where namespaces cannot be made
        procs = [launch(node, ...) for node in (a, b)]

Each namespace has only its loopback and its end of the veth, addressed in a /30 drawn from
198.18.0.0/15 (RFC 2544's range for test networks), so the two nodes reach each other over real TCP
and nothing else; no address or route outside the two namespaces is touched. Names are unique per
call (the process id and a random tag), and both namespaces (with the veth, which dies with them) are
deleted on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@dataclass
class Node:
    netns: str  # the namespace's name (ip netns)
    dev: str  # its end of the veth
    addr: str  # its address on the veth


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def can_make_namespaces() -> str | None:
    """None where this process can make network namespaces, else why not (one line)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2): cannot make network namespaces"
    if os.geteuid() != 0:
        return "not root: cannot make network namespaces"
    return None


@contextlib.contextmanager
def namespace_pair() -> Iterator[tuple[Node, Node]]:
    why = can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    third = secrets.randbelow(512)  # 198.18.0.0/15 holds 512 /24s: draw one, use its first /30
    base = f"198.{18 + third // 256}.{third % 256}"
    a, b = Node(f"attnlab-{tag}-a", f"va{tag}", f"{base}.1"), Node(f"attnlab-{tag}-b", f"vb{tag}", f"{base}.2")
    made: list[str] = []
    try:
        for node in (a, b):
            try:
                ip("netns", "add", node.netns)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot make a network namespace: {e.stderr.strip()}")
            made.append(node.netns)
        # Both ends are created inside their namespaces: the veth never appears in ours.
        ip("link", "add", a.dev, "netns", a.netns, "type", "veth", "peer", "name", b.dev, "netns", b.netns)
        for node in (a, b):
            ip("-n", node.netns, "addr", "add", f"{node.addr}/30", "dev", node.dev)
            ip("-n", node.netns, "link", "set", node.dev, "up")
            ip("-n", node.netns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def torchrun(
    node: Node,
    nodes: int,
    host: Node,
    port: int,
    args: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    mount_tmpfs: Path | None = None,
) -> subprocess.Popen:
    """`torchrun --nnodes NODES` inside `node`'s namespace, one process on it, meeting the others at
    `host`'s address over c10d; output to `log`. mount_tmpfs: this node sees an empty file system
    there (its own mount namespace), as a node without the shared storage would."""
    run = [
        TORCHRUN,
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{host.addr}:{port}",
        "--rdzv-id",
        f"test-{port}",
        # Which agent hosts the rendezvous store: torchrun guesses it by comparing the endpoint
        # with this machine's hostname, which both namespaces share.
        "--rdzv-conf",
        f"is_host={int(node is host)}",
        "--local-addr",
        node.addr,
        *args,
    ]
    if mount_tmpfs is not None:
        script = 'mount -t tmpfs none "$0" && exec "$@"'
        run = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(mount_tmpfs), *run]
    # Gloo finds its address from the hostname, which is the host's; name the veth instead. One thread
    # a process: torchrun sets it only when a node runs several.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": node.dev, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", node.netns, *run],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Every process's exit code; past `timeout` seconds, the ones still running (and their children:
    each was started as its own session) are killed and the test fails."""
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        pytest.fail(f"torchrun still running after {timeout:.0f} s")
    return codes
