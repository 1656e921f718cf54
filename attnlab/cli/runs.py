"""`attnlab runs [FOLDER]`: the runs under a folder, one line each; `attnlab runs compare A B ... --out
FILE`: their loss curves on one picture. Both over runs/listing.py."""

from __future__ import annotations

import argparse

from attnlab.cli.generate import add_options, read_options
from attnlab.cli.options import RunsCompareOptions, RunsOptions
from attnlab.runs.listing import compare_runs, list_runs, table
from attnlab.runs.outputs import check_outputs

SUBCOMMANDS = ("list", "compare")


def run_list(opts: RunsOptions) -> int:
    runs = list_runs(opts.folder)
    if not runs:
        print(f"no runs in {opts.folder} (a run is a folder attnlab train wrote: config.json and model.safetensors)")
        return 0
    print(table(runs))
    return 0


def run_compare(opts: RunsCompareOptions) -> int:
    check_outputs(opts)  # before any work: no file of the user's replaced, nothing written into a run
    runs = compare_runs(opts.runs, opts.out)
    print(f"{opts.out}: the losses of {len(runs)} runs")
    return 0


def fill_runs(runs: argparse.ArgumentParser, parser_class: type) -> None:
    """`attnlab runs [FOLDER]` (the same as `runs list`) and `attnlab runs compare`, in the `runs` parser
    cli/main.py made (filled the first time it is used)."""

    class RunsParser(parser_class):
        """A folder right after `runs` is `runs list FOLDER`: the list needs no word of its own."""

        def parse_known_args(self, args=None, namespace=None):
            args = list(args or [])
            if not args or (args[0] not in SUBCOMMANDS and not args[0].startswith("-")):
                args = ["list", *args]
            return super().parse_known_args(args, namespace)

    runs.usage = "attnlab runs [FOLDER]  |  attnlab runs compare RUN RUN ... --out FILE [--force]"
    runs.description = (
        "attnlab runs [FOLDER] lists every run under FOLDER (default ./runs): its task, model, "
        "parameters, steps, best validation loss and training time. attnlab runs compare RUN RUN "
        "... --out FILE draws their training and validation losses on one picture."
    )
    runs.__class__ = RunsParser  # argparse made it; the subclass only rewrites the arguments it is given
    what = runs.add_subparsers(dest="runs_command", metavar="COMMAND", parser_class=parser_class)
    p = what.add_parser("list", help="the runs under FOLDER, one line each (the default)")
    add_options(p, RunsOptions)
    p.set_defaults(command=lambda args: run_list(read_options(args, RunsOptions)))
    p = what.add_parser("compare", help="training and validation losses of several runs on one picture")
    add_options(p, RunsCompareOptions)
    p.set_defaults(command=lambda args: run_compare(read_options(args, RunsCompareOptions)))


__all__ = ["fill_runs", "run_compare", "run_list"]
