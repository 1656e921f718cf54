"""The `attnlab` command: a thin layer over the library.

`attnlab train TASK` has one sub-command per entry of tasks.TASKS, each with the task's own flags
(generated from its config dataclasses: their fields are the flags, their metadata the help);
predict, eval and attention ask the run's task what to do. No module here is imported by the library.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path

from attnlab.cli import convert as cli_convert
from attnlab.cli import inspect as cli_inspect
from attnlab.cli import interpret as cli_interpret
from attnlab.cli import vectors as cli_vectors
from attnlab.cli.demo import run_demo
from attnlab.config import add_config_flags, checked, flags_of
from attnlab.data.parallel import GENERATED
from attnlab.decoding import sampling
from attnlab.decoding.sampling import GenerateConfig
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run
from attnlab.errors import AttnlabError
from attnlab.interpret.head_select import describe, head_hooks
from attnlab.models.gpt import PRESETS
from attnlab.models.size import (
    ClusterConfig,
    cluster_estimate,
    estimate,
    format_cluster,
    format_estimate,
    format_table,
)
from attnlab.nn.hooks import hooks
from attnlab.runs.folder import check_resumable, read_run_config
from attnlab.runs.run import load
from attnlab.tasks import TASKS, Task
from attnlab.tasks.compare import compare
from attnlab.tasks.compare import format_table as compare_table
from attnlab.tasks.lm_compare import compare_lm, format_lm_table
from attnlab.tasks.lm_eval import SPLITS
from attnlab.version import __version__

# The text models from the simplest up, as the lectures climb: counts, averaged embeddings, the
# parameter-free self-attention, one learned head, then convolutions, recurrence and the encoder.
LADDER_MODELS = "bow,pooled,self-attention,qkv-attention,conv1d,rnn,encoder"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see: {self.prog} --help)\n")


def at_least_1(text: str) -> int:
    """argparse type of counts (--beam, --num-samples, ...): a whole number, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def speaks() -> bool:
    """Under torchrun, one process prints results."""
    return os.environ.get("RANK", "0") == "0"


# ---- commands ------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    """Any task: its settings (tuned, or the run's own when resuming) < the flags, then the engine."""

    task: Task = args.task_obj
    saved = read_run_config(check_resumable(args.out)) if args.resume else None
    tuned = saved["train"] if saved else task.train_defaults(getattr(args, "model", None) or task.default_model)
    train = checked(TrainConfig, {**tuned, **flags_of(args, "train")}, where="[train]")
    result = run(task, task.request(args, train, saved))
    if speaks():
        print(task.result_line(result, args.out))
    return 0


@contextlib.contextmanager
def heads_removed(run, args: argparse.Namespace):
    """The run's model with the heads of --keep / --remove zeroed (interpret/head_select.py)."""

    fns = head_hooks(run.model, args.keep, args.remove)
    if fns:
        print(f"[{describe(run.model, fns)}]", file=sys.stderr)
    with hooks(run.model, fns):
        yield


def cmd_sample(args: argparse.Namespace) -> int:

    gen = checked(GenerateConfig, flags_of(args, "gen"), where="generation")
    run = load(args.run, device=args.device)
    if not run.task.generates:
        raise AttnlabError(
            f"{args.run} is not a language model run (it is {run.task.name}): attnlab sample needs a gpt run"
        )
    with heads_removed(run, args):
        return _sample(run, gen, args)


def _sample(run, gen: GenerateConfig, args: argparse.Namespace) -> int:

    if args.num_samples == 1:  # one sample streams as it is generated
        print(gen.prompt, end="", flush=True)
        for piece in sampling.stream_text(run.model, run.tokenizer, **dataclasses.asdict(gen)):
            print(piece, end="", flush=True)
        print()
        return 0
    # several: one batch, every row decoded in the same forward pass
    for i, text in enumerate(sampling.sample_texts(run.model, run.tokenizer, num_samples=args.num_samples,
                                          **dataclasses.asdict(gen))):  # fmt: skip
        print(("\n" + "-" * 40 + "\n" if i else "") + gen.prompt + text)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:

    run = load(args.run, device=args.device)
    result = run.task.evaluate(run, args.data, args.split, {**vars(args), "progress": not args.json})
    print(json.dumps({"run": str(args.run), **result}) if args.json else run.task.show_evaluation(result))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:

    run = load(args.run, device=args.device)
    with heads_removed(run, args):
        result = run.task.predict(run, args.text, vars(args))
    print(json.dumps(result) if args.json else run.task.show_prediction(result))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:

    if args.task == "lm":
        parts = args.parts.split(",") if args.parts else None
        rows = compare_lm(Path(args.out), args.budget, args.data, parts, force=args.force, blocks=args.blocks)
        print(format_lm_table(rows, blocks=args.blocks))
        print(f"chart: {Path(args.out) / 'compare.png'}")
        return 0

    default = {"digits": "vit,mlp", "caption": "transformer,rnn-attention"}.get(args.task) or (
        "transformer,rnn-attention,rnn" if args.task in GENERATED else LADDER_MODELS
    )
    if args.word_vectors and args.task not in ("sentiment", "tagging"):
        raise AttnlabError("--word-vectors: only the text tasks (sentiment, tagging) read word vectors")
    rows = compare(args.task, (args.models or default).split(","), Path(args.out), force=args.force,
                   word_vectors=args.word_vectors, freeze_vectors=args.freeze_vectors)  # fmt: skip
    print(compare_table(rows))
    print(f"chart: {Path(args.out) / 'compare.png'}")
    return 0


