"""The data of a fine-tuning: the built-in generated instructions, a verifiable task (add, multiply,
countdown at a --level: data/verifiable.py) or a file of the user's, in splits.

    ChatData        conversations for supervised fine-tuning (sft)
    PreferenceData  preference pairs for DPO and a reward model (dpo, reward)

The built-in sets have a test split of their own (questions never trained on: data/instructions.py),
which is also the validation split; a file is shuffled (seeded) and --val-fraction of it held out.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from attnlab.config import check_fraction, check_types, option
from attnlab.data.conversations import Conversation, Preference, kind_of, read_conversations, read_preferences, rows
from attnlab.data.instructions import instructions, preferences
from attnlab.data.supervised import TRAIN_ON
from attnlab.data.verifiable import KINDS as VERIFIABLE
from attnlab.data.verifiable import conversations as verifiable_conversations
from attnlab.errors import AttnlabError

T = TypeVar("T")
BUILTIN = {"instructions": instructions, "preferences": preferences}
# the verifiable tasks, each maker as the instructions' (split, n, seed), with its --level
BUILTIN.update({kind: partial(verifiable_conversations, kind) for kind in VERIFIABLE})
CONVERSATIONS = ("instructions", *VERIFIABLE)  # the built-in data of sft and grpo: any of them
TEST_SEED = 1  # the test questions are drawn apart from the training ones (and are disjoint from them)


@dataclass
class ChatData:
    data: str = option(
        "instructions",
        "conversations: 'instructions' (built-in, generated), a verifiable task "
        "(add, multiply, countdown: generated, answers checked by a program; see --level) or a "
        'JSON/JSONL file of {"messages": [...]}, {"prompt", "completion"}, Alpaca or {"text"} '
        "rows",
    )
    train_on: str = option("assistant", "the tokens the loss reads: the assistant's turns, or all", TRAIN_ON)
    examples: int = option(4000, "built-in data: training conversations to generate", at_least=1)
    test_examples: int = option(
        200, "built-in data: held-out conversations to generate (validation and test)", at_least=1
    )
    val_fraction: float = option(0.05, "a file: the share held out for validation")
    chained: float = option(
        0.0,
        "built-in data: the share of training conversations that chain 2-4 "
        "independent instructions (so later, unrelated ones are answered), in [0, 1)",
    )
    level: int | None = option(
        None,
        "a verifiable task's difficulty: digits of each number (add, multiply), how "
        "many numbers are given (countdown); default 3, 3, 4",
    )

    def __post_init__(self):
        check_types(self)
        check_fraction(self, "val_fraction", "chained")
        if self.data in BUILTIN and self.data not in VERIFIABLE and self.level is not None:
            raise AttnlabError(f"--level sets a verifiable task's difficulty: --data {'|'.join(VERIFIABLE)}")
        if self.data in VERIFIABLE and self.chained:
            raise AttnlabError("--chained chains the built-in instructions: leave it out with --data " + self.data)


@dataclass
class PreferenceData:
    data: str = option(
        "preferences",
        "preference pairs: 'preferences' (built-in: the instructions' right answer "
        'chosen, a near miss rejected) or a JSON/JSONL file of {"prompt", "chosen", "rejected"} '
        "rows",
    )
    examples: int = option(2000, "built-in data: training pairs to generate", at_least=1)
    test_examples: int = option(200, "built-in data: held-out pairs to generate (validation and test)", at_least=1)
    val_fraction: float = option(0.05, "a file: the share held out for validation")

    def __post_init__(self):
        check_types(self)
        check_fraction(self, "val_fraction")


def splits(cfg: ChatData | PreferenceData, builtin: str) -> dict[str, list]:
    """{"train", "val", "test"} of the data: the built-in set's splits (val is its test split), or a
    file's rows shuffled and cut (no test split)."""
    if cfg.data in BUILTIN:
        if cfg.data != builtin and not (builtin in CONVERSATIONS and cfg.data in CONVERSATIONS):
            raise AttnlabError(f"--data {cfg.data} is not data of this task: use --data {builtin} or a file")
        make = BUILTIN[cfg.data]
        test = make("test", cfg.test_examples, TEST_SEED, **_level(cfg))  # single questions, whatever the mix
        chains = {"chained": cfg.chained} if cfg.data == "instructions" and isinstance(cfg, ChatData) else {}
        return {"train": make("train", cfg.examples, 0, **chains, **_level(cfg)), "val": test, "test": test}
    rows = read_rows(cfg.data, pairs=builtin == "preferences")
    random.Random(0).shuffle(rows)
    n_val = round(len(rows) * cfg.val_fraction) if len(rows) > 1 else 0
    if cfg.val_fraction > 0 and len(rows) > 1:
        n_val = min(max(1, n_val), len(rows) - 1)  # one row at least on each side
    return {"train": rows[n_val:], "val": rows[:n_val], "test": []}


def _level(cfg: ChatData | PreferenceData) -> dict[str, Any]:
    """The maker's level argument of a verifiable task's data ({} for the instructions')."""
    return {"level": cfg.level} if cfg.data in VERIFIABLE else {}


def test_split(cfg: ChatData | PreferenceData, builtin: str) -> list:
    """The test split of `splits`, without reading a file again (a file has none)."""
    return splits(cfg, builtin)["test"] if cfg.data in BUILTIN else []


def read_rows(path: str, pairs: bool) -> list:
    """A file's conversations, or (pairs) its preference pairs: a row of the other kind is one line."""
    return read_preferences(path) if pairs else read_conversations(path)


def held_out(cfg: ChatData | PreferenceData, source: str | None = None) -> tuple[list[Conversation], str]:
    """The conversations `attnlab eval` answers, and their split: the built-in instructions' test split,
    or the held-out rows of a file (a preference pair as its prompt and chosen answer)."""
    source = source or cfg.data
    if source in VERIFIABLE:  # the run's own level when it trained on this task, else the default
        level = getattr(cfg, "level", None) if source == cfg.data else None
        return BUILTIN[source]("test", cfg.test_examples, TEST_SEED, level=level), "test"
    if source in BUILTIN:
        return instructions("test", cfg.test_examples, TEST_SEED), "test"
    first = next(rows(source), (0, None))[1]  # the first row alone says the file's kind (none: splits says so)
    pairs = isinstance(first, dict) and kind_of(first) == "preference"
    data = (PreferenceData if pairs else ChatData)(data=source, val_fraction=cfg.val_fraction)
    held = splits(data, "preferences" if pairs else "instructions")["val"]
    return [Conversation((*r.prompt, *r.chosen)) if isinstance(r, Preference) else r for r in held], "val"


def fitting(examples: Sequence[T], lengths: Sequence[int], context: int, what: str) -> list[T]:
    """The examples whose tokens fit the model's context; the others are left out, and said so."""
    kept = [e for e, n in zip(examples, lengths, strict=True) if n - 1 <= context]
    if len(kept) < len(examples):
        if not kept:
            raise AttnlabError(f"every {what} is longer than the model's context of {context} tokens")
        warnings.warn(
            f"left out {len(examples) - len(kept)} of {len(examples)} {what}s longer than the model's "
            f"context of {context} tokens",
            stacklevel=2,
        )
    return kept


def describe(cfg: Any) -> str:
    return cfg.data if cfg.data in BUILTIN else f"file {cfg.data}"
