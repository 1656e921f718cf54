"""A constraint compiled for one tokenizer, and the per-row matcher that masks each step's logits.

Legend: B rows, V the model's vocabulary (the logits' width), Vt the tokenizer's, W = ceil(Vt / 32)
words of a row's bitmask.

`compile` turns a spec ("json_object", a JSON schema, or a Lark grammar) into a Grammar once per
(spec text, tokenizer): llguidance builds the grammar's lexer and parser, which is the costly part
(milliseconds). A request then takes `grammar.matcher()`, a copy of the compiled state (microseconds),
and the engine calls, each step, `apply_masks(logits, matchers)` for its whole batch (rows without
a constraint are untouched) and `matcher.advance(token)` with the token drawn. llguidance finds the
allowed tokens by walking the tokenizer's trie through its lexer: tens of microseconds a token where
testing every token of the vocabulary would take milliseconds.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import torch
from torch import Tensor

from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.structured import lark_subset
from attnlab.decoding.structured import schema as schemas
from attnlab.decoding.structured.vocab import vocabulary
from attnlab.errors import AttnlabError, one_line

# The JSON a constraint lets through is laid out as json.dumps lays it out: ", " and ": " between
# items, no other whitespace. Free whitespace would let a weak model pad forever before closing.
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
CACHED = 64  # compiled grammars kept per tokenizer, least recently used dropped


@dataclass(frozen=True)
class Lark:
    """A grammar in llguidance's Lark dialect (rules, regular-expression tokens, `%json` for an
    embedded JSON schema): the `grammar` of a request, as text."""

    text: str


Spec = str | dict | bool | Lark  # "json_object", a JSON schema, or a grammar


class Grammar:
    """One compiled constraint for one tokenizer: hand each request its own `matcher()`."""

    def __init__(self, vocab: llguidance.LLTokenizer, source: str, kind: str):
        self.kind = kind  # "json_object", "json_schema" or "grammar"
        self.vocab_size, self.eos = vocab.vocab_size, vocab.eos_token
        self._start = llguidance.LLMatcher(vocab, source, log_level=0)
        if self._start.is_error():
            raise AttnlabError(f"this {kind} cannot be compiled: {one_line(self._start.get_error())}")

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the value, for one row."""
        return Matcher(self._start.deep_copy(), self)


