"""Elastic restarts: torchrun --max-restarts 1 starts the group again after a worker is killed, and
the engine resumes the run from its last checkpoint, ending with the weights of a run never killed.

A run of 160 steps (a checkpoint every 20) on two processes; while it trains, rank 1 is sent SIGKILL
(found among torchrun's children by its environment). torchrun stops rank 0, starts both again
with TORCHELASTIC_RESTART_COUNT=1, and the engine, seeing the restart and a checkpoint, resumes it.
A second torchrun trains the same run without a kill, beside it: the two end bit-identical. Then
the same across two namespace nodes (tests/netns.py), node B's worker killed. Slow (each starts at
least four torch processes): 133 s and 40-64 s on the shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from attnlab.io import read_safetensors
from tests.conftest import flags, run_cli
from tests.netns import TORCHRUN, wait_all
from tests.test_multinode import FLAGS, losses, two_nodes

STEPS, EVERY, KILL_AFTER = 160, 20, 30


def launch(corpus: Path, out: Path, log: Path) -> subprocess.Popen:
    """torchrun on this machine, two processes, one restart allowed, writing `out`; output to `log`."""
    args = [
        TORCHRUN,
        *flags(standalone=True, nproc_per_node=2, max_restarts=1),
        "-m",
        "attnlab",
        "train",
        "lm",
        "--data",
        str(corpus),
        *FLAGS,
        "--eval-interval",
        str(EVERY),
        "--max-steps",
        str(STEPS),
        "--out",
        str(out),
    ]
    # torchrun's agent otherwise keeps one store across restarts, where the restarted processes find the
    # failed ones' addresses (pytorch/pytorch#135712: gloo's "connectFullMesh failed", measured here).
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    with open(log, "wb") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def worker(parent: int, rank: int | None) -> int | None:
    """The pid of torchrun `parent`'s first-attempt worker of `rank` (None: any), if it is running."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = dict(kv.split("=", 1) for kv in (entry / "environ").read_text().split("\0") if "=" in kv)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        ours = rank is None or env.get("RANK") == str(rank)
        if ppid == parent and ours and env.get("TORCHELASTIC_RESTART_COUNT") == "0":
            return int(entry.name)
    return None


def last_step(run: Path) -> int:
    try:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return 0
    return max((r["step"] for r in rows), default=0)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_killed_worker_restarts_from_the_checkpoint_to_the_same_weights(tmp_path, corpus, capsys):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    t0 = time.perf_counter()
    procs = [launch(corpus, run, tmp_path / f"{run.name}.log") for run in (killed, whole)]
    pid, at = None, None
    while pid is None and time.perf_counter() - t0 < 300 and procs[0].poll() is None:
        if last_step(killed) >= KILL_AFTER:
            pid = worker(procs[0].pid, 1)
            if pid is not None:
                at = last_step(killed)
                os.kill(pid, signal.SIGKILL)  # a process this test started (through torchrun)
        time.sleep(0.02)
    codes = wait_all(procs, 400)
    log = (tmp_path / "killed.log").read_text(errors="replace")
    assert pid is not None, f"rank 1 was never found running past step {KILL_AFTER}:\n{log[-3000:]}"
    assert codes == [0, 0], log[-3000:]
    resumed = [ln for ln in log.splitlines() if "resuming" in ln]
    assert resumed and "torchrun restarted the group" in resumed[0], log[-3000:]
    a, b = losses(killed), losses(whole)
    assert len(a) == len(b) == STEPS
    wa, wb = (read_safetensors(run / "model.safetensors")[0] for run in (killed, whole))
    same = all(torch.equal(wa[k], wb[k]) for k in wb)
    with capsys.disabled():
        print(
            f"\nkilled rank 1 (pid {pid}) after step {at}; {resumed[0].strip()}; {time.perf_counter() - t0:.1f} s"
            f"\nmax |loss difference| over {STEPS} steps: {max(abs(x - y) for x, y in zip(a, b)):.1e}; "
            f"final weights bit-identical: {same}"
        )
    assert a == b
    assert same


def kill_when(run: Path, parent: int, rank: int | None) -> tuple[int, int]:
    """SIGKILL torchrun `parent`'s first worker (of `rank`) once `run` is past KILL_AFTER steps: (pid, step)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 300:
        if last_step(run) >= KILL_AFTER and (pid := worker(parent, rank)) is not None:
            step = last_step(run)
            os.kill(pid, signal.SIGKILL)  # a process this test started (through torchrun)
            return pid, step
        time.sleep(0.02)
    raise AssertionError(f"no worker of {parent} ran past step {KILL_AFTER}")


@pytest.mark.slow
def test_a_worker_killed_on_one_of_two_nodes_restarts_both(tmp_path, corpus, capsys):
    """Two namespace nodes (tests/netns.py) under --max-restarts 1; node B's worker is killed mid-run.
    B's torchrun counts a restart, A's starts its process again as a change of membership (its count
    stays 0): the group asks every process, so both resume the same checkpoint, and the run ends with
    one process's losses (within 1e-5: a 2-process run is not bit-identical to one process)."""
    run, single = tmp_path / "runs" / "run", tmp_path / "runs" / "single"
    args = ["train", "lm", "--data", str(corpus), *FLAGS, "--eval-interval", str(EVERY), "--max-steps", str(STEPS)]
    killed: list[tuple[int, int]] = []
    codes, logs, _, seconds = two_nodes(
        tmp_path,
        [*args, "--out", str(run)],
        "elastic",
        timeout=400,
        launch=("--max-restarts", "1"),
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        meanwhile=lambda procs: killed.append(kill_when(run, procs[1].pid, None)),
    )
    assert codes == [0, 0], logs
    code, _, err = run_cli([*args, "--out", single], capsys)
    assert code == 0, err
    resumed = [ln for log in logs for ln in log.splitlines() if "resuming" in ln]
    a, b = losses(single), losses(run)
    assert len(a) == len(b) == STEPS
    worst = max(abs(x - y) for x, y in zip(a, b))
    with capsys.disabled():
        print(
            f"\nkilled node B's worker (pid {killed[0][0]}) after step {killed[0][1]}; {resumed[0].strip()}; "
            f"{seconds:.1f} s\nmax |loss - one process| over {STEPS} steps: {worst:.1e}"
        )
    assert resumed and "torchrun restarted the group" in resumed[0]
    assert worst < 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")  # the in-process reference run: one thread, as the workers
