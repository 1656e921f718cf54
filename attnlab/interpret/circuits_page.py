"""DIR/graph.json and DIR/graph.html: an attribution graph as numbers and as an offline page.

The page (viz/static/circuits.html and circuits.js: inline SVG and script, no CDN) lays the pruned
graph out by layer (y: embeddings at the bottom, the target logit on top) and position (x, the
prompt's tokens along the bottom); edges are blue where they raise their target and red where they
lower it, wider for larger weights. Hovering a feature shows its top activating contexts from the
run's validation split (found as `attnlab sae show` finds them, sae_page.top_contexts) and the tokens
its decoder row promotes; clicking a node keeps only the paths through it.
"""

from __future__ import annotations

import html
from pathlib import Path

import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.sae import SavedSAE
from attnlab.interpret.sae_page import direct_logits, top_contexts
from attnlab.interpret.transcoder import Transcoder, read_mlp_in
from attnlab.interpret.views import token_labels
from attnlab.io import write_json, write_text
from attnlab.runs.run import Run
from attnlab.viz.html import page, script_json, static_text


def feature_notes(run: Run, data: dict, tcs: list[Transcoder], tokens: int = 16384, m: int = 4) -> dict:
    """For each feature of the graph ("layer:feature"): its top contexts (token texts and the feature's
    activation on each) and the tokens its output promotes most; {} when the run's data is not at hand."""
    wanted: dict[int, list[int]] = {}
    for node in data["nodes"]:
        if node["kind"] == "feature":
            wanted.setdefault(node["layer"], []).append(node["feature"])
    notes: dict[str, dict] = {}
    for layer, feats in wanted.items():
        feats = sorted(set(feats))
        saved = SavedSAE(tcs[layer], {"hook": f"blocks.{layer}.hook_ff_out"})
        try:
            tops = top_contexts(run, saved, feats, tokens, m, reader=read_mlp_in)
        except AttnlabError:
            return {}  # no data to search: the page shows the graph without contexts
        promoted = _promoted(run, tcs[layer], feats)
        for k, f in enumerate(feats):
            contexts = []
            for j in range(tops.values.shape[1]):
                if float(tops.values[k, j]) <= 0:
                    break
                keep = tops.ids[k, j] >= 0
                contexts.append(
                    {
                        "tokens": token_labels(run.tokenizer, tops.ids[k, j][keep].tolist()),
                        "acts": [round(float(a), 3) for a in tops.acts[k, j][keep]],
                    }
                )
            notes[f"{layer}:{f}"] = {"contexts": contexts, "promotes": promoted[k]}
    return notes


@torch.no_grad()
def _promoted(run: Run, tc: Transcoder, feats: list[int], n: int = 5) -> list[list[str]]:
    """The tokens each feature's output row raises most, read through the final norm's gain and the head."""
    effect = direct_logits(run.model, tc.decoder()[0][feats])  # (S, V)
    return [token_labels(run.tokenizer, row.topk(n).indices.tolist()) for row in effect]


def write_circuit(run: Run, data: dict, tcs: list[Transcoder], folder: str | Path, context_tokens: int = 16384) -> Path:
    """FOLDER/graph.json (the numbers) and FOLDER/graph.html (the page, with the features' contexts)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "graph.json", data)
    notes = feature_notes(run, data, tcs, context_tokens)
    text = circuit_page(data, f"attribution graph: {run.path.name}, target {data['target']!r}", notes)
    write_text(out / "graph.html", text)
    return out / "graph.html"


def circuit_page(data: dict, title: str, notes: dict | None = None) -> str:
    """The page's text: the graph `data` (graph.json's) drawn, with the features' notes when given."""
    parts = {
        "TITLE": html.escape(title),
        "STYLE": static_text("page.css") + static_text("circuits.css"),
        "SCRIPT": static_text("circuits.js"),
        "DATA": script_json({**data, "notes": notes or {}}),
    }
    return page("circuits.html", parts)
