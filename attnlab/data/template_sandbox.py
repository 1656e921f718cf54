"""The Jinja2 environment chat templates run in: HuggingFace's (the immutable sandbox, trim_blocks,
lstrip_blocks, loop controls, tojson), with every step that costs time or memory reported to the
render's budget (data/template_limits.py) before it is taken.

Where each hook sits: Jinja compiles a template to Python. The code generator here sends every piece
written through `emitted` (the template's own text) or `checked` (a {{ value }}, measured before str()
runs) and every `a ~ b` through `joined`; the tree it compiles has every for loop's iterable wrapped in
`looped`, which counts its steps. The sandbox's own hooks (call, the intercepted operators, str.format)
check the deadline, the call depth, and the size of what they are about to make. Filters are wrapped
likewise; four that lay out HTML and can take time quadratic in their text (pprint, urlize, striptags,
wordwrap) are left out, as is the lipsum() global: no chat template needs them. {% include %},
{% import %} and {% extends %} would read other files: refused when the template is compiled.

The written pieces, the template's own text between tags in a buffer and a loop's steps are counted
down by hand, without a method call each: they run millions of times in a long conversation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import update_wrapper
from typing import Any

from jinja2 import Template, TemplateRuntimeError, TemplateSyntaxError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.ext import loopcontrols
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnlab.data.template_limits import (
    MAX_INT_BITS,
    MAX_JSON_INDENT,
    RENDER,
    LimitHit,
    Render,
    TemplateLimits,
    binop_size,
    filter_size,
    format_size,
    method_size,
    now,
    number_bits,
    outside,
    size,
)

LEFT_OUT = ("pprint", "urlize", "striptags", "wordwrap")
OTHER_FILES = {nodes.Extends: "extends", nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from"}


def bounded_filter(name: str, f: Any) -> Any:
    """`f`, measured: its value and arguments estimated before it runs, its result after."""
    skip = 1 if hasattr(f, "jinja_pass_arg") else 0  # its context, environment or eval context comes first

    def filtered(*args: Any, **kwargs: Any) -> Any:
        render = now()
        render.tick()
        value = args[skip]
        if name == "join" and not isinstance(value, list | tuple | str):
            value = list(value)  # a generator (map, select) is read once: measured, then joined
            args = (*args[:skip], value, *args[skip + 1 :])
        render.fits(filter_size(name, value, args[skip + 1 :], kwargs, render.cap), f"the filter {name}")
        result = f(*args, **kwargs)
        render.fits(size(result, render.cap), f"the filter {name}")
        return result

    return update_wrapper(filtered, f)  # keeps jinja_pass_arg, so Jinja passes what f expects


def tojson(value: Any, indent: int | None = None) -> str:
    """JSON as HuggingFace's templates get it (non-ASCII kept), written piece by piece against the cap."""
    if indent is not None and not (isinstance(indent, int) and 0 <= indent <= MAX_JSON_INDENT):
        raise TemplateRuntimeError(f"tojson's indent must be a whole number from 0 to {MAX_JSON_INDENT}")
    render, pieces, total = now(), [], 0
    for piece in json.JSONEncoder(ensure_ascii=False, indent=indent).iterencode(value):
        total += len(piece)
        render.fits(total, "tojson")
        pieces.append(piece)
    return "".join(pieces)


