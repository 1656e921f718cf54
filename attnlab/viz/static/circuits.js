// An attribution graph (attnlab circuits): nodes by layer (y) and position (x), edges by sign and weight.
// The data is graph.json's, with "notes": each feature's top contexts and promoted tokens.
const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function esc(text) {
  const d = document.createElement("div");
  d.textContent = text;
  return d.innerHTML;
}

function layout(data) {
  // x: a column per position, the nodes of one (layer, position) cell side by side; y: a row per layer
  const T = data.tokens.length, L = data.layers;
  const colW = Math.max(56, Math.min(120, 1100 / T)), rowH = 92, left = 48, top = 30;
  const cells = {};
  for (const n of data.nodes) (cells[n.layer + ":" + n.pos] ||= []).push(n);
  for (const group of Object.values(cells)) {
    group.sort((a, b) => (a.kind === "error") - (b.kind === "error") || b.influence - a.influence);
    const step = Math.min(15, (colW * 0.85) / group.length);
    group.forEach((n, k) => {
      n.x = left + (n.pos + 0.5) * colW + (k - (group.length - 1) / 2) * step;
      n.y = top + (L - n.layer) * rowH;
    });
  }
  return { width: left + T * colW + 10, height: top + (L + 1) * rowH + 40, colW, rowH, left, top };
}

function showCircuit(data) {
  const svg = document.getElementById("graph"), info = document.getElementById("info");
  const sc = data.scores, iv = data.intervention;
  const pct = (x) => (x === null || Number.isNaN(x) ? "n/a" : (100 * x).toFixed(1) + "%");
  document.getElementById("summary").innerHTML =
    `<span>target <b>${esc(JSON.stringify(data.target))}</b></span>` +
    `<span>${data.counts.nodes} nodes, ${data.counts.edges} edges (of ${data.counts.active_features} active features)</span>` +
    `<span>replacement ${sc.before.replacement_score.toFixed(3)} / pruned ${sc.after.replacement_score.toFixed(3)}</span>` +
    `<span>completeness ${sc.before.completeness_score.toFixed(3)} / pruned ${sc.after.completeness_score.toFixed(3)}</span>` +
    `<span>intervention signs right: ${pct(iv.replacement_right)} (replacement model), ${pct(iv.real_right)} (real model)</span>`;
  const g = layout(data);
  svg.setAttribute("width", g.width);
  svg.setAttribute("height", g.height);
  const byId = {};
  for (const n of data.nodes) byId[n.id] = n;
  // row labels and the prompt's tokens
  for (let l = -1; l <= data.layers; l++) {
    const label = l < 0 ? "emb" : l === data.layers ? "logit" : "L" + l;
    el("text", { x: 4, y: g.top + (data.layers - l) * g.rowH + 4, class: "lay" }, svg).textContent = label;
  }
  data.tokens.forEach((t, i) => {
    const x = g.left + (i + 0.5) * g.colW, y = g.top + (data.layers + 1) * g.rowH + 26;  // below the embeddings
    const e = el("text", { x, y, class: "tok", "text-anchor": "middle" }, svg);
    e.textContent = t.length > 9 ? t.slice(0, 8) + "…" : t;
  });
  const maxW = Math.max(1e-12, ...data.edges.map((e) => Math.abs(e[2])));
  const edgeEls = data.edges.map(([s, t, w]) => {
    const a = byId[s], b = byId[t];
    const midY = (a.y + b.y) / 2;
    return el("path", {
      d: `M${a.x},${a.y} C${a.x},${midY} ${b.x},${midY} ${b.x},${b.y}`, fill: "none",
      stroke: w >= 0 ? "#2b6cb0" : "#c53030", "stroke-width": (0.4 + 4.5 * Math.abs(w) / maxW).toFixed(2),
      "stroke-opacity": 0.55,
    }, svg);
  });
  const maxI = Math.max(1e-12, ...data.nodes.filter((n) => n.kind === "feature").map((n) => n.influence));
  const nodeEls = {};
  for (const n of data.nodes) {
    let e;
    if (n.kind === "feature") {
      e = el("circle", { cx: n.x, cy: n.y, r: (3 + 6 * Math.sqrt(n.influence / maxI)).toFixed(1), fill: "#f6ad55", stroke: "#9c4221" }, svg);
    } else if (n.kind === "error") {
      e = el("rect", { x: n.x - 4, y: n.y - 4, width: 8, height: 8, fill: "#a0aec0", stroke: "#4a5568" }, svg);
    } else if (n.kind === "embedding") {
      e = el("rect", { x: n.x - 6, y: n.y - 6, width: 12, height: 12, fill: "#68d391", stroke: "#276749" }, svg);
    } else {
      e = el("polygon", { points: `${n.x},${n.y - 10} ${n.x + 10},${n.y} ${n.x},${n.y + 10} ${n.x - 10},${n.y}`, fill: "#b794f4", stroke: "#553c9a" }, svg);
    }
    e.classList.add("node");
    e.addEventListener("mouseenter", () => (info.innerHTML = describe(n, data)));
    e.addEventListener("click", (ev) => { ev.stopPropagation(); highlight(n.id); });
    nodeEls[n.id] = e;
  }
  function highlight(id) {
    // every node upstream and downstream of id through the kept edges
    const up = new Set([id]), down = new Set([id]);
    for (let changed = true; changed; ) {
      changed = false;
      for (const [s, t] of data.edges) {
        if (up.has(t) && !up.has(s)) { up.add(s); changed = true; }
        if (down.has(s) && !down.has(t)) { down.add(t); changed = true; }
      }
    }
    const on = new Set([...up, ...down]);
    for (const [k, e] of Object.entries(nodeEls)) e.classList.toggle("dim", !on.has(+k));
    data.edges.forEach(([s, t], k) => edgeEls[k].classList.toggle("dim", !((up.has(s) && up.has(t)) || (down.has(s) && down.has(t)))));
  }
  svg.addEventListener("click", () => {
    for (const e of [...Object.values(nodeEls), ...edgeEls]) e.classList.remove("dim");
  });
}

function describe(n, data) {
  const tok = esc(JSON.stringify(data.tokens[n.pos] ?? ""));
  const inf = `influence on the target ${n.influence.toFixed(4)}`;
  if (n.kind === "embedding") return `<b>embedding</b> of ${tok} (position ${n.pos})<br>${inf}`;
  if (n.kind === "error") return `<b>error node</b>, layer ${n.layer}, position ${n.pos} ${tok}<br>|error| ${n.norm.toFixed(3)}; ${inf}`;
  if (n.kind === "logit") return `<b>target</b> ${esc(JSON.stringify(data.target))}: ${esc(data.metric)} = ${n.value.toFixed(3)} (bias ${n.bias.toFixed(3)})`;
  let out = `<b>feature ${n.feature}</b>, layer ${n.layer}, position ${n.pos} ${tok}<br>activation ${n.activation.toFixed(3)}; ${inf}`;
  const note = (data.notes || {})[n.layer + ":" + n.feature];
  if (!note) return out;
  out += `<br>promotes: ${note.promotes.map((t) => esc(JSON.stringify(t))).join(", ")}<br>top contexts:`;
  for (const c of note.contexts) {
    const peak = Math.max(1e-9, ...c.acts);
    out += '<div class="ctx">' + c.tokens.map((t, i) =>
      `<span style="background:rgba(255,140,0,${Math.max(0, c.acts[i] / peak).toFixed(2)})" title="${c.acts[i]}">${esc(t)}</span>`).join("") + "</div>";
  }
  return out;
}
