"""Limits on rendering a chat template. A template is a program from somebody else's folder, so one
render of it is bounded in time, in what it writes and builds, and in how deep it calls; Jinja2's
immutable sandbox (under this) already keeps it from Python's internals and from changing its inputs.

Legend: cap = the most characters one render may write, and the size of any one value it builds:
growth x (the conversation's characters + PER_TURN a turn + BASE).

    time    a deadline, checked at every call, filter and operator, and every STEPS loop steps and
            pieces written
    output  every piece written, in any buffer (a macro's, a {% set %} block's, a filter block's),
            is counted against the cap as it is written, and a value is measured before str() runs
    values  what could make a large value out of small ones in one step (str * n, '%999999999s',
            '{:>999999999}', ljust, replace, join, indent, to_bytes, ...) is estimated first and refused
            over the cap, so nothing large is ever allocated; every call's result is measured after
    depth   calls (macros, recursive loops, blocks) nest at most `depth` deep

This module measures; data/template_sandbox.py is the Jinja2 environment that asks it at each step.
A limit passed is a LimitHit, which data/chat.py turns into one line naming the template.
"""

from __future__ import annotations

import re
import time
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from string import Formatter
from typing import Any

from jinja2 import TemplateRuntimeError
from jinja2.runtime import Namespace

from attnlab.errors import ArgumentValueError

PER_TURN = 50  # characters of markers a template may write around each turn (x growth)
BASE = 10_000  # characters of headers and system prompts any conversation may get (x growth)
SOURCE_PER_GROWTH = 5_000  # how long the template itself may be (x growth): 100,000 characters by default
MAX_INT_BITS = 1 << 16  # a number the template computes (x * y, x ** y): 65,536 bits, ~20,000 digits
MAX_JSON_INDENT = 64  # tojson's indent, which is written once per nesting level on every line
STEPS = 32  # cheap steps between two looks at the clock (one look costs about as much as ten steps)
OPTIONS = {"seconds": "--template-seconds", "growth": "--template-growth", "depth": "--template-depth"}


@dataclass(frozen=True)
class TemplateLimits:
    """What one render of a chat template may cost. Real templates (ChatML, Llama 3, Qwen) need
    milliseconds, a few characters per character of the conversation and calls a few deep."""

    seconds: float = 2.0  # wall clock of one render (and of one conversation's assistant-span search)
    growth: float = 20.0  # characters written per character of the conversation; also scales BASE and the source
    depth: int = 50  # nested calls: macros, recursive loops, blocks

    def __post_init__(self) -> None:
        for name in OPTIONS:
            value = getattr(self, name)
            kind = int if name == "depth" else int | float
            if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value < float("inf"):
                raise ArgumentValueError(f"TemplateLimits.{name}: expected a positive number, got {value!r}")

    def cap(self, chars: int) -> int:
        return int(self.growth * (chars + BASE))

    @property
    def source(self) -> int:
        return int(self.growth * SOURCE_PER_GROWTH)


_limits = TemplateLimits()


TRANSLATE = "translate"  # str.translate (a name, not a constant: "translate" is also a task's name)


def template_limits() -> TemplateLimits:
    """The limits every chat template is rendered under (set_template_limits changes them)."""
    return _limits


def set_template_limits(
    seconds: float | None = None, growth: float | None = None, depth: int | None = None
) -> TemplateLimits:
    """Change the limits of every later render (for templates the user trusts); returns the limits
    before (to put back with set_template_limits(**asdict(before)))."""
    global _limits
    before, given = _limits, {"seconds": seconds, "growth": growth, "depth": depth}
    _limits = replace(_limits, **{k: v for k, v in given.items() if v is not None})
    return before


@contextmanager
def template_limits_set(
    seconds: float | None = None, growth: float | None = None, depth: int | None = None
) -> Iterator[TemplateLimits]:
    """set_template_limits for the block only; yields the limits in force."""
    global _limits
    before = set_template_limits(seconds, growth, depth)
    try:
        yield _limits
    finally:
        _limits = before


