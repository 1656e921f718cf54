"""runtime/threads.py: other busy attnlab/torch processes seen through a fake /proc, the threads chosen
beside them, and the user's setting winning over both."""

import io
import os

import pytest
import torch

from attnlab.cli.main import build_parser
from attnlab.errors import AttnlabError
from attnlab.runtime import threads

ME = os.getpid()  # the fake processes around it have pids no real process here has


class FakeProc:
    """Processes as /proc shows them: pid -> (parent, command line, libtorch mapped, cores used)."""

    def __init__(self, table: dict[int, tuple[int, list[str], bool, float]]):
        self.table = table

    def pids(self):
        return list(self.table)

    def stat(self, pid):
        return self.table[pid][0], 10.0

    def cmdline(self, pid):
        return self.table[pid][1]

    def has_torch(self, pid):
        return self.table[pid][2]

    def cores_used(self, pids, seconds=threads.INTERVAL):
        return {pid: self.table[pid][3] for pid in pids}


TRAIN = ["/v/bin/python", "/v/bin/attnlab", "train", "lm", "--out", "r"]
PROCS = {
    1: (0, ["/sbin/init"], False, 0.0),
    9_000_050: (1, ["/v/bin/python", "-m", "pytest"], True, 1.0),  # our parent: not counted
    ME: (9_000_050, ["/v/bin/python", "-m", "pytest"], True, 1.0),
    9_000_101: (ME, ["/v/bin/python", "-m", "attnlab", "eval", "r"], True, 1.0),  # our child: not counted
    9_000_200: (1, TRAIN, True, 1.9),  # another training: counted
    9_000_300: (1, ["python3", "notebook.py"], True, 0.0),  # torch, idle: not counted
    9_000_301: (1, ["python3.11", "script.py"], True, 1.0),  # torch, busy: counted
    9_000_302: (1, ["python3", "crunch.py"], False, 1.0),  # no torch: not counted
    9_000_400: (1, ["bash"], False, 1.0),  # not python
}


def others(table=PROCS, env=None):
    return threads.others(FakeProc(table), me=ME, env=env or {})


def test_only_other_busy_attnlab_and_torch_processes_count():
    found = others()
    assert [(o.pid, o.what) for o in found] == [(9_000_200, "attnlab train lm"), (9_000_301, "python (torch)")]
    assert [round(o.cores, 1) for o in found] == [1.9, 1.0]


def test_torchrun_ranks_of_the_same_job_do_not_count_each_other():
    agent, rank, job = 9_000_010, 9_000_102, 9_000_200
    ranks = {
        1: (0, ["init"], False, 0.0),
        agent: (1, ["/v/bin/python", "/v/bin/torchrun", "-m", "attnlab"], True, 0.0),
        ME: (agent, TRAIN, True, 1.0),
        rank: (agent, TRAIN, True, 1.0),
        job: (1, TRAIN, True, 1.0),
    }
    assert [o.pid for o in others(ranks, {"WORLD_SIZE": "2"})] == [job]
    assert [o.pid for o in others(ranks)] == [rank, job]  # without torchrun a sibling is another job


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (TRAIN, "attnlab train lm"),
        (["attnlab", "chat", "r"], "attnlab chat r"),
        (["python", "-m", "attnlab", "--threads", "1", "serve"], "attnlab serve"),
        (["python3"], "python"),
        (["attnlab", "demo", "--chat", "--out", "/tmp/x"], "attnlab demo"),
        (["vim", "attnlab.txt"], None),
        ([], None),
    ],
)
def test_command_lines_are_named(argv, what):
    assert threads.describe(argv) == what


@pytest.mark.parametrize(
    ("cores", "used", "world", "want"),
    [
        (2, [], 1, 2),
        (2, [1.9], 1, 1),
        (2, [0.6], 1, 1),
        (2, [2.0, 2.0], 1, 1),
        (16, [3.7], 1, 12),
        (16, [4.0], 2, 6),
        (16, [], 4, 4),
    ],
)
def test_threads_are_the_cores_the_others_leave(cores, used, world, want):
    busy = [threads.Other(i, "x", c) for i, c in enumerate(used)]
    assert threads.choose(cores, busy, world) == want


