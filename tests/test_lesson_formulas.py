"""The lessons' formulas are LaTeX, which Jupyter typesets itself and the site writes as MathML at build
time (docs/mathml.py): no formula in a lesson's prose is left in Unicode or ASCII stand-ins
(`softmax(Q Kᵀ / √d_k)`), every one is one latex2mathml reads, and a lesson's page, rendered as the
site renders it (mkdocs-jupyter's nbconvert, then the hook), holds each as a <math> element with its
code and outputs left alone. tests/test_docs_site.py checks the built site's lesson pages too."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

jupytext = pytest.importorskip("jupytext", reason="the lessons open as notebooks: pip install -e '.[notebook]'")
pytest.importorskip("latex2mathml", reason="the formulas need latex2mathml: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))

# What a formula written without LaTeX looks like: mathematical Unicode (roots, transposes, sums,
# sub- and superscripts, arrows, relations, the minus sign, infinity, Greek letters, the dot product)
# and the ASCII stand-ins (softmax(, sqrt(, x^T, 2^(...)). Outside $...$ and code, none of it is drawn
# as mathematics: the site shows it as plain text, in whatever the reader's font makes of it.
UNICODE = re.compile(r"[√ᵀ∑∏ᵢⱼₐ-ₜ₀-₉¹²³⁰-⁹ⁱⁿ←→↦≤≥≠≈−∞·Α-Ωα-ω]")
ASCII = re.compile(r"\b(?:softmax|sqrt|sigmoid)\(|\^\(|\^T\b")


def mathml_hook():
    spec = importlib.util.spec_from_file_location("attnlab_docs_mathml", ROOT / "docs" / "mathml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_cells(path: Path) -> list[str]:
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "markdown"]


def prose(text: str, tex: re.Pattern) -> str:
    """A markdown cell without its formulas, fenced code and code spans: what is read as text."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", tex.sub("", text))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_s_formulas_are_latex_that_the_site_renders(lesson):
    hook = mathml_hook()
    for cell in markdown_cells(lesson):
        for line in prose(cell, hook.NOTEBOOK_TEX).splitlines():
            found = UNICODE.search(line) or ASCII.search(line)
            assert not found, f"{lesson.name}: {found.group()!r} outside $...$ in {line.strip()!r}: write it as LaTeX"
        for m in hook.NOTEBOOK_TEX.finditer(cell):
            hook.mathml(m.group(1) or m.group(2), m.group(1) is not None)  # ValueError if latex2mathml cannot


def test_the_check_finds_a_unicode_formula_and_passes_latex():
    tex = mathml_hook().NOTEBOOK_TEX
    for bad in ["the scores qᵢ · kⱼ", "softmax(Q Kᵀ / √d_k) V", "n² steps", "x ← x + 1", "theta^(-2i/Dh)"]:
        assert UNICODE.search(prose(bad, tex)) or ASCII.search(prose(bad, tex)), bad
    good = r"the scores $q_i \cdot k_j$, $\operatorname{softmax}(QK^\top/\sqrt{d_k})V$ and `F.softmax(x)` in code"
    assert not UNICODE.search(prose(good, tex)) and not ASCII.search(prose(good, tex))


def rendered(path: Path) -> str:
    """The lesson's page content as the site's build makes it: mkdocs-jupyter's converter, then the hook."""
    convert = pytest.importorskip("mkdocs_jupyter.convert", reason="the site needs mkdocs: pip install -e '.[docs]'")
    page = SimpleNamespace(file=SimpleNamespace(src_uri=f"lessons/{path.stem}.ipynb"))
    return mathml_hook().on_page_content(convert.nb2html(str(path)), page, {}, None)


def test_a_lesson_s_page_holds_each_formula_as_mathml():
    lesson = ROOT / "lessons" / "01_attention_from_scratch.py"
    html = rendered(lesson)
    expected = sum(len(mathml_hook().NOTEBOOK_TEX.findall(c)) for c in markdown_cells(lesson))
    assert expected >= 20 and html.count("<math") == expected
    attention = next(m for m in re.findall(r"<math\b.*?</math>", html, re.S) if "<mi>Attention</mi>" in m)
    assert 'display="block"' in attention and "<mfrac>" in attention and "<mi>softmax</mi>" in attention
    assert "$q_i" not in html and "\\operatorname" not in html


def test_only_markdown_cells_are_read_for_formulas(tmp_path):
    """A `$` in code or in a cell's output (prices, shell variables, JavaScript) is not a formula."""
    lesson = tmp_path / "lesson.py"
    lesson.write_text(
        "# %% [markdown]\n# The score $QK^\\top$, then\n#\n# $$\n# \\sqrt{d_k}\n# $$\n#\n# and `$HOME` in code.\n\n"
        "# %%\nprice = '$5 and $10'  # $x$\nprice\n"
    )
    html = rendered(lesson)
    assert html.count("<math") == 2 and html.count('display="block"') == 1
    assert "$5 and $10" in html and "# $x$" in html and "$HOME" in html
