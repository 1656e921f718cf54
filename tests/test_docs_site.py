"""The lessons and the documentation site: every lesson runs top to bottom as a notebook, the command
reference covers the parser, the site builds strictly, the README is a landing page, and the built
site works in a browser from its files (no server, no network).

The lessons run first, in this module, into a temporary folder that the site's build then renders
($ATTNLAB_LESSONS_BUILD; docs/hooks.py would execute a lesson whose recorded source hash differs). In
one module they run in one pytest-xdist worker, in order; in two, each worker executed every lesson.
They run one after another in one kernel (lessons/execute.py execute_all: at the lessons' own settings
about 157 s for the nine on the 2-core Xeon, 318 s in a kernel each, which mostly imports torch and
torch._dynamo again), each with fewer training steps than its own (QUICK): every cell still runs top
to bottom and draws its pictures, which is what is checked here; what the models learn at the
lessons' own settings is what the site of `make docs` shows (it executes them at those)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.cli.main import build_parser
from tests.conftest import lessons_execute

pytest.importorskip("mkdocs", reason="the site is built by mkdocs: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CHROMIUM = Path("/usr/bin/chromium")
# Quiet flags, as in test_browser.py: without the background-networking ones Chromium keeps calling home.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
]


def _gen():
    spec = importlib.util.spec_from_file_location("attnlab_docs_gen", ROOT / "docs" / "gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory, lessons_run, lessons_folder) -> tuple[Path, Path]:
    """The site built by `mkdocs build --strict` (as make docs runs it), from the lessons executed here:
    (site folder, generated pages)."""
    root = tmp_path_factory.mktemp("docs")
    site, generated = root / "site", root / "generated"
    env = {
        **os.environ,
        "ATTNLAB_DOCS_GEN": str(generated),
        "ATTNLAB_LESSONS_BUILD": str(lessons_folder),
        "NO_MKDOCS_2_WARNING": "1",
    }
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return site, generated


LESSONS = ROOT / "lessons"
LESSON_FILES = sorted(LESSONS.glob("[0-9][0-9]_*.py"))
# Each lesson's training steps here (lessons/execute.py with_settings replaces the first cell's values):
# about a fifth of its own (its data, models and every other setting as they are), with every loop,
# evaluation and picture still taken: lesson 8 measures its heads 4 times, lesson 9 validates each run
# once. The nine took 82 s at their own settings and 34 s at these, one after another in one kernel on
# a 2-core AMD EPYC (load average 0.4-2); fewer steps saved little more (30 s at about half of these).
QUICK = {
    "02_words_to_attention": {"STEPS": 30, "VECTOR_EPOCHS": 1},
    "03_translation_rnn_vs_transformer": {"RNN_STEPS": 30, "TRANSFORMER_STEPS": 40},
    "04_gpt": {"STEPS": 50},
    "05_bert_encoders": {"MLM_STEPS": 40, "CLASSIFY_STEPS": 50, "TAG_STEPS": 30},
    "06_images": {"VIT_STEPS": 30, "CAPTION_STEPS": 50},
    "07_modern_blocks": {"MOE_STEPS": 30},
    "08_inside_the_model": {"STEPS": 100},
    "09_pretrained_to_assistant": {"BASE_STEPS": 20, "SFT_STEPS": 10, "DPO_STEPS": 10},
    "10_rlhf": {"WARM_STEPS": 50, "RM_STEPS": 10, "RL_STEPS": 4},
    "11_finding_mechanisms": {"SAE_TOKENS": 50_000, "STEPS": 120, "MAP_STEPS": 60},
}


@pytest.fixture(scope="module")
def lessons_folder(tmp_path_factory) -> Path:
    """Where the lessons' quick notebooks go: not build/lessons, whose notebooks make docs renders."""
    return tmp_path_factory.mktemp("lessons")


@pytest.fixture(scope="module")
def lessons_run(lessons_folder, notebook_kernel) -> dict:
    """Every lesson executed with its QUICK settings (lessons_folder/<lesson>.ipynb written), in the
    test process's one kernel: {path: (notebook, seconds) or error}."""
    pytest.importorskip("jupytext", reason="the lessons run as notebooks: pip install -e '.[notebook]'")
    assert set(QUICK) <= {p.stem for p in LESSON_FILES}, "QUICK names a lesson that is not in lessons/"
    return lessons_execute().execute_all(LESSON_FILES, lessons_folder, settings=QUICK, km=notebook_kernel)


