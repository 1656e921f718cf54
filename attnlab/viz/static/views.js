"use strict";
// Where this view's parts are: the whole document on the exported page and in the explorer; in a
// notebook, where several views share a page, viz/html.py wraps this file in a function that defines
// ATTNLAB_SCOPE: the view's own root element and the prefix of every id in it, so nothing collides.
// box: the element that carries data-focus (the hovered token's index) for tests and styles.
const SCOPE = typeof ATTNLAB_SCOPE === "undefined"
  ? { root: document, prefix: "", box: document.documentElement } : ATTNLAB_SCOPE;
let DATA = { views: [] }; // {views: [{name, queries, keys, weights}]}, as views_json writes it; see showAttention
const ROW = 22; // px per token row: lines are placed by row index, so nothing needs measuring
const CELL = 14; // px per cell of the enlarged heatmap, shared with its axis labels so they line up
const GAP = 220; // px between the query and the key columns, where the lines go
const MIN_LINE = 0.005; // lines under 0.5% are invisible anyway; skipping them keeps long sequences fast
const LONG = 96; // above this many queries, the head view draws only the rows scrolled into view
const THUMB = 128; // thumbnails hold at most THUMB x THUMB pixels, each the largest weight of its block
const ENLARGED = 3000; // px: the enlarged heatmap's cells shrink (to 3 px at least) to stay near this
// Scoped, not document.getElementById: a notebook view may run before its output joins the page.
const $ = (id) => SCOPE.root.querySelector(`#${CSS.escape(SCOPE.prefix + id)}`);
const SVG_NS = $("lines").namespaceURI; // the parser set it: no URL in the page
SCOPE.box.style.setProperty("--row", `${ROW}px`); // one source for the CSS as well
SCOPE.box.style.setProperty("--cell", `${CELL}px`);

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

// A long input's weights come as one byte each (views_json's "weights_u8"): unpack them into the
// nested form the rest reads, [layer][head][query] -> a row of keys (views into one Float32Array).
function unpack(v) {
  if (!v.weights_u8) return v;
  const [L, H, Tq, Tk] = v.shape, bytes = atob(v.weights_u8), all = new Float32Array(bytes.length);
  for (let k = 0; k < bytes.length; k++) all[k] = bytes.charCodeAt(k) / 255;
  const row = (l, h, i) => all.subarray(((l * H + h) * Tq + i) * Tk, ((l * H + h) * Tq + i + 1) * Tk);
  v.weights = range(L).map((l) => range(H).map((h) => range(Tq).map((i) => row(l, h, i))));
  delete v.weights_u8;
  return v;
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
  row.dataset.i = index; // the notebook views' contract (viz/html.py): every token has data-i
  row.title = token;
  const text = element("span", "text", shown(token)), label = element("span", "weight-label");
  if (side === "query") row.append(text, label); // the label faces the lines
  else row.append(label, text);
  // mouseover/mouseout (not enter/leave), so a dispatched mouseover works too; moving between the
  // row's own children changes nothing.
  row.addEventListener("mouseover", () => {
    const f = state.focus;
    if (!f || f.side !== side || f.index !== index) setFocus({ side, index });
  });
  row.addEventListener("mouseout", (e) => row.contains(e.relatedTarget) || setFocus(null));
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
  const queries = f && f.side === "query" ? [f.index] : rowsInView(v.queries.length);
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

// The query rows to draw lines from: all of a short input; of a long one, those scrolled into view
// (and a margin), so that a 1,000-token input draws a few thousand lines rather than a million.
function rowsInView(n) {
  if (n <= LONG) return range(n);
  const pane = $("head-pane"), first = Math.floor(pane.scrollTop / ROW) - 10;
  const last = Math.ceil((pane.scrollTop + pane.clientHeight) / ROW) + 10;
  return range(n).filter((i) => i >= first && i <= last);
}

// With a focused token, every token of the other column shows its weight with it.
function writeLabels() {
  for (const label of SCOPE.root.querySelectorAll(".weight-label")) label.textContent = "";
  for (const row of SCOPE.root.querySelectorAll(".token.active")) row.classList.remove("active");
  const f = state.focus;
  if (!f) return;
  SCOPE.root.querySelector(`.token.${f.side}[data-index="${f.index}"]`).classList.add("active");
  for (const row of SCOPE.root.querySelectorAll(`.token.${f.side === "query" ? "key" : "query"}`)) {
    const other = Number(row.dataset.index);
    const w = f.side === "query" ? weight(f.index, other) : weight(other, f.index);
    row.querySelector(".weight-label").textContent = percent(w);
  }
}

function setFocus(focus) {
  state.focus = focus;
  if (focus) SCOPE.box.dataset.focus = focus.index;
  else delete SCOPE.box.dataset.focus;
  drawLines();
  writeLabels();
}

// ---- model view ----
// White to deep blue, one canvas pixel per cell, or per `step` x `step` block (its largest weight,
// so a thin diagonal survives the shrinking); CSS scales it up without smoothing.
function paint(canvas, m, step = 1) {
  const rows = m.length, cols = rows ? m[0].length : 0;
  const height = Math.ceil(rows / step), width = Math.ceil(cols / step);
  canvas.width = Math.max(width, 1);
  canvas.height = Math.max(height, 1);
  const context = canvas.getContext("2d"), image = context.createImageData(canvas.width, canvas.height);
  const top = new Float32Array(width * height);
  for (let i = 0; i < rows; i++) {
    const r = m[i], base = Math.floor(i / step) * width;
    for (let j = 0; j < cols; j++) if (r[j] > top[base + Math.floor(j / step)]) top[base + Math.floor(j / step)] = r[j];
  }
  for (let k = 0; k < top.length; k++) {
    const w = Math.min(1, top[k]);
    image.data.set([255 * (1 - w), 255 * (1 - 0.8 * w), 255 * (1 - 0.3 * w), 255], 4 * k);
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
      paint(thumb, m, Math.ceil(Math.max(m.length, m[0].length) / THUMB));
      thumb.addEventListener("click", () => {
        choose(l, h);
        enlarge(l, h);
      });
      cells.push(thumb);
    });
  });
  fill(grid, cells);
}

