"""Structured outputs' masks: exactly the tokens that keep the text a prefix of a valid value.

The masks are compared with brute force on schemas whose valid documents can be listed: a token is
allowed when the text with it is a prefix of one of them. Also: the API the engine calls (one row
or a batch, free rows untouched), caching, refusals and the tokenizers it reads.
"""

from __future__ import annotations

import functools
import itertools
import json
import random

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from attnlab.data.tokenizers import EOT, BPETokenizer, CharTokenizer, WordTokenizer, tokenizer_from_json
from attnlab.decoding.structured import Lark, advance_rows, apply_masks, compile, from_response_format
from attnlab.decoding.structured.vocab import SPECIAL, ByteTokenizer, token_bytes
from attnlab.errors import AttnlabError

# Every printable ASCII character, and two accented letters: the character vocabulary of the tests.
CHARS = "".join(chr(c) for c in range(32, 127)) + "éï"


@functools.cache
def char_tok() -> CharTokenizer:
    return CharTokenizer(CHARS)


def json_text(n: int = 300, seed: int = 0) -> list[str]:
    """A few KB of JSON-ish lines: the BPE's training text, so its merges span quotes and brackets."""
    rng = random.Random(seed)
    words = ["name", "id", "age", "red", "green", "blue", "true", "false", "null", "tags", "city", "café"]
    lines = []
    for _ in range(n):
        value = {rng.choice(words): rng.choice([rng.randint(-99, 999), rng.choice(words), [1, 2], None, True])}
        lines.append(json.dumps(value) + " " + " ".join(rng.choices(words, k=4)))
    return lines


@functools.cache
def bpe_tok() -> BPETokenizer:
    return BPETokenizer.train(json_text(), vocab_size=500)


@functools.cache
def metaspace_tok() -> BPETokenizer:
    """A Llama-style BPE: `▁` for a space, every byte as a `<0xNN>` piece, a space put in front of the text."""
    pieces = ["<unk>", EOT, *(f"<0x{b:02X}>" for b in range(256)), "▁", "a", "▁a", '{"', '":', '▁"', "▁true", "12"]
    bpe = models.BPE({p: i for i, p in enumerate(pieces)}, [("▁", "a")], byte_fallback=True, unk_token="<unk>")
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    fuse = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    hf.decoder = decoders.Sequence(fuse)
    hf.add_special_tokens(["<unk>", EOT])
    return tokenizer_from_json(hf.to_str())


TOKENIZERS = {"char": char_tok, "bpe": bpe_tok, "metaspace": metaspace_tok}


def sample(grammar, tok, rows: int = 2, seed: int = 0, most: int = 600) -> list[str]:
    """`rows` texts drawn from random logits (a seeded stand-in for a model) under the grammar's masks,
    beside one free row; each ends when its value closes or it draws end-of-sequence."""
    gen = torch.Generator().manual_seed(seed)
    matchers = [grammar.matcher() for _ in range(rows)] + [None]
    drawn: list[list[int]] = [[] for _ in range(rows)]
    live = set(range(rows))
    for _ in range(most):
        logits = torch.randn(rows + 1, tok.vocab_size + 5, generator=gen) * 3
        free = logits[rows].clone()
        apply_masks(logits, matchers)
        assert torch.equal(logits[rows], free), "a free row's logits are untouched"
        tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0].tolist()
        for r in list(live):
            if tokens[r] == tok.eot_id:  # end-of-sequence is allowed only once the value is whole
                assert matchers[r].accepting
                live.discard(r)
                continue
            matchers[r].advance(tokens[r])
            drawn[r].append(tokens[r])
            if matchers[r].done:
                live.discard(r)
        if not live:
            return [tok.decode(d) for d in drawn]
    raise AssertionError(f"no value closed within {most} tokens: {tok.decode(drawn[0])[:200]!r}")


def documents(values) -> set[bytes]:
    return {json.dumps(v).encode() for v in values}


def objects() -> list[dict]:
    """Every value of FINITE's object schema, properties in the schema's order."""
    out = []
    for a, b in itertools.product([1, 22], [None, True, False]):
        out.append({"a": a} if b is None else {"a": a, "b": b})
    return out


