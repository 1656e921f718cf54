"""The explorer and the exported attention page in a real browser: Debian's chromium, driven by
Playwright. Skipped where either is missing (`apt-get install chromium`, `pip install playwright`;
never `playwright install`, which downloads browsers).

Screenshots of the served page's head view and model view go to $ATTNLAB_SCREENSHOTS (default: the
test's temporary directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from attnlab import load
from attnlab.cli.main import main
from attnlab.decoding.sampling import generate_text
from attnlab.interpret.views import views
from attnlab.serve.app import create_app, running
from attnlab.viz.html import AttentionView, write_attention_html
from tests.conftest import cli_lm, nano_flags

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.is_file():
    pytest.skip(f"no {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

# Quiet flags: without the background-networking ones Chromium keeps calling home, to no avail here.
ARGS = (
    "--no-sandbox --disable-gpu --disable-quic --no-first-run "
    "--disable-background-networking --disable-component-update --disable-sync"
).split()
GPT = nano_flags(2, 2, 5)
PERCENT = re.compile(r"^\d+(\.\d)?%$")


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    return cli_lm(tmp_path_factory.mktemp("browser"), GPT)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("ATTNLAB_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def watch(page) -> list[str]:
    """The page's console errors and uncaught exceptions, as they come."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def test_the_explorer_streams_text_and_shows_its_attention(gpt_run, browser, shots):
    expect = playwright.expect
    prompt = "def add("
    run = load(gpt_run, "cpu")
    expected = generate_text(run.model, run.tokenizer, prompt, max_new_tokens=20, temperature=0.8, seed=3)
    with running(create_app([gpt_run])) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors, elsewhere = watch(page), []
        page.on("request", lambda r: r.url.startswith((url, "blob:", "data:")) or elsewhere.append(r.url))
        page.goto(url)
        page.select_option("#run", "lm")
        expect(page.locator("#run-summary")).to_contain_text("gpt, lm")
        expect(page.locator("#curve polyline.train")).to_have_count(1)  # the loss curve, from the metrics
        page.fill("#prompt", prompt)
        page.fill("#max-tokens", "20")
        page.fill("#seed", "3")  # the page's temperature 0.8, top-k and top-p off: generate_text's call above
        page.click("#go")
        expect(page.locator("#status")).to_contain_text("20 tokens in", timeout=15_000)
        assert page.text_content("#output .generated") == expected[len(prompt) :]

        page.click("#attention-go")
        queries = page.locator(".token.query")
        expect(queries).to_have_count(len(views(run, expected)[0].queries))  # prompt and continuation
        labels = page.locator(".token.key .weight-label")
        assert labels.first.text_content() == ""
        page.hover(".token.query[data-index='5']")
        expect(labels.first).to_have_text(PERCENT)  # query 5 sees key 0: a causal model's earlier token
        page.screenshot(path=str(shots / "serve-head-view.png"), full_page=True)

        page.click(".thumb[data-layer='1'][data-head='1']")
        enlarged = page.locator("#enlarged")
        expect(enlarged).to_be_visible()
        assert enlarged.get_attribute("data-layer") == "1" and enlarged.get_attribute("data-head") == "1"
        page.screenshot(path=str(shots / "serve-model-view.png"))
        page.close()
    assert not errors, errors
    assert not elsewhere, elsewhere  # nothing fetched from anywhere but the server


def test_the_explorer_shows_attention_live_and_inside_the_model(gpt_run, browser, shots):
    """Generation with each token's attention, then the lens, detector, ablation and rollout views."""
    expect = playwright.expect
    with running(create_app([gpt_run])) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors, elsewhere = watch(page), []
        page.on("request", lambda r: r.url.startswith((url, "blob:", "data:")) or elsewhere.append(r.url))
        page.goto(url)
        expect(page.locator("#run-summary")).to_contain_text("gpt, lm")
        page.fill("#prompt", "def add(")
        page.fill("#max-tokens", "12")
        page.fill("#seed", "1")
        page.check("#live")
        page.click("#go")
        expect(page.locator("#status")).to_contain_text("12 tokens in", timeout=15_000)
        generated = page.locator(".live-token.generated")
        expect(generated).to_have_count(12)
        expect(page.locator(".live-token")).to_have_count(8 + 12)  # the prompt's characters, then the new ones
        expect(page.locator("#live-layer option")).to_have_count(2)
        newest = page.locator(".live-token.newest")
        expect(newest).to_have_attribute("data-index", "19")
        shaded = page.eval_on_selector_all(".live-token", "els => els.filter(e => e.style.background).length")
        assert shaded > 0
        generated.nth(2).hover()  # its own row: the tokens before it
        expect(newest).to_have_attribute("data-index", "10")
        assert page.eval_on_selector(".live-token[data-index='11']", "e => e.style.background") == ""  # after it
        page.screenshot(path=str(shots / "serve-live-attention.png"), full_page=True)

        views = (
            ("lens", ".inside-table", 1),
            ("heads", ".inside-table", 4),
            ("ablate", ".inside-table", 1),
            ("rollout", "canvas.rollout-map", 1),
        )
        for what, selector, count in views:
            page.select_option("#inside-what", what)
            page.click("#inside-go")
            expect(page.locator(f"#inside-output {selector}")).to_have_count(count)
            expect(page.locator("#inside-status")).to_have_text("")
        page.select_option("#inside-what", "lens")
        page.click("#inside-go")
        expect(page.locator(".inside-table tr")).to_have_count(1 + 3)  # the tokens' row, embed and 2 layers
        page.screenshot(path=str(shots / "serve-inside-lens.png"), full_page=True)
        page.close()
    assert not errors, errors
    assert not elsewhere, elsewhere


