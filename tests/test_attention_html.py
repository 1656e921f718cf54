"""The attention page: self-contained, its data round-trips, token text cannot break it, its DOM hooks exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from attnlab.viz.html import AttentionView, render_attention_html, views_json, write_attention_html

pytestmark = pytest.mark.usefixtures("one_thread")

DATA_TAG = re.compile(r'<script type="application/json" id="attention-data">(.*?)</script>', re.S)
SCRIPT_TAG = re.compile(r"<script>(.*?)</script>", re.S)


def random_weights(layers: int, heads: int, tq: int, tk: int, seed: int = 0) -> np.ndarray:
    """(L, H, Tq, Tk) rows that sum to 1, like a softmax's."""
    x = np.random.default_rng(seed).random((layers, heads, tq, tk))
    return x / x.sum(-1, keepdims=True)


def two_views() -> list[AttentionView]:
    src, tgt = ["le", "chat", "noir", "</s>"], ["the", "black", "cat"]
    return [
        AttentionView("encoder self-attention", src, src, random_weights(2, 3, 4, 4)),
        AttentionView("cross-attention", tgt, src, random_weights(2, 3, 3, 4, seed=1)),
    ]


def embedded(page: str) -> dict:
    (payload,) = DATA_TAG.findall(page)
    return json.loads(payload)


def test_page_is_self_contained():
    page = render_attention_html(two_views(), "translation")
    for reference in ("http://", "https://", "//cdn", "<link", "@import", "url("):
        assert reference not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    assert len(SCRIPT_TAG.findall(page)) == 1  # the code is inline, next to the JSON tag


def test_embedded_data_round_trips():
    views = two_views()
    data = embedded(render_attention_html(views))
    assert data == views_json(views)
    assert [v["name"] for v in data["views"]] == ["encoder self-attention", "cross-attention"]
    for view, back in zip(views, data["views"]):
        assert back["queries"] == view.queries and back["keys"] == view.keys
        np.testing.assert_allclose(np.array(back["weights"]), view.weights, atol=5e-5)  # rounded to 4 decimals


def test_token_text_cannot_break_out_of_the_page():
    evil = "</script><b>x"
    tokens = [evil, "<!--", "a&b", "\n"]
    page = render_attention_html([AttentionView("self-attention", tokens, tokens, random_weights(1, 1, 4, 4))], "<i>t")
    assert evil not in page and "<!--" not in page
    assert page.count("</script>") == 2  # only the two tags' own ends
    assert "<title>&lt;i&gt;t</title>" in page
    (payload,) = DATA_TAG.findall(page)
    assert "</" not in payload
    assert json.loads(payload)["views"][0]["queries"] == tokens


def test_view_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="must be"):
        AttentionView("self-attention", ["a", "b"], ["a", "b"], np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="2 query and 3 key tokens"):
        AttentionView("cross-attention", ["a", "b"], ["x", "y", "z"], np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="NaN"):
        AttentionView("self-attention", ["a"], ["a"], np.full((1, 1, 1, 1), np.nan))
    with pytest.raises(ValueError) as error:
        AttentionView("self-attention", ["a"], ["a", "b"], np.ones((1, 1, 1, 3)))
    assert "\n" not in str(error.value)  # one line for the user
    with pytest.raises(ValueError, match="at least one"):
        render_attention_html([])


def test_write_attention_html(tmp_path):
    path = tmp_path / "attention.html"
    views = two_views()
    write_attention_html(views, path, title="translation")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert text == render_attention_html(views, "translation")
    assert [p.name for p in tmp_path.iterdir()] == ["attention.html"]  # no temporary file left behind


def test_dom_hooks_are_in_the_page():
    page = render_attention_html(two_views())
    markup = page.split("<script", 1)[0]
    for element_id in ("view", "layer", "head", "queries", "keys", "lines", "thumbs", "enlarged", "enlarged-value"):
        assert f'id="{element_id}"' in markup
    (script,) = SCRIPT_TAG.findall(page)
    for hook in ('"weight-label"', '"thumb"', '"heatmap"', "`token ${side}`", '"query"', '"key"'):
        assert hook in script
    for attribute in ("row.dataset.index", "layer: l, head: h", "query: i, key: j, head: h"):
        assert attribute in script
    assert 'option($("head"), "all", "all heads")' in script


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_script_is_valid_javascript(tmp_path):
    (script,) = SCRIPT_TAG.findall(render_attention_html(two_views()))
    (tmp_path / "page.js").write_text(script)
    result = subprocess.run(["node", "--check", str(tmp_path / "page.js")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_long_inputs_are_sent_one_byte_per_weight():
    """Over DENSE_WEIGHTS weights, each view carries round(255 w) as base64 bytes, (L, H, Tq, Tk) order."""
    import base64

    from attnlab.viz import html as page

    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 40, 50))
    w /= w.sum(-1, keepdims=True)
    view = AttentionView("self-attention", [f"q{i}" for i in range(40)], [f"k{j}" for j in range(50)], w)
    assert "weights" in views_json([view])["views"][0]  # small: nested lists
    old, page.DENSE_WEIGHTS = page.DENSE_WEIGHTS, 1000
    try:
        sent = views_json([view])["views"][0]
    finally:
        page.DENSE_WEIGHTS = old
    assert "weights" not in sent and sent["shape"] == [2, 3, 40, 50]
    back = np.frombuffer(base64.b64decode(sent["weights_u8"]), dtype=np.uint8).reshape(sent["shape"]) / 255
    assert np.abs(back - w).max() <= 0.5 / 255 + 1e-9
