"""Structured outputs: token masks that keep a row's text a valid JSON value, schema or grammar.

`compile(spec, tokenizer)` once per constraint (cached), `grammar.matcher()` per row, then each
step `apply_masks(logits, matchers)` and `advance_rows(matchers, tokens)`, which says which rows'
values have closed. docs/structured-outputs.md lists the JSON-schema keywords honoured and refused.
"""

from attnlab.decoding.structured.grammar import (
    Grammar,
    Lark,
    Matcher,
    advance_rows,
    apply_masks,
    compile,
    from_grammar,
    from_response_format,
)

__all__ = [
    "Grammar",
    "Lark",
    "Matcher",
    "advance_rows",
    "apply_masks",
    "compile",
    "from_grammar",
    "from_response_format",
]
