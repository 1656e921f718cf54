"""Threads that share the machine: fewer of PyTorch's threads when other attnlab or torch processes
are already busy on the same cores.

PyTorch gives every process one thread per core, and its threads spin while they wait for each
other. Two such processes on 2 cores hold 4 spinning threads, and each waits for a thread the other
has descheduled: an SFT run slowed to a fifth, half its CPU spent in the kernel (issue 54; the
figures: docs/cpu.md, "Sharing the machine: threads"). So
at the start of heavy work (a training session, a run loaded to sample, chat, serve or evaluate)
`share()` looks once at /proc: other processes that run attnlab, or python with libtorch loaded,
and the CPU each used over 50 ms. When they are busy, this process keeps cores - busy threads (at
least 1), and says so in one line on stderr. A training looks again 2, 5 and 10 s after its start,
then every 30 s (`revisit`): it gives up threads to a training started with it or after it, and takes
them back when that one ends. What a
user sets wins, and nothing is checked then:

    attnlab --threads 2 train lm ...     this command, 2 threads
    ATTNLAB_THREADS=2                    the same, for every command (0: PyTorch's own choice, no check)
    OMP_NUM_THREADS=2                    PyTorch's own setting, left as it is (torchrun sets it to 1)

torchrun's ranks of one job are siblings that split the cores on purpose: a rank does not count
its siblings, and divides what is left by LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import AttnlabError

ENV = "ATTNLAB_THREADS"
INTERVAL = 0.05  # seconds the CPU of the other processes is sampled over
# Seconds between looks during training (revisit): soon after the start first, since two trainings
# started together each look before the other is busy (seen: more threads than cores for the whole
# run), then every 30 s: a process that started later counts.
REVISITS = (2.0, 5.0, 10.0, 30.0)
BUSY = 0.5  # cores a process must use over INTERVAL to count as busy (an idle chat or server uses ~0)
ADVICE = f"choose with {ENV}=N or attnlab --threads N"


@dataclass(frozen=True)
class Other:
    """Another busy process on this machine."""

    pid: int
    what: str  # "attnlab train lm", "python (torch)"
    cores: float  # CPU used over the sample, in cores


class ProcReader:
    """What `share` reads of /proc (a folder that looks like it, for tests)."""

    def __init__(self, root: str | Path = "/proc", tick: float | None = None):
        self.root = Path(root)
        self.tick = tick or 1 / os.sysconf("SC_CLK_TCK")  # seconds per unit of utime and stime

    def pids(self) -> list[int]:
        return [int(p.name) for p in self.root.iterdir() if p.name.isdigit()]

    def stat(self, pid: int) -> tuple[int, float] | None:
        """(parent pid, CPU seconds used so far), or None for a process that is gone."""
        text = self._read(pid, "stat")
        if text is None:
            return None
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        try:
            return int(fields[1]), (int(fields[11]) + int(fields[12])) * self.tick  # utime + stime
        except (IndexError, ValueError):
            return None

    def cmdline(self, pid: int) -> list[str]:
        text = self._read(pid, "cmdline")
        return [a for a in (text or "").split("\0") if a]

    def cores_used(self, pids: list[int], seconds: float = INTERVAL) -> dict[int, float]:
        """The cores each process used over the next `seconds` (a process that ended: none)."""
        before, t0 = {pid: self.stat(pid) for pid in pids}, time.perf_counter()
        time.sleep(seconds)
        after, spent = {pid: self.stat(pid) for pid in pids}, max(time.perf_counter() - t0, seconds)
        return {pid: (after[pid][1] - before[pid][1]) / spent for pid in pids if before[pid] and after[pid]}

    def has_torch(self, pid: int) -> bool:
        """Whether libtorch is mapped into the process (a python that imported torch)."""
        return "libtorch" in (self._read(pid, "maps") or "")

    def _read(self, pid: int, name: str) -> str | None:
        try:
            return (self.root / str(pid) / name).read_text(errors="replace")
        except OSError:  # gone, or another user's
            return None


def describe(argv: list[str]) -> str | None:
    """ "attnlab train lm" for an attnlab command line, "python" for another python, None otherwise."""
    names = [os.path.basename(a) for a in argv[:3]]
    if not names:
        return None
    for i, name in enumerate(names):
        if name == "attnlab" or (name == "-m" and i + 1 < len(argv) and argv[i + 1] == "attnlab"):
            rest = argv[i + 1 + (name == "-m") :]
            words = [a for a in rest[:4] if a.isidentifier()][:2]  # the command and task, not paths or values
            return " ".join(["attnlab", *words])
    return "python" if names[0].startswith("python") or names[0] == "torchrun" else None


def others(reader: ProcReader | None = None, me: int | None = None, env: dict[str, str] | None = None) -> list[Other]:
    """Other attnlab or torch processes that used at least BUSY cores over INTERVAL. Not counted:
    this process, its parents and children, and under torchrun the ranks of the same job."""
    reader, me, env = reader or ProcReader(), me or os.getpid(), os.environ if env is None else env
    parents = {}
    for pid in reader.pids():
        st = reader.stat(pid)
        if st is not None:
            parents[pid] = st[0]
    ours = _family(parents, me, int(env.get("WORLD_SIZE", "1")) > 1)
    found = {}
    for pid in parents:
        if pid in ours:
            continue
        what = describe(reader.cmdline(pid))
        if what == "python" and reader.has_torch(pid):
            found[pid] = "python (torch)"
        elif what is not None and what != "python":
            found[pid] = what
    used = reader.cores_used(sorted(found)) if found else {}
    return [Other(pid, found[pid], cores) for pid, cores in sorted(used.items()) if cores >= BUSY]


def _family(parents: dict[int, int], me: int, torchrun: bool) -> set[int]:
    """This process, its ancestors (a shell, pytest, torchrun's agent) and descendants, and under
    torchrun its siblings: the other ranks its agent started."""
    ours, p = {me}, parents.get(me)
    while p and p not in ours:
        ours.add(p)
        p = parents.get(p)
    ours |= {pid for pid in parents if _below(parents, pid, me)}
    if torchrun and parents.get(me):
        ours |= {pid for pid, parent in parents.items() if parent == parents[me]}
    return ours


def _below(parents: dict[int, int], pid: int, me: int) -> bool:
    """Whether `me` is `pid` or one of its ancestors."""
    seen = set()
    while pid in parents and pid not in seen:
        if pid == me:
            return True
        seen.add(pid)
        pid = parents[pid]
    return pid == me


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose(n_cores: int, busy: list[Other], local_world: int = 1) -> int:
    """Threads for this process: the cores the others leave (their CPU rounded to whole cores),
    split between the ranks of this torchrun job on this machine; at least 1."""
    taken = round(sum(o.cores for o in busy))
    return max(1, (n_cores - taken) // max(1, local_world))


def asked(env: dict[str, str] | None = None) -> int | None:
    """The thread count the user set: --threads (given to `ask`), else ATTNLAB_THREADS; None if neither.
    0 means PyTorch's own choice."""
    if _state.asked is not None:
        return _state.asked
    env = os.environ if env is None else env
    text = env.get(ENV, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise AttnlabError(f"{ENV}={text!r}: expected a whole number of threads (0: PyTorch's own choice)")
    return int(text)


@dataclass
class _State:
    asked: int | None = None  # --threads of the command being run
    settled: bool = False  # share() has run in this process (for this command)
    own: int = 0  # the threads PyTorch had before share() lowered them (0: share() left them alone)
    looked: float = 0.0  # time.monotonic() of the last look
    looks: int = 0  # looks since share(): the next wait is REVISITS[looks] (the last one from then on)


_state = _State()


def ask(n: int | None) -> None:
    """`attnlab --threads N`: the thread count for this command (None: not given). share() applies it."""
    _state.asked, _state.settled, _state.own = n, False, 0


def share(reader: ProcReader | None = None, env: dict[str, str] | None = None, err=None) -> int | None:
    """At the start of heavy work, once per command: apply the user's thread count, or keep fewer of
    PyTorch's threads when other attnlab/torch processes are busy here (one line on stderr). Returns
    the threads set, or None where nothing changed."""
    if _state.settled:
        return None
    _state.settled = True
    torch = _torch()
    env = os.environ if env is None else env
    n = asked(env)
    if n is not None:
        if n > 0:
            torch.set_num_threads(n)
        return n or None
    if env.get("OMP_NUM_THREADS"):  # set by the user (or torchrun): PyTorch already follows it
        return None
    _state.own, _state.looked, _state.looks = torch.get_num_threads(), time.monotonic(), 0
    return _follow(others(reader, env=env), env, err)


def revisit(
    reader: ProcReader | None = None, env: dict[str, str] | None = None, err=None, now: float | None = None
) -> int | None:
    """During training, after REVISITS seconds (2, 5, 10, then every 30): look again, so that a training
    started together with another, or alone, gives
    up threads to one started after it, and takes them back when that one ends (one line each time
    the count changes). Nothing where the user chose, or share() did not look."""
    now = time.monotonic() if now is None else now
    if not _state.own or now - _state.looked < REVISITS[min(_state.looks, len(REVISITS) - 1)]:
        return None
    _state.looked, _state.looks = now, _state.looks + 1
    env = os.environ if env is None else env
    return _follow(others(reader, env=env), env, err)


def _follow(busy: list[Other], env: dict[str, str], err) -> int | None:
    """Set the threads that `busy` leaves (at most those PyTorch had); the count set, or None if unchanged."""
    torch = _torch()
    have = torch.get_num_threads()
    n = min(_state.own, choose(cores(), busy, int(env.get("LOCAL_WORLD_SIZE", "1"))))
    if n == have:
        return None
    torch.set_num_threads(n)
    why = _said(busy) if busy else "no other attnlab/torch process is busy here now"
    print(f"attnlab: {why}: using {n} thread{'s' * (n > 1)} of {_state.own} ({ADVICE})", file=err or sys.stderr)
    return n


def _torch():
    import torch  # torch: here, not on top, so that `attnlab --help` (which imports this module) stays fast

    return torch


def _said(busy: list[Other]) -> str:
    """ "1 other attnlab/torch process is busy here (pid 42, attnlab train lm, 1.9 cores)"."""
    listed = "; ".join(f"pid {o.pid}, {o.what}, {o.cores:.1f} cores" for o in busy[:3])
    more = f"; {len(busy) - 3} more" if len(busy) > 3 else ""
    verb = "is" if len(busy) == 1 else "are"
    plural = "es" if len(busy) > 1 else ""
    return f"{len(busy)} other attnlab/torch process{plural} {verb} busy here ({listed}{more})"


def sharing_line(reader: ProcReader | None = None, env: dict[str, str] | None = None) -> str | None:
    """For `attnlab doctor`: one line on the other busy attnlab/torch processes here and the threads
    attnlab would use beside them; None when none is busy."""
    env = os.environ if env is None else env
    busy = others(reader, env=env)
    if not busy:
        return None
    n, total = choose(cores(), busy, int(env.get("LOCAL_WORLD_SIZE", "1"))), cores()
    user = asked(env)
    if user:
        use = f"attnlab uses {user} thread{'s' * (user > 1)} as {ENV} or --threads asks"
    elif env.get("OMP_NUM_THREADS"):
        use = f"attnlab follows OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    elif user == 0:
        use = f"attnlab keeps PyTorch's own threads ({ENV}=0)"
    else:
        use = f"attnlab would use {n} thread{'s' * (n > 1)} of {total} cores ({ADVICE})"
    return f"{_said(busy)}: {use}"