@pytest.mark.parametrize("lesson", LESSON_FILES, ids=lambda p: p.stem)
def test_each_lesson_runs_top_to_bottom_and_shows_a_picture(lesson, lessons_run):
    result = lessons_run[lesson]
    if isinstance(result, Exception):
        pytest.fail(f"{lesson.name} stopped: {str(result)[-3000:]}")
    nb, seconds = result
    print(f"{lesson.name}: {seconds:.1f} s")
    assert nb.metadata["attnlab"].get("settings") == QUICK.get(lesson.stem)  # the quick run's, as asked
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{lesson.name} shows no picture"


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every command below `parser` with its own flags and positionals: (words after attnlab, names)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names = []
                for a in sub._actions:
                    if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                        continue
                    names += a.option_strings or [a.metavar or a.dest]
                yield (*path, name), names
                yield from walk(sub, (*path, name))


def test_the_command_reference_has_every_command_and_every_flag(tmp_path):
    gen = _gen()
    gen.write_cli(tmp_path)
    folder = tmp_path / gen.CLI
    index = (folder / "index.md").read_text()
    found = list(walk(build_parser()))
    assert len(found) > 25  # every command and every train task
    for path, names in found:
        page = folder / gen.page_name(path)
        assert page.is_file(), f"no page for attnlab {' '.join(path)}"
        text = page.read_text()
        assert text.startswith(f"# attnlab {' '.join(path)}\n")
        assert f"`attnlab {' '.join(path)}`" in index
        for name in names:
            assert f"`{name}" in text, f"attnlab {' '.join(path)}: {name} is not in {page.name}"


def test_the_site_builds_strictly_with_every_page(built):
    site, generated = built
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for page in [
        "index.html",
        "quickstart.html",
        "gpt.html",
        "architecture.html",
        "reference/cli/index.html",
        "reference/cli/train-lm.html",
        "reference/api/nn.html",
        "lessons/index.html",
    ]:
        assert page in pages
    for lesson in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")):
        assert f"lessons/{lesson.stem}.html" in pages
    # the API pages come from the docstrings: attend's own text is there
    assert "attend" in (site / "reference" / "api" / "nn.html").read_text()


def test_the_readme_is_a_landing_page_that_begins_with_the_two_commands():
    data = README.read_bytes()
    assert len(data) <= 25_000, f"README.md is {len(data):,} bytes; move detail into docs/"
    lines = [line for line in data.decode().splitlines() if line.strip()]
    assert lines[0] == "# attnlab" and lines[1].startswith("```")
    assert lines[2].startswith("make demo") and lines[3].startswith("make test")
    for link in ("docs/quickstart.md", "docs/gpt.md", "docs/serving.md"):
        assert f"]({link})" in data.decode()


# --- in a browser ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        pytest.skip(f"no {CHROMIUM} (apt-get install -y chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield chromium
        chromium.close()


def _open(browser, url: str):
    """A page with what went wrong on it recorded: console errors, uncaught exceptions, requests that
    left the files or failed."""
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"exception: {e}"))
    local = ("file:", "data:", "blob:", "about:")
    page.on("request", lambda r: r.url.startswith(local) or problems.append(f"network: {r.url}"))
    # net::ERR_ABORTED: a favicon or the search worker still loading when the tab moves on to the next page
    page.on("requestfailed", lambda r: "ERR_ABORTED" in (r.failure or "") or problems.append(f"failed: {r.url}"))
    page.goto(url, wait_until="load")
    return page, problems


def test_every_page_opens_from_the_files_without_errors_or_network(built, browser):
    site, generated = built
    bad = {}
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    page, problems = _open(browser, "about:blank")  # one tab for every page: a new tab costs more than a page
    for html in pages:
        problems.clear()
        lesson = html.parent.name == "lessons" and html.name != "index.html"
        # A lesson's pictures must have loaded to be measured; another page is checked once its
        # scripts have run (its parsed document), which is when a console error would have come.
        page.goto(html.as_uri(), wait_until="load" if lesson else "domcontentloaded")
        if lesson:
            sizes = page.eval_on_selector_all("article img", "imgs => imgs.map(i => i.naturalWidth)")
            notebook = json.loads((generated / "lessons" / (html.stem + ".ipynb")).read_text())
            pictures = sum("image/png" in o.get("data", {}) for c in notebook["cells"] for o in c.get("outputs", []))
            if len(sizes) < pictures or 0 in sizes:
                problems.append(f"{pictures} pictures in the notebook, images shown: {sizes}")
        if problems:
            bad[html.relative_to(site).as_posix()] = list(problems)
    page.close()
    assert not bad, bad
    assert len(pages) > 40