// Token labels along one axis of the enlarged heatmap, `cell` px per token; on a long input every
// step-th token is labelled (its label spans the step cells up to the next), so labels never overlap.
function axis(side, tokens, cell) {
  const div = element("div", `axis ${side}`), step = Math.ceil(CELL / cell);
  const labelled = range(Math.ceil(tokens.length / step)).map((k) => k * step);
  fill(div, labelled.map((k) => {
    const label = element("span", "label", shown(tokens[k]));
    label.title = `${k + 1}: ${tokens[k]}`;
    label.dataset.index = k;
    label.style[side === "key" ? "width" : "height"] = `${cell * Math.min(step, tokens.length - k)}px`;
    return label;
  }));
  return div;
}

function enlarge(l, h) {
  const v = view(), m = v.weights[l][h], box = $("enlarged"), value = $("enlarged-value");
  const cell = Math.max(3, Math.min(CELL, Math.floor(ENLARGED / Math.max(v.queries.length, v.keys.length))));
  Object.assign(box.dataset, { layer: l, head: h });
  $("enlarged-title").textContent = `${v.name}: layer ${l + 1}, head ${h + 1}`;
  value.textContent = "";
  const heatmap = element("canvas", "heatmap");
  paint(heatmap, m);
  heatmap.style.width = `${v.keys.length * cell}px`;
  heatmap.style.height = `${v.queries.length * cell}px`;
  // The cell under the mouse, from its position: one listener instead of Tq x Tk elements.
  heatmap.addEventListener("mousemove", (e) => {
    const i = Math.floor(e.offsetY / cell), j = Math.floor(e.offsetX / cell);
    if (i < 0 || j < 0 || i >= v.queries.length || j >= v.keys.length) return;
    value.textContent = `${shown(v.queries[i])} \u2192 ${shown(v.keys[j])}: ${percent(m[i][j])}`;
    heatmap.title = value.textContent;
  });
  fill($("enlarged-body"), [element("span"), axis("key", v.keys, cell), axis("query", v.queries, cell), heatmap]);
  box.hidden = false;
}

// ---- expert view ----
const expertColour = (e, n, gate = 1) => `hsla(${Math.round((360 * e) / n)}, 70%, 55%, ${0.25 + 0.75 * gate})`;

function buildExperts() {
  const X = DATA.experts;
  $("experts").hidden = !X;
  if (!X) return;
  fill($("expert-legend"), range(X.n).map((e) => {
    const chip = element("span", "expert-chip", `expert ${e}`);
    chip.style.background = expertColour(e, X.n);
    return chip;
  }));
  fill($("expert-layers"), X.experts.map((layer, l) => {
    const row = element("div", "expert-layer");
    row.append(element("div", "caption", `layer ${l + 1}`));
    const text = element("div", "expert-text");
    fill(text, X.tokens.map((token, i) => {
      const span = element("span", "expert-token", token);
      Object.assign(span.dataset, { layer: l, expert: layer[i] });
      span.style.background = expertColour(layer[i], X.n, X.gates[l][i]);
      span.title = `expert ${layer[i]}, gate ${X.gates[l][i]}`;
      return span;
    }));
    row.append(text);
    return row;
  }));
}

// ---- controls ----
function redraw() {
  drawLines();
  writeLabels();
  for (const t of SCOPE.root.querySelectorAll(".thumb")) {
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
  delete SCOPE.box.dataset.focus;
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
  data.views.forEach(unpack);
  DATA = data;
  $("view").replaceChildren();
  DATA.views.forEach((v, k) => option($("view"), k, v.name));
  $("view-control").hidden = DATA.views.length < 2; // one view needs no choice
  showView(0);
  buildExperts();
}

$("view").addEventListener("change", (e) => showView(Number(e.target.value)));
$("layer").addEventListener("change", (e) => choose(Number(e.target.value), state.head));
$("head").addEventListener("change", (e) => {
  const value = e.target.value; // a select's value is a string: "all" or a head's index
  choose(state.layer, value === "all" ? "all" : Number(value));
});
// A long input's lines follow the scrolling, redrawn once per frame at most.
let pending = false;
$("head-pane").addEventListener("scroll", () => {
  if (pending || view().queries.length <= LONG || state.focus) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    drawLines();
  });
});
$("enlarged-close").addEventListener("click", () => ($("enlarged").hidden = true));
document.addEventListener("keydown", (e) => e.key === "Escape" && ($("enlarged").hidden = true));