class LimitHit(Exception):
    """A render went past a limit; `limit` names which (a key of OPTIONS), the message says how."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Render:
    """One render's (or one conversation's) budget: a deadline, the cap, what it may still write, depth."""

    def __init__(self, limits: TemplateLimits, chars: int, deadline: float | None = None) -> None:
        self.limits, self.cap = limits, limits.cap(chars)
        self.left, self.depth, self.steps = self.cap, 0, STEPS
        self.deadline = time.monotonic() + limits.seconds if deadline is None else deadline

    def tick(self) -> None:
        """Before a step that may cost up to a cap's worth of work (a call, a filter, an operator)."""
        if time.monotonic() > self.deadline:
            raise LimitHit("seconds", f"took more than {self.limits.seconds:g} s to render")

    def settle(self) -> None:
        """After cheap steps (a loop's step, a piece written), which count down `steps` and `left`
        themselves (they run millions of times): the clock every STEPS, and the characters left."""
        if self.left < 0:
            raise LimitHit("growth", f"writes more than its cap of {self.cap:,} characters")
        if self.steps <= 0:
            self.steps = STEPS
            self.tick()

    def fits(self, size: int, what: str) -> None:
        if size > self.cap:
            raise LimitHit(
                "growth", f"would make a value of about {size:,} characters ({what}), over its cap of {self.cap:,}"
            )


RENDER: ContextVar[Render | None] = ContextVar("attnlab_template_render", default=None)


def now() -> Render:
    """The render under way; outside one, an error (Jinja calls filters while it compiles, to fold
    constants: the error leaves the expression to run time, under a budget)."""
    return RENDER.get() or outside()


def outside() -> Render:
    raise TemplateRuntimeError("a chat template runs only inside a bounded render")


def size(value: Any, budget: int) -> int:
    """About how many characters str(value) has, counted up to just past `budget`. Containers are
    walked, so a list holding one long text 1,000 times counts it 1,000 times."""
    if isinstance(value, str | bytes):
        return len(value)
    total, stack = 0, [value]
    while stack and total <= budget:
        v = stack.pop()
        if isinstance(v, str | bytes):
            total += len(v) + 4  # quotes, comma, space
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2  # decimal digits, over-counted
        elif isinstance(v, Namespace):
            stack.append(getattr(v, "_Namespace__attrs", {}))  # its repr shows this dict
        elif isinstance(v, dict):
            total += 4 * len(v) + 2
            stack += [*v.keys(), *v.values()] if total <= budget else []
        elif isinstance(v, list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
            total += 2 * len(v) + 2
            stack += list(v) if total <= budget else []
        else:
            total += 64  # a number, None, a macro, a generator: a short repr
    return total


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) else default


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _numbers(spec: str) -> int:
    """The widths and precisions written in a format spec, summed (a 10-digit one counts as huge)."""
    return sum(int(d) if len(d) < 10 else 10**10 for d in re.findall(r"\d+", spec))


