"""What a notebook shows inline: a Run (its facts and loss curve), a Trace (its points and its
attention), attention views and pictures. The HTML functions are checked directly; one notebook is
executed by nbclient (a real kernel); the inline view's hover contract is checked in Chromium when
it is installed."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from conftest import TEXT, run_notebook, tiny_model

import attnlab
from attnlab.data.tokenizers import train_tokenizer
from attnlab.interpret.views import write_attention
from attnlab.io import write_json
from attnlab.models.gpt import GPT
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, fresh_dir
from attnlab.runs.marker import record
from attnlab.runs.weights import tied_names, write_weights
from attnlab.viz.cards import curve_svg, facts_text, shapes_text
from attnlab.viz.heads import plot_head_tables
from attnlab.viz.html import AttentionView, Views, inline_attention_html, scoped_css
from attnlab.viz.picture import Drawn, Picture

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = re.compile(r'^<div class="attnlab-view" id="(attnlab-[0-9a-f]+)">')
PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny GPT run written by hand as training writes one (config.json, weights, tokenizer, a
    metrics.jsonl of 4 steps with validation at 2 and 4): seconds, where a real training spends
    most of its time on one-off imports; what is checked here is what a notebook shows of a run."""
    out = tmp_path_factory.mktemp("notebook") / "run"
    tok = train_tokenizer("char", [TEXT])
    config = tiny_model(vocab_size=tok.vocab_size)
    fresh_dir(out)
    record(out, CONFIG, WEIGHTS, TOKENIZER, "metrics.jsonl")
    write_json(
        out / CONFIG,
        {"family": "gpt", "model": asdict(config), "train": {"max_steps": 4}, "data": {"tokenizer": "char"}},
    )
    model = GPT(config)
    tied = tied_names(model)  # the head shares the embedding's weight: stored once, as training stores it
    write_weights({k: v for k, v in model.state_dict().items() if k not in tied}, out / WEIGHTS, {"step": "4"})
    (out / TOKENIZER).write_text(tok.to_json(), encoding="utf-8")
    rows = [{"step": s, "loss": 3.4 - 0.2 * s} for s in range(1, 5)] + [
        {"step": 2, "val_loss": 3.1},
        {"step": 4, "val_loss": 2.8},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def two_views() -> list[AttentionView]:
    w = np.random.default_rng(0).random((2, 2, 3, 3))
    tokens = ["a", "</script>", "c"]  # a token that would end the script, were it not escaped
    return [AttentionView("self-attention", tokens, tokens, w / w.sum(-1, keepdims=True))]


def test_inline_views_are_scoped_self_contained_and_keep_the_contract():
    first, second = inline_attention_html(two_views(), "one"), inline_attention_html(two_views(), "two")
    (a,), (b,) = ROOT.findall(first), ROOT.findall(second)
    assert a != b  # two views on one page never share an id
    for html, root in ((first, a), (second, b)):
        ids = re.findall(r'\bid="([^"]+)"', html)
        assert ids and all(i == root or i.startswith(root + "-") for i in ids)
        assert "http" not in html and "<link" not in html and not re.search(r"<script[^>]*\bsrc", html)
        assert "ATTNLAB_SCOPE" in html and "showAttention" in html  # views.js runs inside its own function
        assert "dataset.i = index" in html and "dataset.focus" in html  # data-i and data-focus
        assert html.count("</script>") == 2  # the data and the code; the token's "</script>" is escaped
    assert Views(two_views())._repr_html_().startswith('<div class="attnlab-view"')
    assert two_views()[0]._repr_html_().startswith('<div class="attnlab-view"')
    assert repr(two_views()[0]) == "AttentionView('self-attention', 2 layers x 2 heads, 3 queries x 3 keys)"
    huge = AttentionView("self-attention", list("ab"), list("ab"), np.full((1 << 20, 2, 2, 2), 0.5))
    assert huge._repr_html_().startswith('<p class="attnlab-too-big">')  # a note, not 5 MB in the .ipynb


def test_scoped_css_renames_the_page_s_ids_and_keeps_colours():
    css = "body { color: #666; }\n#head, #head-pane .x { color: #e80; }\n.token { margin: 0; }"
    out = scoped_css(css, "r1", ["head", "head-pane"])
    assert "#r1 { color: #666; }" in out
    assert "#r1 #r1-head, #r1 #r1-head-pane .x { color: #e80; }" in out
    assert "#r1 .token { margin: 0; }" in out


def test_curve_and_facts():
    svg = curve_svg([(1, 3.0), (2, 2.5), (3, 2.0)], [(2, 2.6)])
    assert svg.startswith('<svg class="attnlab-curve"') and "<polyline" in svg and svg.count("<circle") == 1
    assert curve_svg([], []) == ""
    assert "<circle" in curve_svg([(1, 3.0)], [])  # one step: a dot, not an empty line
    long = curve_svg([(i, 1.0 / (i + 1)) for i in range(5000)], [])
    assert long.count(",") < 500  # averaged down to MAX_POINTS points
    assert facts_text("Run x", {"task": "lm", "tokenizer": "char"}) == "Run x\n  task       lm\n  tokenizer  char"
    lines = shapes_text([(f"p{i}", "1 x 2") for i in range(100)], limit=10)
    assert len(lines) == 11 and "90 more" in lines[5]


def test_pictures_show_in_a_notebook(tmp_path):
    picture = plot_head_tables({"induction": torch.rand(2, 3)}, tmp_path / "heads.png", "detectors")
    assert isinstance(picture, Picture) and picture._repr_png_().startswith(PNG)
    drawn = Drawn("heads.png: 2 layers", picture)
    assert drawn == "heads.png: 2 layers"  # still the summary line the command prints
    assert '<img class="attnlab-image" src="data:image/png;base64,' in drawn._repr_html_()
    assert Picture(tmp_path / "missing.json")._repr_png_() is None  # the numbers: nothing to show


def test_a_trace_shows_its_points_and_its_attention():
    model = GPT(tiny_model()).eval()
    t = attnlab.trace(model, torch.tensor([[1, 2, 3, 4]]))
    text = repr(t)
    assert text.startswith("Trace of 14 points:") and "blocks.1.attn.hook_pattern   1 x 2 x 4 x 4" in text
    (view,) = t.attention()
    assert view.name == "self-attention" and view.queries == ["0", "1", "2", "3"]  # positions: no tokenizer
    html = t._repr_html_()
    assert '<details class="attnlab-points">' in html and 'class="attnlab-view"' in html


def test_a_run_says_what_it_is(run_dir, tmp_path):
    run = attnlab.load(run_dir, "cpu")
    text = repr(run)
    for fact in (
        "task       lm",
        "gpt: 2 layers x 2 heads, width 32",
        "parameters",
        "steps      4 of 4",
        "device     cpu",
        "tokenizer  char",
        "validation",
    ):
        assert fact in text
    assert '<svg class="attnlab-curve"' in run._repr_html_()
    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare)
    (bare / "metrics.jsonl").unlink()
    html = attnlab.load(bare, "cpu")._repr_html_()
    assert "no loss curve" in html and "<svg" not in html
    t = attnlab.trace(run, "def (")
    assert t.tokens == ["d", "e", "f", "·", "("] and t.attention()[0].keys == t.tokens
    written = write_attention(run, "def (", tmp_path / "a.html")
    assert written.startswith(f"{tmp_path / 'a.html'}: self-attention")  # what `attnlab attention` prints
    assert written._repr_html_().startswith('<div class="attnlab-view"')  # and what a notebook shows


