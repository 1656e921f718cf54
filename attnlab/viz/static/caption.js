// Where each word of a caption looked: the image with one word's cross-attention laid on it.
// Used by the caption page (caption.html) and by the explorer, which feeds it words as they come.
// data: {height, width, pixels (base64, one byte per pixel, row-major, 255 = ink), grid: [rows, cols],
//        words: [...], weights: [layer][head][word][patch], model}
"use strict";

function captionPixels(data) {
  const raw = atob(data.pixels);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// The weight of every patch for (layer, head) of one word; head "mean" averages the heads.
function patchWeights(data, layer, head, word) {
  const heads = data.weights[layer];
  if (head !== "mean") return heads[head][word];
  const n = heads[0][word].length;
  const mean = new Array(n).fill(0);
  for (const h of heads) for (let j = 0; j < n; j++) mean[j] += h[word][j] / heads.length;
  return mean;
}

// Draw the image (ink dark on white) at `scale` screen pixels per pixel, reddened by the weights
// (scaled to their maximum, so a spread-out attention still shows where it leans).
function drawCaptionCell(canvas, data, ink, weights, scale) {
  const [rows, cols] = data.grid, ph = data.height / rows, pw = data.width / cols;
  canvas.width = data.width * scale;
  canvas.height = data.height * scale;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(data.width, data.height);
  const top = weights ? Math.max(...weights, 1e-9) : 1;
  for (let y = 0; y < data.height; y++) {
    for (let x = 0; x < data.width; x++) {
      const i = y * data.width + x, g = 255 - ink[i];
      const w = weights ? weights[Math.floor(y / ph) * cols + Math.floor(x / pw)] / top : 0;
      img.data.set([g + (255 - g) * w * 0.85, g * (1 - 0.75 * w), g * (1 - 0.75 * w), 255], 4 * i);
    }
  }
  const small = document.createElement("canvas");
  small.width = data.width;
  small.height = data.height;
  small.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(small, 0, 0, canvas.width, canvas.height);
}

function showCaption(data, root) {
  const $ = (sel) => root.querySelector(sel);
  const ink = captionPixels(data);
  const state = {layer: data.weights.length - 1, head: "mean", word: 0, timer: null};
  const layerSel = $(".cap-layer"), headSel = $(".cap-head"), words = $(".cap-words");
  layerSel.innerHTML = data.weights.map((_, l) => `<option value="${l}">layer ${l + 1}</option>`).join("");
  const nHead = data.weights[0].length;
  headSel.innerHTML = `<option value="mean">mean of heads</option>` +
    Array.from({length: nHead}, (_, h) => `<option value="${h}">head ${h + 1}</option>`).join("");
  layerSel.value = String(state.layer);
  words.replaceChildren(...data.words.map((w, t) => {
    const span = document.createElement("span");
    span.className = "cap-word";
    span.dataset.index = t;
    span.textContent = w;
    span.addEventListener("mouseenter", () => select(t));
    span.addEventListener("click", () => select(t));
    return span;
  }));
  function select(t) {
    state.word = t;
    draw();
  }
  function draw() {
    const big = $(".cap-picture");
    const scale = Math.max(2, Math.floor(Math.min(720, root.clientWidth || 720) / data.width));
    drawCaptionCell(big, data, ink, patchWeights(data, state.layer, state.head, state.word), scale);
    big.dataset.word = state.word;
    for (const s of words.children) s.classList.toggle("active", Number(s.dataset.index) === state.word);
    $(".cap-status").textContent = `"${data.words[state.word]}": layer ${state.layer + 1}, ` +
      (state.head === "mean" ? "mean of heads" : `head ${state.head + 1}`);
  }
  layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); draw(); panels(); });
  headSel.addEventListener("change", () => {
    state.head = headSel.value === "mean" ? "mean" : Number(headSel.value);
    draw();
  });
  $(".cap-play").addEventListener("click", () => {
    clearInterval(state.timer);
    let t = 0;
    select(0);
    state.timer = setInterval(() => {
      t += 1;
      if (t >= data.words.length) return clearInterval(state.timer);
      select(t);
    }, 600);
  });
  // Small multiples of the chosen layer: a row for the mean and one per head, a column per word.
  function panels() {
    const grid = $(".cap-panels");
    if (!grid) return;
    const heads = ["mean", ...Array.from({length: nHead > 1 ? nHead : 0}, (_, h) => h)];
    grid.style.gridTemplateColumns = `max-content repeat(${data.words.length}, max-content)`;
    const cells = [document.createElement("span")];
    for (const w of data.words) {
      const title = document.createElement("span");
      title.className = "cap-title";
      title.textContent = w;
      cells.push(title);
    }
    for (const h of heads) {
      const name = document.createElement("span");
      name.className = "cap-title";
      name.textContent = h === "mean" ? `layer ${state.layer + 1}: mean` : `head ${h + 1}`;
      cells.push(name);
      data.words.forEach((_, t) => {
        const c = document.createElement("canvas");
        c.className = "cap-panel";
        c.dataset.head = h;
        c.dataset.word = t;
        drawCaptionCell(c, data, ink, patchWeights(data, state.layer, h, t), 3);
        c.addEventListener("click", () => { state.head = h; headSel.value = String(h); select(t); });
        cells.push(c);
      });
    }
    grid.replaceChildren(...cells);
  }
  draw();
  panels();
  return {select, state};
}
