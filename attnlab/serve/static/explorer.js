(() => {
const TASKS = {
  lm: ["Generate", "Type a prompt: the model continues it as it samples. Empty: a new document."],
  classify: ["Classify", "Type a text: each label's probability."],
  tag: ["Tag", "Type a text: a tag for each word."],
  mlm: ["Fill in", "Type a text with [MASK] in it: the likeliest words for each."],
  translate: ["Translate", "Type a source text."],
  image: ["Classify an image", "Choose an image file: its label, and [CLS]'s attention over its patches."],
  caption: ["Caption an image", "Choose an image file: its caption, word by word as it is written, and where "
    + "each word looked (the attention moves as the words come; hover a word to go back to it)."],
};
let runs = [];
const current = () => runs.find((r) => r.name === $("run").value);

// ---- talking to the server: every error body is {"error": "one line"} ----
// A server started with --api-key answers 401 without it: ask once, keep it for this tab.
const withKey = (options = {}) => {
  const key = sessionStorage.getItem("attnlab-key");
  return key ? { ...options, headers: { ...(options.headers || {}), Authorization: `Bearer ${key}` } } : options;
};
async function api(path, options) {
  let response = await fetch(path, withKey(options));
  if (response.status === 401) {
    const key = window.prompt("This server needs its API key (attnlab serve --api-key):");
    if (key) {
      sessionStorage.setItem("attnlab-key", key);
      response = await fetch(path, withKey(options));
    }
  }
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error || message;
  } catch (e) {} // not JSON: keep the status line
  throw new Error(message);
}
const post = (path, body) =>
  api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

function status(id, text, error = false) {
  $(id).textContent = text;
  $(id).classList.toggle("error", error);
}

// An input's number, or undefined when empty (JSON.stringify then leaves the field out: its default).
function number(id) {
  const text = $(id).value.trim();
  return text === "" ? undefined : Number(text);
}

// ---- the run: summary, settings, loss curve ----
async function chooseRun() {
  const r = current(), [title, hint] = TASKS[r.kind] || [r.kind, ""];
  $("run-summary").textContent =
    `${r.family}, ${r.kind}, ${r.parameters.toLocaleString("en")} parameters, step ${r.step}`;
  $("config").textContent = JSON.stringify(r.config, null, 2);
  $("task-title").textContent = $("go").textContent = title;
  $("task-hint").textContent = hint;
  $("sampling").hidden = !r.generates;
  const image = r.reads_images; // an image file, not text
  $("text-input").hidden = image;
  $("image-input").hidden = !image;
  $("attention-go").disabled = image;
  $("attention-hint").textContent = image
    ? "Image runs: the attention over the patches comes with each answer above."
    : "Of the text above (for a GPT, with what it generated): every layer and head.";
  $("attention-views").hidden = true;
  $("live-view").hidden = true;
  $("inside-go").disabled = image;
  const open = { lm: ["lens", "heads", "ablate", "rollout"], translate: ["lens", "rollout"] }[r.kind] || ["rollout"];
  if (r.graphs) open.push("circuit"); // transcoders were given for this run (attnlab serve --transcoders)
  for (const o of $("inside-what").options) o.disabled = !open.includes(o.value);
  if (!open.includes($("inside-what").value) || !r.generates) $("inside-what").value = "rollout";
  $("inside-output").replaceChildren();
  status("inside-status", "");
  $("enlarged").hidden = true;
  $("output").replaceChildren();
  status("status", "");
  status("attention-status", "");
  const rows = await (await api(`/api/runs/${encodeURIComponent(r.name)}/metrics`)).json();
  if (current() === r) drawCurve(rows); // unless another run was chosen meanwhile
}

function svg(tag, attributes, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) el.setAttribute(name, value);
  if (text !== undefined) el.textContent = text;
  return el;
}

