"""What `attnlab sae train|show|synthetic` take and do, over interpret/sae*.py (imports torch: cli/sae.py
loads it only when a sub-command is used)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path

from attnlab.cli.generate import add_options, read_options
from attnlab.config import option
from attnlab.interpret.sae import KINDS, SAEConfig, load_sae, save_sae
from attnlab.interpret.sae_page import write_page
from attnlab.interpret.sae_synthetic import SyntheticConfig, run_synthetic, true_l0
from attnlab.interpret.sae_train import check_run, evaluate_sae, train_sae
from attnlab.runs.outputs import check_output_folder
from attnlab.runs.run import load
from attnlab.runtime.threads import share

SHOWN = ("explained_variance", "l0", "ce_loss_recovered", "kl_div", "dead_fraction")


@dataclass
class SaeTrainOptions:
    run: str = option("", "the language-model run whose activations the SAE reads", positional=True)
    hook: str = option(
        "",
        "the hook point, e.g. blocks.1.hook_resid_post (a wrong name lists the run's)",
        required=True,
        metavar="NAME",
    )
    out: str = option("", "folder to write sae.safetensors and sae.json to", required=True, metavar="DIR")
    eval_tokens: int = option(32768, "validation tokens the metrics are measured on", at_least=1)
    device: str = option("auto", "where the model and the SAE run: auto, cpu, cuda, cuda:N or mps")
    force: bool = option(False, "replace an SAE already in --out")
    json: bool = option(False, "print one JSON object (the metrics, the density histogram left out)")


@dataclass
class SaeShowOptions:
    folder: str = option("", "an SAE folder written by attnlab sae train", positional=True, metavar="DIR")
    out: str | None = option(None, "the page to write (default: DIR/features.html)", metavar="FILE")
    features: int = option(48, "live features to show, spread from the rarest to the most common", at_least=1)
    tokens: int = option(65536, "validation tokens searched for each feature's top contexts", at_least=1)
    run: str | None = option(None, "the run to read (default: the one sae.json names)", metavar="RUN")
    device: str = option("cpu", "where the model runs: auto, cpu, cuda, cuda:N or mps")


@dataclass
class SaeSyntheticOptions(SyntheticConfig):  # the features' world (its flags), then the SAE's
    kind: str = option("topk", "the SAE: topk, batchtopk, jumprelu or relu", KINDS)
    latents: int | None = option(None, "the SAE's latents (default: F)", at_least=1)
    k: int | None = option(None, "topk / batchtopk: active latents (default: the true L0, rounded)", at_least=1)
    tokens: int = option(2_000_000, "samples the SAE trains on", at_least=1)
    lr: float = option(1e-2, "Adam's learning rate")
    json: bool = option(False, "print one JSON object")


def run_train(opts: SaeTrainOptions, cfg: SAEConfig) -> int:

    out = check_output_folder(opts.out, opts.force, ("sae.json",), what="an SAE")
    run = load(opts.run, device=opts.device)
    data = check_run(run, opts.hook)  # a wrong hook or a run without data: said before any work
    sae, info = train_sae(run, opts.hook, cfg, progress=not opts.json)
    found = evaluate_sae(run, opts.hook, sae, opts.eval_tokens, data=data)
    save_sae(sae, out, {"hook": opts.hook, "run": str(Path(opts.run).absolute()), "training": info, "metrics": found})
    brief = {k: v for k, v in found.items() if k not in ("density", "density_histogram")}
    if opts.json:
        print(json.dumps({"out": str(out), "hook": opts.hook, **brief, "seconds": info["seconds"]}))
    else:
        print(
            f"{cfg.kind} SAE, {cfg.latents:,} latents on {opts.hook}: {info['tokens']:,} tokens in "
            f"{info['seconds']:.0f} s"
        )
        print("  ".join(f"{k} {brief[k]:.4f}" for k in SHOWN))
        print(f"written: {out / 'sae.safetensors'}, {out / 'sae.json'}; see its features: attnlab sae show {out}")
    return 0


def run_show(opts: SaeShowOptions) -> int:

    saved = load_sae(opts.folder)
    run = load(opts.run or saved.info.get("run", ""), device=opts.device)
    saved.sae.to(run.device)
    out = Path(opts.out) if opts.out else Path(opts.folder) / "features.html"
    write_page(run, saved, out, opts.features, opts.tokens)
    print(f"wrote {out}")
    return 0


def run_synthetic_command(opts: SaeSyntheticOptions) -> int:

    share()
    world = SyntheticConfig(**{f.name: getattr(opts, f.name) for f in fields(SyntheticConfig)})
    latents = opts.latents or opts.features
    k = min(latents, opts.k or max(1, round(true_l0(world))))
    # dead (for AuxK) once silent for as many samples as a true feature fires in 80 times: 2e5, 4e4 and
    # 1.6e4 samples gave 0.7%, 0.1% and 0 dead at 1,024 features in 128 dims (docs/sae.md)
    given = {name: getattr(opts, name) for name in ("kind", "tokens", "lr", "seed")}  # the flags as they are
    cfg = SAEConfig(latents=latents, k=k, aux_k=max(1, opts.dim // 2), dead_after=max(1, round(80 / world.p)), **given)
    r = run_synthetic(world, cfg, progress=not opts.json)
    if opts.json:
        print(json.dumps(r))
    else:
        print(
            f"{opts.features} features in {opts.dim} dims, {cfg.kind} SAE with {latents} latents (k {k}): "
            f"mcc {r['mcc']:.4f}, dead_fraction {r['dead_fraction']:.4f}, L0 true {r['true_l0']:.2f} learned "
            f"{r['learned_l0']:.2f}, explained_variance {r['explained_variance']:.4f}, "
            f"{r['seconds']:.1f} s"
        )
    return 0


def fill(p: argparse.ArgumentParser, name: str) -> None:
    """The flags of `attnlab sae NAME` (cli/sae.py calls it the first time the sub-command is used)."""
    if name == "train":
        add_options(p, SaeTrainOptions)
        add_options(p, SAEConfig)
        p.set_defaults(
            command=lambda args: run_train(read_options(args, SaeTrainOptions), read_options(args, SAEConfig))
        )
    elif name == "show":
        add_options(p, SaeShowOptions)
        p.set_defaults(command=lambda args: run_show(read_options(args, SaeShowOptions)))
    else:
        add_options(p, SaeSyntheticOptions)
        p.set_defaults(command=lambda args: run_synthetic_command(read_options(args, SaeSyntheticOptions)))


__all__ = ["fill"]
