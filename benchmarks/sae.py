"""Sparse autoencoders measured: synthetic ground truth, and an SAE on a trained GPT's residual stream.

    .venv/bin/python benchmarks/sae.py synthetic [--features 1024 --dim 128]
    .venv/bin/python benchmarks/sae.py residual RUN [--hook blocks.1.hook_resid_post] [--out DIR]

synthetic: `attnlab sae synthetic`'s defaults (1,024 features in 128 dimensions, about 5 active a
sample; a topk SAE with one latent per feature): mcc, dead fraction, true and learned L0, and the time.
residual: `attnlab sae train` on a middle layer's residual stream of RUN (e.g. a copy of the chat
demo's base, runs/chat/base: a 0.85M-parameter character GPT on the standard library), then its
metrics on the validation split. Each prints the machine, the load average before and after, wall
time and this process's CPU time (on a shared machine the wall time says more about the others).
Figures: docs/sae.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

from common import cpu_name

from attnlab.cli.main import main as cli


def loads() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def measure(argv: list[str]) -> dict:
    """`attnlab ARGV --json`, its printed object, with wall and CPU seconds."""
    print(f"{cpu_name()}; {loads()} before", file=sys.stderr)
    wall, cpu = time.perf_counter(), time.process_time()
    captured = io.StringIO()  # the command's JSON line, read back
    with contextlib.redirect_stdout(captured):
        code = cli([*argv, "--json"])
    if code:
        raise SystemExit(code)
    out = json.loads(captured.getvalue().strip().splitlines()[-1])
    out.update(wall_s=round(time.perf_counter() - wall, 1), cpu_s=round(time.process_time() - cpu, 1))
    print(f"{cpu_name()}; {loads()} after", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("synthetic", "residual"))
    p.add_argument("run", nargs="?")
    p.add_argument("--features", default="1024")
    p.add_argument("--dim", default="128")
    p.add_argument("--hook", default="blocks.1.hook_resid_post")
    p.add_argument("--out", default="runs/sae_resid")
    p.add_argument("--threads", default="2")
    a, extra = p.parse_known_args()  # other flags go to the attnlab command (--latents, --k, --tokens, ...)
    threads = ["--threads", a.threads]
    if a.what == "synthetic":
        r = measure([*threads, "sae", "synthetic", "--features", a.features, "--dim", a.dim, *extra])
        keys = ("mcc", "dead_fraction", "true_l0", "learned_l0", "explained_variance", "seconds", "wall_s", "cpu_s")
    else:
        if not a.run:
            p.error("residual needs a RUN")
        r = measure(
            [*threads, "sae", "train", a.run, "--hook", a.hook, "--out", a.out, "--force", "--device", "cpu", *extra]
        )
        keys = (
            "explained_variance",
            "ce_loss_recovered",
            "l0",
            "dead_fraction",
            "kl_div",
            "ce_clean",
            "ce_sae",
            "ce_zero",
            "seconds",
            "wall_s",
            "cpu_s",
        )
    print("  ".join(f"{k} {r[k]:.4g}" if isinstance(r[k], float) else f"{k} {r[k]}" for k in keys))


if __name__ == "__main__":
    main()
