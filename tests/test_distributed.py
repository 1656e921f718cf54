"""Data-parallel training: two processes on the CPU (Gloo), launched as torchrun would."""

from __future__ import annotations

import json
import os
import socket
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import attnlab
from tests.conftest import losses, tiny_data, tiny_model, tiny_train

STEPS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pair():
    """Two worker processes, ranks 0 and 1, kept for the whole module, and a function that runs a
    job in both as torchrun would: starting a process and importing torch takes seconds, while the
    engine makes its process group at the start of each run and ends it at the end. A process keeps
    its rank from job to job, as under torchrun (FSDP's device mesh outlives the group in torch)."""
    ctx = mp.get_context("spawn")
    jobs, results = [ctx.Queue() for _ in range(2)], ctx.Queue()
    workers = [ctx.Process(target=_serve, args=(rank, jobs[rank], results), daemon=True) for rank in (0, 1)]
    for w in workers:
        w.start()

    def both(job, *args) -> None:
        port = free_port()
        for q in jobs:
            q.put((port, job, args))
        failures = [error for _, error in (results.get(timeout=300) for _ in jobs) if error]
        assert not failures, failures[0]

    yield both
    for q in jobs:
        q.put(None)
    for w in workers:
        w.join(timeout=30)


def _serve(rank: int, jobs, results) -> None:
    # What torchrun sets for each process.
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    while (request := jobs.get()) is not None:
        port, job, args = request
        os.environ["MASTER_PORT"] = str(port)
        try:
            job(*args)
            results.put((rank, None))
        except BaseException:
            results.put((rank, traceback.format_exc()))