def test_the_exported_page_works_with_no_network(browser, tmp_path):
    expect = playwright.expect
    rng = np.random.default_rng(0)
    src, tgt = ["le", "chat", "</s>"], ["the", "cat"]
    weights = lambda tq, tk: (w := rng.random((2, 3, tq, tk))) / w.sum(-1, keepdims=True)
    views = [
        AttentionView("encoder self-attention", src, src, weights(3, 3)),
        AttentionView("cross-attention", tgt, src, weights(2, 3)),
    ]
    write_attention_html(views, tmp_path / "attention.html", "offline")
    context = browser.new_context(offline=True)
    blocked: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file:"):
            return route.continue_()
        blocked.append(route.request.url)
        return route.abort()

    context.route("**/*", only_files)
    page = context.new_page()
    errors = watch(page)
    page.goto((tmp_path / "attention.html").as_uri())
    expect(page.locator(".token.query")).to_have_count(3)
    expect(page.locator(".thumb")).to_have_count(6)  # 2 layers x 3 heads
    page.hover(".token.query[data-index='1']")
    expect(page.locator(".token.key .weight-label").first).to_have_text(PERCENT)
    page.select_option("#view", "1")
    expect(page.locator(".token.query")).to_have_count(2)
    page.click(".thumb[data-layer='0'][data-head='2']")
    expect(page.locator("#enlarged")).to_be_visible()
    expect(page.locator("#experts")).to_be_hidden()  # no mixture of experts here
    context.close()
    assert not errors, errors
    assert not blocked, blocked


def test_the_page_colours_each_token_by_its_expert(browser, tmp_path):
    expect = playwright.expect
    tokens = ["def", " f", "(x", "):\n"]
    experts = {"tokens": tokens, "experts": [[0, 1, 1, 2], [3, 3, 0, 1]], "gates": [[1.0, 0.6, 0.9, 0.5]] * 2, "n": 4}
    w = np.tril(np.ones((1, 1, 4, 4)))
    write_attention_html(
        [AttentionView("self-attention", tokens, tokens, w / w.sum(-1, keepdims=True))],
        tmp_path / "moe.html",
        "experts",
        experts,
    )
    page = browser.new_page()
    errors = watch(page)
    page.goto((tmp_path / "moe.html").as_uri())
    expect(page.locator("#experts")).to_be_visible()
    expect(page.locator(".expert-token")).to_have_count(8)  # 2 layers x 4 tokens
    expect(page.locator(".expert-chip")).to_have_count(4)
    expect(page.locator(".expert-token[data-layer='1'][data-expert='3']")).to_have_count(2)
    colours = page.eval_on_selector_all(".expert-token[data-layer='0']", "els => els.map(e => e.style.background)")
    assert colours[1] != colours[0] and colours[1].split(",")[:3] == colours[2].split(",")[:3]  # expert 1 twice
    page.close()
    assert not errors, errors


