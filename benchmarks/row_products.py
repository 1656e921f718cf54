"""One-row products (a decode step's matrix-vector products) by kernel, in GB/s of stored weight read.

    .venv/bin/python benchmarks/row_products.py [--shapes gpt2-small|6x384] [--rounds 7]

For each matrix shape of the model, enough different matrices to hold ~160 MB (so the bytes come from
memory, as in a decode step, not from the cache) are multiplied by one row in turn, each kernel in
turn in each round (interleaved: a busy neighbour slows all alike), median of the rounds:
float32 F.linear; int8 torch._weight_int8pack_mm (bf16 activations), inductor's fused sum over the
stored rows, attnlab's hand-written operator (nn/row_kernels.py); bf16 torch.mv, attnlab's operator.
Each kernel's outputs are checked against float64 first (relative error printed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from common import cpu_name, format_table

from attnlab.nn import row_kernels

SHAPES = {
    "gpt2-small": [(768, 768), (2304, 768), (3072, 768), (768, 3072), (50257, 768)],
    "6x384": [(384, 384), (1152, 384), (1536, 384), (384, 1536), (257, 384)],
}
BYTES = 160e6  # weights per round of one kernel: more than the caches hold


@torch.compile(dynamic=False)
def inductor_sum(x, codes, scales):
    return (x * codes.float()).sum(-1) * scales


def kernels() -> dict:
    """name -> (stored dtype, product(x, w32, stored, scales)): w32 float32, stored the kernel's tensor."""
    found = {
        "f32 F.linear": (torch.float32, lambda x, w, s, c: F.linear(x, w)),
        "int8 int8pack_mm": (torch.int8, lambda x, w, s, c: torch._weight_int8pack_mm(x.bfloat16(), s, c.bfloat16())),
        "int8 inductor sum": (torch.int8, lambda x, w, s, c: inductor_sum(x, s, c)),
        "bf16 torch.mv": (torch.bfloat16, lambda x, w, s, c: torch.mv(s, x[0].bfloat16())),
    }
    if row_kernels.loaded():
        found["int8 attnlab"] = (torch.int8, lambda x, w, s, c: row_kernels.int8_row(x, s, c))
        found["bf16 attnlab"] = (torch.bfloat16, lambda x, w, s, c: row_kernels.bf16_row(x, s))
    return found


def matrices(shape: tuple[int, int], dtype: torch.dtype, count: int) -> list[tuple]:
    out = []
    for _ in range(count):
        w = torch.randn(shape) * 0.02
        if dtype == torch.int8:
            scales = w.abs().amax(1) / 127
            codes = torch.round(w / scales[:, None]).to(torch.int8)
            out.append((codes.float() * scales[:, None], codes, scales))
        else:
            out.append((w.to(dtype).float(), w.to(dtype), None))
    return out


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", choices=list(SHAPES), default="gpt2-small")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"attnlab operators: {row_kernels.unavailable() or 'loaded'}")  # fmt: skip
    rows = []
    for shape in SHAPES[args.shapes]:
        count = max(1, int(BYTES // (shape[0] * shape[1] * 4)))  # float32's count: every kernel reads the same set
        x = torch.randn(1, shape[1])
        found = kernels()
        sets = {dtype: matrices(shape, dtype, count) for dtype in {d for d, _ in found.values()}}
        times: dict[str, list[float]] = {name: [] for name in found}
        errors = {}
        for name, (dtype, product) in found.items():
            w, stored, scales = sets[dtype][0]
            ref = x.double() @ w.double().T
            errors[name] = ((product(x, w, stored, scales).double() - ref).abs().max() / ref.abs().max()).item()
        for _ in range(args.rounds):
            for name, (dtype, product) in found.items():
                start = time.perf_counter()
                for w, stored, scales in sets[dtype]:
                    product(x, w, stored, scales)
                times[name].append((time.perf_counter() - start) / count)
        for name, (dtype, _) in found.items():
            seconds = statistics.median(times[name])
            stored_bytes = shape[0] * shape[1] * torch.empty(0, dtype=dtype).element_size()
            rows.append({"shape": f"{shape[0]} x {shape[1]}", "kernel": name, "us": seconds * 1e6,
                         "gbs": stored_bytes / seconds / 1e9, "err": errors[name]})  # fmt: skip
    print(format_table(rows, [("shape", "shape (O x I)", "s"), ("kernel", "kernel", "s"), ("us", "us a product", ".1f"),
                              ("gbs", "GB/s", ".1f"), ("err", "rel. error", ".1e")]))  # fmt: skip


if __name__ == "__main__":
    main()
