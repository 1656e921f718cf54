"""What every case of the hostile-file suite (tests/test_hostile_*.py) asserts, in one place.

A file from somebody else (a HuggingFace or PEFT folder, a GGUF file, a chat template, fine-tuning
data, a request to the server) may be broken or written to hurt. Whatever it holds, attnlab answers
with one `attnlab: error:` line (the server: a 4xx with one message), never a traceback, within
bounded time and memory, and writes or changes nothing of the user's. The bounds, per case:

    SECONDS      wall-clock time of the call (generous: CI machines are shared and slow)
    MEMORY_MIB   growth of the process's peak resident memory during the call

Peak memory is Linux's VmHWM, reset before each case (writing 5 to /proc/self/clear_refs), so a case
that briefly grew by gigabytes and freed them again is caught too. Where /proc is missing the
memory bound is not checked (the time bound still is).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from attnlab.errors import AttnlabError
from tests.conftest import run_cli, shown

SECONDS = 10.0
MEMORY_MIB = 400


def _status(field: str) -> int | None:
    """A field of /proc/self/status in MiB (VmHWM: peak resident memory; VmRSS: now)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) // 1024 if m else None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def bounded(seconds: float = SECONDS, mib: int = MEMORY_MIB) -> Iterator[None]:
    """The block finishes within `seconds` and grows peak memory by less than `mib` MiB."""
    measured = _reset_peak()
    start_rss, start = _status("VmRSS"), time.perf_counter()
    yield
    took = time.perf_counter() - start
    assert took < seconds, f"took {took:.1f} s, more than the bound of {seconds} s"
    peak = _status("VmHWM")
    if measured and peak is not None and start_rss is not None:
        assert peak - start_rss < mib, f"peak memory grew by {peak - start_rss} MiB, more than {mib} MiB"


def tree_state(*paths: Path) -> dict[str, tuple[int, str]]:
    """Every file under `paths` (or the file itself): its size and content hash, by path."""
    state = {}
    for root in map(Path, paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
        for p in files:
            data = p.read_bytes() if p.is_file() else str(p.readlink()).encode()
            state[str(p)] = (len(data), hashlib.sha256(data).hexdigest())
    return state


@contextmanager
def untouched(*paths: Path) -> Iterator[None]:
    """Nothing under `paths` is written, changed, added or removed by the block."""
    before = tree_state(*paths)
    yield
    after = tree_state(*paths)
    changed = sorted(set(before) ^ set(after) | {p for p in before.keys() & after.keys() if before[p] != after[p]})
    assert not changed, f"files changed: {changed[:5]}"


def one_line(message: str, match: str | None = None) -> str:
    """A refusal's message: one non-empty line, no traceback, matching `match` (a regex) if given."""
    assert message.strip() and "\n" not in message.strip(), f"not one line: {message!r}"
    assert "Traceback" not in message
    if match is not None:
        assert re.search(match, message), f"{message!r} does not match {match!r}"
    return message


def refused(
    call: Callable[[], Any],
    match: str | None = None,
    seconds: float = SECONDS,
    mib: int = MEMORY_MIB,
    keep: tuple[Path, ...] = (),
) -> str:
    """call() raises AttnlabError with one line, within the bounds, leaving `keep` untouched."""
    with untouched(*keep), bounded(seconds, mib), pytest.raises(AttnlabError) as e:
        call()
    return one_line(str(e.value), match)


def cli_refuses(
    argv: list[str],
    capsys: pytest.CaptureFixture,
    match: str | None = None,
    seconds: float = SECONDS,
    mib: int = MEMORY_MIB,
    keep: tuple[Path, ...] = (),
) -> str:
    """`attnlab ARGV`, in this process: exit code 2 and one `attnlab: error:` line on stderr (any other
    exception escapes main() and fails the test, as it would print a traceback), within the bounds.
    Progress lines ("converting ... once") may come before it."""
    capsys.readouterr()
    with untouched(*keep), bounded(seconds, mib):
        rc, _, err = run_cli(argv, capsys)
    lines = [line for line in shown(err) if not line.startswith(("converting ", "reading "))]
    assert rc == 2, f"exit code {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), f"not one error line: {err!r}"
    return one_line(lines[0], match)
