"""Speculative decoding at batch 1 (decoding/speculate.py): tokens/s of plain decoding against prompt
lookup, a draft model and auto, on prompts that copy from their input and on open-ended ones.

Two tasks, greedy (or --temperature T, seeded), one sequence at a time through the model's engine
(what `attnlab sample` does):
- grounded: a piece of the standard library's source, a blank line, then the piece's first line
  again: the continuation copies the piece (an edit or a quotation of a given text);
- open: the first words of a line of code ("def ", "class ", "    if "...): nothing to copy.
Each mode decodes every prompt of a task in turn, modes interleaved within a round (a neighbour's burst
falls on all of them alike); tokens/s = new tokens / wall time of the round (prompts included), the
median of --repeats rounds after an untimed warm-up round; tokens/CPU s the same over the process's CPU
time, which other processes on a busy machine do not lengthen (one thread: the work itself); "decoding
x" the speedup over the time after each prompt's first token (its prefill left out, the same in every
mode: a third of the grounded task's time on the compiled step). Every
mode's tokens are checked against plain decoding's (greedy: they must be the same); accepted/drafted
and the verify passes come from the engine's counters.

    .venv/bin/python benchmarks/speculative.py --run runs/target --draft runs/draft
    .venv/bin/python benchmarks/speculative.py --run runs/target --draft runs/draft --no-compile --repeats 5
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import time

from common import cpu_named, format_table

import attnlab
from attnlab.decoding.drafts import use_draft
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import engine_for
from attnlab.decoding.speculate import Speculate

SOURCES = ("textwrap:dedent", "json:dumps", "shutil:copyfile", "difflib:get_close_matches", "fnmatch:translate")
OPEN = ("def ", "class ", "    if ", "import ", "        return ")
MODES = ("off", "prompt", "draft", "auto")
COLUMNS = [
    ("task", "task", ""),
    ("mode", "mode", ""),
    ("tokens_per_s", "tokens/s", ",.1f"),
    ("speedup", "x plain", ".2f"),
    ("tokens_per_cpu_s", "tokens/CPU s", ",.1f"),
    ("cpu_speedup", "x plain (CPU)", ".2f"),
    ("decode_speedup", "decoding x", ".2f"),
    ("decode_cpu_speedup", "decoding x (CPU)", ".2f"),
    ("accepted", "accepted/drafted", ""),
    ("passes", "verify passes", ","),
    ("same", "same tokens", ""),
]


def grounded_prompts(piece: int) -> list[str]:
    """A piece of each SOURCES function's code, a blank line, its first line again."""
    out = []
    for name in SOURCES:
        module, function = name.split(":")
        code = inspect.getsource(getattr(__import__(module, fromlist=["_"]), function))[:piece]
        out.append(code + "\n\n" + code.splitlines()[0] + "\n")
    return out


def decode(engine, tokenizer, prompts: list[str], mode: str, args) -> tuple[list[float], list[list[int]]]:
    """[wall, CPU, wall after each first token, CPU after it] seconds to decode every prompt
    (args.new_tokens each, prompt i with seed i) with `mode`, and the tokens."""
    ask = {} if mode == "off" else {"speculate": Speculate(mode, args.draft_tokens)}
    clocks = (time.perf_counter, time.process_time)
    begin, after, out = [c() for c in clocks], [0.0, 0.0], []
    for i, prompt in enumerate(prompts):
        draw = Draw(args.temperature, seed=i)
        tokens = []
        for step in engine.generate(tokenizer.encode(prompt), draw, args.new_tokens, **ask):
            if not tokens:  # the prompt is in: the rest is decoding
                first = [c() for c in clocks]
            tokens.append(step.token)
        after = [a + c() - f for a, c, f in zip(after, clocks, first, strict=True)]
        out.append(tokens)
    return [c() - b for c, b in zip(clocks, begin, strict=True)] + after, out


def measure(run, prompts: list[str], args) -> list[dict]:
    """One task: each mode's median tokens/s, its counters and whether its tokens are plain decoding's."""
    engine = engine_for(run.model, args.dtype, compiled=args.compile)
    times = {m: [] for m in MODES}  # each round's [wall, CPU, decoding wall, decoding CPU] seconds
    counters = {m: {"drafted": 0, "accepted": 0, "verify passes": 0} for m in MODES}
    tokens = {}
    for round_ in range(args.repeats + 1):
        for mode in MODES:
            before = {key: engine.stats[key] for key in counters[mode]}
            seconds, tokens[mode] = decode(engine, run.tokenizer, prompts, mode, args)
            if round_:  # the first round warms up (and measures the passes' costs: speculate.costs_of)
                times[mode].append(seconds)
                for key in counters[mode]:
                    counters[mode][key] += engine.stats[key] - before[key]
    median = {m: [statistics.median(r[i] for r in times[m]) for i in range(4)] for m in MODES}
    rows, n = [], len(prompts) * args.new_tokens
    for mode in MODES:
        c, t, off = counters[mode], median[mode], median["off"]
        rows.append(
            {
                "mode": mode,
                "tokens_per_s": n / t[0],
                "speedup": off[0] / t[0],
                "tokens_per_cpu_s": n / t[1],
                "cpu_speedup": off[1] / t[1],
                "decode_speedup": off[2] / t[2],
                "decode_cpu_speedup": off[3] / t[3],
                "accepted": f"{c['accepted']}/{c['drafted']}",
                "passes": c["verify passes"],
                "same": tokens[mode] == tokens["off"] if args.temperature == 0 else "(sampled)",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the served model's run")
    parser.add_argument("--draft", required=True, help="a draft run with the same tokenizer")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--piece", type=int, default=140, help="characters of source in a grounded prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (tokens checked equal)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    run, draft = attnlab.load(args.run, device="cpu"), attnlab.load(args.draft, device="cpu")
    use_draft(run.model, draft.model, args.dtype, args.compile, tokenizers=(run.tokenizer, draft.tokenizer))
    rows = []
    for task, prompts in (("grounded", grounded_prompts(args.piece)), ("open", list(OPEN))):
        rows += [{"task": task, **row} for row in measure(run, prompts, args)]
    load = os.getloadavg()
    print(
        f"{cpu_named()}, load {load[0]:.2f}; {args.run} (draft {args.draft}), {args.dtype}, compile {args.compile}, "
        f"temperature {args.temperature}, {args.new_tokens} tokens a prompt, median of {args.repeats} rounds"
    )
    print(format_table(rows, COLUMNS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": load, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
