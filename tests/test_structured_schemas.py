"""Every response parses and validates: 58 schemas, each sampled from random logits with a character
tokenizer, a byte-level BPE (GPT-2's kind) and a Metaspace BPE with byte fallback (Llama's kind).
Random logits stand in for a model that knows nothing of JSON, so the constraint alone must make the
text valid; jsonschema, the reference validator, checks it against the strict reading of the schema
(objects closed).
"""

from __future__ import annotations

import json

import pytest

from attnlab.decoding.structured import compile
from attnlab.decoding.structured.schema import strict
from tests.test_structured import TOKENIZERS, sample

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the reference validator) comes with the dev extra")

INT, BOOL, NULL = {"type": "integer"}, {"type": "boolean"}, {"type": "null"}


def obj(required: list[str] | None = None, **properties) -> dict:
    """An object schema: its properties by name, all of them required unless `required` says which."""
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required}


def text(most: int, **more) -> dict:
    return {"type": "string", "maxLength": most, **more}


def array(items, lo: int = 0, hi: int = 3) -> dict:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


POINT = {"$defs": {"pt": obj(x=INT, y=INT)}}
TREE = {"$defs": {"node": obj(["v"], v=INT, kids=array({"$ref": "#/$defs/node"}, 0, 2))}, "$ref": "#/$defs/node"}
SCHEMAS = [
    # scalars
    BOOL,
    NULL,
    INT,
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "integer", "minimum": -50, "maximum": -10},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
    {"type": "integer", "minimum": 100},
    {"type": "integer", "minimum": -1000000, "maximum": 1000000},
    {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    {"type": "number"},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "number", "minimum": -2.5, "maximum": 2.5},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "number", "minimum": 0.001, "maximum": 1000},
    {"type": "string", "maxLength": 12},
    text(5),
    text(6, minLength=3),
    {"type": "string", "pattern": "^[a-z]{2,5}$"},
    {"type": "string", "pattern": "^\\d{3}-\\d{4}$"},
    {"type": "string", "pattern": "^(cat|dog)s?$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"enum": ["red", "green", "blue"]},
    {"enum": [1, 2, 3, "x", None, True]},
    {"enum": ["café", "naïve"]},
    {"const": "fixed"},
    {"const": {"a": [1, 2]}},
    {"type": ["string", "null"], "maxLength": 4},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, text(3)]},
    # arrays
    array(INT, 0, 4),
    array(BOOL, 2, 3),
    array({"enum": ["a", "b"]}, 1, 5),
    {"type": "array", "prefixItems": [INT, text(3)], "items": False},
    array(array({"type": "integer", "minimum": 0, "maximum": 9}), 0, 3),
    array(NULL, 3, 3),
    array({"anyOf": [INT, NULL]}, 0, 5),
    array(obj(id=INT, ok=BOOL), 1, 3),
    # objects
    obj(name=text(10)),
    obj([], a=INT, b=BOOL),
    obj(),
    obj(id={"type": "integer", "minimum": 1}, tags=array(text(4))),
    obj(user=obj(name=text(8), age={"type": "integer", "minimum": 0, "maximum": 130})),
    obj(a=obj(b=obj(c=obj(d=BOOL)))),
    obj(["kind"], kind={"enum": ["circle", "square"]}, version={"const": 2}),
    obj(value={"anyOf": [INT, text(4), NULL]}),
    obj(["n"], n={"type": ["integer", "null"]}, note=text(6)),
    obj(price={"type": "number", "minimum": 0, "maximum": 10000}, qty={"type": "integer", "minimum": 1}),
    obj(sku={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}),
    {**POINT, **obj(["a"], a={"$ref": "#/$defs/pt"}, b={"$ref": "#/$defs/pt"})},
    TREE,
    {**obj([], a=INT, b=INT), "minProperties": 1},
    {**obj([], a=NULL, b=NULL, c=NULL), "maxProperties": 1},
    {"title": "T", "description": "annotated", **obj(ok={**BOOL, "description": "is it?"})},
    obj(["name", "email"], name=text(12), email={"type": "string", "format": "email"}, phones=array(text(8), 0, 2)),
    obj(date={"type": "string", "format": "date"}, kind={"enum": ["a", "b"]}),
    obj(name={"const": "get_weather"}, arguments=obj(city=text(12), unit={"enum": ["c", "f"]})),
    obj(matrix=array(array({"type": "number", "minimum": -1, "maximum": 1}, 2, 2), 2, 2)),
]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_every_sampled_response_parses_and_validates(name):
    tok = TOKENIZERS[name]()
    checker = jsonschema.FormatChecker()
    failures = []
    for i, schema in enumerate(SCHEMAS):
        reference = strict(schema)
        for out in sample(compile(schema, tok), tok, rows=2, seed=i):
            try:
                jsonschema.validate(json.loads(out), reference, format_checker=checker)
            except (ValueError, jsonschema.ValidationError) as e:
                failures.append((i, out, str(e).splitlines()[0]))
    assert failures == [], failures[:5]
    assert len(SCHEMAS) >= 50
