"""Running under `torchrun`: the process group, this process's rank, and collective helpers.

    torchrun --nproc-per-node 2 -m attnlab train lm --data stdlib --out runs/ddp

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with WORLD_SIZE 1 (or
unset) everything here is a no-op, so the same training loop serves one process and many.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnlab.errors import AttnlabError
from attnlab.runtime.device import pick_device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we created the process group, so we also tear it down

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0 alone writes files and prints."""
        return self.rank == 0


def world_size() -> int:
    """How many processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(device_name: str = "auto") -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes (NCCL on CUDA, Gloo on CPU) and pick this
    process's device: cuda:LOCAL_RANK on GPUs."""
    world = world_size()
    device = pick_device(device_name)
    if world == 1:
        return Dist(), device
    try:
        rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    except KeyError as e:
        raise AttnlabError(f"WORLD_SIZE is {world} but {e.args[0]} is not set: launch with torchrun") from None
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        except ValueError as e:  # e.g. MASTER_ADDR missing
            raise AttnlabError(f"cannot join the process group ({e}): launch with torchrun") from None
    return Dist(rank, world, local, owns), device


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def mean(d: Dist, value: float, device: torch.device) -> float:
    """The average of `value` over all processes."""
    if not d.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / d.world


def shutdown(d: Dist) -> None:
    if d.enabled and d.owns_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def main_first(d: Dist) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. writes a file); the others run it once it is done."""
    if not d.main:
        barrier(d)
    yield
    if d.main:
        barrier(d)