// Train loss as a line, validation loss as dots, on shared axes.
function drawCurve(rows) {
  const W = 560, H = 220, left = 52, right = 12, top = 12, bottom = 30;
  const points = (key) => rows.filter((r) => Number.isFinite(r[key])).map((r) => [r.step, r[key]]);
  const train = points("loss"), val = points("val_loss"), all = train.concat(val);
  if (!all.length) {
    return fill($("curve"), [svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no metrics")]);
  }
  const extent = (k) => all.reduce(([lo, hi], p) => [Math.min(lo, p[k]), Math.max(hi, p[k])], [Infinity, -Infinity]);
  const [x0, x1] = extent(0), [y0, y1] = extent(1);
  // Enough digits that the two ends of the y axis differ (2.3026 and 2.3019, not 2.30 twice).
  const digits = Math.min(6, Math.max(3, 2 + Math.ceil(Math.log10(Math.abs(y1) / (y1 - y0 || 1)))));
  const X = (s) => left + ((W - left - right) * (s - x0)) / (x1 - x0 || 1);
  const Y = (v) => H - bottom - ((H - top - bottom) * (v - y0)) / (y1 - y0 || 1);
  const every = Math.max(1, Math.floor(train.length / 2000)); // a long run: 2,000 points draw the same line
  const line = train.filter((_, i) => i % every === 0).map(([s, v]) => `${X(s).toFixed(1)},${Y(v).toFixed(1)}`);
  const parts = [
    svg("rect", { class: "frame", x: left, y: top, width: W - left - right, height: H - top - bottom }),
    svg("polyline", { class: "train", points: line.join(" ") }),
    ...val.map(([s, v]) => svg("circle", { class: "val", cx: X(s), cy: Y(v), r: 3 })),
    svg("text", { x: left - 4, y: top + 10, "text-anchor": "end" }, y1.toPrecision(digits)),
    svg("text", { x: left - 4, y: H - bottom, "text-anchor": "end" }, y0.toPrecision(digits)),
    svg("text", { x: left, y: H - 10 }, `step ${x0}`),
    svg("text", { x: W - right, y: H - 10, "text-anchor": "end" }, `${x1}`),
    svg("text", { x: W / 2, y: H - 10, "text-anchor": "middle" }, "loss: train (line), validation (dots)"),
  ];
  fill($("curve"), parts);
}

// ---- the task ----
// Bars for [[label, probability], ...].
function bars(pairs) {
  return pairs.map(([label, p]) => {
    const row = element("div", "probability-row"), bar = element("div", "probability-bar");
    bar.style.width = `${100 * p}%`;
    const track = element("div");
    track.append(bar);
    row.append(element("span", "", label), track, element("span", "", percent(p)));
    return row;
  });
}

const RENDER = {
  classify: (o) => [element("p", "answer", `${o.label} (${percent(o.probability)})`),
    ...bars(Object.entries(o.probabilities).sort((a, b) => b[1] - a[1]))],
  tag: (o) => o.tokens.map((t) => {
    const box = element("span", "tagged");
    box.title = percent(t.probability);
    box.append(element("span", "word", t.token), element("span", "tag", t.tag));
    return box;
  }),
  mlm: (o) => o.masks.flatMap((m) => [element("p", "answer", `[MASK] at token ${m.position + 1}`),
    ...bars(m.candidates.map((c) => [c.token, c.probability]))]),
  translate: (o) => [element("p", "answer text", o.translation)],
};

// Read NDJSON as it arrives, calling each(object) per line.
async function readLines(response, each) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.trim()) each(JSON.parse(line));
    }
    if (done) return;
  }
}

