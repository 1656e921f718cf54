"""A request's `grammar` (Lark, within decoding/structured/lark_subset.py's subset): through the real
`openai` client against a random-weight character GPT, so that only the mask shapes the text, every
reply parses under its grammar, checked by an independent reader (Python's own parser for arithmetic,
the csv module for CSV); each part of the subset accepts and refuses what Lark says it does; anything
outside the subset, or a grammar that does not compile, is a one-line 400 naming the field."""

from __future__ import annotations

import ast
import csv
import io
import re

import pytest

from attnlab import load
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding.structured import from_grammar
from attnlab.decoding.structured.lark_subset import check
from attnlab.errors import AttnlabError
from tests import test_openai_api
from tests.conftest import extra, make_run, tiny_model

openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"
server, client = test_openai_api.server, test_openai_api.client  # a live server on our run_dir

# Depth and length bounded, so that even a random model's reply closes within max_tokens.
ARITHMETIC = r"""
start: expr
expr: term (("+" | "-") term){0,3}
term: factor (("*" | "/") factor){0,2}
factor: NUMBER | "(" inner ")"
inner: NUMBER (("+" | "-" | "*") NUMBER){1,2}
NUMBER: /[1-9][0-9]{0,2}/
"""
CSV = r"""
start: "name,age\n" row{1,3}
row: NAME "," AGE "\n"
NAME: /[a-z]{1,8}/
AGE: /[0-9]{1,3}/
"""
YES_NO = 'start: "yes" | "no"'


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-layer character GPT with random weights, context 256."""
    return make_run(tmp_path_factory.mktemp("grammar") / "lm", tiny_model(context=256), CharTokenizer(CHARS))


def complete(client, grammar: str, seed: int, temperature: float = 1.0) -> tuple[str, str]:
    r = client.completions.create(
        model="lm",
        prompt="Say: ",
        max_tokens=120,
        seed=seed,
        temperature=temperature,
        extra_body={"grammar": grammar},
    )
    return r.choices[0].text, r.choices[0].finish_reason


def arithmetic(text: str) -> bool:
    """Python reads it as numbers joined by + - * / (and brackets), nothing else."""
    if not re.fullmatch(r"[0-9+\-*/()]+", text):
        return False
    tree = ast.parse(text, mode="eval").body
    allowed = (ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(n, allowed) for n in ast.walk(tree))


def csv_rows(text: str) -> bool:
    rows = list(csv.reader(io.StringIO(text)))
    head, body = rows[0], rows[1:]
    names_ages = all(len(r) == 2 and re.fullmatch("[a-z]+", r[0]) and r[1].isdigit() for r in body)
    return head == ["name", "age"] and 1 <= len(body) <= 3 and names_ages and text.endswith("\n")


@pytest.mark.parametrize(
    ("grammar", "parses"),
    [(ARITHMETIC, arithmetic), (CSV, csv_rows), (YES_NO, lambda t: t in ("yes", "no"))],
    ids=["arithmetic", "csv", "yes-no"],
)
def test_every_reply_parses_under_its_grammar(client, grammar, parses):
    texts = set()
    for seed, temperature in [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.5)]:
        text, finish = complete(client, grammar, seed, temperature)
        assert finish == "stop" and parses(text), text
        texts.add(text)
    assert len(texts) > 1  # sampling did choose: the grammar leaves choices and the mask keeps them


def test_chat_and_a_stream_take_a_grammar(client):
    kw = dict(model="lm", messages=[{"role": "user", "content": "Sum?"}], max_tokens=120, seed=4)
    r = client.chat.completions.create(**kw, extra_body={"grammar": ARITHMETIC})
    assert r.choices[0].finish_reason == "stop" and arithmetic(r.choices[0].message.content)
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"grammar": ARITHMETIC}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


# Each part of the subset, as Lark reads it: texts it takes whole, texts it refuses.
PARTS = [
    ('start: "a" | "b"', ["a", "b"], ["c", "ab"]),
    ('start: "x" ("," "x")* "."', ["x.", "x,x,x."], ["x,.", "x"]),
    ('start: "a"+ "b"?', ["a", "aab"], ["b", "abb"]),
    ('start: "a" ["b"] "c"', ["ac", "abc"], ["abbc"]),
    ('start: "no"i', ["no", "NO", "nO"], ["n"]),
    ("start: /[0-9]+/ /x/i", ["12x", "7X"], ["x"]),
    ('start: L{2,3}\nL: "a".."c"', ["ab", "cca"], ["a", "abca", "ad"]),
    ('start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%ignore " "', ["ab, cd", "ab ,cd"], [", ab"]),
    ('// a comment\nstart: "y"  // another', ["y"], ["n"]),
]


def takes(grammar, tok, text: str) -> bool:
    matcher = grammar.matcher()
    try:
        for t in tok.encode(text):
            matcher.advance(t)
    except AttnlabError:
        return False
    return matcher.accepting


@pytest.mark.parametrize(("text", "good", "bad"), PARTS)
def test_each_part_of_the_subset_reads_as_lark_reads_it(run_dir, text, good, bad):
    tok = load(run_dir, "cpu").tokenizer
    grammar = from_grammar(text, tok)
    assert [takes(grammar, tok, g) for g in good] == [True] * len(good)
    assert [takes(grammar, tok, b) for b in bad] == [False] * len(bad)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("%import common.NUMBER\nstart: NUMBER", "line 1: the directive %import is outside"),
        ('start: %json {"type": "object"}', "the directive %json (for a JSON schema use response_format"),
        ("start: @other", "references to other grammars (@name)"),
        ("start: <[0]>", "special tokens"),
        ("start: A\nA: /[a-z]+/ & ~/ab/", "line 2: the lexeme operator &"),
        ('start: "a" ~ 2', "the operator ~"),
        ('start: a\na.2: "x"', "rule priorities"),
        ('start: "a" -> b', "aliases"),
        ('start: s{"a"}\ns{x}: x', "templates"),
        ("start: T\nT[max_tokens=3]: /a+/", "attributes"),
        ('word: "a"', "no rule named start"),
        ("  ", "non-empty"),
        ("start: " + '"a" ' * 6000, "at most 20,000"),
    ],
)
def test_what_is_outside_the_subset_is_refused_in_one_line(text, message):
    with pytest.raises(AttnlabError) as e:
        check(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_grammar_is_a_one_line_400(client):
    for grammar, says in [("start: @x", "references to other grammars"), ("start: foo", "unknown name")]:
        with pytest.raises(openai.BadRequestError) as e:
            complete(client, grammar, 0)
        error = e.value.body
        assert says in error["message"] and "\n" not in error["message"] and error["param"] == "grammar"
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.completions.create(
            model="lm", prompt="x", extra_body={"grammar": YES_NO, "response_format": {"type": "json_object"}}
        )