def test_a_thousand_tokens_render_and_stay_usable(browser, tmp_path, shots, record_property):
    """1,000 tokens, 2 layers x 4 heads (8 million weights, sent one byte each): the page renders,
    draws only the lines of the rows in view, and keeps answering. The time is logged, not asserted."""
    import time

    expect = playwright.expect
    n, rng = 1000, np.random.default_rng(0)
    tokens = [f"t{i}" for i in range(n)]
    scores = rng.standard_normal((2, 4, n, n)) * 3  # peaky rows, as trained heads have
    scores[..., np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf  # causal
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    write_attention_html([AttentionView("self-attention", tokens, tokens, w)], tmp_path / "long.html", "long")
    size_mb = (tmp_path / "long.html").stat().st_size / 1e6
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors = watch(page)
    start = time.perf_counter()
    page.goto((tmp_path / "long.html").as_uri())
    expect(page.locator(".thumb")).to_have_count(8)
    expect(page.locator(".token.query")).to_have_count(n)
    rendered = time.perf_counter() - start
    lines = page.locator("line.line").count()
    assert 0 < lines < 50 * 4 * 60  # the rows in view only, not a million
    page.locator("#head-pane").evaluate("pane => { pane.scrollTop = 900 * 22; }")
    page.wait_for_function("document.querySelector('line.line[data-query=\"900\"]') !== null")
    page.hover(".token.query[data-index='900']")
    expect(page.locator(".token.key[data-index='900'] .weight-label")).to_have_text(PERCENT)
    start = time.perf_counter()
    page.click(".thumb[data-layer='1'][data-head='3']")
    expect(page.locator("#enlarged")).to_be_visible()
    enlarged = time.perf_counter() - start
    labels = page.locator("#enlarged .axis.key .label").count()
    assert 0 < labels < n  # every k-th token labelled
    page.screenshot(path=str(shots / "long-input.png"))
    page.close()
    print(
        f"\n1,000 tokens, 2 layers x 4 heads: page {size_mb:.1f} MB, rendered in {rendered:.2f} s "
        f"({lines} lines drawn), enlarged heatmap in {enlarged:.2f} s, {labels} key labels"
    )
    record_property("render_s", round(rendered, 3))
    assert not errors, errors


def test_the_caption_page_moves_the_attention_with_the_word(browser, tmp_path):
    """Hovering a word redraws the image under its attention: the patch it looked at turns red."""
    from attnlab.viz.captions import write_caption_html

    image = np.zeros((1, 8, 48), np.float32)  # a blank strip: only the attention colours it
    words, looked = ["seventy", "-", "four"], [1, 5, 10]  # the patch each word looks at (grid 2 x 12)
    weights = np.full((2, 2, 3, 24), 0.1 / 23)
    for t, j in enumerate(looked):
        weights[:, :, t, j] = 0.9
    write_caption_html(image, words, weights, (2, 12), tmp_path / "caption.html", "seventy-four")
    context = browser.new_context(offline=True)
    page = context.new_page()
    errors = watch(page)
    page.goto((tmp_path / "caption.html").as_uri())
    playwright.expect(page.locator(".cap-word")).to_have_count(3)
    playwright.expect(page.locator(".cap-panel")).to_have_count(3 * 3)  # mean and 2 heads, per word
    red = """([col, row]) => { const c = document.querySelector('.cap-picture'), s = c.width / 48;
        const [r, g] = c.getContext('2d').getImageData((col * 4 + 2) * s, (row * 4 + 2) * s, 1, 1).data;
        return r - g; }"""
    for t, j in enumerate(looked):
        page.hover(f".cap-word[data-index='{t}']")
        playwright.expect(page.locator(".cap-picture")).to_have_attribute("data-word", str(t))
        assert page.evaluate(red, [j % 12, j // 12]) > 150  # the looked-at patch: red
        assert page.evaluate(red, [(j + 3) % 12, j // 12]) < 30  # another: nearly white
    playwright.expect(page.locator(".cap-word.active")).to_have_text("four")
    context.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("caption")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        assert (
            main(
                [
                    "train",
                    "caption",
                    "--out",
                    str(root / "cap"),
                    "--max-steps",
                    "3",
                    "--batch-size",
                    "8",
                    "--eval-interval",
                    "3",
                    "--eval-batches",
                    "1",
                    "--n-train",
                    "64",
                    "--n-test",
                    "8",
                    "--d-model",
                    "32",
                    "--n-layer",
                    "1",
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
    return root / "cap"


def test_the_explorer_captions_an_upload_word_by_word(caption_run, browser, tmp_path, shots):
    """Upload a strip: the caption's words arrive with their attention, as stream_caption gives them."""
    from PIL import Image

    from attnlab.data import strips
    from attnlab.tasks.caption import stream_caption

    strip = strips.strips("test", 1)[0]
    Image.fromarray((strip.image * 255).astype("uint8")).save(tmp_path / "strip.png")
    run = load(caption_run, "cpu")
    words = [w for w, _ in stream_caption(run, strip.image[None].astype("float32"))]
    with running(create_app([caption_run])) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors = watch(page)
        page.goto(url)
        playwright.expect(page.locator("#run-summary")).to_contain_text("caption")
        playwright.expect(page.locator("#image-input")).to_be_visible()
        page.set_input_files("#image", str(tmp_path / "strip.png"))
        page.click("#go")
        playwright.expect(page.locator("#status")).to_contain_text(" s", timeout=15_000)
        assert page.locator(".cap-word").all_text_contents() == words
        playwright.expect(page.locator(".cap-picture")).to_have_attribute("data-word", str(len(words) - 1))
        page.hover(".cap-word[data-index='0']")  # back to the first word
        playwright.expect(page.locator(".cap-picture")).to_have_attribute("data-word", "0")
        page.screenshot(path=str(shots / "serve-caption.png"), full_page=True)
        page.close()
    assert not errors, errors
