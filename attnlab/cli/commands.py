"""The commands that use a trained run (predict, translate, eval, sample), compare several, and the
demo and size: each takes its options dataclass (cli/options.py) and calls the library."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.cli.chat import generating_run, template_of, with_draft
from attnlab.cli.demo import run_demo
from attnlab.cli.demo_chat import run_chat_demo
from attnlab.cli.options import (
    DemoOptions,
    EmbedOptions,
    EvalOptions,
    HeadsOut,
    PredictOptions,
    ReportOptions,
    SampleOptions,
    SizeOptions,
)
from attnlab.cli.quantize import note_quantized
from attnlab.config import checked
from attnlab.data.conversations import Message
from attnlab.decoding import sampling
from attnlab.decoding.chat import answers, stream_answer
from attnlab.decoding.dialogue import trimmed
from attnlab.decoding.sampling import GenerateConfig
from attnlab.decoding.settings import compiling
from attnlab.errors import AttnlabError
from attnlab.interpret.head_select import describe, head_hooks
from attnlab.models.cluster import ClusterConfig, cluster_estimate, format_cluster
from attnlab.models.gpt import PRESETS
from attnlab.models.size import estimate, format_estimate
from attnlab.models.size import format_table as size_table
from attnlab.nn.hooks import hooks
from attnlab.runs.embed import embed, pooling_of
from attnlab.runs.report import table, write_report
from attnlab.runs.run import Run, load
from attnlab.runtime.device import pick_dtype
from attnlab.tasks.compare import CompareOptions, run_comparison
from attnlab.tasks.reward import best_of


def speaks() -> bool:
    """Under torchrun, one process prints results."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def heads_removed(run: Run, opts: HeadsOut) -> Iterator[None]:
    """The run's model with the heads of --keep / --remove zeroed (interpret/head_select.py)."""
    fns = head_hooks(run.model, opts.keep, opts.remove)
    if fns:
        print(f"[{describe(run.model, fns)}]", file=sys.stderr)
    with hooks(run.model, fns):
        yield


def run_predict(opts: PredictOptions) -> int:
    """predict and translate: what the run's task answers for the input."""
    run = load(opts.run, device=opts.device)
    with heads_removed(run, opts):
        result = run.task.predict(run, opts.text, dataclasses.asdict(opts))
    print(json.dumps(result) if opts.json else run.task.show_prediction(result))
    return 0


def run_embed(opts: EmbedOptions) -> int:
    """Each text's vector (its first values, or all of them with --json) and the cosine similarities."""
    run = load(opts.run, device=opts.device)
    vectors = embed(run, opts.texts, opts.pooling, opts.truncate, opts.dimensions)  # (N, D), unit rows
    how = pooling_of(run.model, opts.pooling)
    if opts.json:
        print(json.dumps({"pooling": how, "texts": opts.texts, "embeddings": vectors.tolist()}))
        return 0
    print(f"{how} pooling, {vectors.shape[1]} dimensions, unit length")
    for i, (text, v) in enumerate(zip(opts.texts, vectors), 1):
        shown = text if len(text) <= 40 else f"{text[:37]}..."
        print(f"[{i}] {' '.join(f'{x:+.3f}' for x in v[:6].tolist())} ...  {shown!r}")
    if len(opts.texts) > 1:  # unit vectors: their dot products are the cosine similarities
        print("cosine similarity:")
        for i, row in enumerate((vectors @ vectors.T).tolist(), 1):
            print(f"[{i}] " + " ".join(f"{x:6.3f}" for x in row))
    return 0


def run_eval(opts: EvalOptions) -> int:
    run = note_quantized(load(opts.run, device=opts.device, quantize=opts.quantize))
    result = run.task.evaluate(run, opts.data, opts.split, {**dataclasses.asdict(opts), "progress": not opts.json})
    print(json.dumps({"run": str(opts.run), **result}) if opts.json else run.task.show_evaluation(result))
    return 0


SAMPLE_BATCH = 64  # rows decoded together by `attnlab sample --num-samples N`


