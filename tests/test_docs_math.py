"""The site's formulas, written as MathML at build time by docs/mathml.py from what
pymdownx.arithmatex marks (the site itself is built by tests/test_docs_site.py): inline and display
formulas converted, code and prices left alone, a formula that cannot be read failing with the page
named."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

markdown = pytest.importorskip("markdown", reason="the site is built by mkdocs: pip install -e '.[docs]'")
pytest.importorskip("pymdownx", reason="the site is built by mkdocs: pip install -e '.[docs]'")
pytest.importorskip("latex2mathml", reason="the formulas need latex2mathml: pip install -e '.[docs]'")
from mkdocs.exceptions import PluginError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE = SimpleNamespace(file=SimpleNamespace(src_uri="lecture.md"))


def hook():
    spec = importlib.util.spec_from_file_location("attnlab_docs_mathml", ROOT / "docs" / "mathml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(text: str) -> str:
    """The page as the site's build writes it: mkdocs.yml's arithmatex, then the hook."""
    md = markdown.Markdown(
        extensions=["pymdownx.arithmatex", "pymdownx.superfences"],
        extension_configs={"pymdownx.arithmatex": {"generic": True}},
    )
    return hook().on_page_content(md.convert(text), PAGE, {}, None)


def test_inline_and_display_formulas_become_math_elements():
    html = page(
        "Scores $QK^\\top$ then\n\n$$\n\\operatorname{softmax}\\left(\\frac{QK^\\top}{\\sqrt{d_k}}\\right)V\n$$\n"
    )
    assert html.count("<math") == 2 and "arithmatex" not in html and "$" not in html
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline"><mrow><mi>Q</mi>' in html
    block = html.split('display="block">')[1]
    assert block.startswith("<mrow><mi>softmax</mi>")  # a function's name, not an operator spaced as one
    assert "<mfrac>" in block and "<msqrt><mrow><msub><mi>d</mi><mi>k</mi></msub></mrow></msqrt>" in block


def test_code_and_prices_are_left_alone():
    html = page("It costs $5 and $10.\n\n`$x$` in code\n\n```python\nprint('$a$')\n```\n")
    assert "<math" not in html and "$5 and $10" in html and "<code>$x$</code>" in html and "$a$" in html


@pytest.mark.parametrize(
    "tex, why",
    [
        ("x^", "MissingSuperScriptOrSubscriptError"),
        ("\\softmaks(x)", "\\\\softmaks is not a command latex2mathml knows"),
    ],
)
def test_a_formula_that_cannot_be_read_fails_the_build_naming_its_page(tex, why):
    with pytest.raises(PluginError, match=r"^lecture\.md: cannot render the formula .*: " + why):
        page(f"${tex}$")
