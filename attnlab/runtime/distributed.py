"""Running under `torchrun`: the process group, this process's rank, and collective helpers.

    torchrun --nproc-per-node 2 -m attnlab train lm --data stdlib --out runs/ddp

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with WORLD_SIZE 1 (or
unset) everything here is a no-op, so the same training loop serves one process and many. Under
`--max-restarts N` it starts the whole group again after a failure and counts the restarts in
TORCHELASTIC_RESTART_COUNT (`restarts()`): the engine then resumes the run from its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

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


# Every process joins within this many seconds (ATTNLAB_JOIN_TIMEOUT) or none goes on: a process that
# stopped before it joined (its node could not read the run, say) otherwise keeps the others waiting
# for torch's 30 minutes. Once joined, collectives keep torch's default timeout (long steps are fine).
JOIN_TIMEOUT = 300.0


def restarts() -> int:
    """How many times torchrun (--max-restarts) has started this node's processes again after a failure."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def restarted(d: Dist) -> bool:
    """Whether torchrun started this group again. Asked of every process: only the node whose process
    failed counts a restart; the other nodes start theirs again as a change of membership, at 0."""
    if not d.enabled:
        return restarts() > 0
    t = torch.tensor([restarts()], dtype=torch.int64)  # gloo or NCCL: NCCL needs it on the device
    t = t.cuda() if dist.get_backend() == "nccl" else t
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item()) > 0


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
        join = float(os.environ.get("ATTNLAB_JOIN_TIMEOUT", JOIN_TIMEOUT))
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=join))
        except ValueError as e:  # e.g. MASTER_ADDR missing
            raise AttnlabError(f"cannot join the process group ({e}): launch with torchrun") from None
        except dist.DistError as e:  # a process never came (its own error is in its node's log), or no master
            raise AttnlabError(
                f"rank {rank} could not join the other {world - 1} processes within {join:.0f} s "
                f"(ATTNLAB_JOIN_TIMEOUT): one stopped before it joined (see its node's log) or "
                f"MASTER_ADDR is out of reach ({str(e).splitlines()[0]})"
            ) from None
        steps = (default_pg_nccl_timeout if device.type == "cuda" else None) or default_pg_timeout
        dist.distributed_c10d._set_pg_timeout(steps)  # torch's own, for the steps
        if rank == 0 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0 and shared_store():
            warnings.warn(
                "torchrun --max-restarts: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun, or a "
                "restarted group reads the failed one's addresses from torchrun's store and cannot "
                "join (pytorch/pytorch#135712)",
                stacklevel=2,
            )
    return Dist(rank, world, local, owns), device


def shared_store() -> bool:
    """torchrun's agent keeps the store the processes meet in (c10d rendezvous, torch >= 2.5), and
    keeps it across restarts, with the keys of the attempt before."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


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
