"""Labelled data for classification and tagging: files, or the tasks attnlab generates.

Classification: CSV, TSV or JSONL with a text column and a label column (names settable).
Tagging: CoNLL style, one `token label` per line and a blank line between sentences.
Built in: `sentiment` (classification) and `tagging`, written by attnlab's own generators.

An example is (text, label) for classification and (words, tags) for tagging. Splits come
as files (--val, --test) or are cut deterministically from the training file.
"""

from __future__ import annotations

import csv
import io
import json
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from attnlab.config import check_fraction, option
from attnlab.data import sentiment, tagging
from attnlab.data.text import read_text
from attnlab.errors import AttnlabError

SPLIT_NAMES = ("train", "val", "test")


@dataclass
class LabeledDataConfig:
    data: str = option("sentiment", "built-in task (sentiment, tagging) or a file: CSV/TSV/JSONL, or CoNLL to tag")
    val: str | None = option(None, "validation file (default: cut from --data)")
    test: str | None = option(None, "test file (default: cut from --data)")
    text_column: str = option("text", "column of a CSV/TSV/JSONL file that holds the text")
    label_column: str = option("label", "column of a CSV/TSV/JSONL file that holds the label")
    vocab_size: int = option(10000, "words kept in the vocabulary, most frequent first")
    max_len: int = option(128, "tokens per example; longer texts are truncated, with a warning")
    split_fraction: float = option(0.1, "share of --data cut off for validation, and again for test, when not given")
    data_seed: int = option(0, "seed of the generated tasks and of the split")

    def __post_init__(self):
        check_fraction(self, "split_fraction", high=0.5)
        for name in ("vocab_size", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def load_splits(cfg: LabeledDataConfig, task: str) -> dict[str, list]:
    """{"train", "val", "test"} -> examples for a task of FORMATS ("classify" or "tag")."""
    if cfg.data in BUILTIN_TASKS:
        if BUILTIN_TASKS[cfg.data] != task:
            raise AttnlabError(f"--data {cfg.data} is a {BUILTIN_TASKS[cfg.data]} task, not {task}")
        splits = FORMATS[task].generated.splits(cfg.data_seed)
    else:

        def read(path: str) -> list:
            return FORMATS[task].read(path, cfg)

        splits = {"train": read(cfg.data)}
        given = {"val": cfg.val, "test": cfg.test}
        cut = cut_splits(splits["train"], [name for name, path in given.items() if path is None], cfg)
        splits.update(cut)
        splits.update({name: read(path) for name, path in given.items() if path is not None})
    for name in SPLIT_NAMES:
        if not splits.get(name):
            raise AttnlabError(f"the {name} split of {cfg.data} is empty: give more data or a {name} file")
    return splits


def cut_splits(examples: list, names: list[str], cfg: LabeledDataConfig) -> dict[str, list]:
    """Move a seeded-random share of `examples` into each split in `names` (same result every run)."""
    if not names:
        return {}
    order = list(range(len(examples)))
    random.Random(cfg.data_seed).shuffle(order)
    n = round(len(examples) * cfg.split_fraction)
    out = {name: [examples[i] for i in order[k * n : (k + 1) * n]] for k, name in enumerate(names)}
    rest = sorted(order[len(names) * n :])
    examples[:] = [examples[i] for i in rest]
    return out


def open_data(path: str | Path) -> io.StringIO:
    """A UTF-8 data file (bytes that are not UTF-8 counted in a warning), or one line saying it is missing."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise AttnlabError(f"data file not found: {path}")
    return io.StringIO(read_text(p), newline="")


def read_table(path: str | Path, text_column: str, label_column: str) -> list[tuple[str, str]]:
    """(text, label) rows of a CSV, TSV (by extension) or JSONL file."""
    suffix = Path(path).suffix.lower()
    with open_data(path) as f:
        if suffix in (".jsonl", ".json"):
            rows = [_json_row(line, path, n) for n, line in enumerate(f, 1) if line.strip()]
        else:
            rows = _csv_rows(f, path, delimiter="\t" if suffix == ".tsv" else ",", label_column=label_column)
    for n, row in enumerate(rows, 1):
        missing = [c for c in (text_column, label_column) if c not in row]
        if missing:
            raise AttnlabError(
                f"{path}: no column {missing[0]!r} (row {n} has: {', '.join(map(str, row))}); "
                "set --text-column / --label-column"
            )
    pairs = [tuple("" if r[c] is None else str(r[c]) for c in (text_column, label_column)) for r in rows]
    kept = [(text, label) for text, label in pairs if text.strip() and label.strip()]
    if len(kept) < len(pairs):
        warnings.warn(
            f"{path}: {len(pairs) - len(kept):,} of {len(pairs):,} rows have an empty text or label and were dropped",
            stacklevel=2,
        )
    return kept


def _csv_rows(f: io.StringIO, path, delimiter: str, label_column: str) -> list[dict]:
    """The rows of a CSV/TSV file; a quote left open (which would swallow the rows after it into
    one field, a fake class when that field is the label) is an error naming its row and line."""
    reader = csv.DictReader(f, delimiter=delimiter, strict=True)
    rows, start = [], 2  # line 1 is the header
    try:
        for n, row in enumerate(reader, 1):
            end = reader.line_num
            label = row.get(label_column)
            if isinstance(label, str) and "\n" in label.strip("\r\n"):  # a label never spans lines
                raise AttnlabError(
                    f"{path}: row {n} (line {start}): its {label_column!r} runs over lines {start}"
                    f"-{end}: a quote opened on line {start} closes only on line {end}"
                )
            rows.append(row)
            start = end + 1
    except csv.Error as e:
        open_quote = "end of data" in str(e)
        why = "a quote opened on this line is never closed" if open_quote else f"not valid CSV ({e})"
        raise AttnlabError(
            f"{path}: row {len(rows) + 1} (line {start}): {why}; a quote inside a field "
            f'is written "" and the field quoted'
        ) from None
    return rows


def _json_row(line: str, path, n: int) -> dict:
    try:
        row = json.loads(line)
    except ValueError as e:
        raise AttnlabError(f"{path}:{n}: not JSON ({e})") from None
    if not isinstance(row, dict):
        raise AttnlabError(f"{path}:{n}: each line must be a JSON object")
    return row


def read_conll(path: str | Path) -> list[tuple[list[str], list[str]]]:
    """Sentences of a CoNLL-style file: `token label` per line (label = last field), blank line between."""
    sentences, words, tags = [], [], []
    with open_data(path) as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                if words:
                    sentences.append((words, tags))
                words, tags = [], []
                continue
            if len(fields) < 2:
                raise AttnlabError(f"{path}:{n}: expected 'token label', got {line.strip()!r}")
            words.append(fields[0])
            tags.append(fields[-1])
    if words:
        sentences.append((words, tags))
    return sentences


@dataclass(frozen=True)
class LabeledFormat:
    """A task of labels: its generated data (a module with splits(seed)), its name, and how its files read."""

    builtin: str
    generated: ModuleType
    read: Callable[[str, LabeledDataConfig], list]


# By task: classification reads tables (text, label); tagging reads CoNLL sentences (words, tags).
FORMATS = {
    "classify": LabeledFormat(
        "sentiment", sentiment, lambda path, cfg: read_table(path, cfg.text_column, cfg.label_column)
    ),
    "tag": LabeledFormat("tagging", tagging, lambda path, cfg: read_conll(path)),
}
BUILTIN_TASKS = {f.builtin: task for task, f in FORMATS.items()}  # generated data -> the task it is for