def test_a_notebook_shows_a_run_and_its_attention(run_dir, notebook_kernel):
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import attnlab\nrun = attnlab.load({str(run_dir)!r}, 'cpu')\nrun"),
        nbformat.v4.new_code_cell("attnlab.trace(run, 'def add(a, b):')"),
    ]
    run_notebook(nbclient.NotebookClient(nb, km=notebook_kernel, timeout=120, kernel_name="python3"))
    run_html, trace_html = (c.outputs[-1]["data"]["text/html"] for c in nb.cells)
    assert "<strong>Run " in run_html and "lm" in run_html and "parameters" in run_html
    assert '<svg class="attnlab-curve"' in run_html
    assert '<div class="attnlab-view"' in trace_html and 'id="attnlab-' in trace_html
    assert "dataset.i = index" in trace_html and "<script>" in trace_html
    assert '"queries":["d","e","f","·"' in trace_html  # labelled with the run's tokens


def test_hovering_a_token_focuses_only_its_own_view(run_dir, tmp_path):
    if not Path("/usr/bin/chromium").is_file():
        pytest.skip("no /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    run = attnlab.load(run_dir, "cpu")
    page_html = run._repr_html_() + attnlab.trace(run, "def add(")._repr_html_() + Views(two_views())._repr_html_()
    (tmp_path / "page.html").write_text(f"<!DOCTYPE html><html><body>{page_html}</body></html>", encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((tmp_path / "page.html").as_uri())
        first, second = page.query_selector_all("div.attnlab-view")
        assert len(first.query_selector_all("[data-i]")) == 2 * 8  # queries and keys of "def add("
        all_lines = len(first.query_selector_all("line"))
        first.query_selector_all("[data-i]")[3].dispatch_event("mouseover")
        assert first.get_attribute("data-focus") == "3" and second.get_attribute("data-focus") is None
        assert 0 < len(first.query_selector_all("line")) < all_lines  # only the token's own lines
        first.query_selector_all("[data-i]")[3].dispatch_event("mouseout")
        assert first.get_attribute("data-focus") is None
        second.query_selector_all("[data-i]")[1].hover()
        assert second.get_attribute("data-focus") == "1" and first.get_attribute("data-focus") is None
        browser.close()
    assert errors == []