async function generate(r) {
  const prompt = $("prompt").value;
  const body = { run: r.name, prompt, max_new_tokens: number("max-tokens"), temperature: number("temperature"),
    top_k: number("top-k"), top_p: number("top-p"), seed: number("seed"), attention: $("live").checked };
  const response = await post("/api/generate", body);
  const generated = element("span", "text generated");
  fill($("output"), [element("span", "text prompt-text", prompt), generated]);
  $("output").dataset.prompt = prompt;
  $("live-view").hidden = true;
  await readLines(response, (line) => {
    if (line.error) throw new Error(line.error);
    if (line.prompt_tokens) startLive(line.prompt_tokens);
    if (line.attention) addLive(line.tokens, line.attention);
    if (line.text !== undefined) generated.append(line.text);
    if (line.done) {
      const rate = line.seconds > 0 ? ` (${(line.tokens / line.seconds).toFixed(1)} tokens/s)` : "";
      status("status", `${line.tokens} tokens in ${line.seconds.toFixed(2)} s${rate}, seed ${line.seed}`);
    }
  });
}

// ---- attention while it writes: each generated token with the row that produced it ----
// rows[k]: (L, Tk) for token k, over the Tk tokens before it (the model's window); null for a token
// that came in the same piece as a later one (a character of several byte-level tokens).
const live = { tokens: 0, first: 0, rows: [], hover: null };

function startLive(promptTokens) {
  Object.assign(live, { tokens: promptTokens.length, first: promptTokens.length, rows: [], hover: null });
  $("live-layer").replaceChildren();
  fill($("live-tokens"), promptTokens.map((t, i) => liveToken(t, i)));
  $("live-view").hidden = false;
}

function liveToken(text, i) {
  const span = element("span", "live-token", shown(text));
  span.dataset.index = i;
  span.addEventListener("mouseenter", () => live.rows[i] && ((live.hover = i), shadeLive()));
  span.addEventListener("mouseleave", () => ((live.hover = null), shadeLive()));
  return span;
}

function addLive(tokens, attention) {
  if (!$("live-layer").options.length) {
    attention.forEach((_, l) => option($("live-layer"), l, `layer ${l + 1}`));
    $("live-layer").value = attention.length - 1; // the last layer: closest to the prediction
  }
  tokens.forEach((t, k) => {
    const i = live.tokens++, span = liveToken(t, i);
    span.classList.add("generated");
    $("live-tokens").append(span);
    live.rows[i] = k === tokens.length - 1 ? attention : null;
  });
  shadeLive();
}

// Shade the tokens the chosen (hovered, else newest) token attended to, darkest at its maximum.
function shadeLive() {
  const spans = $("live-tokens").children, k = live.hover ?? live.tokens - 1;
  const row = live.rows[k] && live.rows[k][Number($("live-layer").value)];
  const most = row ? Math.max(...row) || 1 : 1;
  for (const span of spans) {
    const i = Number(span.dataset.index), j = row ? i - (k - row.length) : -1; // row covers k - Tk .. k - 1
    const w = row && j >= 0 && j < row.length ? row[j] : 0;
    span.style.background = w ? `rgba(232, 128, 0, ${(0.8 * w / most).toFixed(3)})` : ""; // text stays legible
    span.title = w ? percent(w) : "";
    span.classList.toggle("newest", i === k);
  }
}

// ---- inside the model: /api/inspect's numbers as shaded tables and maps ----
function table(caption, columns, rows) {
  const t = element("table", "inside-table");
  t.append(element("caption", "", caption));
  const head = element("tr");
  head.append(element("th"), ...columns.map((c) => element("th", "", c)));
  t.append(head, ...rows.map(([name, cells]) => {
    const tr = element("tr");
    tr.append(element("th", "", name), ...cells);
    return tr;
  }));
  return t;
}

// A cell with its text; blue for [0, 1] scores, or blue (-) / red (+) for a change scaled by `scale`.
function cell(text, value, scale = 0, tip = "") {
  const td = element("td", "", text), v = scale ? value / scale : value;
  td.style.background = scale
    ? `rgba(${v > 0 ? "200, 40, 40" : "40, 90, 200"}, ${Math.min(1, Math.abs(v)).toFixed(2)})`
    : `rgba(40, 90, 200, ${Math.min(1, Math.max(0, v)).toFixed(2)})`;
  if (Math.abs(v) > 0.6) td.style.color = "#fff";
  td.title = tip;
  return td;
}

