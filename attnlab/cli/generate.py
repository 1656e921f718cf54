"""The command line generated from option dataclasses: one argument per field, never written by hand.

A command's options are a dataclass (cli/options.py, or the library's own: CompareOptions, a task's
TrainOptions); each field's `option(...)` metadata says its help, its allowed values and how it
shows (positional, nargs, metavar, a whole number of at least N, a group of exclusive options, a
flag given several times). `add_options` makes the arguments and `read_options` the dataclass back.

A list or tuple field takes several values: `--lora-targets q v`, or `--lora-targets q,v` (nargs "+"
unless the field gives its own), each converted to the element type, gathered into the field's own
container (`Several`). Commas separate values where the count is open, except in positionals (run
folders may hold commas) and fields that say commas=False (words of a word-vectors file: GloVe has
"," and "1,000"); a list of fixed length (nargs=3) takes its values space-separated.

Settings sections (model, training, data, generation, ...) are different: every flag defaults to
None, so that what the user gave can be laid over a preset, a TOML file or a resumed run's own
settings (`add_section`, `given`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

from attnlab.config import check_types, field_type
from attnlab.errors import AttnlabError

NOT_FLAGS = {"model": {"vocab_size"}}  # set from the tokenizer, not by hand
MADE_FROM = "made_from"  # each argument's (dataclass, field), for tests that walk the parser


def whole_number(least: int):
    """An argparse type: a whole number, `least` or more."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {n}")
        return n

    return parse


def finite(text: str) -> float:
    """An argparse type: a finite number (float() takes nan, which passes every range check, and inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    overrides: dict[str, dict] | None = None,
    skip: frozenset[str] = frozenset(),
) -> None:
    """One argument per field of the options dataclass cls; overrides[name] replaces parts of a
    field's metadata for this command (its help, choices or default)."""
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        meta = {**f.metadata, **(overrides or {}).get(f.name, {})}
        names, kw = _argument(cls, f, meta)
        where = parser
        if meta.get("group"):  # options that exclude one another
            if meta["group"] not in groups:
                title = parser.add_argument_group(meta["group"])
                groups[meta["group"]] = title.add_mutually_exclusive_group()
            where = groups[meta["group"]]
        setattr(where.add_argument(*names, **kw), MADE_FROM, (cls, f))


def _argument(cls: type, f: dataclasses.Field, meta: dict) -> tuple[list[str], dict[str, Any]]:
    """The name(s) and argparse keywords of one field."""
    base, _ = field_type(cls, f)
    default = meta.get("default", f.default)
    kw: dict[str, Any] = {"help": meta["help"]}
    if meta.get("positional"):
        names = [f.name]
    else:
        names, kw["dest"] = ["--" + f.name.replace("_", "-")], f.name
        kw["required"] = bool(meta.get("required"))
        if not kw["required"] and default not in (None, False, "", (), []) and not meta.get("repeat"):
            kw["help"] += f" (default: {' '.join(map(str, default)) if is_list(base) else default})"
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
    elif is_list(base):
        kw.update(several(base, meta, kw["help"], default, positional=bool(meta.get("positional"))))
        default = [] if meta.get("repeat") else default
    else:
        kw["type"] = _converter(base, meta)
        if meta.get("choices") is not None:
            kw["choices"] = list(meta["choices"])
        for key in ("nargs", "metavar"):
            if meta.get(key) is not None:
                kw[key] = meta[key]
    kw["default"] = default
    return names, kw


def _converter(element: type, meta: dict) -> Callable[[str], Any]:
    """What turns one word of the command line into a value of type `element`."""
    if meta.get("at_least") is not None:
        return whole_number(meta["at_least"])
    return finite if element is float else element


def is_list(base: Any) -> bool:
    """A list or tuple field (list[str], tuple[str, ...]): one that takes several values."""
    return typing.get_origin(base) in (list, tuple)


class Several(argparse.Action):
    """A list or tuple option's values: every word's items (see `_items`) gathered into the field's
    container; a repeatable option (repeat=True) adds to what its earlier uses gave."""

    def __init__(self, *args, into: type = list, repeat: bool = False, commas: bool = False, **kw):
        super().__init__(*args, **kw)
        self.into, self.repeat, self.commas = into, repeat, commas

    def __call__(self, parser, namespace, values, option_string=None):
        words = [values] if self.nargs is None else values  # nargs None: one word, one use of the flag
        items = [item for word in words for item in word]
        if self.repeat:
            items = [*(getattr(namespace, self.dest, None) or []), *items]
        setattr(namespace, self.dest, self.into(items))