def test_an_attention_view_in_a_lesson_answers_hover(built, browser):
    site, _ = built
    views = [p for p in sorted((site / "lessons").glob("*.html")) if "attnlab-view" in p.read_text()]
    assert views, "no rendered lesson holds an inline attention view (div.attnlab-view): lesson 4 ends on one"
    page, problems = _open(browser, views[0].as_uri())
    root = page.locator("div.attnlab-view").first
    root.scroll_into_view_if_needed()
    before = root.get_attribute("data-focus")
    root.locator("[data-i]").nth(1).hover()
    page.wait_for_function(
        "([r, b]) => r.hasAttribute('data-focus') && r.getAttribute('data-focus') !== b",
        arg=[root.element_handle(), before],
        timeout=5000,
    )
    assert not problems, problems
    page.close()


# --- formulas and code blocks --------------------------------------------------------------------

# What a page would fetch from elsewhere: a script, style sheet, image or frame at an http(s) address.
REMOTE = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"'](?:https?:)?//", re.I)


def test_the_formulas_are_mathml_written_at_build_time(built):
    site, _ = built
    text = (site / "formulas.html").read_text()
    formulas = re.findall(r"<math\b.*?</math>", text, re.S)
    assert len(formulas) >= 20 and "$$" not in text and "arithmatex" not in text
    attention = [m for m in formulas if "<mi>Attention</mi>" in m and "<mi>softmax</mi>" in m]
    assert attention and 'display="block"' in attention[0]  # softmax(Q K^T / sqrt(d_k) + M) V, drawn as a fraction
    assert "<mfrac>" in attention[0] and "<msqrt><mrow><msub><mi>d</mi><mi>k</mi></msub></mrow></msqrt>" in attention[0]
    for page in ("gpt.html", "encoders.html", "modern-blocks.html", "baselines.html"):  # formulas in the prose
        assert "<math" in (site / page).read_text(), page
    # the lessons' markdown cells too (their $...$, which nbconvert leaves for MathJax): 23 in lesson 1
    lessons = {p.stem: p.read_text().count("<math") for p in (site / "lessons").glob("[0-9][0-9]_*.html")}
    assert lessons["01_attention_from_scratch"] >= 20 and sum(lessons.values()) >= 100, lessons
    left = [p.name for p in site.rglob("*.html") if "\\operatorname" in p.read_text() or "\\frac" in p.read_text()]
    assert not left, f"LaTeX left as text in {left}"


def test_no_page_loads_anything_from_a_cdn(built):
    site, _ = built
    pages = sorted(site.rglob("*.html"))
    assert "404.html" in {p.name for p in pages}  # a template, not a page: docs/hooks.py cleans it too
    remote = {p.relative_to(site).as_posix(): REMOTE.findall(p.read_text()) for p in pages}
    assert not {k: v for k, v in remote.items() if v}
    sheets = [p for p in site.rglob("*.css") if re.search(r"@import\s+(url\()?[\"']?(https?:)?//", p.read_text())]
    assert not sheets


def test_a_long_code_line_scrolls_visibly_and_formulas_are_drawn(built, browser):
    site, _ = built
    assert "overflow-x: auto" in (site / "stylesheets" / "attnlab.css").read_text()
    page, problems = _open(browser, (site / "quickstart.html").as_uri())
    assert 'href="stylesheets/attnlab.css"' in page.content()
    # the first block with a line longer than the column: it scrolls, with a usual-size bar, to the line's end
    overflow, bar, shadow, end, room = page.evaluate("""() => {
        const c = [...document.querySelectorAll('article pre > code')].find(c => c.scrollWidth > c.clientWidth + 1);
        const s = getComputedStyle(c);
        c.scrollLeft = c.scrollWidth;
        return [s.overflowX, s.scrollbarWidth, s.backgroundImage, c.scrollLeft, c.scrollWidth - c.clientWidth];
    }""")
    assert (overflow, bar) == ("auto", "auto") and "linear-gradient" in shadow
    assert end == room > 0  # scrolled to the end of the longest line: nothing is cut off for good
    page.goto((site / "formulas.html").as_uri(), wait_until="load")
    # MathML laid out by the browser: the fraction of the attention formula stacks, taller than a line
    height, line = page.evaluate("""() => {
        const m = [...document.querySelectorAll('math[display=block]')].find(m => m.textContent.includes('Attention'));
        return [m.getBoundingClientRect().height, parseFloat(getComputedStyle(m).fontSize)];
    }""")
    assert height > 1.8 * line, (height, line)
    assert not problems, problems
    page.close()
