"""The pages' script, style and HTML are package files, assembled into self-contained pages."""

from __future__ import annotations

import json
import re

import numpy as np

from attnlab.serve.page import page
from attnlab.viz.html import AttentionView, fill, render_attention_html, static_text

VIEWS = [
    AttentionView(
        "self-attention",
        ["a", "</script><b>x", "@@SCRIPT@@"],
        ["a", "</script><b>x", "@@SCRIPT@@"],
        np.full((1, 2, 3, 3), 1 / 3),
    )
]


def test_the_static_files_are_package_data():
    for name in ("views.js", "views.css", "views.html", "attention.html"):
        assert len(static_text(name)) > 100
    for name in ("explorer.js", "explorer.css", "explorer.html"):
        assert len(static_text(name, "attnlab.serve")) > 100
    assert "function showAttention" in static_text("views.js")


def test_both_pages_are_whole_and_inline():
    for text in (render_attention_html(VIEWS, "t"), page(2000, 500)):
        assert "@@" not in text.replace("@@SCRIPT@@", "")  # every part filled (the token's own text aside)
        assert not re.search(r"https?://", text) and "<script src" not in text and "<link" not in text
        assert static_text("views.js") in text and static_text("views.css") in text
    served = page(2000, 500)
    assert static_text("explorer.js", "attnlab.serve") in served and 'maxlength="2000"' in served


def test_token_text_cannot_leave_the_data_tag():
    text = render_attention_html(VIEWS, "t")
    data = text.split('<script type="application/json" id="attention-data">')[1].split("</script>")[0]
    assert "</script>" not in data and "\\u003c/script>" in data
    back = json.loads(data)["views"][0]  # what the page's JSON.parse reads: the tokens as they were
    assert back["queries"] == VIEWS[0].queries and back["keys"] == VIEWS[0].keys
    assert np.allclose(back["weights"], VIEWS[0].weights, atol=1e-4)
    assert text.count("<script") == 2  # the data tag and the one script


def test_fill_is_one_pass():
    assert fill("<@@A@@|@@B@@>", {"A": "@@B@@", "B": "b"}) == "<@@B@@|b>"
