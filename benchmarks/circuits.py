"""Attribution graphs on one run: transcoders trained once (or reused), then one graph per prompt,
with circuit-tracer's replacement and completeness scores, the intervention check in the replacement
and the real model, and the time of each graph.

    .venv/bin/python benchmarks/circuits.py runs/chat/base --out runs/circuits --latents 2048 --k 32 --tokens 2000000

docs/circuits.md's table. Transcoders already in OUT/transcoders are reused (delete them to retrain).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import attnlab
from attnlab.interpret.circuits_config import CircuitConfig
from attnlab.interpret.circuits_run import trace_circuit
from attnlab.interpret.sae import SAEConfig
from attnlab.interpret.transcoder import (
    INDEX,
    evaluate_transcoders,
    load_transcoders,
    save_transcoders,
    train_transcoders,
)

PROMPTS = [
    "def add(a, b):\n    return a",
    "for i in range(len(",
    "import os\nimport s",
    "class Point:\n    def __init__(se",
]


def transcoders(run, folder: Path, a: argparse.Namespace) -> tuple[list, dict]:
    if (folder / INDEX).is_file():
        return load_transcoders(folder)
    cfg = SAEConfig(
        latents=a.latents, kind="topk", k=a.k, tokens=a.tokens, batch=4096, dead_after=max(4096, a.tokens // 10)
    )
    tcs, info = train_transcoders(run, cfg, progress=False)
    index = {"run": info["run"], "training": info, "metrics": evaluate_transcoders(run, tcs)}
    save_transcoders(folder, tcs, index)
    return tcs, index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--out", default="runs/circuits")
    ap.add_argument("--latents", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--prompts", nargs="+", default=PROMPTS)
    a = ap.parse_args()
    run = attnlab.load(a.run, device="cpu")
    tcs, index = transcoders(run, Path(a.out) / "transcoders", a)
    m = index["metrics"]
    print(
        json.dumps(
            {
                "training_s": index["training"]["seconds"],
                **{k: m[k] for k in ("explained_variance", "l0", "dead_fraction", "ce_loss_recovered")},
            }
        ),
        flush=True,
    )
    for prompt in a.prompts:
        t0 = time.perf_counter()
        d = trace_circuit(run, prompt, None, tcs, CircuitConfig(top=a.top)).data
        iv = d["intervention"]
        print(
            json.dumps(
                {
                    "prompt": prompt,
                    "target": d["target"],
                    "active_features": d["counts"]["active_features"],
                    "nodes": d["counts"]["nodes"],
                    "edges": d["counts"]["edges"],
                    **d["scores"]["before"],
                    "pruned": d["scores"]["after"],
                    "signs_replacement": iv["replacement_right"],
                    "signs_real": iv["real_right"],
                    "graph_s": d["seconds"]["graph"],
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