class Matcher:
    """Where one row stands in its grammar: which tokens may come next, and whether the value closed."""

    def __init__(self, state: llguidance.LLMatcher, grammar: Grammar):
        self.state, self.grammar = state, grammar
        self.words = (grammar.vocab_size + 31) // 32

    def fill_bitmask(self, words: Tensor) -> None:
        """Write the allowed tokens into `words`, (W,) int32 on the CPU: bit t % 32 of word t // 32."""
        self.state.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)

    def allowed(self, out: Tensor) -> Tensor:
        """Fill `out`, a (V,) bool tensor, with the tokens allowed next (False past the tokenizer's Vt)."""
        words = torch.empty(1, self.words, dtype=torch.int32)
        self.fill_bitmask(words[0])
        out.copy_(penalties(words, out.shape[0], torch.float32, out.device)[0] == 0)
        return out

    def advance(self, token: int) -> None:
        """Take the token drawn for this row; one outside the mask is the caller's bug."""
        if not self.state.consume_token(int(token)):
            raise AttnlabError(f"token {int(token)} breaks the constraint: {one_line(self.state.get_error())}")

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` tokens (drafted tokens the verifier rejected)."""
        if not self.state.rollback(tokens):
            raise AttnlabError(f"cannot take back {tokens} tokens: {one_line(self.state.get_error())}")

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (the rest of a fixed key, say): an engine may feed them
        in one forward instead of drawing them one by one; empty when the next token is a choice."""
        return self.state.compute_ff_tokens()

    @property
    def done(self) -> bool:
        """The value has closed: nothing but end-of-sequence may follow."""
        return self.state.is_stopped()

    @property
    def error(self) -> str:
        """Why the row cannot go on ("" while it can): a value its vocabulary cannot spell ends in
        end-of-sequence alone, and the caller reports the text as unfinished."""
        return one_line(self.state.get_error()) if self.state.is_error() else ""

    @property
    def accepting(self) -> bool:
        """What was drawn so far is a whole value (a number may still grow, an object has closed)."""
        return self.state.is_accepting()


_TABLES: dict[tuple, Tensor] = {}


def byte_table(device: torch.device, dtype: torch.dtype) -> Tensor:
    """(256, 8): for each byte of a bitmask, what its 8 bits add to 8 logits: 0 if set, -inf if clear."""
    key = (device, dtype)
    if key not in _TABLES:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1  # (256, 8), lowest bit first
        _TABLES[key] = torch.zeros(256, 8, dtype=dtype).masked_fill(bits == 0, float("-inf")).to(device)
    return _TABLES[key]


def penalties(words: Tensor, width: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(n, W) int32 bitmasks -> (n, width) to add to logits: 0 where allowed, -inf elsewhere (and past Vt).

    One table lookup per byte, cheaper than shifting out every bit (docs/structured-outputs.md#measured);
    the bytes of an int32 are read lowest first, as x86 and ARM store them."""
    n = words.shape[0]
    index = words.to(device).view(torch.uint8).view(-1).long()  # (4 n W,)
    bias = byte_table(device, dtype).index_select(0, index).view(n, -1)  # (n, 32 W)
    if bias.shape[1] >= width:
        return bias[:, :width]
    return torch.cat([bias, bias.new_full((n, width - bias.shape[1]), float("-inf"))], dim=1)


_EXECUTOR: list[llguidance.LLExecutor] = []  # one pool of threads for every batch's masks


def apply_masks(logits: Tensor, matchers: Sequence[Matcher | None]) -> Tensor:
    """Set to -inf, in place, the logits of the tokens each constrained row may not take next.

    logits: (B, V) on any device; matchers: one per row, None where the row is free."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    words = torch.empty(len(rows), max(matchers[i].words for i in rows), dtype=torch.int32)  # (n, W)
    if len(rows) == 1 or logits.device.type == "cpu":
        # On a CPU, llguidance's pool of threads competes with torch's for the cores the model runs
        # on: 16 rows of a 6 x 384 GPT drew 11% fewer tokens/s with it, 2% fewer filled one by one
        # (docs/structured-outputs.md#tokenss-with-and-without-a-schema).
        for n, i in enumerate(rows):
            matchers[i].fill_bitmask(words[n])
    else:  # llguidance's threads fill the rows at once, outside the GIL, while the accelerator waits
        if not _EXECUTOR:
            _EXECUTOR.append(llguidance.LLExecutor())
        pairs = [(matchers[i].state, n) for n, i in enumerate(rows)]
        _EXECUTOR[0].unsafe_compute_mask_ptr(pairs, words.data_ptr(), words.shape[1] * 4, len(rows))
    bias = penalties(words, logits.shape[1], logits.dtype, logits.device)  # (n, V)
    if len(rows) == len(matchers):
        return logits.add_(bias)
    return logits.index_add_(0, torch.tensor(rows, device=logits.device), bias)


def advance_rows(matchers: Sequence[Matcher | None], tokens: Sequence[int]) -> list[bool]:
    """Give each constrained row its drawn token; True for the rows whose value has now closed
    (end-of-sequence drawn, or nothing else may follow), which the engine ends. Free rows: False."""
    closed = []
    for m, token in zip(matchers, tokens):
        if m is not None:
            m.advance(token)
        closed.append(m is not None and m.done)
    return closed


def source(spec: Spec) -> tuple[str, str]:
    """(kind, llguidance's grammar text) of a spec, its schema checked against the supported keywords."""
    if isinstance(spec, Lark):
        return "grammar", llguidance.LLMatcher.grammar_from_lark(spec.text)
    if spec == "json_object":  # any object, its members free
        return "json_object", json_grammar({"type": "object"})
    if isinstance(spec, str):
        raise AttnlabError(f"unknown constraint {spec!r}: give 'json_object', a JSON schema (a dict) or Lark(text)")
    schemas.check(spec)
    return "json_schema", json_grammar(schemas.strict(spec))


def json_grammar(schema: Any) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_LAYOUT)


# {tokenizer: {spec's text: Grammar}}, least recently used last; dropped with the tokenizer.
_GRAMMARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile(spec: Spec, tokenizer: Tokenizer) -> Grammar:
    """The Grammar of `spec` for `tokenizer`, compiled once per (spec's JSON text, tokenizer)."""
    cache = _GRAMMARS.setdefault(tokenizer, OrderedDict())
    try:  # the text as given, keys in their order: a schema's property order is the output's
        key = f"lark:{spec.text}" if isinstance(spec, Lark) else json.dumps(spec)
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        kind, text = source(spec)
    except RecursionError:  # a hostile request's schema, nested thousands deep
        raise AttnlabError("the schema nests too deeply to compile") from None
    except ValueError as e:  # llguidance's reader refuses it (nested past its limit, not JSON)
        raise AttnlabError(f"this constraint cannot be compiled: {one_line(e)}") from None
    cache[key] = Grammar(vocabulary(tokenizer), text, kind)
    if len(cache) > CACHED:
        cache.popitem(last=False)
    return cache[key]


def from_response_format(fmt: dict[str, Any], tokenizer: Tokenizer) -> Grammar | None:
    """The Grammar an OpenAI `response_format` asks for (None for plain text). A json_schema is
    always read strictly, whatever its `strict` says: the output must validate."""
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return compile("json_object", tokenizer)
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise AttnlabError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
        return compile(inner["schema"], tokenizer)
    raise AttnlabError(f"response_format type {kind!r} is not supported: use text, json_object or json_schema")


def from_grammar(text: str, tokenizer: Tokenizer) -> Grammar:
    """A request's `grammar`: Lark text within lark_subset's part of the dialect, compiled for `tokenizer`."""
    lark_subset.check(text)
    return compile(Lark(text), tokenizer)
