"""`attnlab inspect ... --out FILE.html`: the numbers of interpret/report.py as one self-contained page.

Rollout and flow are attention maps, so they get the attention page (head view, model view). The
logit lens and the per-head tables are tables of shaded cells, each with its number in it and the
exact value in its tooltip: readable without a script, printable, and searchable with Ctrl-F.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.io import atomic_write
from attnlab.viz.html import AttentionView, write_attention_html

STYLE = """body { font: 14px system-ui, sans-serif; margin: 1em 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; } caption { text-align: left; font-weight: bold; }
th { font-weight: normal; color: #666; padding: 2px 6px; } td { padding: 2px 6px; text-align: center;
font-family: monospace; white-space: pre; min-width: 3em; } .scroll { overflow-x: auto; }"""


def _shade(v: float, diverging: bool) -> str:
    """A cell's background: white to blue for scores in [0, 1]; blue (-) or red (+) for changes."""
    if diverging:
        a = min(1.0, abs(v))
        return f"rgba({'200,40,40' if v > 0 else '40,90,200'},{a:.2f})"
    return f"rgba(40,90,200,{min(1.0, max(0.0, v)):.2f})"


def _cell(text: str, value: float, diverging: bool = False, tip: str = "") -> str:
    colour = "#fff" if (abs(value) if diverging else value) > 0.6 else "#000"
    return (
        f'<td style="background:{_shade(value, diverging)};color:{colour}" title="{html.escape(tip)}">'
        f"{html.escape(text)}</td>"
    )


def _table(caption: str, columns: list[str], rows: list[tuple[str, list[str]]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>" for name, cells in rows)
    table = f"<table><caption>{html.escape(caption)}</caption><tr><th></th>{head}</tr>{body}</table>"
    return f'<div class="scroll">{table}</div>'


def lens_tables(result: dict) -> str:
    """Layers down (the last on top, as the picture), positions across; each cell the top token."""
    shown = lambda t: repr(t)[1:-1]
    rows = []
    for name, top, prob in reversed(list(zip(result["layers"], result["top"], result["prob"]))):
        rows.append((name, [_cell(shown(t), p, tip=f"{shown(t)}: {p:.3f}") for t, p in zip(top, prob)]))
    return _table(
        "logit lens: the top next token after each layer, shaded by its probability",
        [shown(t) for t in result["tokens"]],
        rows,
    )


def head_tables(result: dict) -> str:
    diverging = result.get("diverging", False)
    out = []
    for name, table in result["tables"].items():
        scale = (max((abs(v) for row in table for v in row), default=1.0) or 1.0) if diverging else 1.0
        rows = [
            (f"layer {i + 1}", [_cell(f"{v:.2f}", v / scale, diverging, f"{v:.4f}") for v in row])
            for i, row in enumerate(table)
        ]
        out.append(_table(name, [f"head {h + 1}" for h in range(len(table[0]))], rows))
    return "".join(out)


def write_report_html(result: dict, path: str | Path, title: str) -> None:
    """The page of an inspect result (see the module's docstring), by the kind of numbers it holds."""
    if result["kind"] not in PAGES:
        raise AttnlabError(f"--what {result['what']} draws a .png or .svg, or writes .json")
    PAGES[result["kind"]](result, Path(path), title)


def _views_page(result: dict, path: Path, title: str) -> None:
    views = [AttentionView(v["name"], v["queries"], v["keys"], np.asarray(v["weights"])) for v in result["views"]]
    write_attention_html(views, path, title)


def _tables_page(tables: Callable[[dict], str]) -> Callable[[dict, Path, str], None]:
    """A page of tables (the lens's, the heads'), the result's title as a note above them."""

    def write(result: dict, path: Path, title: str) -> None:
        note = f"<p>{html.escape(result['title'])}</p>" if "title" in result else ""
        text = (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{note}{tables(result)}"
            "</body></html>"
        )
        atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    return write


PAGES = {"views": _views_page, "lens": _tables_page(lens_tables), "tables": _tables_page(head_tables)}
