"""Parallel data for translation: (source, target) pairs from files, or the tasks attnlab generates.

Files: TSV with `source<TAB>target` on each line, or two aligned files (--data SOURCE --target
TARGET) where line n of one translates line n of the other. Blank lines are skipped and each
side is stripped of surrounding spaces.
Built in (see numbers.py and dates.py for the first two):

    numbers   forty-two                  -> quarante-deux      (English words to French words)
    dates     the 21st of November 2026  -> 2026-11-21         (human-written dates to ISO 8601)
    copy      qwhxk                      -> qwhxk              (3..20 lowercase letters, no spaces:
    reverse   qwhxk                      -> kxhwq               one letter is one character token)

Splits come as files (--val, --test) or are cut deterministically from --data. A built-in task
holds out VAL_SIZE and TEST_SIZE pairs whose number, date or letter string never occurs in train,
so scores measure translating new inputs, not recalling seen ones.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from attnlab.config import check_fraction, option
from attnlab.data import dates, numbers
from attnlab.data.labeled import cut_splits, open_data
from attnlab.errors import AttnlabError

GENERATED = ("numbers", "dates", "copy", "reverse")
# Words and ISO dates repeat in chunks ("quatre-vingt", "-11-") that BPE merges; letter tasks need letters.
TASK_TOKENIZER = {"numbers": "bpe", "dates": "bpe", "copy": "char", "reverse": "char"}
SPLIT_NAMES = ("train", "val", "test")
VAL_SIZE, TEST_SIZE = 1000, 2000  # held-out pairs of every built-in task
SYMBOLS, MIN_SYMBOLS, MAX_SYMBOLS = string.ascii_lowercase, 3, 20  # copy and reverse

Pair = tuple[str, str]


@dataclass
class ParallelDataConfig:
    data: str = option(
        "numbers",
        "built-in task (numbers, dates, copy, reverse) or a file: TSV lines source<TAB>target, "
        "or source lines when --target is given",
    )
    target: str | None = option(None, "target file aligned with --data: line n translates line n of --data")
    val: str | None = option(None, "validation pairs: a TSV file or SOURCE,TARGET files (default: cut from --data)")
    test: str | None = option(None, "test pairs: a TSV file or SOURCE,TARGET files (default: cut from --data)")
    tokenizer: str | None = option(
        None, "char or bpe (default: the built-in task's own, bpe for files)", choices=("char", "bpe")
    )
    vocab_size: int = option(1000, "BPE vocabulary size of each side (of both with --shared-vocab)")
    shared_vocab: bool = option(False, "one tokenizer for source and target, e.g. when both sides share a script")
    max_len: int = option(128, "tokens per side; longer pairs are truncated, with a warning")
    n_train: int = option(30000, "training pairs a built-in task generates (val and test pairs come on top)")
    split_fraction: float = option(0.05, "share of --data cut off for validation, and again for test, when not given")
    data_seed: int = option(0, "seed of the generated tasks and of the split")

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "n_train"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        check_fraction(self, "split_fraction", high=0.5)


def tokenizer_kind(cfg: ParallelDataConfig) -> str:
    """ "char" or "bpe": --tokenizer if given, else the built-in task's default, else "bpe" for files."""
    return cfg.tokenizer or TASK_TOKENIZER.get(cfg.data, "bpe")


def load_pairs(cfg: ParallelDataConfig) -> dict[str, list[Pair]]:
    """{"train", "val", "test"} -> (source, target) pairs, from a built-in task or from files."""
    if cfg.data in GENERATED:
        if cfg.target is not None:
            raise AttnlabError(f"--target goes with a source file, not with the built-in task {cfg.data}")
        splits = generate(cfg.data, cfg.data_seed, (cfg.n_train, VAL_SIZE, TEST_SIZE))
    else:
        splits = {"train": read_pairs(cfg.data, cfg.target)}
        splits.update(
            cut_splits(splits["train"], [name for name in ("val", "test") if getattr(cfg, name) is None], cfg)
        )
    for name in ("val", "test"):
        if getattr(cfg, name) is not None:  # a given file replaces the cut or generated split
            splits[name] = _read_spec(getattr(cfg, name))
    for name in SPLIT_NAMES:
        if not splits.get(name):
            raise AttnlabError(f"the {name} split of {cfg.data} is empty: give more data or a {name} file")
    return splits


# ---- built-in tasks ---------------------------------------------------------------------------


