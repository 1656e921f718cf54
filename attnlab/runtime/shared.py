"""Shared storage: every process of a run must see the run directory that rank 0 writes.

Rank 0 writes the checkpoints; every other process reads them to resume, and the run's tokenizer
to start. A node whose --out is a different folder (a local disk, a mount missing on that node)
would fail later, alone, while the others wait for it in a collective. So before anyone reads the
run, `check_shared` asks every process to read a file rank 0 has just written:

    rank 0: write PARENT/.attnlab-shared-NONCE holding NONCE (a random token: no stale file passes)
    all:    broadcast NONCE; read the file, retrying for up to `timeout` seconds (a network file
            system may show a new file late); all_gather what each one found
    all:    raise the same one line naming every process that could not read it
Every process reaches both collectives whatever it finds, so a node that cannot see the folder
makes every process stop with that line after at most `timeout` seconds, instead of hanging.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import torch.distributed as dist

from attnlab.errors import AttnlabError
from attnlab.io import write_text
from attnlab.runtime.distributed import Dist

# Seconds a process waits for rank 0's file to show (ATTNLAB_SHARED_TIMEOUT); NFS caches a folder's
# attributes for 30-60 s by default (acdirmin/acdirmax), and a new name is usually seen at once.
SHARED_TIMEOUT = 60.0
PROBE = ".attnlab-shared-"


def read_probe(path: Path, nonce: str, timeout: float) -> str | None:
    """None once `path` holds `nonce`; else what was wrong when `timeout` ran out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text(encoding="utf-8")
            if text == nonce:
                return None
            found = "another run's check file"
        except FileNotFoundError:
            found = "no such file"
        except OSError as e:
            found = f"{type(e).__name__}: {e.strerror or e}"
        if time.monotonic() >= deadline:
            return f"{found} after {timeout:.0f} s"
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def check_shared(d: Dist, out: Path, timeout: float | None = None) -> None:
    """Every process sees the folder that holds the run `out` as rank 0 does, or every process
    raises one line saying which cannot. A no-op in one process."""
    if not d.enabled:
        return
    timeout = float(os.environ.get("ATTNLAB_SHARED_TIMEOUT", SHARED_TIMEOUT)) if timeout is None else timeout
    folder = Path(out).absolute().parent  # the run itself may not exist yet (and is not ours to touch first)
    host = socket.gethostname()
    sent: list = [None, None, host]  # nonce, rank 0's error, rank 0's host
    if d.main:
        nonce = secrets.token_hex(8)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_text(folder / f"{PROBE}{nonce}", nonce)
            sent[0] = nonce
        except OSError as e:
            sent[1] = f"{type(e).__name__}: {e.strerror or e}"
    dist.broadcast_object_list(sent, src=0)
    nonce, error, first = sent
    if error is not None:
        raise AttnlabError(
            f"rank 0 on {first} cannot write into {folder} ({error}): the run directory must be "
            "on storage every process can write and read"
        )
    probe = folder / f"{PROBE}{nonce}"
    found = read_probe(probe, nonce, timeout)
    seen: list = [None] * d.world
    dist.all_gather_object(seen, (d.rank, host, found))
    if d.main:
        probe.unlink(missing_ok=True)
    blind = [f"rank {r} on {h}: {why}" for r, h, why in seen if why is not None]
    if blind:
        raise AttnlabError(
            f"{len(blind)} of {d.world} processes cannot read the file rank 0 on {first} wrote into "
            f"{folder} ({'; '.join(blind)}): the run directory must be on storage every node sees, "
            "at the same path; give --out a folder there"
        )
