"""torchrun on a GPU: `torchrun -m attnlab train` then --resume, and a process group of one on NCCL
under which DDP and FSDP train and resume to the losses of the same run without a group. Skipped without
a GPU (marker `cuda`); ATTNLAB_TEST_DEVICE=cpu runs them on the CPU, on gloo (see tests/test_cuda.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import attnlab
from attnlab.data import DataConfig
from attnlab.models.gpt import GPTConfig
from tests.conftest import losses
from tests.test_cuda import DEVICE, ON_GPU, ROOT, corpus, tiny

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(ON_GPU and not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU"),
]

# ---- torchrun: NCCL, DDP and FSDP -------------------------------------------------------------------

TRAIN = (
    "train lm --n-layer 1 --n-head 2 --d-model 64 --context 32 --batch-size 8 "
    "--eval-interval 4 --eval-batches 1 --warmup-steps 1 --dtype float32"
).split()

# A world of one is no group at all to attnlab (runtime/distributed.py: WORLD_SIZE 1 joins nothing, wraps
# nothing). This driver makes one: init() sees a world of 2 (past that shortcut: attnlab picks the device
# and the backend, and joins torchrun's group, of one) and a group counts as enabled, so DDP or FSDP
# wrap the model and every collective runs, on NCCL on a GPU. It trains with each to 4 steps, then
# resumes to 8, and writes the backends it joined.
GROUP_OF_ONE = """
import dataclasses, json, sys
import torch.distributed as dist
from attnlab.cli.main import main
from attnlab.runtime import distributed as D

D.Dist.enabled = property(lambda self: dist.is_initialized())
joined, real_init, real_world = [], D.init, D.world_size

def init(device_name="auto"):
    D.world_size = lambda: 2
    try:
        d, device = real_init(device_name)
    finally:
        D.world_size = real_world
    joined.append(dist.get_backend())
    return dataclasses.replace(d, world=1), device

D.init = init
out, args = sys.argv[1], sys.argv[2:]
for parallel in ("ddp", "fsdp"):
    for steps, more in (("4", []), ("8", ["--resume"])):
        code = main([*args, "--out", f"{out}/{parallel}", "--parallel", parallel, "--max-steps", steps, *more])
        assert code == 0, (parallel, steps)
json.dump(joined, open(f"{out}/backends.json", "w"))
"""


def torchrun(args: list[str], timeout: float = 240) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-6000:]  # the worker's traceback, then torchrun's summary


def test_torchrun_trains_and_resumes(tmp_path):
    """`torchrun -m attnlab train` (one process: attnlab runs it as without torchrun), then --resume."""
    out, data = tmp_path / "run", corpus(tmp_path)
    base = ["-m", "attnlab", *TRAIN, "--data", str(data), "--out", str(out), "--device", DEVICE.type]
    torchrun([*base, "--max-steps", "4"])
    torchrun([*base, "--resume", "--max-steps", "8"])
    assert len(losses(out)) == 8 and attnlab.load(out, "cpu").step == 8


def test_a_group_of_one_trains_with_ddp_and_fsdp_on_nccl(tmp_path):
    """Under torchrun, a process group of one (see GROUP_OF_ONE): the backend attnlab joins is NCCL on a
    GPU, and DDP and FSDP runs (4 steps, resumed to 8) give the losses of the same run without a group."""
    data, driver = corpus(tmp_path), tmp_path / "group_of_one.py"
    driver.write_text(GROUP_OF_ONE)
    torchrun([str(driver), str(tmp_path), *TRAIN, "--data", str(data), "--device", DEVICE.type])
    assert json.loads((tmp_path / "backends.json").read_text()) == ["nccl" if ON_GPU else "gloo"] * 4
    model = GPTConfig(n_layer=1, n_head=2, d_model=64, context=32)
    alone = tmp_path / "alone"
    cfg = dict(batch_size=8, eval_interval=4, warmup_steps=1, lr=3e-3)  # TRAIN's settings, and the default lr
    attnlab.train(alone, model, tiny(max_steps=4, **cfg), DataConfig(data=str(data)), progress=False)
    attnlab.train(alone, None, tiny(max_steps=8, **cfg), None, resume=True, progress=False)
    want = losses(alone)
    for parallel in ("ddp", "fsdp"):
        got = losses(tmp_path / parallel)
        assert len(got) == 8 and max(abs(x - y) for x, y in zip(got, want)) < 1e-4, (parallel, got, want)
