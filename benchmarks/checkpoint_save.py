"""How long one checkpoint takes to save as a model gets deeper (it should grow with the number of
tensors, not with its square).

    .venv/bin/python benchmarks/checkpoint_save.py [--layers 96 500] [--width 32] [--repeats 3]

For each depth: a GPT of that many layers, one AdamW step (so the optimizer has state to save), then
the engine's own `save_checkpoint` into a temporary run folder, timed `--repeats` times (median).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from common import cpu_name

from attnlab.engine.saving import save_checkpoint
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs.checkpoint import BackgroundWriter
from attnlab.runtime.distributed import Dist


def session(n_layer: int, width: int, run: Path) -> SimpleNamespace:
    """What save_checkpoint reads of a training session, for a model after one step."""
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, d_model=width, context=16, vocab_size=64, dropout=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (2, 16))
    torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    optimizer.step()
    return SimpleNamespace(
        raw=model,
        optimizer=optimizer,
        dist=Dist(),
        step=1,
        elapsed=0.0,
        rng=np.random.default_rng(0),
        run=run,
        writer=BackgroundWriter(),
        saved_step=0,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[96, 500])
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    print(f"checkpoint save, width {a.width}, median of {a.repeats} ({cpu_name()}, torch {torch.__version__})")
    for n in a.layers:
        with tempfile.TemporaryDirectory() as tmp:
            s = session(n, a.width, Path(tmp))
            times = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                save_checkpoint(s)
                times.append(time.perf_counter() - t)
        tensors = len(list(s.raw.parameters()))
        print(
            f"{n:5d} layers, {tensors:5d} tensors: {statistics.median(times):7.3f} s "
            f"(samples {', '.join(f'{x:.3f}' for x in times)})"
        )


if __name__ == "__main__":
    main()