const INSIDE = {
  lens: (o) => [table("logit lens: the top next token after each layer (last layer on top), shaded by its probability",
    o.tokens.map(shown), o.layers.map((name, l) => [name, o.top[l].map((t, i) =>
      cell(shown(t), o.prob[l][i], 0, `${shown(t)}: ${percent(o.prob[l][i])}`))]).reverse())],
  tables: (o) => [element("p", "hint", o.title + (o.loss !== undefined ? ` (loss ${o.loss})` : "")),
    ...Object.entries(o.tables).map(([name, t]) => {
      const scale = o.diverging ? Math.max(...t.flat().map(Math.abs)) || 1 : 0;
      return table(name, t[0].map((_, h) => `head ${h + 1}`),
        t.map((row, l) => [`layer ${l + 1}`, row.map((v) => cell(v.toFixed(2), v, scale, v.toFixed(4)))]));
    })],
  views: (o) => o.views.map(unpack).map((v) => {
    const m = v.weights[0][0], canvas = element("canvas", "rollout-map"), size = Math.min(8, 600 / v.keys.length);
    paint(canvas, m.map((row) => { const most = Math.max(...row) || 1; return row.map((w) => w / most); }));
    canvas.style.width = `${Math.max(1, v.keys.length * size)}px`;
    canvas.style.height = `${Math.max(1, v.queries.length * size)}px`;
    canvas.addEventListener("mousemove", (e) => {
      const i = Math.floor(e.offsetY / size), j = Math.floor(e.offsetX / size);
      if (m[i] && m[i][j] !== undefined) canvas.title = `${shown(v.queries[i])} \u2190 ${shown(v.keys[j])}: ${percent(m[i][j])}`;
    });
    return figure(canvas, `${v.name} (rows: positions, columns: tokens; each row darkest at its maximum)`);
  }),
};

async function inside() {
  const r = current();
  status("inside-status", "computing...");
  try {
    if ($("inside-what").value === "circuit") return await circuit(r);
    const out = await (await post("/api/inspect", { run: r.name, text: shownText(), what: $("inside-what").value })).json();
    fill($("inside-output"), INSIDE[out.kind](out));
    status("inside-status", "");
  } catch (e) {
    status("inside-status", e.message, true);
  }
}

// The graph's own page (interpret/circuits_page.py) in a frame: its script and style stay inside it.
async function circuit(r) {
  const out = await (await post("/api/circuit", { run: r.name, text: shownText() })).json();
  const frame = element("iframe", "circuit-frame");
  frame.srcdoc = out.page;
  fill($("inside-output"), [frame]);
  status("inside-status", `target ${JSON.stringify(out.target)}: replacement ${out.scores.before.replacement_score.toFixed(3)}, ` +
    `completeness ${out.scores.before.completeness_score.toFixed(3)}, ${out.seconds.total.toFixed(1)} s`);
}

async function predictImage(r) {
  const file = $("image").files[0];
  if (!file) throw new Error("choose an image file first");
  const form = new FormData();
  form.append("run", r.name);
  form.append("image", file);
  const out = await (await api("/api/predict_image", { method: "POST", body: form })).json();
  const picture = element("img", "upload");
  picture.src = URL.createObjectURL(file); // the user's own file, read locally
  picture.alt = file.name;
  const figures = element("div", "cls-attention");
  figures.append(figure(picture, file.name));
  if (out.attention) figures.append(...patchMaps(out.attention));
  fill($("output"), [element("p", "answer", `${out.label} (${percent(out.probability)})`),
    ...bars(out.top.map((t) => [t.label, t.probability])), figures]);
}

