"""`attnlab sae train RUN --hook NAME --latents N --out DIR`, `attnlab sae show DIR` and `attnlab sae
synthetic --features F --dim D`: sparse autoencoders. Each sub-command's flags are filled the first time
it is used (cli/sae_run.py, which imports torch), so `attnlab sae --help` starts without torch."""

from __future__ import annotations

import argparse
import importlib

RUN = "attnlab.cli.sae_run"  # the sub-commands' options and what runs them: imported when one is used
SUBCOMMANDS = {
    "train": "train an SAE on one hook point of a language-model run, streamed from the run's own data",
    "show": "a self-contained HTML page of an SAE's features: top contexts, logit effects, density",
    "synthetic": "an SAE on activations made of known sparse features: how well it finds them (mcc)",
}


def fill_sae(sae: argparse.ArgumentParser, parser_class: type) -> None:
    """`attnlab sae train|show|synthetic`, in the `sae` parser cli/main.py made (filled when used)."""
    sae.description = (
        "Sparse autoencoders: train one on a run's hook point (streamed from its own data), "
        "see its features, or check one against known features (synthetic). docs/sae.md."
    )
    what = sae.add_subparsers(dest="sae_command", metavar="COMMAND", parser_class=parser_class)
    what.required = True
    for name, help_ in SUBCOMMANDS.items():
        p = what.add_parser(name, help=help_, description=help_)
        p.fill = lambda p=p, name=name: importlib.import_module(RUN).fill(p, name)
        p.keeps_help = True  # its flags need torch to be made: its help is kept once made


__all__ = ["fill_sae"]
