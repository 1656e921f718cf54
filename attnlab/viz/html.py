"""Attention in the browser: one self-contained HTML page with a head view and a model view.

The head view draws, for one layer and one head (or all heads overlaid, one colour each), a line
from every query token on the left to every key token on the right, as thick and as opaque as the
weight; hovering a token keeps only its lines and writes their weights beside the other column.
The model view shows every layer x head as a thumbnail heatmap; a click enlarges one, with token
labels on both axes, and selects it in the head view. Script, style and data are all inline, so
the page opens from disk with no network and can be archived or mailed as one file.

The page's parts are files in viz/static/ (package data): views.html, views.css and views.js are
the head view and the model view, shared with `attnlab serve`'s page, which calls
showAttention(data) with each answer of /api/attention; attention.html is the exported page.
In a notebook the same parts are one `<div class="attnlab-view">` (inline.html, `inline_attention_html`):
its ids prefixed and its style scoped to it, views.js run inside a function of its own, so several
views share a page (Jupyter, nbconvert, mkdocs-jupyter) without one name colliding.

Shapes: L layers, H heads, Tq query tokens (rows), Tk key tokens (columns).
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
import secrets
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

from attnlab.io import atomic_write

DECIMALS = 4  # weights in the page: 0.01% is finer than any line width or colour step can show
# Above this many weights (all views together), the page gets one byte per weight, base64 (about 1.3
# bytes each instead of about 7 as JSON text): 1,000 tokens x 2 layers x 4 heads is 8 million weights,
# 11 MB instead of 56 MB, which the browser parses in a fraction of a second.
DENSE_WEIGHTS = 1 << 20
# A notebook keeps every output inside the .ipynb: above this many weights (about 5.6 MB as bytes) an
# inline view is a note saying how to write the page instead (a 12 x 12 model on 1,000 tokens has 144 M).
INLINE_WEIGHTS = 1 << 22


@dataclass
class AttentionView:
    """One attention map to show, e.g. a GPT's "self-attention" or a translation model's "cross-attention"."""

    name: str
    queries: list[str]  # token labels of the rows, in order
    keys: list[str]  # token labels of the columns, in order
    weights: np.ndarray  # (L, H, Tq, Tk), each row sums to 1 (masked entries 0)

    def __post_init__(self):
        self.queries = [str(t) for t in self.queries]
        self.keys = [str(t) for t in self.keys]
        self.weights = w = np.asarray(self.weights, dtype=float)
        if w.ndim != 4:
            raise ValueError(f"{self.name}: weights must be (layers, heads, queries, keys), got shape {w.shape}")
        if w.shape[2:] != (len(self.queries), len(self.keys)):
            raise ValueError(
                f"{self.name}: weights end in {w.shape[2:]} but there are {len(self.queries)} query "
                f"and {len(self.keys)} key tokens; pass one label per row and per column"
            )
        if w.shape[0] == 0 or w.shape[1] == 0:
            raise ValueError(f"{self.name}: weights have no layers or no heads (shape {w.shape})")
        if not np.isfinite(w).all():  # JSON has no NaN: the page would not load
            raise ValueError(f"{self.name}: weights contain NaN or inf; check the attention mask")

    def __repr__(self) -> str:  # the dataclass's would print every weight
        n_layer, n_head, tq, tk = self.weights.shape
        return f"AttentionView({self.name!r}, {n_layer} layers x {n_head} heads, {tq} queries x {tk} keys)"

    def _repr_html_(self) -> str:
        """A notebook shows the head view and the model view inline."""
        return inline_attention_html([self])


class Views(list):
    """A list of AttentionView that a notebook shows as one inline view (a select picks the view)."""

    def _repr_html_(self) -> str:
        return inline_attention_html(list(self))


def views_json(views: list[AttentionView], experts: dict | None = None) -> dict:
    """The data the page embeds: {"views": [{name, queries, keys, weights}]}, weights (L, H, Tq, Tk) as
    nested lists to DECIMALS places; for long inputs (over DENSE_WEIGHTS weights in all) each view
    instead has "shape": [L, H, Tq, Tk] and "weights_u8": round(255 w) as base64 bytes in that order
    (views.js reads both). For a mixture of experts, "experts": {tokens, experts (L, T) first
    choices, gates (L, T), n}."""
    compact = sum(v.weights.size for v in views) > DENSE_WEIGHTS
    return {**({"experts": experts} if experts else {}), "views": [_view_json(v, compact) for v in views]}


def _view_json(v: AttentionView, compact: bool) -> dict:
    out = {"name": v.name, "queries": v.queries, "keys": v.keys}
    if not compact:
        return {**out, "weights": np.round(v.weights, DECIMALS).tolist()}
    u8 = np.rint(np.clip(v.weights, 0, 1) * 255).astype(np.uint8)  # (L, H, Tq, Tk), steps of 1/255
    return {**out, "shape": list(u8.shape), "weights_u8": base64.b64encode(u8.tobytes()).decode("ascii")}


def script_json(data: dict) -> str:
    """JSON safe inside a <script> tag: every "<" written as \\u003c, so no token text can close the
    tag ("</script>") or open an HTML comment ("<!--"); JSON.parse reads the escape back as "<"."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_attention_html(views: list[AttentionView], title: str = "", experts: dict | None = None) -> str:
    """The page's text: a head view and a model view of each view, chosen from a select (and the
    expert view, given a mixture of experts' routing)."""
    if not views:
        raise ValueError("no attention to show: pass at least one AttentionView")
    # The data sits in a JSON tag that the page parses, never evaluates: token text cannot run as code.
    parts = {
        "TITLE": html.escape(title or "attention"),
        "STYLE": static_text("views.css"),
        "VIEWS": static_text("views.html"),
        "DATA": script_json(views_json(views, experts)),
        "SCRIPT": static_text("views.js"),
    }
    return page("attention.html", parts)