def run_sample(opts: SampleOptions, gen: dict[str, Any]) -> int:
    """One sample streams as it is generated; several are drawn as one batch."""
    cfg = checked(GenerateConfig, gen, where="generation")
    if (opts.best_of > 1 or opts.reward is not None) and (opts.chat is None or opts.reward is None):
        raise AttnlabError(
            "best-of-N answers a chat message and scores it with a reward model: give --chat MESSAGE, "
            "--best-of N and --reward RUN"
        )
    if opts.chat is not None and ({"prompt", "stop"} & set(gen)):
        raise AttnlabError(
            "--chat is the prompt, and its answer ends at the chat template's end of turn: leave out "
            "--prompt and --stop"
        )
    cfg = dataclasses.replace(cfg, compile=compiling(cfg.compile))  # on unless --no-compile, ATTNLAB_COMPILE=0
    run = with_draft(
        generating_run(opts.run, opts.device, "sample", opts.quantize, cfg.compile), opts.draft, cfg.speculate
    )
    pick_dtype(cfg.dtype, run.device, run.model.cfg.d_model, use="decode")  # says why on stderr before the text
    with heads_removed(run, opts):
        if opts.chat is not None:
            return sample_answers(run, opts, cfg)
        if opts.num_samples == 1:
            print(cfg.prompt, end="", flush=True)
            for piece in sampling.stream_text(run.model, run.tokenizer, cfg.prompt, cfg):
                print(piece, end="", flush=True)
            print()
            return 0
        # Batches of SAMPLE_BATCH, each printed when done: memory stays that of one batch, however many
        # samples are asked for (10^9 once grew to 9 GB in a minute). Sample i still draws with seed + i.
        kw, base = dataclasses.asdict(cfg), sampling.seed_of(cfg.seed)
        for start in range(0, opts.num_samples, SAMPLE_BATCH):
            kw["seed"], n = base + start, min(SAMPLE_BATCH, opts.num_samples - start)
            for i, text in enumerate(sampling.sample_texts(run.model, run.tokenizer, num_samples=n, **kw), start):
                print(("\n" + "-" * 40 + "\n" if i else "") + cfg.prompt + text, flush=True)
    return 0


def sample_answers(run: Run, opts: SampleOptions, cfg: GenerateConfig) -> int:
    """--chat: the answers to one user message, as `attnlab chat` would give them (one streams; several
    are decoded together, answer i drawing with seed + i)."""
    template, messages = template_of(run), [Message("user", opts.chat)]
    kw = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("prompt", "stop", "seed")}
    if opts.reward is not None:
        return sample_best(run, opts, cfg, messages, kw)
    if opts.num_samples == 1:
        for piece in trimmed(stream_answer(run.model, run.tokenizer, template, messages, seed=cfg.seed, **kw)):
            print(piece, end="", flush=True)
        print()
        return 0
    base = sampling.seed_of(cfg.seed)
    for start in range(0, opts.num_samples, SAMPLE_BATCH):  # batches, as plain samples are drawn
        n = min(SAMPLE_BATCH, opts.num_samples - start)
        for i, text in enumerate(
            answers(run.model, run.tokenizer, template, [messages] * n, seed=base + start, **kw), start
        ):
            print(("\n" + "-" * 40 + "\n" if i else "") + text, flush=True)
    return 0


def sample_best(run: Run, opts: SampleOptions, cfg: GenerateConfig, messages: list[Message], kw: dict) -> int:
    """--best-of N --reward RUN: the answer the reward model scores highest of N drawn (each sample)."""
    reward = load(opts.reward, device=opts.device)
    base = sampling.seed_of(cfg.seed)
    for i in range(opts.num_samples):
        ranked = best_of(run, reward, messages, opts.best_of, seed=base + i * opts.best_of, **kw)
        scores = ", ".join(f"{s:+.2f}" for s, _ in ranked)
        print(f"best of {opts.best_of} by {opts.reward} (scores {scores})", file=sys.stderr)
        print(("\n" + "-" * 40 + "\n" if i else "") + ranked[0][1], flush=True)
    return 0


def run_compare(opts: CompareOptions) -> int:
    _, table = run_comparison(opts)
    print(table)
    print(f"chart: {Path(opts.out) / 'compare.png'}")
    return 0


def run_size(opts: SizeOptions, cluster: dict[str, Any]) -> int:
    names = list(PRESETS) if opts.preset == "all" else [opts.preset]
    for name in names:
        if name not in PRESETS:
            raise AttnlabError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)} or all")
    plan = checked(ClusterConfig, cluster, where="cluster")
    results = [estimate(PRESETS[n], n) for n in names]
    for e in results:
        e["cluster"] = cluster_estimate(e, plan)
    if opts.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    elif len(results) > 1:
        print(size_table(results))
    else:
        print(format_estimate(results[0]) + "\n" + format_cluster(results[0], results[0]["cluster"]))
    return 0


def run_demo_command(opts: DemoOptions) -> int:
    if opts.chat:
        run_chat_demo("runs/chat" if opts.out == "runs/demo" else opts.out, opts.base, opts.seed)
        return 0
    if opts.base or opts.seed is not None:
        raise AttnlabError(f"{'--base' if opts.base else '--seed'} is for the assistant chain: give --chat too")
    run_demo(opts.out, opts.max_steps, opts.time_budget)
    return 0


def run_report(opts: ReportOptions) -> int:
    """`attnlab report OUT`: the chain's report card (runs/report.py), its table printed."""
    report = write_report(opts.folder)
    for row in table(report):
        print("  ".join(f"{c:>18}" for c in row))
    print("written: " + ", ".join(report["files"]))
    return 0