# Schemas with few enough valid documents to list them all: (schema, its documents).
FINITE = [
    ({"enum": ["red", "green", "blue", "gr"]}, documents(["red", "green", "blue", "gr"])),
    ({"type": "integer", "minimum": 0, "maximum": 12}, documents(range(13))),
    (
        {"type": "object", "properties": {"a": {"enum": [1, 22]}, "b": {"type": "boolean"}}, "required": ["a"]},
        documents(objects()),
    ),
    (
        {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 2},
        documents([[], *[[v] for v in "x yz".split()], *[list(p) for p in itertools.product(["x", "yz"], repeat=2)]]),
    ),
    ({"type": ["boolean", "null"]}, documents([True, False, None])),
]


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("case", range(len(FINITE)))
def test_the_mask_allows_exactly_the_tokens_that_continue_a_valid_document(name, case):
    tok = TOKENIZERS[name]()
    schema, docs = FINITE[case]
    spelled = token_bytes(tok)
    grammar = compile(schema, tok)
    checked = exact = 0
    for doc in sorted(docs)[:6]:  # walk towards several documents, checking the mask at every prefix
        matcher, text = grammar.matcher(), b""
        for t in ByteTokenizer(tok)(doc):  # the document's tokens, spelling it byte for byte
            mask = matcher.allowed(torch.empty(tok.vocab_size + 3, dtype=torch.bool))
            expected = [not b.startswith(SPECIAL) and any(d.startswith(text + b) for d in docs) for b in spelled] + [
                False
            ] * 3
            expected[tok.eot_id] = text in docs
            got = mask.tolist()
            wrong = [(spelled[i] if i < len(spelled) else i) for i in range(len(got)) if got[i] != expected[i]]
            if wrong:
                # Only where the grammar forces the next bytes (", " then a key's quote) may the two
                # differ: llguidance then lets through only the tokens that spell them as the
                # tokenizer would, a subset of what brute force allows.
                assert matcher.state.compute_ff_bytes(), f"after {text!r}: mask and brute force differ on {wrong[:8]}"
                assert any(got) and all(e for g, e in zip(got, expected) if g), f"after {text!r}"
            checked, exact = checked + 1, exact + (not wrong)
            matcher.advance(t)
            text += spelled[t]
        assert matcher.accepting and text in docs
    assert exact >= checked // 2  # most prefixes force nothing: there the mask is exact


def test_a_closed_value_leaves_only_end_of_sequence():
    tok = char_tok()
    matcher = compile({"type": "object", "properties": {"ok": {"type": "boolean"}}}, tok).matcher()
    for t in tok.encode('{"ok": true}'):
        assert not matcher.done
        matcher.advance(t)
    mask = matcher.allowed(torch.empty(tok.vocab_size, dtype=torch.bool))
    assert matcher.done and mask.nonzero().flatten().tolist() == [tok.eot_id]


def test_one_row_and_a_batch_give_the_same_masks():
    tok = bpe_tok()
    grammar = compile({"type": "array", "items": {"type": "integer"}, "maxItems": 3}, tok)
    a, b = grammar.matcher(), grammar.matcher()
    a.advance(tok.encode("[")[0])
    logits = torch.zeros(3, tok.vocab_size)
    apply_masks(logits, [a, None, b])
    for row, m in ((0, a), (2, b)):
        assert torch.equal(logits[row] == 0, m.allowed(torch.empty(tok.vocab_size, dtype=torch.bool)))
    assert torch.equal(logits[1], torch.zeros(tok.vocab_size))
    assert not torch.equal(logits[0], logits[2])  # after "[" and at the start: different tokens allowed


def test_a_grammar_is_compiled_once_per_schema_text_and_tokenizer():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "null"}}}
    char, bpe = char_tok(), bpe_tok()
    first = compile(schema, char)
    assert compile(json.loads(json.dumps(schema)), char) is first  # an equal schema: the same grammar
    assert compile(schema, bpe) is not first
    reordered = {"type": "object", "properties": {"y": {"type": "null"}, "x": {"type": "integer"}}}
    assert compile(reordered, char) is not first  # property order is the output's order
    assert compile("json_object", char) is compile("json_object", char)


