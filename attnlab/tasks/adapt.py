"""What every task that adapts a pretrained language model shares (sft, dpo, reward).

setup:   the --init model as a run (a HuggingFace folder is converted once), its tokenizer and chat
         template copied into the new run
prepare: the task's examples encoded with the template; the model: the base's weights, its block
         matrices quantized (--quantize-base), LoRA adapters on top (--lora-rank > 0), or every
         weight trained (--lora-rank 0); config.json names the base and the adapters
a run:   attnlab sample / chat answer through its template; eval scores the held-out answers
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.config import checked, option
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.finetune import PreferenceData, fitting, held_out, splits
from attnlab.data.supervised import Example, pair_examples, show, surely_longer
from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.decoding.chat import right_answers
from attnlab.engine.train import TrainRequest
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPTConfig
from attnlab.progress import tqdm
from attnlab.runs.adapted import CHAT_TEMPLATE, as_run, build_base, run_template, with_adapters
from attnlab.runs.converters import as_records, lora_of, quantized_base
from attnlab.runs.folder import TOKENIZER, read_run_config
from attnlab.runs.kind import kind_of
from attnlab.tasks.base import ModelChoice, Task, TrainOptions
from attnlab.tasks.common import config_json

# A fine-tuning's training settings: a smaller step than pretraining's (the base knows much already),
# no weight decay pulling the adapters to zero, and validation often enough to watch a short run.
TUNED = dict(
    lr=1e-3, batch_size=32, max_steps=600, warmup_steps=30, weight_decay=0.0, eval_interval=100, eval_batches=4
)


@dataclass
class AdaptOptions:
    """The own options of every adapting task (LoRA and a quantized base are converters: runs/converters.py)."""

    show_masks: bool = option(False, "print one training example with the tokens the loss reads marked")


@dataclass
class Encoded:
    tok: Tokenizer
    template: ChatTemplate
    model: dict[str, Any]  # the GPT's config fields
    parts: dict[str, list]  # split -> examples that fit the context


def check_split(split: str | None, held: str) -> None:
    """`attnlab eval --split` of a fine-tuned run: its data's held-out split, or none given."""
    if split not in (None, held):
        raise AttnlabError(f"this data's held-out split is {held}: use --split {held} or leave it out")


def longest(example: Example | tuple[Example, Example]) -> int:
    return max(len(e.ids) for e in example) if isinstance(example, tuple) else len(example.ids)


def encoded_rows(rows: list, encode, room: int | None, unit: str) -> list:
    """`encode(row)` of each row; with `room` (the tokens the model reads), those that do not fit left
    out and said so (one whose characters alone say it cannot fit is left out unencoded)."""
    with _collector_skips_what_is_alive():
        if room is None or not rows:
            return [encode(r) for r in _shown(rows, unit)]
        encoded = [None if surely_longer(r, room) else encode(r) for r in _shown(rows, unit)]
    return fitting(encoded, [room + 2 if e is None else longest(e) for e in encoded], room, unit)


SHOWN_FROM = 50_000  # rows: from here encoding lasts long enough to want a bar (docs/log.md, "Data")


def _shown(rows: list, unit: str) -> list:
    """The rows, with a progress bar where there are many (a small file encodes in a blink)."""
    return tqdm(rows, desc=f"encoding {unit}", unit=" rows", leave=False) if len(rows) >= SHOWN_FROM else rows