def _worker(out: str, corpus: str, accum: int, parallel: str, steps: int = STEPS, resume: bool = False) -> None:
    cfg = tiny_train(max_steps=steps, batch_size=8, grad_accum=accum, parallel=parallel, eval_interval=STEPS // 2)
    if resume:
        attnlab.train(out, None, cfg, None, resume=True, progress=False)
    else:
        attnlab.train(out, tiny_model(), cfg, tiny_data(corpus), progress=False)


@pytest.mark.parametrize("parallel, accum", [("ddp", 1), ("ddp", 2), ("fsdp", 2)])
def test_two_processes_match_one_at_the_same_global_batch(tmp_path, corpus, pair, parallel, accum):
    """Losses over 20 steps within 1e-5 of one process, replicated (DDP) or sharded (FSDP);
    the checkpoint (whole weights, even from shards) loads in one process."""
    single, double = tmp_path / "single", tmp_path / "double"
    cfg = tiny_train(max_steps=STEPS, batch_size=8, grad_accum=accum, eval_interval=STEPS // 2)
    attnlab.train(single, tiny_model(), cfg, tiny_data(corpus), progress=False)
    pair(_worker, str(double), str(corpus), accum, parallel)
    a, b = losses(single), losses(double)
    assert len(a) == len(b) == STEPS
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
    one, two = attnlab.load(single), attnlab.load(double)
    idx = torch.randint(0, one.tokenizer.vocab_size, (2, 16))
    assert torch.allclose(one.model(idx), two.model(idx), atol=1e-4)
    # Only rank 0 wrote: one metrics row per step, no stray temporary files.
    assert not [p for p in double.iterdir() if ".tmp" in p.name]


def test_batch_must_split_over_processes(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(attnlab.AttnlabError, match="does not split"):
        attnlab.train(tmp_path / "r", tiny_model(), tiny_train(batch_size=8), tiny_data(corpus), progress=False)


def test_sharded_run_resumes_sharded_and_in_one_process(tmp_path, corpus, pair):
    """A run trained for 10 steps and resumed to 20 has the same losses whether it is sharded
    over two processes throughout, sharded then resumed in one process, or one process."""
    half = STEPS // 2
    runs = {name: tmp_path / name for name in ("single", "sharded", "mixed")}
    cfg = {"batch_size": 8, "eval_interval": half}
    attnlab.train(runs["single"], tiny_model(), tiny_train(max_steps=half, **cfg), tiny_data(corpus), progress=False)
    for name in ("sharded", "mixed"):
        pair(_worker, str(runs[name]), str(corpus), 1, "fsdp", half)
    pair(_worker, str(runs["sharded"]), str(corpus), 1, "fsdp", STEPS, True)
    for name in ("single", "mixed"):
        attnlab.train(runs[name], None, tiny_train(max_steps=STEPS, **cfg), None, resume=True, progress=False)
    a, b, c = (losses(runs[n]) for n in ("single", "sharded", "mixed"))
    assert len(a) == len(b) == len(c) == STEPS
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert max(abs(x - y) for x, y in zip(a, c)) < 1e-5


def _task_worker(out: str, task: str) -> None:
    run_task(*_task_request(out, task))


def _task_request(out, task: str):
    from attnlab.data.labeled import LabeledDataConfig
    from attnlab.data.parallel import ParallelDataConfig
    from attnlab.tasks import TASKS
    from attnlab.tasks.request import python_request

    cfg = tiny_train(max_steps=6, batch_size=8, eval_interval=3)
    if task == "classify":
        model, fields, data = "encoder", dict(preset="encoder-tiny", n_layer=1, d_model=16), LabeledDataConfig()
    else:
        model, fields = "transformer", dict(n_layer=1, d_model=16, n_head=2, d_ff=32, dropout=0.0)
        data = ParallelDataConfig(data="reverse", n_train=100, max_len=32, vocab_size=40)
    return TASKS[task], python_request(TASKS[task], out, model, fields, cfg, data, progress=False)


def run_task(task, req):
    from attnlab.engine.train import run

    return run(task, req)


@pytest.mark.parametrize("task", ["classify", "translate"])
def test_every_task_trains_under_torchrun(tmp_path, pair, task):
    """The engine runs any task's skeleton in several processes: rank 0 sets the run up, every
    process reads it, and two processes give one process's losses at the same global batch."""
    single, double = tmp_path / "single", tmp_path / "double"
    run_task(*_task_request(single, task))
    pair(_task_worker, str(double), task)
    a, b = losses(single), losses(double)
    assert len(a) == len(b) == 6
    # A translation's loss is a mean over target tokens, whose count differs between the two halves of
    # a batch: two processes average per-process means, so they agree closely, not to the last digit.
    tolerance = 1e-5 if task == "classify" else 5e-3
    assert max(abs(x - y) for x, y in zip(a, b)) < tolerance, (a, b)
    scored = [json.loads((run / "eval.json").read_text()) for run in (single, double)]
    assert scored[0].keys() == scored[1].keys()


def _late_looker(out: str, corpus: str) -> None:
    """Rank 1 looks at the run folder half a second late; rank 0 must not have written into it by
    then, or rank 1 could find a half-written file and refuse the folder as not a run."""
    import time

    from attnlab.engine import train

    check = train.check_dir

    def late(path, resume, force):
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            if path.exists():
                raise AssertionError(f"rank 0 wrote {sorted(p.name for p in path.iterdir())} before rank 1 looked")
        check(path, resume, force)

    train.check_dir = late
    try:
        _worker(out, corpus, 1, "ddp", 2)
    finally:
        train.check_dir = check


def test_every_process_checks_the_folder_before_any_writes(tmp_path, corpus, pair):
    pair(_late_looker, str(tmp_path / "run"), str(corpus))
    assert losses(tmp_path / "run")


def _phase(out: str, corpus: str, parallel: str, steps: int) -> None:
    """Train (or go on training) run `out` to `steps` steps: one phase of a run whose world size changes."""
    cfg = tiny_train(max_steps=steps, batch_size=8, parallel=parallel, eval_interval=8, schedule="inverse_sqrt")
    if Path(out).exists():
        attnlab.train(out, None, cfg, None, resume=True, progress=False)
    else:
        attnlab.train(out, tiny_model(), cfg, tiny_data(corpus), progress=False)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_world_size_changes_between_resumes(tmp_path, corpus, pair, parallel):
    """Checkpointed at 2 processes, resumed at 1, then at 2 again: every step's loss is one uninterrupted
    process's (the schedule does not depend on --max-steps, so each phase's own is the whole run's).
    Checkpoints are whole and keyed by name, and every process draws the same global batch."""
    single, changed = tmp_path / "single", tmp_path / "changed"
    _phase(str(single), str(corpus), parallel, 24)
    pair(_phase, str(changed), str(corpus), parallel, 8)
    _phase(str(changed), str(corpus), parallel, 16)
    pair(_phase, str(changed), str(corpus), parallel, 24)
    a, b = losses(single), losses(changed)
    assert len(a) == len(b) == 24
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)


def test_a_world_size_the_batch_cannot_split_over_is_one_line(tmp_path, corpus, monkeypatch):
    """A run of batch 8 resumed on 3 processes: refused before joining, saying which counts work."""
    _phase(str(tmp_path / "r"), str(corpus), "ddp", 2)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(attnlab.AttnlabError, match=r"on 3 processes: run on 1, 2, 4, 8 processes or change"):
        _phase(str(tmp_path / "r"), str(corpus), "ddp", 4)


def _tracked(out: str, corpus: str) -> None:
    cfg = tiny_train(max_steps=4, batch_size=8, eval_interval=2, warmup_steps=1, log="tensorboard")
    attnlab.train(out, tiny_model(), cfg, tiny_data(corpus), progress=False)


def test_only_rank_0_writes_the_tracker(tmp_path, corpus, pair):
    """--log tensorboard under two processes: one event file, holding the losses of metrics.jsonl."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pair(_tracked, str(tmp_path / "run"), str(corpus))
    board = tmp_path / "run" / "tensorboard"
    assert len(list(board.iterdir())) == 1
    events = accumulator.EventAccumulator(str(board))
    events.Reload()
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(losses(tmp_path / "run"), rel=1e-6)


def _look(root: str, same: bool) -> None:
    """Rank 1's run folder is rank 0's (same) or a folder of its own: a node whose --out is a local disk."""
    from attnlab.runtime import distributed
    from attnlab.runtime.shared import PROBE, check_shared

    d, _ = distributed.init("cpu")
    try:
        out = Path(root) / ("shared" if same or d.rank == 0 else "local") / "run"
        if same:
            check_shared(d, out, timeout=1)
            distributed.barrier(d)  # rank 0 has removed its file
            assert not list(out.parent.glob(f"{PROBE}*")) and not out.exists()
        else:
            line = r"^1 of 2 processes cannot read the file rank 0 on .* \(rank 1 on .*: no such file after 1 s\)"
            with pytest.raises(attnlab.AttnlabError, match=line):
                check_shared(d, out, timeout=1)
    finally:
        distributed.shutdown(d)


def test_every_process_reads_what_rank_0_wrote_or_all_stop(tmp_path, pair):
    """The start-up check of shared storage: passes (and leaves nothing) where both see one folder;
    where rank 1 does not, both processes raise the same line naming rank 1, after the timeout."""
    pair(_look, str(tmp_path), True)
    pair(_look, str(tmp_path), False)


def test_a_process_that_never_joins_stops_the_others_in_one_line(monkeypatch):
    """Rank 0 of two, alone: it stops after ATTNLAB_JOIN_TIMEOUT seconds with one line, not torch's 30 minutes."""
    from attnlab.runtime import distributed

    env = dict(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for k, v in {**env, "ATTNLAB_JOIN_TIMEOUT": "2"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(attnlab.AttnlabError, match=r"^rank 0 could not join the other 1 processes within 2 s"):
        distributed.init("cpu")


def _restartable(_: None) -> None:
    """Join as under torchrun --max-restarts with its shared store: rank 0 warns that a restart cannot rejoin."""
    import warnings

    from attnlab.runtime import distributed

    os.environ["TORCHELASTIC_MAX_RESTARTS"] = "1"
    shared, distributed.shared_store = distributed.shared_store, lambda: True  # torchrun's variable, without torchrun
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            d, _ = distributed.init("cpu")
        assert not distributed.restarted(d)
        distributed.shutdown(d)
        named = [w for w in seen if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in str(w.message)]
        assert len(named) == (1 if d.main else 0), [str(w.message) for w in seen]
    finally:
        distributed.shared_store = shared
        del os.environ["TORCHELASTIC_MAX_RESTARTS"]


def test_restarts_with_torchruns_shared_store_are_warned_of(pair):
    pair(_restartable, None)
