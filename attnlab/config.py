"""Typed configuration dataclasses: helpers shared by every config.

Each config field carries its help text in `metadata={"help": ...}` (see `option`), so the
command line (cli/generate.py) and TOML files are generated from the dataclasses themselves.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from attnlab.errors import ArgumentTypeError, ArgumentValueError, AttnlabError, kind

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

T = TypeVar("T")


def option(default: Any, help: str, choices: Sequence | None = None, **cli: Any) -> Any:
    """A dataclass field with its command-line help and allowed values (a tuple, or `names(registry)`).
    `cli`: how the command line shows it, read by cli/generate.py: positional=True, nargs, metavar,
    required=True, at_least=N (a whole number of at least N), group (mutually exclusive options),
    repeat=True (a list, one value per use of the flag)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, **cli})


class names(Sequence):  # noqa: N801  (read as a function: option(..., names(NORMS)))
    """The names of a registry, read live: a part registered after the config class was made (a norm
    added by a plugin or a test) is an allowed value too. Equal to the tuple of the names."""

    def __init__(self, registry: dict):
        self.registry = registry

    def __getitem__(self, i):
        return tuple(self.registry)[i]

    def __len__(self) -> int:
        return len(self.registry)

    def __contains__(self, name: object) -> bool:
        return name in self.registry

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __repr__(self) -> str:
        return repr(tuple(self))


@functools.cache
def _hints(cls: type, names: tuple[str, ...]) -> dict[str, Any]:
    """The class's resolved type hints. Resolving them evaluates every annotation string, and the
    generated command line asks for each of its ~630 flags: once per class is enough. The field
    names are part of the key because `add_block_option` changes a class in place."""
    return typing.get_type_hints(cls)


def field_type(cls: type, f: dataclasses.Field) -> tuple[type, bool]:
    """The field's base type (int, float, str, bool) and whether None is allowed."""
    hint = _hints(cls, tuple(cls.__dataclass_fields__))[f.name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (base,) = [a for a in args if a is not type(None)]
        return base, True
    return hint, False


def parse_value(cls: type, name: str, raw: Any) -> Any:
    """Convert a value from TOML or the command line to the field's declared type."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    base, optional = field_type(cls, f)
    if raw is None or (optional and isinstance(raw, str) and raw.lower() in ("none", "")):
        if not optional:
            raise AttnlabError(f"{name} cannot be empty")
        return None
    try:
        if base is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if base is int and (isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer())):
            raise ValueError(raw)  # never round 3.7 to 3 or read True as 1
        value = base(raw)
    except (TypeError, ValueError, OverflowError):
        raise AttnlabError(f"{name}: expected {base.__name__}, got {raw!r}") from None
    if base is float:
        check_finite(name, value, raw)
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise AttnlabError(f"{name}: {value!r} is not one of {', '.join(map(str, choices))}")
    return value


def check_finite(name: str, value: float, raw: Any = None) -> None:
    """A float setting must be a number: NaN passes every range check (a timeout of NaN never fires),
    inf trains to NaN or waits forever."""
    if not math.isfinite(value):
        raise ArgumentValueError(f"{name}: must be a finite number, got {value if raw is None else raw!r}")


SEED_LIMIT = 2**63  # torch.manual_seed takes a signed 64-bit number, numpy's generators a non-negative one


def check_seed(name: str, seed: int | None) -> None:
    """A seed numpy and torch both accept: a whole number in [0, 2**63)."""
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise ArgumentValueError(f"{name} must be a whole number from 0 to 2**63 - 1, got {seed}")


def _fits(value: Any, base: Any) -> bool:
    """Whether `value` is of the field type `base` (an int is a float; a bool is not an int)."""
    if base is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if base in (str, bool):
        return isinstance(value, base)
    if typing.get_origin(base) in (list, tuple):
        return isinstance(value, list | tuple)
    return True  # a type of its own: the class checks it


def check_types(cfg: Any) -> None:
    """Every field of a config dataclass of its declared type, floats finite: for a library caller who
    builds one by hand (TrainConfig(max_steps="5") would fail later with "'<' not supported")."""
    cls = type(cfg)
    for f in dataclasses.fields(cfg):
        base, optional = field_type(cls, f)
        value = getattr(cfg, f.name)
        if value is None and optional:
            continue
        if not _fits(value, base):
            expected = getattr(base, "__name__", str(base)) + (" or None" if optional else "")
            raise ArgumentTypeError(f"{cls.__name__}.{f.name}: expected {expected}, got {kind(value)}")
        if base is float:
            check_finite(f"{cls.__name__}.{f.name}", value)


def check_fraction(cfg: Any, *names: str, high: float = 1.0) -> None:
    """Each named field a share in [0, high): written as `not (...)` so that NaN fails too."""
    for name in names:
        value = getattr(cfg, name)
        if not _fits(value, float):
            raise ArgumentTypeError(f"{type(cfg).__name__}.{name}: expected a number, got {kind(value)}")
        if not 0 <= value < high:
            raise ValueError(f"{name} must be in [0, {high:g}), got {value}")


def from_dict(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Build a config dataclass from a dict, rejecting unknown keys with a clear message."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(names), n=1)
        raise AttnlabError(
            f"unknown option(s) in {where}: {', '.join(unknown)}" + (f" (did you mean {near[0]}?)" if near else "")
        )
    return cls(**{k: parse_value(cls, k, v) for k, v in values.items()})


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file: tables [model], [train], [data]."""
    p = Path(path)
    if not p.is_file():
        raise AttnlabError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise AttnlabError(f"{p}: not valid TOML ({e})") from None


def checked(cls: type, values: dict[str, Any], where: str) -> Any:
    """from_dict, with a config's own validation errors turned into one-line user errors."""
    try:
        return from_dict(cls, values, where=where)
    except ValueError as e:
        raise AttnlabError(f"{where}: {e}") from None
