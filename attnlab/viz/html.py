"""Attention in the browser: one self-contained HTML page with a head view and a model view.

The head view draws, for one layer and one head (or all heads overlaid, one colour each), a line
from every query token on the left to every key token on the right, as thick and as opaque as the
weight; hovering a token keeps only its lines and writes their weights beside the other column.
The model view shows every layer x head as a thumbnail heatmap; a click enlarges one, with token
labels on both axes, and selects it in the head view. Script, style and data are all inline, so
the page opens from disk with no network and can be archived or mailed as one file.

Shapes: L layers, H heads, Tq query tokens (rows), Tk key tokens (columns).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.engine.rundir import atomic_write

DECIMALS = 4  # weights in the page: 0.01% is finer than any line width or colour step can show


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


def views_json(views: list[AttentionView]) -> dict:
    """The data the page embeds: {"views": [{name, queries, keys, weights (L, H, Tq, Tk) as nested lists}]}."""
    return {
        "views": [
            {
                "name": v.name,
                "queries": v.queries,
                "keys": v.keys,
                "weights": np.round(v.weights, DECIMALS).tolist(),
            }
            for v in views
        ]
    }


def _script_json(data: dict) -> str:
    """JSON safe inside a <script> tag: every "<" written as \\u003c, so no token text can close the
    tag ("</script>") or open an HTML comment ("<!--"); JSON.parse reads the escape back as "<"."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_attention_html(views: list[AttentionView], title: str = "") -> str:
    """The page's text: a head view and a model view of each view, chosen from a select."""
    if not views:
        raise ValueError("no attention to show: pass at least one AttentionView")
    heading = html.escape(title or "attention")
    data = _script_json(views_json(views))
    return PAGE.format(title=heading, style=STYLE, views=VIEWS_HTML, data=data, script=SCRIPT)


def write_attention_html(views: list[AttentionView], path: Path, title: str = "") -> None:
    """Write the page to path (atomically: a reader never sees half a file)."""
    text = render_attention_html(views, title)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