@contextmanager
def _collector_skips_what_is_alive() -> Iterator[None]:
    """Python's cycle collector leaves out every object alive now (the rows read: a million rows are
    millions of objects) while they are encoded: each of its full passes would walk them all again
    (docs/log.md, "Data"). What encoding makes is still collected (a template's
    rendering may leave cycles)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Adapting(Task):
    """A task that starts from a pretrained GPT (--init) and adapts it on conversations or pairs."""

    models = {"gpt": ModelChoice("gpt", GPTConfig)}
    default_model = "gpt"
    set_by_data = frozenset(f.name for f in fields(GPTConfig))  # the --init model's, all of them: no flags
    options = AdaptOptions
    converters = ("lora", "quantize")
    kept_on_resume = "the run's examples stay as they were"
    generates = True
    endpoint = "/api/generate"
    family = "gpt"  # the family of the runs it writes
    new_weights: tuple[str, ...] = ()  # weights the base has not got (a head): trained from their init
    unit = "pair"  # what an example is, for messages
    builtin = "preferences"  # the built-in data of the task (finetune.BUILTIN)
    reads_whole_rows = False  # True: the model reads all of an example's tokens (not shifted by one)
    init_help = (
        "the model to adapt: an attnlab GPT run (lm, sft, dpo; a LoRA run's adapters are merged in) or a "
        "HuggingFace folder (GPT-2, Llama, Mixtral: converted once)"
    )

    def train_defaults(self, model: str) -> dict[str, Any]:
        return dict(TUNED)

    def model_of(self, config: dict[str, Any]) -> str:
        return "gpt"

    # ---- the run's files and model --------------------------------------------------------------
    def setup(self, req: TrainRequest) -> dict[str, str]:
        init = req.base
        tok, template = load_tokenizer(init), run_template(init)
        room = read_run_config(init)["model"]["context"] - self.reads_whole_rows
        # Every row read and checked here, before the run's folder is made: a row it cannot read fails
        # first. One is encoded (the template's errors too); prepare encodes them all, once.
        rows = splits(req.data, self.builtin)["train"]
        row = next((r for r in rows if not surely_longer(r, room)), None)
        if row is None:  # what prepare would find, after encoding them all
            raise AttnlabError(f"every {self.unit} is longer than the model's context of {room} tokens")
        example = self.encode_row(row, tok, template, req.data)
        if req.options.show_masks:
            first = example[0] if isinstance(example, tuple) else example
            print(f"one training example, the tokens the loss reads in green:\n{show(first, tok)}", file=sys.stderr)
        return {TOKENIZER: tok.to_json(), CHAT_TEMPLATE: json.dumps(template.to_dict(), ensure_ascii=False)}

    def init_run(self, init: str | Path | None) -> Path:
        """The --init model as a run folder, checked to be a language model."""
        if init is None:
            raise AttnlabError(
                f"attnlab train {self.name} adapts a pretrained model: give --init RUN (an attnlab "
                "GPT run or a HuggingFace folder)"
            )
        path = as_run(init)
        config = read_run_config(path)
        if not kind_of(config).generates:
            raise AttnlabError(f"--init {init} is {kind_of(config).noun} run: {self.name} adapts a language model")
        return path

    def complete(self, req: TrainRequest) -> TrainRequest:
        """The --init model as a run folder: resolved here, once (a HuggingFace folder is converted
        the first time)."""
        return replace(req, base=self.init_run(req.init))

    def model_config(self, req: TrainRequest) -> dict[str, Any]:
        if req.resume:
            return dict(req.model_config)
        return dict(read_run_config(req.base)["model"])

    def builder(self, req: TrainRequest, model: dict[str, Any]):
        """The model to train: the base's weights, converted as the request says (quantized, LoRA on
        top); without converters every weight trains."""
        lora, quantize = lora_of(req.converters), quantized_base(req.converters)

        def build() -> nn.Module:
            net = build_base(req.base, self.family, model, quantize, new=self.new_weights)
            return net if lora is None else with_adapters(net, lora, self.new_weights)

        return build

    def run_config(self, req: TrainRequest, model: dict[str, Any]) -> dict:
        config = config_json(req, self.family, model, {"kind": self.name})
        if req.converters:  # the base it adapts, and what trains beside the adapters (a new head)
            config["adapter"] = {"base": str(req.base.resolve()), "also": list(self.new_weights)}
            config["converters"] = as_records(req.converters)
        return config

    def encode_row(self, row: Any, tok: Tokenizer, template: ChatTemplate, data: Any) -> Any:
        """One row of the data as the model reads it: a preference pair as two examples here, a
        conversation as one in sft."""
        return pair_examples(row, template, tok)

    def examples(self, tok: Tokenizer, template: ChatTemplate, data: Any, room: int | None = None) -> dict[str, list]:
        """The task's encoded examples by split; with `room`, only those that fit it (encoded_rows)."""
        encode = lambda row: self.encode_row(row, tok, template, data)  # noqa: E731
        return {k: encoded_rows(v, encode, room, self.unit) for k, v in splits(data, self.builtin).items()}

    def encoded(self, req: TrainRequest) -> Encoded:
        """What every prepare starts from: the run's tokenizer and template, the model's settings and
        adapters, and the examples that fit its context (a pair: both rows)."""
        tok, template = load_tokenizer(req.out), run_template(req.out)
        model = self.model_config(req)
        # the model reads an example's tokens shifted by one (sft, dpo) or whole (a reward model)
        parts = self.examples(tok, template, req.data, model["context"] - self.reads_whole_rows)
        return Encoded(tok, template, model, parts)

    # ---- the request (tasks/request.py) -------------------------------------------------------------
    def check_given(self, opts: TrainOptions, flags: dict[str, dict[str, Any]], preset: str | None) -> None:
        clash = [f"--{k.replace('_', '-')}" for k in flags.get("model", {})] + ["--preset"] * bool(opts.preset)
        if clash:
            raise AttnlabError(f"--init decides the model of a fine-tuning: drop {', '.join(clash)}")

    def from_init(self, init: str, fields: dict[str, Any], preset: str | None) -> dict[str, Any]:
        return {}  # the init run's model, read in prepare

    # ---- a trained run --------------------------------------------------------------------------
    def next_step(self, out: str) -> str:
        return f". Try: attnlab chat {out}"

    def exact(
        self,
        model: nn.Module,
        tok: Tokenizer,
        template: ChatTemplate,
        convs: list[Conversation],
        progress: str | None = None,
    ) -> dict:
        """The share of conversations whose final answer the model gives exactly (greedy); progress: the
        name of a bar counting the answers."""
        if not convs:
            return {"exact": None, "examples": 0}
        right = sum(right_answers(model, tok, template, convs, progress))
        return {"exact": right / len(convs), "examples": len(convs)}

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """Exact answers on the held-out conversations (the built-in instructions' test split, or a file's)."""
        cfg = checked(self.data_config, run.config["data"], where=f"{run.path} data")
        convs, held = held_out(cfg, data)
        check_split(split, held)
        scores = self.exact(run.model, run.tokenizer, run_template(run.path), convs)
        return {"data": data or cfg.data, "split": held, **scores, **self.more_scores(run, data)}

    def held_out_pairs(self, run, data: str | None) -> tuple[list, str, str]:
        """The held-out preference pairs `attnlab eval` scores, their split and their data: the built-in
        pairs' test split (for --data instructions too: the same questions), or a file's held-out rows."""
        given = {} if data is None else {"data": "preferences" if data == "instructions" else data}
        cfg = checked(PreferenceData, {**run.config["data"], **given}, where="data")
        held = "test" if cfg.data == "preferences" else "val"
        room = run.model.cfg.context - self.reads_whole_rows
        return self.examples(run.tokenizer, run_template(run.path), cfg, room)[held], held, cfg.data

    def more_scores(self, run, data: str | None) -> dict[str, Any]:
        """What a task measures beside the exact answers (DPO: its preference accuracy)."""
        return {}

    def show_evaluation(self, r: dict[str, Any]) -> str:
        exact = "n/a" if r["exact"] is None else f"{r['exact']:.1%}"
        return f"{r['data']} ({r['split']}): exact answers {exact} of {r['examples']}"

    def test_line(self, test: dict[str, Any]) -> str:
        return f"exact answers on the held-out instructions {test['exact']:.1%} ({test['examples']})"
