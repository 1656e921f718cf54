"""Small summaries a notebook shows inline (`_repr_html_`, `__repr__`): facts as a table, a loss
curve as inline SVG, a list of named shapes. Strings in, strings out: the objects that own the
facts (a Run, a Trace) gather them and call these.

Everything is inline (no script, no file, no network), so it shows the same in Jupyter, in a page
nbconvert or mkdocs-jupyter wrote, and in a notebook opened untrusted.
"""

from __future__ import annotations

import html

import numpy as np

WIDTH, HEIGHT, PAD = 360, 150, 34  # px of the curve's box, and its margin for the axis labels
MAX_POINTS = 400  # a longer train curve is averaged down to this many points: a path stays small


def facts_text(title: str, facts: dict[str, str]) -> str:
    """A title line and one aligned line per fact, as a repr in a terminal shows them."""
    width = max((len(k) for k in facts), default=0)
    return "\n".join([title, *(f"  {k.ljust(width)}  {v}" for k, v in facts.items())])


def facts_html(title: str, facts: dict[str, str], picture: str = "", css_class: str = "attnlab-card") -> str:
    """A title, a two-column table of facts and an optional picture (HTML, e.g. curve_svg's) beside it."""
    rows = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{html.escape(k)}</th>'
        f'<td style="text-align:left">{html.escape(v)}</td></tr>'
        for k, v in facts.items()
    )
    side = f'<div class="attnlab-picture">{picture}</div>' if picture else ""
    return (
        f'<div class="{css_class}" style="display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap">'
        f"<div><strong>{html.escape(title)}</strong><table>{rows}</table></div>{side}</div>"
    )


def _averaged(points: np.ndarray, n: int) -> np.ndarray:
    """(N, 2) points as at most n, each the mean of an equal run of neighbours."""
    if len(points) <= n:
        return points
    return np.stack([chunk.mean(axis=0) for chunk in np.array_split(points, n)])


def curve_svg(train: list[tuple[float, float]], val: list[tuple[float, float]], label: str = "loss") -> str:
    """Train loss (a line) and validation loss (dots) over steps, as one inline <svg class="attnlab-curve">;
    "" when there is nothing to draw."""
    if not train and not val:
        return ""
    t = _averaged(np.asarray(train, dtype=float).reshape(-1, 2), MAX_POINTS)
    v = np.asarray(val, dtype=float).reshape(-1, 2)
    both = np.concatenate([t, v])
    (x0, y0), (x1, y1) = both.min(axis=0), both.max(axis=0)
    sx = (WIDTH - 2 * PAD) / max(x1 - x0, 1e-12)
    sy = (HEIGHT - 2 * PAD) / max(y1 - y0, 1e-12)

    def xy(p: np.ndarray) -> str:  # step, loss -> px; the y axis points down in SVG
        return f"{PAD + (p[0] - x0) * sx:.1f},{HEIGHT - PAD - (p[1] - y0) * sy:.1f}"

    parts = [
        f'<rect x="{PAD}" y="{PAD}" width="{WIDTH - 2 * PAD}" height="{HEIGHT - 2 * PAD}" fill="none" stroke="#ccc"/>'
    ]
    if len(t) > 1:
        parts.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{" ".join(map(xy, t))}"/>')
    dots = [(p, "#1f77b4") for p in t] if len(t) == 1 else []
    dots += [(p, "#ff7f0e") for p in v]
    parts += [f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{c}"/>' for p, c in dots for cx, cy in [xy(p).split(",")]]
    text = 'font-size="10" fill="#555"'
    legend = '<tspan fill="#1f77b4">train</tspan>' + (' <tspan fill="#ff7f0e">validation</tspan>' if len(v) else "")
    parts += [
        f'<text x="{PAD - 3}" y="{PAD + 4}" text-anchor="end" {text}>{y1:.3g}</text>',
        f'<text x="{PAD - 3}" y="{HEIGHT - PAD}" text-anchor="end" {text}>{y0:.3g}</text>',
        f'<text x="{PAD}" y="{HEIGHT - PAD + 12}" {text}>{x0:.0f}</text>',
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 12}" text-anchor="end" {text}>step {x1:.0f}</text>',
        f'<text x="{PAD}" y="{PAD - 8}" {text}>{html.escape(label)}: {legend}</text>',
    ]
    return (
        f'<svg class="attnlab-curve" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(label)} curve">'
        f"<title>{html.escape(label)} over training steps</title>{''.join(parts)}</svg>"
    )


def shapes_text(rows: list[tuple[str, str]], limit: int = 40) -> list[str]:
    """Aligned "name  shape" lines; past `limit`, the first and last ones and how many were left out."""
    width = max((len(n) for n, _ in rows), default=0)
    lines = [f"  {n.ljust(width)}  {s}" for n, s in rows]
    if len(lines) <= limit:
        return lines
    half = limit // 2
    return [*lines[:half], f"  ... {len(lines) - 2 * half} more ...", *lines[-half:]]


def shapes_html(title: str, rows: list[tuple[str, str]]) -> str:
    """A folded table of names and shapes (a <details> a reader opens), title as its summary."""
    body = "".join(f"<tr><td><code>{html.escape(n)}</code></td><td>{html.escape(s)}</td></tr>" for n, s in rows)
    return (
        f'<details class="attnlab-points"><summary>{html.escape(title)}</summary>'
        f"<table><tr><th>point</th><th>shape</th></tr>{body}</table></details>"
    )
