"""Quantized frozen linears (quant/quantize.py) against nn.Linear: the quantize -> dequantize error, the
bytes, and the forward time at GPT-2-small's shapes.

    .venv/bin/python benchmarks/quantize_speed.py

Weights N(0, 0.02) as at GPT-2's init; error: the largest |W - W_deq| and the relative RMS error
||W - W_deq|| / ||W||. Time: the forward on 1024 tokens (a training batch, 8 x 128) and on 1 token (a
decode step), nn.Linear, int8 and NF4 timed in turn in each round (interleaved, so a busy neighbour
on a shared machine slows all three alike), median of 5 rounds.
"""

from __future__ import annotations

import statistics
import time

import torch
from common import cpu_name
from torch import nn

from attnlab.quant.quantize import QuantizedLinear

SHAPES = [(768, 768), (768, 3072)]  # (in, out): attention's out_proj, the feed-forward's up
TOKENS = [1024, 1]


def seconds(layer: nn.Module, x: torch.Tensor, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        layer(x)
    return (time.perf_counter() - start) / number


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("shape (in x out) | kind  | max |err| | rel. RMS err | weight bytes | tokens | ms (median of 5)")
    for d_in, d_out in SHAPES:
        linear = nn.Linear(d_in, d_out)
        nn.init.normal_(linear.weight, std=0.02)
        layers = {"float32": linear, **{k: QuantizedLinear.from_linear(linear, k) for k in ("int8", "nf4")}}
        for tokens in TOKENS:
            x = torch.randn(tokens, d_in)
            number = 20 if tokens > 1 else 200
            runs: dict[str, list[float]] = {k: [] for k in layers}
            for layer in layers.values():
                seconds(layer, x, 3)  # warm up
            for _ in range(5):
                for kind, layer in layers.items():
                    runs[kind].append(seconds(layer, x, number))
            for kind, layer in layers.items():
                w = linear.weight if kind == "float32" else layer.dequantize()
                err = (w - linear.weight).abs().max().item()
                rel = ((w - linear.weight).norm() / linear.weight.norm()).item()
                size = linear.weight.nbytes if kind == "float32" else layer.codes.nbytes + layer.scales.nbytes
                ms = statistics.median(runs[kind]) * 1e3
                print(f"{d_in} x {d_out:<5} | {kind:7} | {err:.2e} | {rel:.4f} | {size:>10,} | {tokens:>5} | {ms:.3f}")


if __name__ == "__main__":
    main()