class _Generator(CodeGenerator):
    """Jinja's code generator, with every piece written passed through the environment's counters."""

    def visit_Output(self, node: nodes.Output, frame: Any) -> None:
        self._buffered = frame.buffer is not None
        super().visit_Output(node, frame)

    def _output_const_repr(self, group: Any) -> str:
        """The template's own text: counted as written into a buffer (a macro's, a {% set %} block's);
        at the top it is counted as render_bounded reads it."""
        text = super()._output_const_repr(group)
        return f"environment.emitted({text})" if self._buffered else text

    def _output_child_pre(self, node: Any, frame: Any, finalize: Any) -> None:  # {{ x }} -> str(checked(x))
        super()._output_child_pre(node, frame, finalize)
        self.write("environment.checked(")

    def _output_child_post(self, node: Any, frame: Any, finalize: Any) -> None:
        self.write(")")
        super()._output_child_post(node, frame, finalize)

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:  # a ~ b: measured before it is joined
        self.write("environment.joined(context.eval_ctx.autoescape, (")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with a budget asked at every step (see the module's docstring)."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "+", "%", "**"})  # also keeps Jinja from folding them while compiling

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        del self.globals["lipsum"]  # pages of text from one number
        filters = {name: f for name, f in self.filters.items() if name not in LEFT_OUT}
        self.filters = {name: bounded_filter(name, f) for name, f in {**filters, "tojson": tojson}.items()}

    def _generate(
        self, source: nodes.Template, name: str | None, filename: str | None, defer_init: bool = False
    ) -> str:
        """Jinja's documented hook between parsing and code: no other file read, every loop stepped."""
        for node in source.find_all(tuple(OTHER_FILES)):
            raise TemplateSyntaxError(
                f"a chat template cannot read other files ({{% {OTHER_FILES[type(node)]} %}})", node.lineno
            )
        for loop in list(source.find_all(nodes.For)):
            loop.iter = nodes.Call(
                nodes.EnvironmentAttribute("looped"), [loop.iter], [], None, None, lineno=loop.lineno
            )
        return super()._generate(source, name, filename, defer_init)

    # The three below count down by hand and call Render.settle only when a count runs out.
    def looped(self, iterable: Iterable) -> Iterator:
        render = now()
        for item in iterable:
            render.steps -= 1
            if render.steps <= 0:
                render.settle()
            yield item

    def emitted(self, text: str) -> str:
        render = RENDER.get() or outside()
        render.left -= len(text)
        render.steps -= 1
        if render.left < 0 or render.steps <= 0:
            render.settle()
        return text

    def checked(self, value: Any) -> Any:
        render = RENDER.get() or outside()
        render.left -= len(value) if value.__class__ is str else size(value, render.left)
        render.steps -= 1
        if render.left < 0 or render.steps <= 0:
            render.settle()
        return value

    def joined(self, autoescape: bool, parts: tuple) -> str:
        render = now()
        render.tick()
        render.fits(sum(size(p, render.cap) for p in parts), "~")
        return (markup_join if autoescape else str_join)(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        render = now()
        render.tick()
        if (bits := number_bits(operator, left, right)) > MAX_INT_BITS:
            raise LimitHit(
                "growth", f"would compute a number of {bits:,} bits with {operator!r}, more than {MAX_INT_BITS:,}"
            )
        render.fits(binop_size(operator, left, right, render.cap), repr(operator))
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        """str.format and format_map, measured (width fields, each field's value) before they run."""
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        text, mapping = value.__self__, value.__name__ == "format_map"

        def formatted(*args: Any, **kwargs: Any) -> str:
            render = now()
            named = (args[0] if args else {}) if mapping else kwargs
            render.fits(format_size(text, () if mapping else args, named, render.cap), ".format()")
            return sandboxed(*args, **kwargs)

        return update_wrapper(formatted, sandboxed)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        render = now()
        render.tick()
        if render.depth >= render.limits.depth:
            raise LimitHit("depth", f"calls more than {render.limits.depth} deep (a macro that calls itself?)")
        owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
        if isinstance(owner, str | bytes):
            if name == "join" and args and not isinstance(args[0], list | tuple | str):
                args = (list(args[0]), *args[1:])  # read once: measured, then joined
            render.fits(method_size(name, owner, args, kwargs, render.cap), f".{name}()")
        elif isinstance(owner, int) and name == "to_bytes":
            render.fits(method_size("to_bytes", b"", args, kwargs, render.cap), ".to_bytes()")
        render.depth += 1
        try:
            result = super().call(context, obj, *args, **kwargs)
        finally:
            render.depth -= 1
        render.fits(size(result, render.cap), "what a call returned")
        return result


def compile_template(source: str, limits: TemplateLimits, functions: dict[str, Any]) -> Template:
    """The template, compiled in a fresh bounded environment with `functions` among its globals
    (Jinja's errors pass through)."""
    if len(source) > limits.source:
        raise LimitHit("growth", f"is {len(source):,} characters long, more than {limits.source:,}")
    env = BoundedEnvironment()
    env.globals.update(functions)
    return env.from_string(source)


def render_bounded(
    template: Template, variables: dict, chars: int, limits: TemplateLimits, deadline: float | None = None
) -> str:
    """The template's text for `variables` (a conversation of `chars` characters), within `limits`:
    by `deadline` (a monotonic time) when given, else `limits.seconds` from now."""
    render = Render(limits, chars, deadline)
    token, pieces, written = RENDER.set(render), [], 0
    try:
        for piece in template.generate(**variables):
            written += len(piece)
            if written > render.cap:
                raise LimitHit("growth", f"writes more than its cap of {render.cap:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        RENDER.reset(token)
