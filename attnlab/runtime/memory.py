"""Will it fit? Memory estimates made before anything large is allocated.

A size that comes from outside (--context 100000000, --image-size 100000) must give one line
("needs ~51 GB; this machine has 24") before the allocation, not an allocator traceback or a
machine swapping itself to a halt. The estimates are rough on purpose and only refuse what
cannot fit in the whole memory of the device, so they never stop a run that would have worked.
"""

from __future__ import annotations

import os

import torch

from attnlab.errors import AttnlabError


def device_memory(device: torch.device | str = "cpu") -> int:
    """Bytes of memory the device has in all (a GPU's own memory, else the machine's)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound we can read
        return 1 << 62


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f}" if n < 10e9 else f"{n / 1e9:,.0f}"


def check_fits(need: int, what: str, advice: str, device: torch.device | str = "cpu") -> None:
    """One line, before allocating, if `need` bytes exceed the device's whole memory."""
    have = device_memory(device)
    if need > have:
        raise AttnlabError(f"{what} needs ~{gb(need)} GB; this machine has {gb(have)} GB: {advice}")
