"""Row products (a decode step's matrix products, batch 1 to 32) by kernel, in GB/s of stored weight read.

    .venv/bin/python benchmarks/row_products.py [--shapes gpt2-small|6x384] [--batches 1,2,4,8,16,32] [--rounds 7]

For each matrix shape of the model, enough different matrices to hold ~160 MB (so the bytes come from
memory, as in a decode step, not from the cache) are multiplied by M rows in turn, each kernel in turn
in each round (interleaved: a busy neighbour slows all alike), median of the rounds: float32 F.linear
and attnlab's operator (quant/row_kernels.py); int8 torch._weight_int8pack_mm (bf16 activations),
inductor's fused sum over the stored rows (batch 1 only), attnlab's operator; int4 PyTorch's int4
kernel and attnlab's (q8 activations); bf16 PyTorch's (torch.mv on one row, F.linear on more) and
attnlab's. GB/s counts what each layer stores (codes, scales, zeros); "x f32" is float32 F.linear's
time over the kernel's at that shape and batch. Each kernel's outputs are checked against the float64
product of the weights it holds (relative error; attnlab's int4 rounds its activations to int8).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from common import columns, cpu_name, format_table
from torch import nn

from attnlab.quant import row_kernels
from attnlab.quant.packed import COMPUTE, KERNELS, ROW_OPS, PackedLinear

SHAPES = {
    "gpt2-small": [(768, 768), (2304, 768), (3072, 768), (768, 3072), (50257, 768)],
    "6x384": [(384, 384), (1152, 384), (1536, 384), (384, 1536), (257, 384)],
}
BYTES = 160e6  # weights per round of one kernel: more than the caches hold


@torch.compile(dynamic=False)
def inductor_sum(x, codes, scales):
    return (x * codes.float()).sum(-1) * scales


def kernels() -> dict:
    """name -> (kind of stored weight, product(x, layer)): layer an nn.Linear (float32) or a PackedLinear."""
    packed = lambda kind: lambda x, layer: KERNELS[kind](x.to(COMPUTE), *layer.operands())[:, : layer.out_features]
    found = {
        "f32 F.linear": ("float32", lambda x, layer: F.linear(x, layer.weight)),
        "int8 int8pack_mm": ("int8", packed("int8")),
        "int8 inductor sum": ("int8", lambda x, layer: inductor_sum(x, layer.codes, layer.scales.to(COMPUTE).float())),
        "int4 int4pack_mm": ("int4", packed("int4")),
        "bf16 PyTorch": ("bf16", packed("bf16")),
    }
    if row_kernels.loaded():
        found.update({f"{kind} attnlab": (kind, ROW_OPS[kind]) for kind in ROW_OPS})
        found["f32 attnlab"] = ("float32", lambda x, layer: row_kernels.f32_row(x, layer.weight))
    return found


def layers(shape: tuple[int, int], kind: str, count: int) -> list[nn.Module]:
    made = [nn.Linear(shape[1], shape[0], bias=False) for _ in range(count)]
    return made if kind == "float32" else [PackedLinear.from_linear(m, kind) for m in made]


def weight(layer: nn.Module) -> torch.Tensor:
    return layer.weight if isinstance(layer, nn.Linear) else layer.dequantize()


def stored_bytes(layer: nn.Module) -> int:
    return layer.weight.numel() * 4 if isinstance(layer, nn.Linear) else layer.stored_bytes()


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", choices=list(SHAPES), default="gpt2-small")
    parser.add_argument("--batches", default="1", help="rows per product, comma-separated (e.g. 1,2,4,8,16,32)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"attnlab operators: {row_kernels.unavailable() or 'loaded'}"
    )
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    for shape in SHAPES[args.shapes]:
        count = max(1, int(BYTES // (shape[0] * shape[1] * 4)))  # float32's count: every kernel reads the same set
        every = kernels()
        sets = {kind: layers(shape, kind, count) for kind in {kind for kind, _ in every.values()}}
        for batch in batches:
            x = torch.randn(batch, shape[1])
            found = {name: k for name, k in every.items() if batch == 1 or "inductor" not in name}
            times = timed(found, sets, x, count, args.rounds)
            base = statistics.median(times["f32 F.linear"])
            for name, (kind, product) in found.items():
                seconds = statistics.median(times[name])
                ref = x.double() @ weight(sets[kind][0]).double().T
                error = ((product(x, sets[kind][0]).double() - ref).abs().max() / ref.abs().max()).item()
                rows.append(
                    {
                        "shape": f"{shape[0]} x {shape[1]}",
                        "batch": batch,
                        "kernel": name,
                        "us": seconds * 1e6,
                        "gbs": stored_bytes(sets[kind][0]) / seconds / 1e9,
                        "vs": base / seconds,
                        "err": error,
                    }
                )
    print(
        format_table(
            rows,
            columns(
                "shape:shape (O x I):s; batch:M:d; kernel::s; us:us a product:.1f; "
                "gbs:GB/s:.1f; vs:x f32:.2f; err:rel. error:.1e"
            ),
        )
    )


def timed(found: dict, sets: dict, x: torch.Tensor, count: int, rounds: int) -> dict[str, list[float]]:
    """Seconds a product, per kernel per round: each round runs every kernel over its whole set in turn."""
    times: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(rounds):
        for name, (kind, product) in found.items():
            start = time.perf_counter()
            for layer in sets[kind]:
                product(x, layer)
            times[name].append((time.perf_counter() - start) / count)
    return times


if __name__ == "__main__":
    main()