def _letters(rng: random.Random) -> str:
    return "".join(rng.choices(SYMBOLS, k=rng.randint(MIN_SYMBOLS, MAX_SYMBOLS)))


# Each task: draw(rng) -> a key (the number, date or string), and write(key, rng) -> (source, target).
# Splits are disjoint by key, so a held-out number never shows up in train, even in other words.
TASKS: dict[str, tuple[Callable[[random.Random], Hashable], Callable[[Hashable, random.Random], Pair]]] = {
    "numbers": (numbers.sample, lambda n, rng: (numbers.english(n), numbers.french(n))),
    "dates": (dates.sample, lambda d, rng: (dates.render(d, rng), d.isoformat())),
    "copy": (_letters, lambda s, rng: (s, s)),
    "reverse": (_letters, lambda s, rng: (s, s[::-1])),
}
# Most distinct keys a task may be asked for: every day in the date range; half of all numbers,
# beyond which drawing unseen ones by rejection slows down. Letter strings never run out.
CAPACITY = {"numbers": numbers.LIMIT // 2, "dates": dates.N_DAYS}


def generate(task: str, seed: int, sizes: tuple[int, int, int]) -> dict[str, list[Pair]]:
    """Train, val and test pairs of a built-in task, of the given sizes, with no key in two splits.

    The same seed always gives the same splits. Keys are drawn until `sum(sizes)` distinct ones are
    found and then shuffled, so every split has the same mix (e.g. of number lengths).
    """
    draw, write = TASKS[task]
    total = sum(sizes)
    if total > CAPACITY.get(task, total):
        raise AttnlabError(f"the {task} task has at most {CAPACITY[task]} distinct pairs, asked for {total}")
    rng = random.Random(seed)
    pairs: dict[Hashable, Pair] = {}
    for _ in range(50 * total + 1000):  # guards the loop; within CAPACITY it ends far sooner
        if len(pairs) == total:
            break
        key = draw(rng)
        if key not in pairs:
            pairs[key] = write(key, rng)
    if len(pairs) < total:
        raise AttnlabError(f"could not draw {total} distinct {task} pairs; ask for fewer with --n-train")
    data = list(pairs.values())
    rng.shuffle(data)  # rare keys (one-digit numbers) were all drawn early; spread them over the splits
    n_train, n_val, _ = sizes
    return {"train": data[:n_train], "val": data[n_train : n_train + n_val], "test": data[n_train + n_val :]}


# ---- files ------------------------------------------------------------------------------------


def read_pairs(source: str | Path, target: str | Path | None = None) -> list[Pair]:
    """Pairs of a TSV file, or of two aligned files when `target` is given."""
    return read_tsv(source) if target is None else read_aligned(source, target)


def _read_spec(spec: str) -> list[Pair]:
    """--val / --test: a TSV file, or "SOURCE,TARGET" aligned files (a file whose name has a comma wins)."""
    if "," in spec and not Path(spec).expanduser().is_file():
        source, target = spec.split(",", 1)
        return read_aligned(source, target)
    return read_tsv(spec)


def _pair(source: str, target: str, where: str) -> Pair:
    source, target = source.strip(), target.strip()
    if not source or not target:
        raise AttnlabError(f"{where}: the {'source' if not source else 'target'} side is empty")
    return source, target


def read_tsv(path: str | Path) -> list[Pair]:
    """(source, target) pairs of a file with `source<TAB>target` on each line; blank lines skipped."""
    pairs = []
    with open_data(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise AttnlabError(f"{path}:{n}: expected source<TAB>target (one tab), found {len(fields) - 1} tabs")
            pairs.append(_pair(*fields, where=f"{path}:{n}"))
    return pairs


def _lines(path: str | Path) -> list[str]:
    with open_data(path) as f:
        return [line.rstrip("\r\n") for line in f]


def read_aligned(source: str | Path, target: str | Path) -> list[Pair]:
    """Pairs of two files, line n of `target` translating line n of `source`; lines blank on both sides skipped."""
    src, tgt = _lines(source), _lines(target)
    if len(src) != len(tgt):
        raise AttnlabError(
            f"{source} has {len(src)} lines but {target} has {len(tgt)}: "
            "aligned files need one target line per source line"
        )
    return [
        _pair(s, t, where=f"{source}:{n} / {target}:{n}")
        for n, (s, t) in enumerate(zip(src, tgt), 1)
        if s.strip() or t.strip()
    ]