@pytest.fixture
def two_threads(monkeypatch):
    """Two cores and two torch threads to start from; torch's count and this module's state restored."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "cores", lambda: 2)
    torch.set_num_threads(2)
    threads.ask(None)
    yield
    threads.ask(None)
    torch.set_num_threads(before)


def test_another_training_leaves_one_thread_said_in_one_line(two_threads):
    err = io.StringIO()
    assert threads.share(FakeProc(PROCS), env={}, err=err) == 1
    assert torch.get_num_threads() == 1
    line = err.getvalue()
    assert line.count("\n") == 1 and "pid 9000200, attnlab train lm" in line and "using 1 thread of 2" in line
    assert "ATTNLAB_THREADS=N or attnlab --threads N" in line
    assert threads.share(FakeProc(PROCS), env={}, err=err) is None  # once per command


def test_alone_nothing_changes_and_nothing_is_said(two_threads):
    err = io.StringIO()
    alone = {k: v for k, v in PROCS.items() if k in (1, 9_000_050, ME)}
    assert threads.share(FakeProc(alone), env={}, err=err) is None
    assert torch.get_num_threads() == 2 and err.getvalue() == ""


class Untouchable(FakeProc):
    def pids(self):
        raise AssertionError("a thread count the user set needs no look at the other processes")


@pytest.mark.parametrize(
    ("env", "asked", "want"),
    [
        ({"ATTNLAB_THREADS": "2"}, None, 2),
        ({}, 2, 2),
        ({"ATTNLAB_THREADS": "1"}, 2, 2),
        ({"OMP_NUM_THREADS": "2"}, None, 2),
        ({"ATTNLAB_THREADS": "0"}, None, 2),
    ],
)
def test_what_the_user_set_wins(two_threads, env, asked, want):
    threads.ask(asked)
    threads.share(Untouchable(PROCS), env=env, err=io.StringIO())
    assert torch.get_num_threads() == want


def test_a_bad_setting_is_one_line(two_threads):
    with pytest.raises(AttnlabError, match="ATTNLAB_THREADS='two': expected a whole number"):
        threads.share(Untouchable(PROCS), env={"ATTNLAB_THREADS": "two"})


def test_sharing_line_for_doctor(two_threads):
    assert threads.sharing_line(FakeProc({k: PROCS[k] for k in (1, 9_000_050, ME)}), env={}) is None
    line = threads.sharing_line(FakeProc(PROCS), env={})
    assert line.startswith("2 other attnlab/torch processes are busy here (pid 9000200, attnlab train lm, 1.9 cores;")
    assert line.endswith("attnlab would use 1 thread of 2 cores (choose with ATTNLAB_THREADS=N or attnlab --threads N)")
    said = threads.sharing_line(FakeProc(PROCS), env={"ATTNLAB_THREADS": "2"})
    assert said.endswith("attnlab uses 2 threads as ATTNLAB_THREADS or --threads asks")


def test_the_reader_parses_proc_files(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (python (x) y) R 7 " + " ".join(["0"] * 9) + " 250 50 0 0\n")
    (tmp_path / "42" / "cmdline").write_bytes(b"python\0-m\0attnlab\0train\0")
    (tmp_path / "42" / "maps").write_text("7f00-7f10 r-xp 0 0:0 1 /v/torch/lib/libtorch_cpu.so\n")
    (tmp_path / "self").mkdir()
    reader = threads.ProcReader(tmp_path, tick=0.01)
    assert reader.pids() == [42] and reader.stat(42) == (7, 3.0) and reader.has_torch(42)
    assert reader.cmdline(42) == ["python", "-m", "attnlab", "train"] and reader.stat(43) is None


def test_the_real_proc_is_read_in_a_moment():
    import time

    t0 = time.perf_counter()
    found = threads.others()
    assert all(o.cores >= threads.BUSY for o in found) and time.perf_counter() - t0 < 2.0


def test_threads_flag_before_the_command():
    assert build_parser().parse_args(["--threads", "3", "runs"]).threads_all == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--threads", "-1", "runs"])


def test_training_and_loading_apply_the_users_count(tmp_path, two_threads, monkeypatch):
    import attnlab
    from tests.conftest import tiny_model, tiny_train

    (tmp_path / "c.txt").write_text("abc def\n" * 400)
    data = attnlab.DataConfig(data=str(tmp_path / "c.txt"), tokenizer="char")
    monkeypatch.setenv("ATTNLAB_THREADS", "1")
    threads.ask(None)
    attnlab.train(tmp_path / "r", tiny_model(), tiny_train(max_steps=1, warmup_steps=1), data, progress=False)
    assert torch.get_num_threads() == 1  # the session's start applied it
    torch.set_num_threads(2)
    threads.ask(None)  # a new command
    attnlab.load(tmp_path / "r", device="cpu")
    assert torch.get_num_threads() == 1


def test_a_training_gives_threads_to_a_later_one_and_takes_them_back(two_threads):
    err, alone = io.StringIO(), {k: v for k, v in PROCS.items() if k in (1, 9_000_050, ME)}
    assert threads.share(FakeProc(alone), env={}, err=err) is None and torch.get_num_threads() == 2
    start = threads._state.looked
    assert threads.revisit(FakeProc(PROCS), env={}, err=err, now=start + 1) is None  # not yet: the first after 2 s
    assert threads.revisit(FakeProc(PROCS), env={}, err=err, now=start + 2) == 1
    assert torch.get_num_threads() == 1 and "pid 9000200, attnlab train lm" in err.getvalue()
    assert threads.revisit(FakeProc(alone), env={}, err=err, now=start + 6) is None  # the next after 5 s more
    assert threads.revisit(FakeProc(alone), env={}, err=err, now=start + 7) == 2
    assert torch.get_num_threads() == 2 and err.getvalue().count("\n") == 2
    assert "no other attnlab/torch process is busy here now: using 2 threads of 2" in err.getvalue()
    later = start + 7 + 10  # then 10 s, then every 30 s
    assert threads.revisit(FakeProc(alone), env={}, err=err, now=later) is None and threads._state.looks == 3
    assert threads.revisit(FakeProc(alone), env={}, err=err, now=later + 29) is None and threads._state.looks == 3
    assert threads.revisit(FakeProc(alone), env={}, err=err, now=later + 30) is None and threads._state.looks == 4


def test_revisiting_leaves_a_users_count_alone(two_threads):
    threads.ask(2)
    threads.share(Untouchable(PROCS), env={}, err=io.StringIO())
    assert threads.revisit(Untouchable(PROCS), env={}, now=1e9) is None and torch.get_num_threads() == 2
