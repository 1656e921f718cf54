"""MkDocs hook (mkdocs.yml `hooks:`): the formulas of the pages as MathML, written at build time.

A page marks a formula as LaTeX, `$...$` inline or `$$ ... $$` on lines of their own;
pymdownx.arithmatex (generic mode) finds them, leaving code blocks alone, and wraps each in
`<span class="arithmatex">\\(...\\)</span>` or `<div class="arithmatex">\\[...\\]</div>`. Here each
becomes a `<math>` element by latex2mathml, which browsers draw themselves: no script, font or CDN
at view time, so the site shows its formulas offline, opened from the files. A formula latex2mathml
cannot read fails the (strict) build, naming the page and the formula.

The lessons' pages (notebooks, rendered by mkdocs-jupyter through nbconvert) mark theirs as Jupyter
does, and nbconvert leaves them as written for MathJax, `$...$` and `$$...$$`: in a notebook page's
markdown cells (not its code, nor its outputs) they become MathML the same way.
"""

from __future__ import annotations

import html
import re

from mkdocs.exceptions import PluginError

try:  # the docs extra's dependency (pip install -e '.[docs]'); a plain install never builds the site
    from latex2mathml.converter import convert
except ImportError:  # pragma: no cover - told once, at the first page
    convert = None

# arithmatex's generic output: the TeX between \( \) inline or \[ \] on its own, HTML-escaped.
MARKED = re.compile(r'<(span|div) class="arithmatex">\\([(\[])(.*?)\\[)\]]</\1>', re.S)


# latex2mathml writes \operatorname{softmax} as an operator (<mo>), which browsers space as one: "softmax (x)".
# A function's name is an identifier, as it writes \log or \sin: upright, and no space before its "(".
NAMED = re.compile(r"<mo>([A-Za-z]{2,})</mo>")


# A command latex2mathml does not know comes out as its own name, backslash and all: "\\nosuch".
UNKNOWN = re.compile(r">(\\[A-Za-z]+)<")


def mathml(tex: str, block: bool) -> str:
    """One formula (its LaTeX, as written in the page) as a <math> element; ValueError if it cannot."""
    out = convert(tex.strip(), display="block" if block else "inline")
    if unknown := UNKNOWN.search(out):
        raise ValueError(f"{unknown.group(1)} is not a command latex2mathml knows")
    return NAMED.sub(r"<mi>\1</mi>", out)


# A notebook page: each markdown cell's rendered text (up to the next cell, or the styles nbconvert adds
# at the end); in it nbconvert's own delimiters, display first (its rules: no \\$, no $$ read as $).
CELL = re.compile(r'(<div class="[^"]*\bjp-MarkdownOutput\b[^"]*"[^>]*>)(.*?)(?=<div class="jp-Cell\b|<style|\Z)', re.S)
CODE = re.compile(r"(<code\b.*?</code>|<pre\b.*?</pre>)", re.S)  # `$x$` in code stays as written
NOTEBOOK_TEX = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<![$\\])\$(.+?)(?<![$\\])\$", re.S)


def _rendered(tex: str, block: bool, page) -> str:
    """mathml() of a formula as the page holds it (HTML-escaped), or the build stopped naming both."""
    tex = html.unescape(tex)
    try:
        return mathml(tex, block)
    except Exception as e:  # latex2mathml's own errors often have no message: their names say it
        why = f"{type(e).__name__}{f': {e}' if str(e) else ''}"
        raise PluginError(f"{page.file.src_uri}: cannot render the formula {tex.strip()!r}: {why}") from None


def _notebook(content: str, page) -> str:
    def text(part: str) -> str:
        return NOTEBOOK_TEX.sub(lambda m: _rendered(m.group(1) or m.group(2), m.group(1) is not None, page), part)

    def cell(m: re.Match) -> str:
        parts = CODE.split(m.group(2))  # text, code, text, ...
        return m.group(1) + "".join(p if i % 2 else text(p) for i, p in enumerate(parts))

    return CELL.sub(cell, content)


def on_page_content(content: str, page, config, files) -> str:
    notebook = page.file.src_uri.endswith(".ipynb") and "$" in content
    if "arithmatex" not in content and not notebook:
        return content
    if convert is None:
        raise PluginError("the formulas need latex2mathml: pip install -e '.[docs]'")
    content = MARKED.sub(lambda m: _rendered(m.group(3), m.group(2) == "[", page), content)
    return _notebook(content, page) if notebook else content