def several(base: Any, meta: dict, text: str, default: Any, positional: bool) -> dict[str, Any]:
    """argparse keywords of a list or tuple field: its values space-separated, or comma-separated where
    commas are taken (see the module's docstring), each converted to the element type; its help is
    `text` and how to give several values."""
    repeat = bool(meta.get("repeat"))
    nargs = None if repeat else meta.get("nargs", "+")
    commas = not positional and nargs in ("+", "*", None) and meta.get("commas", True)
    choices = meta.get("choices")
    convert = _converter(typing.get_args(base)[0], meta)
    kw = {
        "action": Several,
        "into": typing.get_origin(base),
        "repeat": repeat,
        "commas": commas,
        "type": _items(convert, choices, commas),
        "help": _several_help(text, meta, default, nargs, commas),
    }
    if nargs is not None:
        kw["nargs"] = nargs
    if meta.get("metavar") is not None or choices is not None:
        kw["metavar"] = meta.get("metavar") or "{" + ",".join(map(str, choices)) + "}"
    return kw


def _items(convert: Callable[[str], Any], choices: Sequence | None, commas: bool) -> Callable[[str], list]:
    """An argparse type for one word of a list option: its items (the pieces between commas, where
    commas are taken), each converted and checked against the choices."""

    def parse(word: str) -> list:
        pieces = [p.strip() for p in word.split(",")] if commas else [word]
        if commas and "" in pieces:  # "q,,v" or "q,": a slip, not a value
            raise argparse.ArgumentTypeError(f"an empty value in {word!r}: separate values by spaces or by one comma")
        items = [convert(p) for p in pieces]
        if choices is not None and (bad := [i for i in items if i not in choices]):
            raise argparse.ArgumentTypeError(f"invalid choice: {bad[0]!r} (choose from {', '.join(map(str, choices))})")
        return items

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's "invalid int value: 'x'" names it
    return parse


def _several_help(text: str, meta: dict, default: Any, nargs: Any, commas: bool) -> str:
    """`text` and how to give several values: "... (several: q v, or q,v)"."""
    if nargs not in ("+", "*", None) or meta.get("positional"):  # a fixed count, a positional: usage says it
        return text
    word = meta.get("metavar") if isinstance(meta.get("metavar"), str) else "X"
    a, b = list(default)[:2] if isinstance(default, list | tuple) and len(default) >= 2 else (word, word)
    if not commas:
        return f"{text} (several, space-separated: {a} {b})"
    return f"{text} (several: {'give it again' if nargs is None else f'{a} {b}'}, or {a},{b})"


def read_options(args: argparse.Namespace, cls: type) -> Any:
    """The options dataclass from parsed arguments; a value its checks refuse is one user error."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    try:
        options = cls(**values)
        check_types(options)
        return options
    except ValueError as e:
        raise AttnlabError(str(e)) from None


def add_section(
    parser: argparse.ArgumentParser,
    section: str,
    cls: type | tuple[type, ...],
    title: str,
    skip: frozenset[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
    prefix: str = "",
) -> None:
    """One --flag per field of a settings dataclass, defaulting to None (so we know what was given).
    Several classes: one flag per field name, its help naming the class. `defaults`: the values the
    command uses in place of the fields' own (a preset, tuned settings), for --help. `prefix`: put
    before each field's name in its flag (LoRAConfig's rank is --lora-rank)."""
    group = parser.add_argument_group(title)
    classes = cls if isinstance(cls, tuple) else (cls,)
    seen = set(skip) | NOT_FLAGS.get(section, set())
    for c in classes:
        for f in dataclasses.fields(c):
            if f.name not in seen:
                seen.add(f.name)
                where = f" [{c.__name__}]" if len(classes) > 1 else ""
                kw = _flag(section, c, f, where, defaults or {})
                flag = "--" + (prefix + f.name).replace("_", "-")
                setattr(group.add_argument(flag, **kw), MADE_FROM, (c, f))


def _flag(section: str, cls: type, f: dataclasses.Field, where: str, defaults: dict) -> dict[str, Any]:
    base, _ = field_type(cls, f)
    default = defaults.get(f.name, None if f.default is dataclasses.MISSING else f.default)
    kw: dict[str, Any] = {
        "dest": f"{section}__{f.name}",
        "default": None,
        "help": f"{f.metadata.get('help', '')} (default: {default}){where}",
    }
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif is_list(base):  # laid over the preset whole: the values given replace the preset's list
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
        text = f"{f.metadata.get('help', '')} (default: {shown}){where}"
        kw.update(several(base, {**f.metadata, "metavar": f.name.upper()}, text, default, positional=False))
    else:
        choices = f.metadata.get("choices")
        kw["metavar"] = "{" + ",".join(choices) + "}" if choices else f.name.upper()
    return kw


def given(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """The flags of a section the user gave, {field: value}."""
    prefix = section + "__"
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}
