"""The command line generated from option dataclasses: one argument per field, never written by hand.

A command's options are a dataclass (cli/options.py, or the library's own: CompareOptions, a task's
TrainOptions); each field's `option(...)` metadata says its help, its allowed values and how it
shows (positional, nargs, metavar, a whole number of at least N, a group of exclusive options, a
flag given several times). `add_options` makes the arguments and `read_options` the dataclass back.

Settings sections (model, training, data, generation, ...) are different: every flag defaults to
None, so that what the user gave can be laid over a preset, a TOML file or a resumed run's own
settings (`add_section`, `given`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from typing import Any

from attnlab.config import check_types, field_type
from attnlab.errors import AttnlabError

NOT_FLAGS = {"model": {"vocab_size"}}  # set from the tokenizer, not by hand


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


def add_options(parser: argparse.ArgumentParser, cls: type, overrides: dict[str, dict] | None = None,
                skip: frozenset[str] = frozenset()) -> None:  # fmt: skip
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
        where.add_argument(*names, **kw)


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
        if not kw["required"] and default not in (None, False, "") and not meta.get("repeat"):
            kw["help"] += f" (default: {default})"
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
    else:
        element = typing.get_args(base)[0] if typing.get_origin(base) is list else base
        if meta.get("at_least") is not None:
            kw["type"] = whole_number(meta["at_least"])
        else:
            kw["type"] = finite if element is float else element
        if meta.get("choices") is not None:
            kw["choices"] = list(meta["choices"])
        for key in ("nargs", "metavar"):
            if meta.get(key) is not None:
                kw[key] = meta[key]
        if meta.get("repeat"):
            kw["action"], default = "append", []
    kw["default"] = default
    return names, kw


def read_options(args: argparse.Namespace, cls: type) -> Any:
    """The options dataclass from parsed arguments; a value its checks refuse is one user error."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    try:
        options = cls(**values)
        check_types(options)
        return options
    except ValueError as e:
        raise AttnlabError(str(e)) from None


def add_section(parser: argparse.ArgumentParser, section: str, cls: type | tuple[type, ...], title: str,
                skip: frozenset[str] = frozenset(), defaults: dict[str, Any] | None = None) -> None:  # fmt: skip
    """One --flag per field of a settings dataclass, defaulting to None (so we know what was given).
    Several classes: one flag per field name, its help naming the class. `defaults`: the values the
    command uses in place of the fields' own (a preset, tuned settings), for --help."""
    group = parser.add_argument_group(title)
    classes = cls if isinstance(cls, tuple) else (cls,)
    seen = set(skip) | NOT_FLAGS.get(section, set())
    for c in classes:
        for f in dataclasses.fields(c):
            if f.name not in seen:
                seen.add(f.name)
                where = f" [{c.__name__}]" if len(classes) > 1 else ""
                group.add_argument("--" + f.name.replace("_", "-"), **_flag(section, c, f, where, defaults or {}))


def _flag(section: str, cls: type, f: dataclasses.Field, where: str, defaults: dict) -> dict[str, Any]:
    base, _ = field_type(cls, f)
    default = defaults.get(f.name, None if f.default is dataclasses.MISSING else f.default)
    kw: dict[str, Any] = {"dest": f"{section}__{f.name}", "default": None,
                          "help": f"{f.metadata.get('help', '')} (default: {default}){where}"}  # fmt: skip
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    else:
        choices = f.metadata.get("choices")
        kw["metavar"] = "{" + ",".join(choices) + "}" if choices else f.name.upper()
    return kw


def given(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """The flags of a section the user gave, {field: value}."""
    prefix = section + "__"
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}
