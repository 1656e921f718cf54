"""Texts embedded per second by attnlab.embed (runs/embed.py) at batch 1 and 32, for small models of
each family that embeds (random weights: the speed does not depend on them).

    python benchmarks/embed_speed.py [--tokens 48] [--repeats 3] [--threads N]

Each text is --tokens ids long; batch 1 embeds 64 texts one forward pass each, batch 32 embeds 256
in passes of 32. Prints one JSON line per model: texts/s at each batch (the median of --repeats),
with the machine's CPU, the threads torch used and the load. On a machine others are busy on, one
thread measures steadier: two threads waiting on each other under a load of 8 ran 30x slower here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.runs.embed import embed_ids

MODELS = {
    "gpt-nano": lambda: GPT(GPTConfig.from_preset("gpt-nano")),  # 4 x 128, context 64, 256 tokens
    "gpt-micro": lambda: GPT(GPTConfig.from_preset("gpt-micro")),  # 6 x 384, context 256
    "encoder-small": lambda: Encoder(EncoderConfig.from_preset("encoder-small")),  # 4 x 128, 8,192 words
    "transformer-small": lambda: Seq2Seq(Seq2SeqConfig.from_preset("transformer-small", src_vocab=8192)),
}
TEXTS = {1: 64, 32: 256}  # batch size -> texts embedded per measurement


def texts_per_second(model: torch.nn.Module, tokens: int, batch: int, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (TEXTS[batch], tokens), generator=g).tolist()
    embed_ids(model, ids[:batch], batch_size=batch)  # warm-up: the first pass allocates
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        embed_ids(model, ids, batch_size=batch)
        times.append(time.perf_counter() - t0)
    return len(ids) / statistics.median(times)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, build in MODELS.items():
        model = build().eval()
        speeds = {f"batch_{b}": round(texts_per_second(model, args.tokens, b, args.repeats), 1) for b in TEXTS}
        row = {"model": name, "tokens": args.tokens, "texts_per_s": speeds, "threads": torch.get_num_threads()}
        print(json.dumps({**row, "cpu": cpu_name(), "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
