"""Fine-tuning GPT-2-small's shape (124M) on a CPU: every weight, LoRA, LoRA on an int8 base, LoRA on
an NF4 base (QLoRA): trainable parameters, peak resident memory, tokens/s and the loss after the same
number of steps, each run by `attnlab train sft` in a process of its own.

    .venv/bin/python benchmarks/finetune_memory.py [--steps 12] [--batch-size 8] [--preset gpt2-small]

The base is a randomly initialized GPT-2-small (nothing is downloaded; a converted checkpoint on disk
may be given with --base DIR) with a character tokenizer that reads the built-in instructions. Peak
memory is Linux's high-water mark of the resident set (VmHWM), read twice: after the model is built
(loading the base) and, reset between (/proc/self/clear_refs), over the training steps alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from common import cpu_name

ROWS = {
    "full": {},
    "lora": {"lora_rank": 8},
    "lora-int8": {"lora_rank": 8, "quantize_base": "int8"},
    "lora-nf4": {"lora_rank": 8, "quantize_base": "nf4"},
}


def make_base(folder: Path, preset: str) -> Path:
    """A random run of the preset's shape, its tokenizer the characters of the instructions."""
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.instructions import instructions
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.engine.config import TrainConfig
    from attnlab.io import write_json, write_text
    from attnlab.models.gpt import GPT, PRESETS
    from attnlab.runs.marker import record
    from attnlab.runs.weights import save_weights

    cfg = replace(PRESETS[preset], dropout=0.0)
    texts = [ChatTemplate().render(c.messages) for c in instructions("train", 2000, 0)]
    tok = train_tokenizer("char", texts, 256)
    folder.mkdir(parents=True)
    record(folder, "config.json", "model.safetensors", "tokenizer.json")
    config = {
        "family": "gpt",
        "model": asdict(cfg),
        "train": asdict(TrainConfig()),
        "data": {"data": "instructions", "tokenizer": "char", "vocab_size": tok.vocab_size},
    }
    write_json(folder / "config.json", config)
    write_text(folder / "tokenizer.json", tok.to_json())
    save_weights(GPT(cfg), folder / "model.safetensors", {"step": "0"})
    return folder


def vm(field: str) -> int:
    """A /proc/self/status figure in bytes (VmHWM: peak resident, VmRSS: resident now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def one(name: str, base: str, out: str, steps: int, batch: int, accum: int) -> None:
    """Child process: one fine-tuning, its figures as one JSON line on stdout."""
    import torch

    import attnlab.engine.session as session
    from attnlab.data.finetune import ChatData
    from attnlab.engine.config import TrainConfig
    from attnlab.quant.quantize import QuantizedLinear

    torch.set_num_threads(2)
    marks = {}
    start = session.start

    def measured_start(*args, **kw):  # the model built from the base: mark the load's peak, then reset it
        s = start(*args, **kw)
        marks["load_peak"] = vm("VmHWM")
        marks["trainable"] = sum(p.numel() for p in s.raw.parameters() if p.requires_grad)
        quantized = [m for m in s.raw.modules() if isinstance(m, QuantizedLinear)]  # weights kept as codes
        marks["parameters"] = sum(p.numel() for p in s.raw.parameters()) + sum(
            m.in_features * m.out_features for m in quantized
        )
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return s

    import attnlab.engine.train as train_mod

    loop = train_mod.loop

    def measured_loop(*args, **kw):  # the training steps' peak, before the test split is scored
        result = loop(*args, **kw)
        marks["train_peak"] = vm("VmHWM")
        return result

    train_mod.start, train_mod.loop = measured_start, measured_loop
    import attnlab

    cfg = TrainConfig(
        max_steps=steps,
        batch_size=batch,
        grad_accum=accum,
        eval_interval=steps,
        eval_batches=1,
        warmup_steps=2,
        lr=1e-3,
        weight_decay=0.0,
        device="cpu",
        dtype="float32",
    )
    data = ChatData(examples=400, test_examples=8)
    attnlab.train(out, None, cfg, data, init=base, task="sft", progress=False, **ROWS[name])
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "loss" in r]
    rate = statistics.median(r["tokens_per_s"] for r in steps_rows[1:])  # the first step warms up
    last = statistics.mean(r["loss"] for r in steps_rows[-3:])
    print(json.dumps({"name": name, **marks, "tokens_per_s": rate, "loss": last}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="gpt2-small")
    ap.add_argument("--base", help="a run (or HuggingFace folder) to start from instead of a random base")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=8, help="micro-batches per step (8: one conversation each)")
    ap.add_argument("--only", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--one", choices=list(ROWS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one, args.base, args.out, args.steps, args.batch_size, args.grad_accum)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base or str(make_base(Path(tmp) / "base", args.preset))
        print(
            f"CPU: {cpu_name()}; base {args.base or 'random ' + args.preset}; {args.steps} steps of batch "
            f"{args.batch_size} in {args.grad_accum} micro-batches, float32, 2 threads",
            flush=True,
        )
        print("| | trainable parameters | peak memory, loading | peak memory, training | tokens/s | loss |")
        print("|---|---:|---:|---:|---:|---:|")
        results = {}
        for name in args.only:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                name,
                "--base",
                base,
                "--out",
                f"{tmp}/{name}",
                "--steps",
                str(args.steps),
                "--batch-size",
                str(args.batch_size),
                "--grad-accum",
                str(args.grad_accum),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{name} failed:\n{done.stderr[-2000:]}")
            r = results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"| {name} | {r['trainable']:,} of {r['parameters']:,} | {r['load_peak'] / 2**30:.2f} GiB | "
                f"{r['train_peak'] / 2**30:.2f} GiB | {r['tokens_per_s']:,.0f} | {r['loss']:.3f} |",
                flush=True,
            )
        if "full" in results and "lora" in results:
            print(
                f"LoRA's training peak / full fine-tuning's: "
                f"{results['lora']['train_peak'] / results['full']['train_peak']:.2f}"
            )


if __name__ == "__main__":
    main()
