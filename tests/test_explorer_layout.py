"""The explorer's attention-shaded text wraps at the page's edge, even with no spaces in it (code, or
newlines shown as the two characters \\n): measured in Debian's chromium where it is installed, and
read from the style sheets everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnlab.viz.html import static_text

CHROMIUM = Path("/usr/bin/chromium")
ARGS = (
    "--no-sandbox --disable-gpu --disable-quic --no-first-run "
    "--disable-background-networking --disable-component-update --disable-sync"
).split()
# 240 tokens with no space between or inside them: 6,000 px on one line before the fix
TOKENS = ["def\\n", "add", "(a,", "b)"] * 60
# the line's box in each page: (style sheet, its package, the box's HTML, its selector, its tokens' class)
EXPERTS = "<div id='experts'><div class='expert-text'>@@</div></div>"
SHADED = {
    "live attention": ("explorer.css", "attnlab.serve", "<div id='live-tokens'>@@</div>", "#live-tokens", "live-token"),
    "experts": ("views.css", "attnlab.viz", EXPERTS, ".expert-text", "expert-token"),
}


def rule(css: str, selector: str) -> str:
    found = re.search(re.escape(selector) + r"\s*\{([^}]*)\}", css)
    assert found, f"no rule for {selector}"
    return found.group(1)


@pytest.mark.parametrize("what", SHADED)
def test_the_shaded_text_may_break_anywhere(what):
    sheet, package, _, selector, _ = SHADED[what]
    assert "overflow-wrap: anywhere" in rule(static_text(sheet, package), selector)


@pytest.mark.parametrize("what", SHADED)
def test_a_long_line_without_spaces_wraps_in_a_browser(what):
    if not CHROMIUM.is_file():
        pytest.skip(f"no {CHROMIUM} (apt-get install -y chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    sheet, package, html, selector, span = SHADED[what]
    spans = "".join(f'<span class="{span}">{t}</span>' for t in TOKENS)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 600, "height": 400})
        page.set_content(f"<style>{static_text(sheet, package)}</style>{html.replace('@@', spans)}")
        wide, shown, tall = page.locator(selector).evaluate("e => [e.scrollWidth, e.clientWidth, e.clientHeight]")
        browser.close()
    assert wide <= shown <= 600, f"{what}: {wide} px of text in {shown} px"
    assert tall > 5 * 16  # wrapped onto many lines, not cut