# The page: VIEWS_HTML, STYLE and VIEWS_SCRIPT are the head view and the model view, shared with
# `attnlab serve`'s page, which calls showAttention(data) with each answer of /api/attention.
# Ids and classes a test or a reader can rely on:
#   #view, #layer, #head                 the selects (#head has "all" plus one value per head)
#   .token.query / .token.key [data-index]  the token rows of the head view, each with a .weight-label
#   #lines                                the svg; each line.line has data-query, data-key, data-head
#   .thumb[data-layer][data-head]         the model view's canvases; .selected marks the head view's choice
#   #enlarged[data-layer][data-head]      the enlarged heatmap (hidden until a thumb is clicked): .axis.query and
#                                         .axis.key hold .label[data-index] spans, #enlarged-value the hovered cell
VIEWS_HTML = """\
<div id="controls">
  <label id="view-control">view <select id="view"></select></label>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
</div>
<main>
<section id="head-view">
  <h2>Head view</h2>
  <p class="hint">Hover a token to keep only its lines and see its weights. With all heads, labels show their mean.</p>
  <div class="column-titles"><span>queries</span><span>keys</span></div>
  <div id="head-pane">
    <div id="queries" class="column"></div><svg id="lines"></svg><div id="keys" class="column"></div>
  </div>
</section>
<section id="model-view">
  <h2>Model view</h2>
  <p class="hint">Layers down, heads across. Click a head to enlarge it and show it in the head view.</p>
  <div id="thumbs"></div>
</section>
</main>
<div id="enlarged" hidden>
  <div class="bar">
    <strong id="enlarged-title"></strong><span id="enlarged-value"></span>
    <button id="enlarged-close" type="button">close</button>
  </div>
  <div id="enlarged-body"></div>
</div>
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
{views}<script type="application/json" id="attention-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1em 2em; color: #222; }
[hidden] { display: none !important; }
#controls { display: flex; gap: 1.5em; margin-bottom: 1em; }
main { display: flex; flex-wrap: wrap; gap: 3em; align-items: flex-start; }
.hint { color: #666; font-size: 12px; max-width: 40em; }
.column-titles { display: flex; justify-content: space-between; color: #666; font-size: 12px; }
#head-pane { display: flex; align-items: flex-start; max-height: 75vh; overflow: auto; width: max-content; }
.column { flex: none; }
.token { height: var(--row); line-height: var(--row); display: flex; gap: 0.4em; cursor: default; }
.token.query { justify-content: flex-end; }
.token .text { max-width: 12em; overflow: hidden; text-overflow: ellipsis; white-space: pre; font-family: monospace; }
.token.active .text { background: #ffe08a; }
.weight-label { min-width: 3.2em; font-size: 11px; color: #a33; }
.token.query .weight-label { text-align: right; }
#thumbs { display: grid; gap: 4px; align-items: center; max-height: 75vh; overflow: auto; }
.caption { font-size: 11px; color: #666; white-space: nowrap; }
.thumb { width: 56px; height: 56px; image-rendering: pixelated; border: 1px solid #ccc; cursor: pointer; }
.thumb.selected { outline: 2px solid #e80; }
#enlarged { position: fixed; inset: 4vh 4vw; background: #fff; border: 1px solid #999;
  box-shadow: 0 4px 24px #0004; display: flex; flex-direction: column; padding: 0.8em; }
#enlarged .bar { display: flex; gap: 1.5em; align-items: center; margin-bottom: 0.5em; }
#enlarged-close { margin-left: auto; }
#enlarged-body { overflow: auto; display: grid; grid-template-columns: max-content max-content; }
.axis { display: flex; font: 11px monospace; }
.axis.key { flex-direction: row; align-items: flex-end; }
.axis.query { flex-direction: column; }
.axis .label { overflow: hidden; white-space: pre; width: var(--cell); height: var(--cell); line-height: var(--cell); }
.axis.key .label { writing-mode: vertical-rl; transform: rotate(180deg); height: auto; max-height: 10em; }
.axis.query .label { width: auto; max-width: 12em; text-align: right; padding-right: 4px; }
.heatmap { image-rendering: pixelated; }
"""

