"""What a training session keeps on disk and in memory to stop and go on: checkpoints (weights,
optimizer state, RNG), snapshots of the weights along the way, and the RNG states of the last step
(restored when Ctrl-C lands mid-step)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from attnlab.io import snapshot
from attnlab.runs.checkpoint import TrainState, checkpoint, write_checkpoint
from attnlab.runs.weights import model_weights, state_dict_api, write_weights
from attnlab.runtime import distributed

if TYPE_CHECKING:  # session.py starts a run with a checkpoint from here
    from attnlab.engine.session import Session


def save_checkpoint(s: Session, background: bool = False) -> None:
    """Whole weights and optimizer state (every process takes part in gathering them under
    FSDP); rank 0 writes them, as a run any number of processes can load or resume. In the
    background, they are copied now and s.writer's thread writes them while training goes on:
    the loop waits for it before it returns or raises, so the run it leaves is whole."""
    weights = model_weights(s.raw)
    if s.optimizer.state:
        api = state_dict_api()
        options = api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer = api.get_optimizer_state_dict(s.raw, s.optimizer, options=options)
    else:  # before the first step; asking torch would run a zero step and shift AdamW's step count
        names = {id(p): n for n, p in s.raw.named_parameters()}
        groups = [{**g, "params": [names[id(p)] for p in g["params"]]} for g in s.optimizer.param_groups]
        optimizer = {"state": {}, "param_groups": groups}
    if s.dist.main:
        # Copies: the state dicts may hold the training's own tensors (all of them on the CPU, AdamW's
        # step counts on a GPU), which the next steps change in place while the thread writes.
        files = checkpoint(TrainState(s.step, weights, optimizer, s.elapsed), s.rng, copy=background)
        s.writer.submit(partial(write_checkpoint, s.run, files))  # after the one before it is written
        if not background:
            s.writer.wait()
    s.saved_step = s.step  # on disk, or (background) once the loop ends
    distributed.barrier(s.dist)


SNAPSHOTS = "snapshots"  # RUN/snapshots/step_0000100.safetensors: weights only, every --snapshot-every steps


def save_snapshot(s: Session) -> None:
    """The weights at this step, kept apart from the checkpoint (which each save replaces), written
    by the checkpoint thread from copies taken now."""
    weights = model_weights(s.raw)  # every process takes part under FSDP
    if s.dist.main:
        copies = {k: snapshot(v, copy=True) for k, v in weights.items()}
        path = s.run / SNAPSHOTS / f"step_{s.step:07d}.safetensors"
        path.parent.mkdir(exist_ok=True)
        s.writer.submit(partial(write_weights, copies, path, {"step": str(s.step)}))


def rng_snapshot(s: Session) -> dict:
    state = {"step": s.step, "numpy": s.rng.bit_generator.state, "torch": torch.get_rng_state()}
    if s.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(s.device)
    return state


def restore_rng(s: Session, state: dict) -> None:
    s.rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], s.device)
