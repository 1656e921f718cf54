"""Files, safely: atomic writes, JSON, safetensors, and the metrics log every run keeps.

Every file is written to a temporary name, flushed to disk and renamed into place, so a crash
mid-save leaves the previous version of the file whole; a folder built for the cache (a converted
model) likewise appears at its name only whole (`build_folder`). Nothing is pickled: tensors go to
safetensors, everything else to JSON, so reading a file never executes code from it. A full disk
is one line that names the file and says what was kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from attnlab.errors import AttnlabError

if TYPE_CHECKING:  # tensors are only named here: `attnlab runs` and --help read files without torch
    import torch


def cache_root() -> Path:
    """Where attnlab keeps what it can rebuild (token caches, generated corpora, measurements)."""
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


# A folder build_folder is building: .NAME.tmp-PID-RANDOM beside its final name (never read as one).
BUILDING = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")
STALE_AFTER = 24 * 3600  # seconds: a temporary folder untouched this long is a leftover, whatever its PID says


def build_folder(final: Path, build: Callable[[Path], object], ready: Callable[[Path], bool]) -> Path:
    """`final`, built once and never seen half-built. If ready(final) it is returned as it is; else
    build(tmp) writes a temporary sibling, renamed to `final` only when build returns and removed if
    it raises. What a killed build leaves is at no final name, and a later call removes it (its
    process is gone). Two processes building `final` at once: the first rename wins, both return it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(final.parent)
    if ready(final):
        return final
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        build(tmp)
        _sync_folder(tmp)
        _rename_into_place(tmp, final, ready)
    finally:
        if tmp.exists() or tmp.is_symlink():  # build failed, or another process's rename came first
            with contextlib.suppress(OSError):  # never hide why the build failed; a later sweep retries
                remove_path(tmp)
    return final


def _rename_into_place(tmp: Path, final: Path, ready: Callable[[Path], bool]) -> None:
    """Rename folder tmp to final (the system refuses while final is a folder with files in it)."""
    for attempt in range(2):
        try:
            os.rename(tmp, final)
        except OSError:
            if not tmp.is_dir():
                raise AttnlabError(
                    f"{tmp} was removed while it was being written (by a cache cleanup?): run the command again"
                ) from None
            if ready(final):  # another process's came first: it is as good as ours
                return
            if attempt:
                break
            _set_aside(final)  # not a whole one (a file, a link, a folder of an older attnlab)
            continue
        _sync_folder(final.parent)
        return
    raise AttnlabError(f"cannot put {tmp} in place of {final}: remove {final} and run the command again")


def _set_aside(p: Path) -> None:
    """Rename p to a temporary name (which a later sweep removes, should we be killed now), then remove it."""
    aside = p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(p, aside)
    except FileNotFoundError:  # another process set it aside first
        return
    remove_path(aside)


def _sync_folder(d: Path) -> None:
    """A folder's files and entries on disk (before it is renamed into place, and the rename after)."""
    if os.name == "nt":  # Windows cannot open a folder; its renames are already ordered
        return
    for p in [*filter(lambda p: p.is_file() and not p.is_symlink(), d.iterdir()), d]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def leftover(p: Path) -> bool:
    """A temporary folder of build_folder's that no build will finish: its process is gone, or it has
    not been touched for a day (a PID the system has given to another process since)."""
    m = BUILDING.match(p.name)
    if m is None:
        return False
    try:
        if time.time() - p.lstat().st_mtime > STALE_AFTER:
            return True
    except FileNotFoundError:
        return False
    return not _alive(int(m[1]))


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # Windows: os.kill(pid, 0) would stop it; the age decides
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def sweep_leftovers(parent: Path) -> list[str]:
    """Remove the temporary folders killed builds left in `parent`; their names."""
    gone = [p for p in parent.iterdir() if leftover(p)] if parent.is_dir() else []
    for p in gone:
        remove_path(p)
    return [p.name for p in gone]


def remove_path(p: Path) -> None:
    """Remove a file, a link (never what it points to) or a folder and all in it; nothing if absent."""
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink(missing_ok=True)
    elif p.is_dir():
        shutil.rmtree(p, ignore_errors=True)  # a file another process removed first is no error...
        if p.exists():
            shutil.rmtree(p)  # ...but what could not be removed is: say why


def tree_size(p: Path) -> int:
    """Bytes of the files under `p` (or of file p), links not followed: what removing it frees."""
    if not p.is_dir() or p.is_symlink():
        return _file_size(p)
    return sum(_file_size(Path(root, name)) for root, _, files in os.walk(p) for name in files)


def _file_size(p: Path) -> int:
    try:
        st = p.lstat()
    except OSError:  # removed while we count
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0  # a link's target is elsewhere


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
    return (
        f"disk full writing {path} ({mb(written)} written when space ran out, {mb(free)} free on that disk); "
        f"{keep}: free some space and run the command again"
    )


def mb(n: int) -> str:
    """A size in the unit that reads best: 12.3 KB, 45.6 MB, 7.8 GB."""
    unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("bytes", 1)) if n >= s or s == 1)
    return f"{n / scale:.1f} {unit}" if scale > 1 else f"{n} bytes"


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2))


def read_json(path: Path, limit: int | None = None) -> Any:
    """A JSON file; `limit`: the most bytes it may have (a file from someone else may be anything)."""
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    if limit is not None and path.stat().st_size > limit:
        raise AttnlabError(f"{path} is {path.stat().st_size:,} bytes, more than such a file has ({limit:,} at most)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise AttnlabError(f"{path} is corrupt ({e})") from None
    except RecursionError:  # nested thousands deep: Python's parser gives up
        raise AttnlabError(f"{path} is corrupt (it nests deeper than JSON files do)") from None


def snapshot(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """t on the CPU, contiguous; with copy, never sharing memory with t."""
    return t.detach().to("cpu", copy=copy).contiguous()


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file  # torch (2-4 s to import): loaded already where tensors are written

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
