"""Which JSON-schema keywords a constraint honours, and the strict reading of a schema.

A keyword the mask would not enforce is refused, never ignored: a schema asking for unique items
that came back with duplicates would be a silent lie. `check` walks every subschema and raises a
one-line AttnlabError naming the first keyword it cannot honour and where it stands (a JSON
pointer), which the server turns into a 400. `strict` is OpenAI's strict mode: an object takes no
property beyond those listed (additionalProperties false), `required` as given.
"""

from __future__ import annotations

import copy
from typing import Any

from attnlab.errors import AttnlabError

# Keywords that only describe: they constrain nothing, so honouring them is reading past them.
ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly"}
)
# Keywords that shape the value, each enforced token by token (docs/structured-outputs.md lists them).
SUPPORTED = frozenset(
    {
        *("type", "enum", "const", "anyOf", "$ref", "$defs", "definitions"),
        *("properties", "required", "additionalProperties", "minProperties", "maxProperties"),
        *("items", "prefixItems", "minItems", "maxItems"),
        *("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
        *("minLength", "maxLength", "pattern", "format"),
    }
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
FORMATS = frozenset({"date", "time", "date-time", "email", "uuid", "ipv4", "ipv6"})
# Where subschemas sit: a keyword whose value is one schema, and those whose value holds several.
ONE_SCHEMA = ("items", "additionalProperties")
MANY_SCHEMAS = {"properties": dict, "$defs": dict, "definitions": dict, "prefixItems": list, "anyOf": list}


def refuse(what: str, where: str) -> AttnlabError:
    return AttnlabError(f"{what} at {where} is not supported in a structured output (docs/structured-outputs.md)")


def check(schema: Any, where: str = "#") -> None:
    """Raise on the first keyword or value of `schema` the mask cannot enforce."""
    if isinstance(schema, bool):  # true: anything; false: nothing
        return
    if not isinstance(schema, dict):
        raise AttnlabError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}, at {where}")
    for key, value in schema.items():
        if key not in SUPPORTED and key not in ANNOTATIONS:
            raise refuse(f"JSON-schema keyword {key!r}", where)
        check_value(key, value, f"{where}/{key}")
    for key in ONE_SCHEMA:
        if isinstance(schema.get(key), (dict, bool)):
            check(schema[key], f"{where}/{key}")
    for key, kind in MANY_SCHEMAS.items():
        children = schema.get(key, kind())
        if not isinstance(children, kind):
            raise AttnlabError(f"{where}/{key} must be a JSON {'object' if kind is dict else 'array'}")
        named = children.items() if kind is dict else enumerate(children)
        for name, child in named:
            check(child, f"{where}/{key}/{name}")


def check_value(key: str, value: Any, where: str) -> None:
    """The values of the keywords whose every value the mask cannot enforce."""
    if key == "type":
        for t in value if isinstance(value, list) else [value]:
            if t not in TYPES:
                raise refuse(f"type {t!r}", where)
    elif key == "format" and value not in FORMATS:
        raise refuse(f"format {value!r}", where)
    elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
        raise refuse(f"$ref {value!r} (only references inside the schema, '#/...')", where)
    elif key == "required" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise AttnlabError(f"{where} must be a list of property names")
    elif key == "items" and isinstance(value, list):
        raise refuse("items as a list (write prefixItems)", where)


def strict(schema: Any) -> Any:
    """A copy of `schema` read strictly: every object schema closed (additionalProperties false);
    an open one (additionalProperties true or a schema) is refused, as is requiring an unlisted property."""
    out = copy.deepcopy(schema)
    close(out, "#")
    return out


def close(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        return
    types = schema.get("type")
    if "properties" in schema or "object" in (types if isinstance(types, list) else [types]):
        if schema.get("additionalProperties", False) is not False:
            raise refuse("additionalProperties other than false (strict mode)", f"{where}/additionalProperties")
        schema["additionalProperties"] = False
        listed = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in listed:
                raise AttnlabError(f"{where}/required names {name!r}, which {where}/properties does not list")
    close(schema.get("items"), f"{where}/items")
    for key, kind in MANY_SCHEMAS.items():
        children = schema.get(key, kind())
        for name, child in children.items() if kind is dict else enumerate(children):
            close(child, f"{where}/{key}/{name}")