_PERCENT = re.compile(r"%(\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def percent_size(fmt: Any, args: Any, budget: int) -> int:
    """str % args: the format, its widths, and the arguments (each as often as a spec names it)."""
    if not isinstance(fmt, str | bytes):
        return 0
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    specs = list(_PERCENT.finditer(text))
    total = len(text) + sum(_numbers(m.group(0)) for m in specs)
    values = args if isinstance(args, tuple) else (args,)
    if "*" in text:  # widths taken from the arguments
        total += sum(abs(v) for v in values if isinstance(v, int))
    per_name = len(specs) if isinstance(args, dict) else 1
    return total + per_name * size(args, budget)


def format_size(fmt: str, args: tuple, kwargs: Any, budget: int) -> int:
    """str.format: the format, and per field the value it names and the widths of its spec."""
    total, auto, named = len(fmt), 0, dict(kwargs)
    numbers = sum(abs(v) for v in (*args, *named.values()) if isinstance(v, int))  # widths a spec may name
    for _, field, spec, _ in Formatter().parse(fmt):
        if field is None:
            continue
        key = re.split(r"[.\[]", field)[0]
        if key == "":
            key, auto = str(auto), auto + 1
        value = args[int(key)] if key.isdigit() and int(key) < len(args) else named.get(key)
        total += size(value, budget) + _numbers(spec or "") + (numbers if "{" in (spec or "") else 0)
        if total > budget:
            break
    return total


def binop_size(op: str, left: Any, right: Any, budget: int) -> int:
    """x * n, x + y and x % args on texts, lists and tuples: the result's size, before it is made."""
    sized = str | bytes | list | tuple
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, sized) and isinstance(n, int) and n > 0:
                return size(seq, budget // n + 1) * n
    if op == "+" and isinstance(left, sized) and isinstance(right, sized):
        return size(left, budget) + size(right, budget)
    if op == "%":
        return percent_size(left, right, budget)
    return 0


def number_bits(op: str, left: Any, right: Any) -> int:
    """The bits of x * y or x ** y on whole numbers, before they are computed (0 for anything else)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return 0
    if op == "*":
        return left.bit_length() + right.bit_length()
    if op == "**" and right > 0 and abs(left) > 1:
        return left.bit_length() * right
    return 0


def method_size(name: str, text: str | bytes, args: tuple, kwargs: dict, budget: int) -> int:
    """A str (or bytes) method's result, before it runs; 0 for one that cannot grow its text much."""
    if name in ("ljust", "rjust", "center", "zfill"):
        return max(len(text), _int(_arg(args, kwargs, 0, "width")))
    if name == "expandtabs":
        tab = "\t" if isinstance(text, str) else b"\t"
        return len(text) + text.count(tab) * max(_int(_arg(args, kwargs, 0, "tabsize", 8)), 0)
    if name == "replace" and len(args) >= 2 and isinstance(args[0], type(text)):
        found = text.count(args[0]) if args[0] else len(text) + 1
        count = _int(_arg(args, kwargs, 2, "count", -1), -1)
        return len(text) + (min(found, count) if count >= 0 else found) * size(args[1], budget)
    if name == "join" and args:
        items = args[0]
        return sum(size(x, budget) for x in items) + len(text) * max(len(items) - 1, 0)
    if name == "to_bytes":  # int.to_bytes(length)
        return _int(_arg(args, kwargs, 0, "length", 1))
    if name == TRANSLATE and args and isinstance(args[0], dict):
        return len(text) * max([1, *(size(v, budget) for v in args[0].values())])
    return 0


def filter_size(name: str, value: Any, args: tuple, kwargs: dict, budget: int) -> int:
    """A filter's result, before it runs: filters that turn their value into text measure it first,
    and the ones with a width, a count or a separator are estimated from it."""
    text = size(value, budget)
    if name == "center":
        return max(text, _int(_arg(args, kwargs, 0, "width", 80)))
    if name == "indent":
        width = _arg(args, kwargs, 0, "width", 4)
        lines = value.count("\n") + 1 if isinstance(value, str) else text
        return text + lines * (len(width) if isinstance(width, str) else _int(width))
    if name == "format":
        return percent_size(value, kwargs or args, budget)
    if name == "replace":  # every occurrence replaced (count ignored: an upper bound)
        old, new = _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", "")
        found = value.count(old) if isinstance(value, str) and isinstance(old, str) and old else text + 1
        return text + found * size(new, budget)
    if name == "join":  # `value` is a list, a tuple or a text here (bounded_filter reads a generator first)
        between = size(_arg(args, kwargs, 0, "d", ""), budget) * max(len(value) - 1, 0)
        return sum(size(x, budget) for x in value) + between
    if name in ("batch", "slice"):
        count = _int(_arg(args, kwargs, 0, "linecount" if name == "batch" else "slices"))
        return count * (1 + size(_arg(args, kwargs, 1, "fill_with"), budget))
    if name == "sum" and not isinstance(_arg(args, kwargs, 1, "start", 0), int | float):
        raise TemplateRuntimeError("sum adds numbers only in a chat template (lists or texts take quadratic time)")
    return text if name in TEXT_FILTERS else 0


# Filters that turn their value into text (a list into its repr), so a value is measured before they run.
TEXT_FILTERS = {
    "capitalize",
    "e",
    "escape",
    "forceescape",
    "lower",
    "safe",
    "string",
    "title",
    "trim",
    "truncate",
    "upper",
    "urlencode",
    "wordcount",
    "xmlattr",
}