def write_attention_html(views: list[AttentionView], path: Path, title: str = "", experts: dict | None = None) -> None:
    """Write the page to path (atomically: a reader never sees half a file)."""
    text = render_attention_html(views, title, experts)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def inline_attention_html(views: list[AttentionView], title: str = "", experts: dict | None = None) -> str:
    """The page's views as one HTML fragment for a notebook's output (`_repr_html_`), script, style
    and data inline. Contract (tests and other pages rely on it): the root is `<div class="attnlab-view"
    id="attnlab-...">`; every token row has `data-i` (its index); hovering one (mouseover) sets
    `data-focus` on the root to that index and draws only its lines, mouseout removes it."""
    if not views:
        raise ValueError("no attention to show: pass at least one AttentionView")
    n = sum(v.weights.size for v in views)
    if n > INLINE_WEIGHTS:
        return (
            f'<p class="attnlab-too-big">{n:,} attention weights are too many to keep in a notebook '
            f"(over {INLINE_WEIGHTS:,}): write them as a page with attnlab.viz.html.write_attention_html"
            "(views, 'attention.html'), or pass fewer tokens or layers.</p>"
        )
    root = f"attnlab-{secrets.token_hex(6)}"  # unique per output: two views on one page never share an id
    markup = static_text("views.html")
    ids = re.findall(r'id="([\w-]+)"', markup)
    parts = {
        "ROOT": root,
        "TITLE": html.escape(title),
        "DATA": script_json(views_json(views, experts)),
        "STYLE": scoped_css(static_text("views.css") + static_text("inline.css"), root, ids),
        "VIEWS": re.sub(r'id="([\w-]+)"', rf'id="{root}-\1"', markup),
        "SCRIPT": static_text("views.js"),
    }
    return fill(static_text("inline.html"), parts)


def scoped_css(css: str, root: str, ids: list[str]) -> str:
    """views.css for one view: every rule under #root ("body" becomes #root itself) and each of the
    page's ids renamed as inline_attention_html renames them, so the style reaches this view alone."""
    # Only the known ids: colours such as #666 look the same to a regex.
    css = re.sub(rf"#({'|'.join(map(re.escape, ids))})(?![\w-])", rf"#{root}-\1", css)
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)  # comments could hide a brace
    rules = []
    for rule in css.split("}"):
        if "{" not in rule:
            continue
        selectors, body = rule.split("{", 1)
        scoped = [f"#{root}" if s.strip() == "body" else f"#{root} {s.strip()}" for s in selectors.split(",")]
        rules.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(rules)


# static/views.html: ids and classes a test or a reader can rely on.
#   #view, #layer, #head                 the selects (#head has "all" plus one value per head)
#   .token.query / .token.key [data-index][data-i]  the token rows of the head view, each with a .weight-label
#   #lines                                the svg; each line.line has data-query, data-key, data-head
#   .thumb[data-layer][data-head]         the model view's canvases; .selected marks the head view's choice
#   #experts .expert-token[data-layer][data-expert]   the expert view (hidden without experts): each token
#                                         of each MoE layer on its first-choice expert's colour
#   #enlarged[data-layer][data-head]      the enlarged heatmap (hidden until a thumb is clicked): .axis.query and
#                                         .axis.key hold .label[data-index] spans, #enlarged-value the hovered cell


@functools.cache
def static_text(name: str, package: str = "attnlab.viz") -> str:
    """A file of `package`'s static/ folder (package data), read once per process."""
    return (files(package) / "static" / name).read_text(encoding="utf-8")


def page(body: str, parts: dict[str, str]) -> str:
    """A page of its own: page.html's head, style (parts["STYLE"]) and title around the static file
    `body`, filled in one pass (fill)."""
    return fill(static_text("page.html").replace("@@BODY@@", static_text(body)), parts)


def fill(template: str, parts: dict[str, str]) -> str:
    """The template with each @@NAME@@ replaced by parts[NAME], in one pass: text put in (a token
    that reads "@@SCRIPT@@", say) is never scanned again."""
    return re.sub(r"@@([A-Z_]+)@@", lambda m: parts[m.group(1)], template)