// A caption as it is written: each word arrives with its attention (L, H, N) and the picture moves to it.
async function captionImage(r) {
  const file = $("image").files[0];
  if (!file) throw new Error("choose an image file first");
  const form = new FormData();
  form.append("run", r.name);
  form.append("image", file);
  const response = await api("/api/caption", { method: "POST", body: form });
  const box = element("div", "caption-view");
  box.innerHTML = `<div class="cap-words"></div><div class="cap-controls"><label>layer <select class="cap-layer">
    </select></label><label>heads <select class="cap-head"></select></label><button class="cap-play" type="button">
    &#9654; play</button><span class="cap-status"></span></div><canvas class="cap-picture"></canvas>
    <div class="cap-panels"></div>`;
  fill($("output"), [box]);
  let data = null, view = null;
  await readLines(response, (line) => {
    if (line.error) throw new Error(line.error);
    if (line.image) data = { ...line.image, words: [], weights: [] };
    if (line.word !== undefined) {
      data.words.push(line.word);
      line.attention.forEach((heads, l) => {
        data.weights[l] = data.weights[l] || heads.map(() => []);
        heads.forEach((row, h) => data.weights[l][h].push(row));
      });
      const keep = view && { layer: view.state.layer, head: view.state.head };
      view = showCaption(data, box);
      if (keep) {
        Object.assign(view.state, keep);
        box.querySelector(".cap-layer").value = String(keep.layer);
        box.querySelector(".cap-head").value = String(keep.head);
      }
      view.select(data.words.length - 1); // the newest word: the attention moves with the writing
    }
    if (line.done) status("status", `"${line.caption}" in ${line.seconds.toFixed(2)} s`);
  });
}

function figure(content, caption) {
  const box = element("figure");
  box.append(content, element("figcaption", "caption", caption));
  return box;
}

// [CLS]'s attention over the patches: one map per layer, the mean of its heads, darkest at its maximum.
function patchMaps({ grid: [rows, cols], weights }) {
  return weights.map((heads, l) => {
    const mean = range(rows).map((i) => range(cols).map((j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
    const most = Math.max(...mean.flat()) || 1;
    const canvas = element("canvas", "patch-map");
    paint(canvas, mean.map((row) => row.map((w) => w / most)));
    return figure(canvas, `[CLS], layer ${l + 1}`);
  });
}

async function run() {
  const r = current();
  if (!r) return;
  $("go").disabled = true;
  status("status", r.generates ? "generating..." : "working...");
  try {
    // The run says where its inputs go (its task's endpoint); generating and captioning write the status last.
    if (r.endpoint === "/api/generate") return await generate(r);
    if (r.endpoint === "/api/caption") return await captionImage(r);
    if (r.endpoint === "/api/predict_image") await predictImage(r);
    else {
      const response = await post("/api/predict", { run: r.name, text: $("prompt").value });
      fill($("output"), RENDER[r.kind](await response.json()));
    }
    status("status", "");
  } catch (e) {
    status("status", e.message, true);
  } finally {
    $("go").disabled = false;
  }
}

// ---- attention: the exported page's views, fed from the server ----
// The text typed, and what a GPT generated from it (if the prompt is still the one it continued).
function shownText() {
  const prompt = $("prompt").value, generated = $("output").querySelector(".generated");
  return prompt + (generated && $("output").dataset.prompt === prompt ? generated.textContent : "");
}

async function attention() {
  const r = current();
  status("attention-status", "computing...");
  try {
    const text = shownText();
    const data = await (await post("/api/attention", { run: r.name, text })).json();
    $("attention-views").hidden = false;
    showAttention(data);
    status("attention-status", "");
  } catch (e) {
    status("attention-status", e.message, true);
  }
}

async function start() {
  try {
    runs = await (await api("/api/runs")).json();
    for (const r of runs) option($("run"), r.name, `${r.name} (${r.kind})`);
    await chooseRun();
  } catch (e) {
    status("status", e.message, true);
  }
}

$("run").addEventListener("change", () => chooseRun().catch((e) => status("status", e.message, true)));
$("go").addEventListener("click", run);
$("prompt").addEventListener("keydown", (e) => e.key === "Enter" && (e.ctrlKey || e.metaKey) && run());
$("attention-go").addEventListener("click", attention);
$("inside-go").addEventListener("click", inside);
$("live-layer").addEventListener("change", shadeLive);
start();
})();
