"""Files, safely: atomic writes, JSON, safetensors, and the metrics log every run keeps.

Every file is written to a temporary name, flushed to disk and renamed into place, so a crash
mid-save leaves the previous version of the file whole. Nothing is pickled: tensors go to
safetensors, everything else to JSON, so reading a file never executes code from it. A full disk
is one line that names the file and says what was kept.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from attnlab.errors import AttnlabError


def cache_root() -> Path:
    """Where attnlab keeps what it can rebuild (token caches, generated corpora, measurements)."""
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp) and rename tmp over path (atomic on POSIX and Windows). tmp ends in path's suffix,
    for writers that check it (AOTInductor's packages must end in .pt2)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # on disk before it takes the old file's place
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:
        if not disk_full(e):
            raise
        size = tmp.stat().st_size if tmp.exists() else 0
        raise AttnlabError(disk_full_message(path, size)) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def disk_full(e: BaseException) -> bool:
    """An OSError for a full disk or quota, or safetensors' wrapping of one (it keeps only the text)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return "No space left on device" in str(e) or "Disk quota exceeded" in str(e)


def disk_full_message(path: Path, written: int) -> str:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    keep = f"the previous {path.name} is intact" if path.exists() else f"{path.name} was not written"
    return (f"disk full writing {path} ({mb(written)} written when space ran out, {mb(free)} free on that disk); "
            f"{keep}: free some space and run the command again")  # fmt: skip


def mb(n: int) -> str:
    """A size in the unit that reads best: 12.3 KB, 45.6 MB, 7.8 GB."""
    unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("bytes", 1)) if n >= s or s == 1)
    return f"{n / scale:.1f} {unit}" if scale > 1 else f"{n} bytes"


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2))


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise AttnlabError(f"{path} is corrupt ({e})") from None


def snapshot(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """t on the CPU, contiguous; with copy, never sharing memory with t."""
    return t.detach().to("cpu", copy=copy).contiguous()


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=metadata))


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a missing or broken file is a user error."""
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise AttnlabError(f"{path} is corrupt or truncated ({e})") from None


def read_metrics(path: Path, max_rows: int | None = None) -> list[dict]:
    """The rows of metrics.jsonl (none if it is missing), read line by line; a line cut short by a
    crash is skipped. With max_rows, a long run's training rows are thinned to about that many
    (every k-th), and every validation row is kept."""
    if not path.is_file():
        return []
    every = 1
    if max_rows is not None:
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        every = max(1, -(-lines // max_rows))
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and (n % every == 0 or "loss" not in row):  # not a training row: kept
                rows.append(row)
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the checkpoint we resume from, so curves do not double back."""
    rows = [r for r in read_metrics(path) if r["step"] <= step]
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
