"""The `attnlab` command: a thin layer over the library.

Every command is one entry of COMMANDS: its options dataclass (cli/options.py), from which its flags
are generated (cli/generate.py), the settings sections it reads, and the function that calls the
library. `attnlab train TASK` has one sub-command per entry of tasks.TASKS (cli/train_tasks.py).
Nothing in the library imports this package.

The table names what it uses as "module:name" strings (a bare module is one of attnlab.cli), and
a command's parser is filled the first time it is used: `attnlab --help` imports none of them,
`attnlab COMMAND --help` only that command's options, and the function that runs a command is
imported when it runs. So `--help`, most `COMMAND --help` and `runs` start without the seconds
torch takes to import (tests/test_startup.py; docs/cpu.md has the times).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnlab.cli.help_cache import asks_help, keep_help, kept_help
from attnlab.errors import AttnlabError, interrupt_quietly_at_start

with interrupt_quietly_at_start():  # Ctrl-C while the parser's few modules load: one line, exit 130
    from attnlab.cli.generate import add_options, add_section, given, read_options
    from attnlab.cli.suggest import UNRECOGNIZED_BY, unrecognized, with_suggestion
    from attnlab.data.template_limits import BASE, OPTIONS, SOURCE_PER_GROWTH, TemplateLimits, template_limits_set
    from attnlab.runs.outputs import check_outputs
    from attnlab.runtime.threads import ENV as THREADS_ENV
    from attnlab.runtime.threads import ask as ask_threads
    from attnlab.version import __version__


def ref(text: str) -> Any:
    """ "commands:run_sample" -> attnlab.cli.commands.run_sample; "attnlab.models.cluster:ClusterConfig" as
    written: what the table names, imported when it is needed."""
    module, _, name = text.partition(":")
    return getattr(importlib.import_module(module if "." in module else f"attnlab.cli.{module}"), name)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not a usage dump; and a sub-command's
    arguments are added the first time it is used (`fill`), so the commands not run are not imported."""

    fill: Callable[[], None] | None = None  # adds this parser's arguments (and sub-commands)
    keeps_help = False  # its filling imports torch: its help text is kept once made (cli/help_cache.py)

    def filled(self) -> Parser:
        fill, self.fill = self.fill, None
        if fill is not None:
            fill()
        return self

    def filled_all(self) -> Parser:
        """This parser and every sub-command under it (train's tasks) filled: the whole parser."""
        for action in self.filled()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    sub.filled_all()
        return self

    def format_help(self) -> str:
        self.filled()
        return super().format_help()

    def print_help(self, file=None) -> None:
        text = self.format_help()
        if self.keeps_help:
            keep_help(self.prog, text)
        self._print_message(text, file or sys.stdout)

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {with_suggestion(message)} (see: {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        if self.fill is not None and self.keeps_help and asks_help(list(args or [])):
            if (text := kept_help(self.prog)) is not None:  # the help as made before: no torch to import
                self._print_message(text, sys.stdout)
                self.exit(0)
        if self.fill is not None:  # filling may make it a parser of its own kind (runs): ask it again
            return self.filled().parse_known_args(args, namespace)
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(ns, UNRECOGNIZED_BY):  # the innermost parser: it knows the flags
            setattr(ns, UNRECOGNIZED_BY, self)
        return ns, extras

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:  # reported by the sub-command's parser, with the flag meant ("did you mean")
            where = getattr(ns, UNRECOGNIZED_BY, self)
            where.error(unrecognized(where, extras))
        return ns


@dataclass(frozen=True)
class Command:
    """One command: its options and settings sections ((section, dataclass, title): flags whose given
    values are passed on as a dict), what runs it, and changes to the shared options for it. Classes
    and functions are "module:name" strings (see `ref`), imported when the command is used."""

    name: str
    help: str
    options: str
    run: str
    description: str | None = None
    sections: tuple[tuple[str, str, str], ...] = ()
    overrides: dict[str, dict] = field(default_factory=dict)
    epilog: str | None = None  # a function that writes the text shown after the options, its lines kept


class KeepsLines(argparse.HelpFormatter):
    """argparse's help, but a text of several lines (an epilog's table) keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return text if "\n" in text else super()._fill_text(text, width, indent)


COMMANDS = [
    Command(
        "demo",
        "train qwen3-nano-fast on Python's standard library for 2 minutes, then sample (--chat: base, "
        "sft, dpo, reward model, best-of-8)",
        "options:DemoOptions",
        "commands:run_demo_command",
    ),
    Command(
        "predict",
        "a classifier's label, a tagger's tags, a masked-LM's [MASK] candidates, a translation, an image's class",
        "options:PredictOptions",
        "commands:run_predict",
    ),
    Command(
        "embed",
        "unit-length text vectors from a run (a GPT, an encoder, an encoder-decoder), and their similarities",
        "options:EmbedOptions",
        "commands:run_embed",
        "Embed each TEXT as one unit-length vector pooled from the run's final hidden states: a GPT's last "
        "token (the only one that has seen the whole text), an encoder's mean over its tokens (a classifier "
        "trained on [CLS]: that position), an encoder-decoder's encoder mean. Prints each text's first "
        "values and the cosine similarities between the texts; --json: the vectors. The same vectors as "
        "attnlab.embed(run, texts) and /v1/embeddings of attnlab serve.",
    ),
    Command(
        "compare",
        "train several models on one task with one budget; table and bar chart",
        "attnlab.tasks.compare_options:CompareOptions",
        "commands:run_compare",
    ),
    Command(
        "translate",
        "translate a text with a translation run (same as predict)",
        "options:TranslateOptions",
        "commands:run_predict",
    ),
    Command(
        "attention",
        "attention of a run on one input (PNG, SVG, HTML, JSON)",
        "options:AttentionOptions",
        "inspect:run_attention",
        "Draw what each head attends to for one input: a .png or .svg heatmap grid (queries down, keys across; "
        "every layer and head, one layer's heads and their mean with --layer, one head with --head), a "
        "self-contained .html page with the head view and the model view (no network needed), or .json: the "
        "weights behind the picture (all views, or those --view/--layer/--head pick). Translation runs: "
        "encoder, decoder and cross-attention; image runs: [CLS] over the patches.",
    ),
    Command(
        "plot",
        "loss and lr curves, position encodings, token embeddings, expert routing",
        "options:PlotOptions",
        "inspect:run_plot",
        "Pictures of a trained run: loss (training and validation curves), lr (the schedule as "
        "run), "
        "positions (the position vectors as an image, position x dimension, and their cosine similarities), "
        "embeddings (a 2-D PCA of the token embeddings, the most useful tokens labelled); for a mixture of "
        "experts, experts (the text of --text once per layer, each token on the colour of the expert it was "
        "routed to) and expert-load (each layer's share of tokens per expert against the step).",
    ),
    Command(
        "serve",
        "a local web explorer and an OpenAI-compatible API over trained runs",
        "options:ServeOptions",
        "inspect:run_serve",
        "A local web page over trained runs: each run's config, size and loss curve; type an input and get the "
        "output of its task (streamed text with temperature / top-k / top-p for a GPT, labels, tags, [MASK] "
        "fills, translations, an uploaded image's class); and the attention of that input in the head view and "
        "the model view. JSON API under /api (see /openapi.json); an OpenAI-compatible API under /v1 (models, "
        "completions, chat completions; streaming; concurrent requests decoded as one batch). Beyond this "
        "machine (a --host other than loopback) it needs a key.",
    ),
    Command(
        "convert",
        "a local HuggingFace checkpoint or a GGUF file -> an attnlab run (what it reads: convert --help)",
        "options:ConvertOptions",
        "convert:run_convert",
        "Read a local HuggingFace model directory (config.json, model.safetensors or its "
        "shards, tokenizer.json; pickles such as pytorch_model.bin are never opened) or a GGUF file "
        "(llama.cpp's and ollama's format: a llama or gpt2 "
        "model; quantized weights are read as the float32 values they stand for) and write an attnlab run "
        "that every command works on. SOURCE is either; --from-hf DIR is the same as a directory SOURCE. "
        "Nothing is downloaded. Every size the files declare is checked against the bytes they hold before "
        "anything is built; a file that does not fit is one line.",
    ),
    Command(
        "export",
        "a run -> a HuggingFace directory, a PEFT adapter folder, an ONNX file or a GGUF file",
        "options:ExportOptions",
        "convert:run_export",
        "Write a run in another format: --to hf, a directory that transformers' "
        "from_pretrained "
        "loads (GPT runs as GPT-2, Llama or Qwen3, encoder runs as BERT); --to peft, a LoRA run's adapter as "
        "adapter_config.json and adapter_model.safetensors, which PEFT's PeftModel.from_pretrained loads over "
        "the base (named by base_model_name_or_path: the HuggingFace folder the base was converted from, else "
        "the base run, to export with --to hf first); --to onnx, a file with dynamic batch and length, checked "
        "with onnxruntime (GPT runs); --to gguf, one file that llama.cpp and ollama run (GPT runs with GPT-2's "
        "block, Llama's or Qwen3's, a Mixtral's experts too; the tokenizer and chat template inside), its "
        "matrices stored as --type says.",
    ),
    Command(
        "merge",
        "a LoRA run -> a full run: its adapters folded into its base's weights",
        "options:MergeOptions",
        "convert:run_merge",
        "Fold a LoRA run's adapters into its base (W + (alpha / r) B A in every adapted "
        "matrix) and "
        "write a full run in --out, as a full fine-tune writes one: every weight, the tokenizer and chat "
        "template, no adapter. A base the run quantized (int8, NF4) is merged in float, from the base run's "
        "own weights. The merged run exports with --to hf.",
    ),
    Command(
        "quantize",
        "a language model run -> a run whose weights are stored int8, int4 or bf16 for decoding",
        "options:QuantizeOptions",
        "quantize:run_quantize",
        "Store a language model run's block matrices and LM "
        "head small, for "
        "inference: int8 (one byte a weight and a scale per output channel), int4 (half a byte, a scale and a "
        "zero per group of 32) or bf16 (two bytes). A decode step reads every weight once, so fewer bytes are "
        "more tokens per second on a CPU. A layer stays float32 where this machine measured float32 faster for "
        "its shape. The new run is a folder every command loads (sample, chat, eval, serve, inspect); "
        "--quantize on those commands does the same in memory. Weights only: it does not train.",
    ),
    Command(
        "vectors",
        "query, evaluate, draw or export trained word vectors",
        "options:VectorsOptions",
        "vectors:run_vectors",
        "Ask a vectors run (or a word2vec/GloVe text file) for neighbours, analogies and similarities; score it "
        "on analogy questions and similarity ratings; draw or export it.",
    ),
    Command(
        "inspect",
        "logit lens, head detectors, head ablation, rollout/flow, heads over training",
        "options:InspectOptions",
        "interpret:run_inspect",
        "lens: a GPT's next-token prediction read after each "
        "layer; heads: "
        "previous-token, first-token, duplicate-token and induction scores of every head; ablate: the loss "
        "change on the input when each head is zeroed (with no input: on the repeated half of random tokens "
        "repeated twice); rollout / flow: how much each position draws on each input token through all the "
        "layers (any run; flow is slow past 64 tokens); over-training: detector scores and the loss on repeated "
        "tokens at every weight snapshot (train with --snapshot-every N).",
        overrides={"device": {"default": "cpu"}},
    ),
    Command(
        "patch",
        "activation and attribution patching: which activations carry the clean answer",
        "options:PatchOptions",
        "patch:run_patch",
        "Run the model on --clean and --corrupted (same length), "
        "copy one activation at a time from the clean run into the corrupted one and measure --metric: the "
        "effect is (patched - corrupted) / (clean - corrupted), 1 where that activation alone restores the "
        "clean answer. Sites: the residual stream by layer and position, each attention head (query heads, "
        "grouped-query models included; cross-attention's too), and each layer's attention, MLP and residual. "
        "Any Transformer run: a language model (the next token), an encoder (a masked LM's [MASK], a "
        "classifier's class), a translation (clean and corrupted sources; the decoder reads the clean "
        "translation), an image classifier (image files; patches as positions). --method attribution "
        "estimates every site from one backward pass (AtP); --method eap or eap-ig scores every edge of the "
        "residual graph; --sender HEADS --receivers HEADS is path patching (the senders' effect through the "
        "receivers only). --json prints every effect, keyed by component, layer, head and position.",
        overrides={"device": {"default": "cpu"}},
    ),
    Command(
        "circuits",
        "transcoders and an attribution graph: which features carry a prompt's next token",
        "circuits:CircuitsOptions",
        "circuits_run:run_circuits",
        "Train a transcoder per layer (each MLP's input "
        "-> its output, sparse; kept in OUT/transcoders and reused), replace every MLP of the model by its "
        "transcoder plus an error node, freeze attention and norms on --prompt, and trace every edge from the "
        "token embeddings through the features to --target's logit; prune it, score it (replacement and "
        "completeness, as circuit-tracer), ablate its top features to check the signs, and write "
        "OUT/graph.json and OUT/graph.html (offline; hover a feature for its top contexts). A GPT or Llama-block "
        "run of attnlab train lm. docs/circuits.md.",
        sections=(("graph", "attnlab.interpret.circuits_config:CircuitConfig", "the graph"),),
        overrides={"device": {"default": "cpu"}},
    ),
    Command(
        "sample",
        "generate text from a trained run",
        "options:SampleOptions",
        "commands:run_sample",
        "Continue --prompt (streamed as it is drawn; several samples as one batch); with --chat MESSAGE, "
        "answer MESSAGE as a user's turn through the run's chat template and print only the answer.",
        sections=(("gen", "attnlab.decoding.settings:GenerateConfig", "generation"),),
    ),
    Command(
        "chat",
        "talk with a language model run in the terminal, through its chat template",
        "options:ChatOptions",
        "chat:run_chat",
        "An interactive conversation: type a message after 'you> ' and the answer streams as the "
        "model writes it. Every turn is rendered with the run's chat template (its chat_template.json, as a "
        "fine-tuned or converted run keeps it; attnlab's built-in ChatML otherwise) and the answer ends at the "
        "template's end of turn. The conversation is kept, so later answers see earlier turns; when it outgrows "
        "the model's context the oldest turns are dropped (the --system text stays); each answer keeps the room "
        "the run's trained answers need (--reserve). Ctrl-C stops an answer (its turn is left out); /reset starts "
        "over; /quit, Ctrl-D or Ctrl-C at the prompt leaves. In a terminal: line editing, history in "
        "~/.attnlab_history (ATTNLAB_HISTORY names another file, empty for none).",
        epilog="phrasings:phrasings_help",
    ),
    Command(
        "eval",
        "a language model's loss and bits per character, a classifier's accuracy, a translation's "
        "BLEU, an image model's accuracy",
        "options:EvalOptions",
        "commands:run_eval",
    ),
    Command(
        "report",
        "a chat demo chain's report card: each stage's held-out numbers, time, size, machine "
        "and commit, and exact answers by kind (markdown and self-contained HTML)",
        "options:ReportOptions",
        "commands:run_report",
    ),
    Command(
        "size",
        "parameters, FLOPs per token and memory of a preset",
        "options:SizeOptions",
        "commands:run_size",
        sections=(("cluster", "attnlab.models.cluster:ClusterConfig", "planning a training run"),),
    ),
    Command(
        "doctor",
        "this machine: device, PyTorch, CPU, and what --dtype auto chose at each width and why",
        "options:DoctorOptions",
        "doctor:run_doctor",
        description="Print the device, PyTorch's "
        "version and threads, the CPU and its bf16 "
        "instructions, and for each width measured here the precision --dtype auto chose for training and for "
        "decoding, with the medians and spreads of the interleaved float32 and bf16 timings behind it. "
        "--measure WIDTH measures now; --clear forgets the kept measurements.",
    ),
]


# `attnlab train TASK ...` and `attnlab runs ...`: commands with sub-commands of their own, each filled
# by a function of its module (name -> its help in `attnlab --help`, the function that fills its parser).
GROUPS = {
    "train": ("train a model", "train_tasks:add_tasks"),
    "runs": ("list the runs under a folder, or draw their loss curves together", "runs:fill_runs"),
    "sae": (
        "sparse autoencoders: train one on a run's hook point, show its features, or test on synthetic features",
        "sae:fill_sae",
    ),
}


def add_command(sub, command: Command) -> Parser:
    p = sub.add_parser(command.name, help=command.help, description=command.description, formatter_class=KeepsLines)
    p.fill = lambda: fill_command(p, command)
    return p


def fill_command(p: Parser, command: Command) -> None:
    """The command's flags, from its options dataclass and sections, and what runs it."""
    options = ref(command.options)
    p.epilog = ref(command.epilog)() if command.epilog else None
    add_options(p, options, command.overrides)
    for section, cls, title in command.sections:
        add_section(p, section, ref(cls), title)

    def run(args: argparse.Namespace) -> int:
        sections = [given(args, section) for section, _, _ in command.sections]
        opts = read_options(args, options)
        check_outputs(opts)  # before any work: no file of the user's replaced, nothing written into a run
        return ref(command.run)(opts, *sections)

    p.set_defaults(command=run)


def add_group(sub, name: str) -> Parser:
    help_, fills = GROUPS[name]
    p = sub.add_parser(name, help=help_)
    p.fill = lambda: ref(fills)(p, Parser)
    return p


def add_template_limits(p: Parser) -> None:
    """Top-level options (before the command): the limits of rendering a chat template."""
    defaults = TemplateLimits()
    g = p.add_argument_group(
        "chat template limits",
        "A chat template comes from a model's folder or file, and "
        "attnlab renders it within limits; raise them only for a folder you trust. They go "
        "before the command: attnlab --template-seconds 30 chat RUN.",
    )
    helps = {
        "seconds": f"seconds one render may take, and one conversation's search for its assistant turns "
        f"(default {defaults.seconds:g})",
        "growth": f"characters a template may write per character of the conversation, plus {BASE:,} times "
        f"this for headers; the template itself may be {SOURCE_PER_GROWTH:,} times this long "
        f"(default {defaults.growth:g})",
        "depth": f"how deep a template's calls (macros, recursive loops) may nest (default {defaults.depth})",
    }
    for name, flag in OPTIONS.items():
        kind = int if name == "depth" else float
        g.add_argument(flag, type=_positive(kind), metavar="N", help=helps[name])


def _positive(kind: type) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            whole = "whole " if kind is int else ""
            raise argparse.ArgumentTypeError(f"expected a positive {whole}number, got {text!r}")
        return value

    return parse


def _threads(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of threads (0: PyTorch's own), got {text!r}")
    return int(text)


def build_parser(lazy: bool = False) -> Parser:
    """The whole parser; lazy: each command's part is added when that command is used (what `attnlab`
    runs: the others are never imported)."""
    p = Parser(prog="attnlab", description="Build, train, sample and inspect Transformers.")
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    p.add_argument(
        "--threads",
        dest="threads_all",
        type=_threads,
        metavar="N",
        help=f"PyTorch threads for this command (default: one per core, fewer when other attnlab or "
        f"torch processes are busy here, said in one line; 0: PyTorch's own choice, nothing "
        f"checked); {THREADS_ENV}=N sets it for every command",
    )
    add_template_limits(p)
    sub = p.add_subparsers(dest="name", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    parsers = [add_command(sub, COMMANDS[0]), add_group(sub, "train")]
    parsers += [add_command(sub, command) for command in COMMANDS[1:]]
    parsers.append(add_group(sub, "runs"))
    parsers.append(add_group(sub, "sae"))
    if not lazy:
        for command in parsers:
            command.filled_all()
    return p


def main(argv: list[str] | None = None) -> int:
    # Library warnings (e.g. a prompt cropped to the context) as one plain line.
    warnings.formatwarning = lambda message, *args, **kwargs: f"attnlab: warning: {message}\n"
    try:
        args = build_parser(lazy=True).parse_args(argv)  # a usage error is argparse's SystemExit(2), one line
        ask_threads(args.threads_all)  # runtime/threads.py applies it when the heavy work starts
        limits = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in OPTIONS.items()}
        with template_limits_set(**limits):  # for this command (main may run again in one process)
            return args.command(args)
    except AttnlabError as e:  # Interrupted (Ctrl-C, work saved) says how to go on, and exits 130
        print(f"attnlab: {e.heading}{e}", file=sys.stderr)
        return e.status
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
