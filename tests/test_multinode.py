"""Two nodes on one machine: torchrun in two network namespaces, over real TCP between them.

One torchrun "node" in each namespace (tests/netns.py), joined by c10d rendezvous at node A's
address, gloo for the gradients: the run takes one process's steps at the same global batch, its
checkpoint resumes on one node after both stopped, and a node that does not see the run directory
makes both stop with one line. Skipped where namespaces cannot be made (not root, no `ip`).
The two-node tests start four torch processes each, so they run with the slow ones:
    pytest -s -m slow tests/test_multinode.py tests/test_elastic.py
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import losses, run_cli
from tests.netns import namespace_pair, torchrun, wait_all

PORT = 29500  # free in any new namespace: nothing else listens there
FLAGS = (
    "--n-layer 2 --n-head 2 --d-model 32 --context 32 --dropout 0 --batch-size 8 --lr 3e-3 "
    "--warmup-steps 5 --schedule inverse_sqrt --eval-interval 5 --eval-batches 2 "
    "--device cpu --dtype float32"
).split()


def two_nodes(
    tmp_path,
    args: list[str],
    tag: str,
    blind_b: bool = False,
    timeout: float = 300,
    launch: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    meanwhile=None,
):
    """torchrun [LAUNCH] -m attnlab ARGS on nodes A and B; returns (exit codes, logs, nodes, seconds).
    meanwhile(procs): called once both have started (what the test does while they run)."""
    with namespace_pair() as (a, b):
        t0 = time.perf_counter()
        procs, logs = [], [tmp_path / f"{tag}-{n}.log" for n in "ab"]
        for node, log in zip((a, b), logs):
            blind = tmp_path / "runs" if blind_b and node is b else None
            procs.append(torchrun(node, 2, a, PORT, [*launch, "-m", "attnlab", *args], log, env, blind))
        if meanwhile is not None:
            meanwhile(procs)
        codes = wait_all(procs, timeout)
        return codes, [log.read_text(errors="replace") for log in logs], (a, b), time.perf_counter() - t0


@pytest.mark.slow  # four torch processes start: 36 s (quiet) to 119 s (loaded) on the 2-core machine
def test_two_nodes_train_as_one_process_and_resume_on_one(tmp_path, corpus, capsys):
    """10 steps on two nodes (a process each) have one process's losses within 1e-5; the run then goes
    on to step 20 in one process and still matches (the schedule does not depend on --max-steps)."""
    single, double = tmp_path / "runs" / "single", tmp_path / "runs" / "double"
    data = ["--data", str(corpus)]
    args = ["train", "lm", *data, *FLAGS, "--out", str(double), "--max-steps", "10"]
    codes, logs, (a, b), seconds = two_nodes(tmp_path, args, "train")
    assert codes == [0, 0], logs
    code, _, err = run_cli(["train", "lm", *data, *FLAGS, "--out", single, "--max-steps", "20"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["train", "lm", "--out", double, "--resume", "--max-steps", "20"], capsys)
    assert code == 0, err
    assert "resuming" in err and "from step 10" in err
    one, two = losses(single), losses(double)
    assert len(one) == len(two) == 20
    diffs = [abs(x - y) for x, y in zip(one, two)]
    with capsys.disabled():
        print(
            f"\nnode A {a.netns} {a.addr} ({a.dev}), node B {b.netns} {b.addr} ({b.dev}); two nodes, 10 steps: "
            f"{seconds:.1f} s wall\nper-step |loss - one process|, steps 1-10 on two nodes: "
            f"{' '.join(f'{d:.1e}' for d in diffs[:10])}\nsteps 11-20 resumed on one: "
            f"{' '.join(f'{d:.1e}' for d in diffs[10:])}"
        )
    assert max(diffs) < 1e-5, (one, two)
    assert "x 2 processes" in logs[0]  # rank 0 (node A) announced the group


@pytest.mark.slow  # two more torchrun nodes start (about 45 s under load); test_distributed checks the same cheaply
def test_a_node_that_cannot_see_the_run_directory_says_so(tmp_path, corpus, capsys, monkeypatch):
    """Node B has an empty file system where the run's folder is (a node without the shared mount):
    both nodes stop with one line naming B's process, within seconds, instead of waiting."""
    out = tmp_path / "runs" / "r"
    args = ["train", "lm", "--data", str(corpus), *FLAGS, "--out", str(out), "--max-steps", "4"]
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("ATTNLAB_SHARED_TIMEOUT", "3")  # seconds B looks for the file before it gives up
    codes, logs, _, seconds = two_nodes(tmp_path, args, "blind", blind_b=True, timeout=240)
    lines = [next((ln for ln in log.splitlines() if ln.startswith("attnlab: error:")), "") for log in logs]
    with capsys.disabled():
        print(f"\n{seconds:.1f} s; node A: {lines[0]}\nnode B: {lines[1]}")
    assert codes[0] != 0 and codes[1] != 0
    for line in lines:
        assert "1 of 2 processes cannot read the file rank 0" in line and "rank 1" in line, logs
    assert not out.exists()


pytestmark = pytest.mark.usefixtures("one_thread")


SBATCH = Path(__file__).parent.parent / "examples" / "slurm" / "train.sbatch"


@pytest.mark.parametrize("resumed", [False, True])
def test_the_slurm_template_runs_torchrun_as_documented(tmp_path, resumed):
    """examples/slurm/train.sbatch run by bash with srun, scontrol and torchrun stubbed: one torchrun
    per node meeting at the job's first host under the job's id, its flags torchrun's own, its
    attnlab command one that attnlab parses, and --resume once the run has a checkpoint."""
    from torch.distributed.run import get_args_parser

    from attnlab.cli.main import build_parser

    stubs, run = tmp_path / "bin", tmp_path / "run"
    stubs.mkdir()
    for name, body in {
        "srun": 'exec "$@"',
        "scontrol": "printf 'gpu-a\\ngpu-b\\n'",
        "torchrun": f'printf "%s\\0" "$@" > {tmp_path}/argv',
    }.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    if resumed:
        run.mkdir()
        (run / "train_state.safetensors").write_bytes(b"")
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "RUN": str(run),
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-[a-b]",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_PER_TASK": "32",
    }
    subprocess.run(["bash", str(SBATCH)], env=env, check=True, timeout=30)
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    launch = get_args_parser().parse_args(argv)
    assert (launch.nnodes, launch.nproc_per_node, launch.rdzv_endpoint, launch.rdzv_id) == (
        "2",
        "4",
        "gpu-a:29500",
        "4242",
    )
    assert launch.module and launch.training_script == "attnlab" and launch.max_restarts == 1
    args = build_parser().parse_args(launch.training_script_args)
    assert (args.out, args.resume) == (str(run), resumed)