def cmd_size(args: argparse.Namespace) -> int:

    names = list(PRESETS) if args.preset == "all" else [args.preset]
    for name in names:
        if name not in PRESETS:
            raise AttnlabError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)} or all")
    cluster = checked(ClusterConfig, flags_of(args, "cluster"), where="cluster")
    results = [estimate(PRESETS[n], n) for n in names]
    for e in results:
        e["cluster"] = cluster_estimate(e, cluster)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    elif len(results) > 1:
        print(format_table(results))
    else:
        print(format_estimate(results[0]) + "\n" + format_cluster(results[0], results[0]["cluster"]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:

    run_demo(args.out, args.max_steps, args.time_budget)
    return 0


# ---- parser --------------------------------------------------------------------------------


def add_train_commands(sub) -> None:
    """`attnlab train TASK`: one sub-command per registered task."""
    train = sub.add_parser("train", help="train a model")
    tasks = train.add_subparsers(dest="task", metavar="TASK", parser_class=Parser)
    tasks.required = True
    for task in TASKS.values():
        p = tasks.add_parser(task.name, help=task.help, description=task.description)
        p.add_argument("--out", required=True, help="run directory to create (or continue with --resume)")
        p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
        p.add_argument(
            "--force",
            action="store_true",
            help="replace --out if it is an attnlab run (it has attnlab.json); other folders are refused",
        )
        p.add_argument("--init", default=None, metavar="RUN", help=task.init_help)
        task.add_flags(p)
        p.set_defaults(func=cmd_train, task_obj=task)

    cli_vectors.add_train_command(tasks)


def add_head_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("heads (see what they do by taking them out)").add_mutually_exclusive_group()
    g.add_argument("--remove", metavar="HEADS", default=None, help="zero these heads' outputs: LAYER.HEAD from 1, "
                   "comma-separated (2.3,1.1); a layer alone (2) is all its heads; encoder-decoder: encoder:, "
                   "decoder: or cross: before it")  # fmt: skip
    g.add_argument("--keep", metavar="HEADS", default=None, help="zero every other head of the same attention: "
                   "only these remain (same syntax as --remove)")  # fmt: skip


def add_run_commands(sub) -> None:
    """predict, compare and translate: what a trained run does with an input."""
    pr = sub.add_parser("predict", help="a classifier's label, a tagger's tags, a masked-LM's [MASK] candidates, "
                        "a translation, an image's class")  # fmt: skip
    pr.add_argument("run", help="run directory (classify, tag, mlm, translate or image)")
    pr.add_argument("text", help='text to read (for a masked-LM run put [MASK] in it: "import [MASK]"); '
                    "for an image run, an image file")  # fmt: skip
    pr.add_argument("--top-k", type=at_least_1, default=None, help="candidates per [MASK] (default: 5), classes shown "
                    "for an image (default: 3)")  # fmt: skip
    pr.add_argument(
        "--beam", type=at_least_1, default=1, help="translation and caption runs: beam width, 1 = greedy (default: 1)"
    )
    pr.add_argument("--attention", default=None, metavar="FILE", help="translation runs: draw the alignment; "
                    "ViT runs: draw [CLS]'s attention to each patch over the image (.png, .svg or .json); caption "
                    "runs: where each word looked, one panel per word and head (.png, .svg, .json, or .html: a page "
                    "where hovering a word moves the attention)")  # fmt: skip
    pr.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    add_head_flags(pr)
    pr.set_defaults(func=cmd_predict)
    cmp = sub.add_parser("compare", help="train several models on one task with one budget; table and bar chart")
    cmp.add_argument(
        "--task",
        default="sentiment",
        choices=("sentiment", "tagging", *GENERATED, "digits", "caption", "lm"),
        help="generated task: sentiment, tagging, a translation task, the digits images, caption (digits-strips: "
        "the Transformer captioner against Show-Attend-Tell's RNN), or lm: the language-model "
        "recipes, classic gpt-nano against gpt-nano-fast and its ablations (default: sentiment)",
    )
    cmp.add_argument("--budget", default="2m", help="lm: training time of each recipe (90s, 2m, 1.5h)")
    cmp.add_argument("--data", default="stdlib", help="lm: the corpus (a file, a folder or stdlib)")
    cmp.add_argument("--parts", default=None, help="lm: comma-separated parts of the fast recipe to ablate "
                     "(default: every one)")  # fmt: skip
    cmp.add_argument("--blocks", action="store_true", help="lm: compare blocks instead of recipes: the "
                     "classic (gpt-nano), Llama (llama-nano) and mixture-of-experts (moe-nano) blocks, trained "
                     "alike")  # fmt: skip
    cmp.add_argument("--word-vectors", default=None, metavar="RUN_OR_FILE", help="sentiment, tagging: also train "
                     "each model with a word embedding from these vectors (an attnlab train vectors run, or a "
                     "word2vec/GloVe file), as the row MODEL+vectors")  # fmt: skip
    cmp.add_argument("--freeze-vectors", action=argparse.BooleanOptionalAction, default=True,
                     help="keep the pretrained vectors fixed while training (default: frozen)")  # fmt: skip
    cmp.add_argument("--models", default=None, help=f"comma-separated models (default: {LADDER_MODELS}; "
                     "translation: transformer,rnn-attention,rnn; digits: vit,mlp)")  # fmt: skip
    cmp.add_argument("--out", default="runs/compare", help="folder for the runs, table and chart")
    cmp.add_argument("--force", action="store_true", help="replace earlier runs in --out")
    cmp.set_defaults(func=cmd_compare)

    tr = sub.add_parser("translate", help="translate a text with a translation run (same as predict)")
    tr.add_argument("run", help="run directory (attnlab train translate)")
    tr.add_argument("text", help="source text")
    tr.add_argument("--beam", type=at_least_1, default=1, help="beam width; 1 is greedy decoding (default: 1)")
    tr.add_argument("--attention", default=None, metavar="FILE",
                    help="also draw the alignment (cross-attention): .png, .svg or .json")  # fmt: skip
    tr.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    tr.add_argument("--json", action="store_true", help="print one JSON object")
    add_head_flags(tr)
    tr.set_defaults(func=cmd_predict)


def build_parser() -> Parser:
    p = Parser(prog="attnlab", description="Build, train, sample and inspect Transformers.")

    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="train gpt-nano-fast on Python's standard library for 2 minutes, then sample")
    demo.add_argument("--out", default="runs/demo", help="run directory (a free name is picked if it exists)")
    demo.add_argument("--time-budget", default="2m", help="minutes of training (90s, 2m, 1.5h; default 2m)")
    demo.add_argument("--max-steps", type=int, default=None, help="train for this many steps instead of a budget")
    demo.set_defaults(func=cmd_demo)
    add_train_commands(sub)
    add_run_commands(sub)

    cli_inspect.add_commands(sub)
    cli_convert.add_commands(sub)
    cli_vectors.add_commands(sub)
    cli_interpret.add_commands(sub)

    sample = sub.add_parser("sample", help="generate text from a trained run")
    sample.add_argument("run", help="run directory")
    sample.add_argument(
        "--num-samples", type=at_least_1, default=1, help="how many samples, drawn as one batch (default: 1)"
    )
    sample.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    add_config_flags(sample, "gen", GenerateConfig, "generation")
    add_head_flags(sample)
    sample.set_defaults(func=cmd_sample)

    ev = sub.add_parser("eval", help="a language model's loss and bits per character, a classifier's accuracy, "
                        "a translation's BLEU, an image model's accuracy")  # fmt: skip
    ev.add_argument("run", help="run directory")
    ev.add_argument("--data", default=None, help="file, folder or stdlib; image runs: digits, a folder of class "
                    "sub-folders or a .npz, scored whole (default: the run's own data)")  # fmt: skip
    ev.add_argument("--glob", default=None, help="files of a folder to read (default: the run's, or *)")
    ev.add_argument(
        "--split",
        default=None,
        choices=(*SPLITS, "test"),
        help="held-out part (same split as training), training part, or all (default: val; "
        "classifiers and taggers: test)",
    )
    ev.add_argument("--max-tokens", type=at_least_1, default=None, help="evaluate at most this many tokens")
    ev.add_argument(
        "--confusion",
        default=None,
        metavar="FILE",
        help="image runs: where to draw the confusion matrix, .png, .svg or .json (default: RUN/eval_confusion.png)",
    )
    ev.add_argument("--beam", type=at_least_1, default=1, help="translation runs: beam width, 1 = greedy (default: 1)")
    ev.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_eval)

    size = sub.add_parser("size", help="parameters, FLOPs per token and memory of a preset")
    size.add_argument("--preset", required=True, help=f"{', '.join(PRESETS)}, or all")
    size.add_argument("--json", action="store_true", help="print JSON")
    add_config_flags(size, "cluster", ClusterConfig, "planning a training run")
    size.set_defaults(func=cmd_size)
    return p


def main(argv: list[str] | None = None) -> int:
    # Library warnings (e.g. a prompt cropped to the context) as one plain line.
    warnings.formatwarning = lambda message, *args, **kwargs: f"attnlab: warning: {message}\n"
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AttnlabError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnlab sample RUN | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # unreadable data, unwritable run or cache directory, disk full, ...
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