VIEWS_SCRIPT = r"""
"use strict";
let DATA = { views: [] }; // {views: [{name, queries, keys, weights}]}, as views_json writes it; see showAttention
const ROW = 22; // px per token row: lines are placed by row index, so nothing needs measuring
const CELL = 14; // px per cell of the enlarged heatmap, shared with its axis labels so they line up
const GAP = 220; // px between the query and the key columns, where the lines go
const MIN_LINE = 0.005; // lines under 0.5% are invisible anyway; skipping them keeps long sequences fast
const SVG_NS = document.getElementById("lines").namespaceURI; // the parser set it: no URL in the page
const $ = (id) => document.getElementById(id);
document.documentElement.style.setProperty("--row", `${ROW}px`); // one source for the CSS as well
document.documentElement.style.setProperty("--cell", `${CELL}px`);

// head: "all" or a head index; focus: the hovered token, {side: "query" | "key", index}, or null
const state = { view: 0, layer: 0, head: "all", focus: null };
const view = () => DATA.views[state.view];
const nHeads = () => view().weights[0].length;
const range = (n) => [...Array(n).keys()];
const shownHeads = () => (state.head === "all" ? range(nHeads()) : [state.head]);
const colour = (h) => `hsl(${Math.round((360 * h) / nHeads())}, 70%, 42%)`;
const percent = (w) => `${(100 * w).toFixed(w < 0.1 ? 1 : 0)}%`;
// Newlines and tabs are spelled out so that a token stays on its one row.
const shown = (token) => token.replace(/\n/g, "\\n").replace(/\t/g, "\\t");

// The weight of query i on key j in the chosen layer: one head's, or the mean over all heads.
function weight(i, j) {
  const W = view().weights[state.layer], heads = shownHeads();
  return heads.reduce((sum, h) => sum + W[h][i][j], 0) / heads.length;
}

// Children go in through a fragment, not spread arguments, which engines cap in number.
function fill(parent, children) {
  const fragment = document.createDocumentFragment();
  for (const child of children) fragment.append(child);
  parent.replaceChildren(fragment);
}

// Token text is only ever set as textContent or an attribute, never parsed as HTML.
function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function option(select, value, label) {
  const o = element("option", "", label);
  o.value = value;
  select.append(o);
}

// ---- head view ----
function tokenRow(side, index, token) {
  const row = element("div", `token ${side}`);
  row.dataset.index = index;
  row.title = token;
  const text = element("span", "text", shown(token)), label = element("span", "weight-label");
  if (side === "query") row.append(text, label); // the label faces the lines
  else row.append(label, text);
  row.addEventListener("mouseenter", () => setFocus({ side, index }));
  row.addEventListener("mouseleave", () => setFocus(null));
  return row;
}

function buildTokens() {
  const v = view(), svg = $("lines");
  fill($("queries"), v.queries.map((t, i) => tokenRow("query", i, t)));
  fill($("keys"), v.keys.map((t, j) => tokenRow("key", j, t)));
  svg.setAttribute("width", GAP);
  svg.setAttribute("height", Math.max(v.queries.length, v.keys.length, 1) * ROW);
}

// One line per (head, query, key) of the chosen layer; with a focused token, only its lines.
function drawLines() {
  const v = view(), W = v.weights[state.layer], f = state.focus;
  const queries = f && f.side === "query" ? [f.index] : range(v.queries.length);
  const keys = f && f.side === "key" ? [f.index] : range(v.keys.length);
  const lines = [];
  for (const h of shownHeads())
    for (const i of queries)
      for (const j of keys) {
        const w = W[h][i][j];
        if (w < MIN_LINE) continue;
        const line = document.createElementNS(SVG_NS, "line");
        const attributes = { x1: 0, y1: (i + 0.5) * ROW, x2: GAP, y2: (j + 0.5) * ROW, stroke: colour(h) };
        attributes["stroke-width"] = 0.5 + 3 * w;
        attributes["stroke-opacity"] = 0.1 + 0.9 * w;
        for (const [name, value] of Object.entries(attributes)) line.setAttribute(name, value);
        line.setAttribute("class", "line");
        Object.assign(line.dataset, { query: i, key: j, head: h });
        lines.push(line);
      }
  fill($("lines"), lines);
}

// With a focused token, every token of the other column shows its weight with it.
function writeLabels() {
  for (const label of document.querySelectorAll(".weight-label")) label.textContent = "";
  for (const row of document.querySelectorAll(".token.active")) row.classList.remove("active");
  const f = state.focus;
  if (!f) return;
  document.querySelector(`.token.${f.side}[data-index="${f.index}"]`).classList.add("active");
  for (const row of document.querySelectorAll(`.token.${f.side === "query" ? "key" : "query"}`)) {
    const other = Number(row.dataset.index);
    const w = f.side === "query" ? weight(f.index, other) : weight(other, f.index);
    row.querySelector(".weight-label").textContent = percent(w);
  }
}

function setFocus(focus) {
  state.focus = focus;
  drawLines();
  writeLabels();
}

// ---- model view ----
// One canvas pixel per cell, white to deep blue; CSS scales it up without smoothing.
function paint(canvas, m) {
  const rows = m.length, cols = rows ? m[0].length : 0;
  canvas.width = Math.max(cols, 1);
  canvas.height = Math.max(rows, 1);
  const context = canvas.getContext("2d"), image = context.createImageData(canvas.width, canvas.height);
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) {
      const w = Math.min(1, Math.max(0, m[i][j]));
      image.data.set([255 * (1 - w), 255 * (1 - 0.8 * w), 255 * (1 - 0.3 * w), 255], 4 * (i * cols + j));
    }
  context.putImageData(image, 0, 0);
}

function buildThumbs() {
  const grid = $("thumbs"), cells = [element("span")];
  grid.style.gridTemplateColumns = `auto repeat(${nHeads()}, max-content)`;
  for (const h of range(nHeads())) cells.push(element("span", "caption", `head ${h + 1}`));
  view().weights.forEach((layer, l) => {
    cells.push(element("span", "caption", `layer ${l + 1}`));
    layer.forEach((m, h) => {
      const thumb = element("canvas", "thumb");
      Object.assign(thumb.dataset, { layer: l, head: h });
      thumb.title = `layer ${l + 1}, head ${h + 1}`;
      paint(thumb, m);
      thumb.addEventListener("click", () => {
        choose(l, h);
        enlarge(l, h);
      });
      cells.push(thumb);
    });
  });
  fill(grid, cells);
}

// Token labels along one axis of the enlarged heatmap, one CELL per token.
function axis(side, tokens) {
  const div = element("div", `axis ${side}`);
  fill(div, tokens.map((t, k) => {
    const label = element("span", "label", shown(t));
    label.title = t;
    label.dataset.index = k;
    return label;
  }));
  return div;
}

function enlarge(l, h) {
  const v = view(), m = v.weights[l][h], box = $("enlarged"), value = $("enlarged-value");
  Object.assign(box.dataset, { layer: l, head: h });
  $("enlarged-title").textContent = `${v.name}: layer ${l + 1}, head ${h + 1}`;
  value.textContent = "";
  const heatmap = element("canvas", "heatmap");
  paint(heatmap, m);
  heatmap.style.width = `${v.keys.length * CELL}px`;
  heatmap.style.height = `${v.queries.length * CELL}px`;
  // The cell under the mouse, from its position: one listener instead of Tq x Tk elements.
  heatmap.addEventListener("mousemove", (e) => {
    const i = Math.floor(e.offsetY / CELL), j = Math.floor(e.offsetX / CELL);
    if (i < 0 || j < 0 || i >= v.queries.length || j >= v.keys.length) return;
    value.textContent = `${shown(v.queries[i])} \u2192 ${shown(v.keys[j])}: ${percent(m[i][j])}`;
    heatmap.title = value.textContent;
  });
  fill($("enlarged-body"), [element("span"), axis("key", v.keys), axis("query", v.queries), heatmap]);
  box.hidden = false;
}

// ---- controls ----
function redraw() {
  drawLines();
  writeLabels();
  for (const t of document.querySelectorAll(".thumb")) {
    const sameHead = state.head === "all" || Number(t.dataset.head) === state.head;
    t.classList.toggle("selected", Number(t.dataset.layer) === state.layer && sameHead);
  }
}

function choose(layer, head) {
  Object.assign(state, { layer, head });
  $("layer").value = layer;
  $("head").value = head;
  redraw();
}

function showView(index) {
  Object.assign(state, { view: index, focus: null });
  $("enlarged").hidden = true;
  $("layer").replaceChildren();
  $("head").replaceChildren();
  view().weights.forEach((_, l) => option($("layer"), l, `layer ${l + 1}`));
  option($("head"), "all", "all heads");
  for (const h of range(nHeads())) option($("head"), h, `head ${h + 1}`);
  buildTokens();
  buildThumbs();
  choose(0, "all"); // views may differ in layers and heads: start each at its first layer
}

// Show new attention data (views_json's); the controls' listeners below are set up once.
function showAttention(data) {
  DATA = data;
  $("view").replaceChildren();
  DATA.views.forEach((v, k) => option($("view"), k, v.name));
  $("view-control").hidden = DATA.views.length < 2; // one view needs no choice
  showView(0);
}

$("view").addEventListener("change", (e) => showView(Number(e.target.value)));
$("layer").addEventListener("change", (e) => choose(Number(e.target.value), state.head));
$("head").addEventListener("change", (e) => {
  const value = e.target.value; // a select's value is a string: "all" or a head's index
  choose(state.layer, value === "all" ? "all" : Number(value));
});
$("enlarged-close").addEventListener("click", () => ($("enlarged").hidden = true));
document.addEventListener("keydown", (e) => e.key === "Escape" && ($("enlarged").hidden = true));
"""

# The exported page's data sits in a JSON tag and is parsed, never evaluated, so token text cannot run as code.
SCRIPT = VIEWS_SCRIPT + 'showAttention(JSON.parse(document.getElementById("attention-data").textContent));\n'