REFUSED = [
    ({"type": "array", "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "not", "#/properties/a"),
    ({"allOf": [{"type": "integer"}]}, "allOf", "#"),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "oneOf", "#"),
    ({"if": {"type": "integer"}, "then": {"minimum": 0}}, "if", "#"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties", "#"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames", "#"),
    ({"type": "array", "items": {"type": "array", "contains": {"const": 1}}}, "contains", "#/items"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired", "#"),
    ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties", "#"),
    ({"type": "string", "format": "hostname"}, "hostname", "#/format"),
    ({"type": "tuple"}, "tuple", "#/type"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "#/$ref"),
    ({"type": "object", "additionalProperties": True}, "additionalProperties", "#/additionalProperties"),
    ({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["b"]}, "'b'", "#/required"),
    ({"anyOf": [{"type": "null"}, {"type": "string", "contentEncoding": "base64"}]}, "contentEncoding", "#/anyOf/1"),
    ({"type": "object", "properties": {}, "required": "a"}, "property names", "#/required"),
]


@pytest.mark.parametrize("schema, keyword, where", REFUSED, ids=[r[1] for r in REFUSED])
def test_an_unsupported_keyword_is_refused_in_one_line_naming_it(schema, keyword, where):
    with pytest.raises(AttnlabError) as e:
        compile(schema, char_tok())
    message = str(e.value)
    assert "\n" not in message and keyword in message and where in message


def test_response_format_and_grammars():
    tok = char_tok()
    assert from_response_format({"type": "text"}, tok) is None
    assert from_response_format({"type": "json_object"}, tok) is compile("json_object", tok)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    assert from_response_format(fmt, tok) is compile(schema, tok)
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {"name": "n"}}):
        with pytest.raises(AttnlabError, match="response_format"):
            from_response_format(bad, tok)
    yes_no = compile(Lark('start: "yes" | "no" | "maybe"'), tok)
    assert {t for seed in range(6) for t in sample(yes_no, tok, seed=seed)} <= {"yes", "no", "maybe"}
    with pytest.raises(AttnlabError, match="cannot be compiled") as e:
        compile(Lark("start: missing_rule"), tok)
    assert "\n" not in str(e.value)


def test_any_json_object_parses():
    for name, make in TOKENIZERS.items():
        tok = make()
        for text in sample(compile("json_object", tok), tok, rows=3, most=3000):
            assert isinstance(json.loads(text), dict), (name, text)


def test_the_tokenizers_spell_their_tokens_as_bytes():
    bpe, char, meta = bpe_tok(), char_tok(), metaspace_tok()
    text = 'the {"café": [1, null]}\n'
    for tok in (bpe, meta):
        spelled = token_bytes(tok)
        assert spelled[tok.eot_id].startswith(SPECIAL)
        assert b"".join(spelled[i] for i in tok.encode(text)).lstrip(b" ") == text.encode()  # Llama's leading space
    assert b"".join(token_bytes(char)[i] for i in char.encode(text[:-1])) == text[:-1].encode()
    with pytest.raises(AttnlabError, match="char or BPE"):
        token_bytes(WordTokenizer(["a", "b"]))


def test_end_of_sequence_rollback_and_half_precision():
    tok = char_tok()
    grammar = compile({"type": "integer", "minimum": 0}, tok)
    matcher = grammar.matcher()
    for ch in "123":
        matcher.advance(tok.encode(ch)[0])
    after_one = grammar.matcher()
    after_one.advance(tok.encode("1")[0])
    matcher.rollback(2)  # a verifier took back two drafted tokens: the state after "1" again
    width = tok.vocab_size
    assert torch.equal(
        matcher.allowed(torch.empty(width, dtype=torch.bool)), after_one.allowed(torch.empty(width, dtype=torch.bool))
    )
    logits = torch.zeros(2, width, dtype=torch.bfloat16)
    apply_masks(logits, [matcher, after_one])
    assert torch.equal(logits[0].isfinite(), after_one.allowed(torch.empty(width, dtype=torch.bool)))
    matcher.advance(tok.eot_id)  # end-of-sequence once the number is whole: the value is done
    assert matcher.done and not after_one.done


def test_a_schema_nested_thousands_deep_is_a_one_line_error():
    for depth in (300, 5000):
        schema: dict = {"type": "array"}
        inner = schema
        for _ in range(depth):
            inner["items"] = {"type": "array"}
            inner = inner["items"]
        with pytest.raises(AttnlabError) as e:
            compile(schema, char_tok())
        assert "\n" not in str(e.value)


def test_a_value_the_vocabulary_cannot_spell_ends_the_row_with_an_error():
    tok = CharTokenizer("abc")  # no "{": no object can start
    matcher = compile("json_object", tok).matcher()
    mask = matcher.allowed(torch.empty(tok.vocab_size, dtype=torch.bool))
    assert mask.nonzero().flatten().tolist() == [tok.eot_id]
    assert matcher.done and matcher.error and "\n" not in matcher.error
    assert compile("json_object", char_tok()).matcher().error == ""


def test_rows_advance_together_and_forced_tokens_spell_the_fixed_text():
    tok = char_tok()
    grammar = compile({"type": "object", "properties": {"name": {"enum": ["ab"]}}, "required": ["name"]}, tok)
    rows = [grammar.matcher(), None, grammar.matcher()]
    assert advance_rows(rows, tok.encode("{x{")) == [False, False, False]
    assert tok.decode(rows[0].forced()) == '"name": "ab"}'  # everything after "{" is fixed
    for t in rows[0].forced():
        closed = advance_rows(rows, [t, 0, t])
    assert closed == [True, False, True] and rows[0].done
