"""One attribution graph of a run, end to end: `attnlab.interpret.circuits_run.trace_circuit`.

    tcs, _ = load_transcoders("out/transcoders")       # or train_transcoders(run, SAEConfig(...))
    result = trace_circuit(run, "def add(a, b):\\n    return a", " +", tcs)
    result.data["scores"]                                # replacement and completeness, before/after pruning
    write_circuit(run, result, "out")                    # out/graph.json and out/graph.html

The graph (circuits.py), its scores and pruning (circuits_graph.py), the intervention check
(circuits_check.py), and the JSON the page (circuits_page.py) draws.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError
from attnlab.interpret.circuits import Attribution, attribute
from attnlab.interpret.circuits_check import intervention_check
from attnlab.interpret.circuits_config import CircuitConfig
from attnlab.interpret.circuits_graph import Pruned, prune
from attnlab.interpret.circuits_page import circuit_page
from attnlab.interpret.transcoder import Transcoder, decoder_blocks
from attnlab.interpret.views import token_labels
from attnlab.runs.run import Run


@dataclass
class Circuit:
    attribution: Attribution
    pruned: Pruned
    data: dict  # what graph.json holds

    def _repr_html_(self) -> str:
        """A notebook shows the graph's page inline, in a frame of its own so that its script and style
        stay inside it (without the features' top contexts: write_circuit's page has them)."""
        page = circuit_page(self.data, f"attribution graph, target {self.data['target']!r}")
        return (
            f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: 680px; border: 0"></iframe>'
        )


def prompt_ids(run: Run, prompt: str) -> torch.Tensor:
    """The prompt's ids (1, T), refused in one line when empty or longer than the context."""
    decoder_blocks(run.model)  # a decoder, or one line saying it is not
    if run.tokenizer is None:
        raise AttnlabError(f"{run.path} has no tokenizer: an attribution graph reads a text prompt")
    ids = run.tokenizer.encode(prompt)
    if not ids:
        raise AttnlabError("the prompt has no tokens")
    if len(ids) > run.model.cfg.context:
        raise AttnlabError(
            f"the prompt is {len(ids)} tokens, longer than the run's context of {run.model.cfg.context}: shorten it"
        )
    return torch.tensor([ids], device=next(run.model.parameters()).device)


def target_id(run: Run, target: str | None, ids: torch.Tensor) -> int:
    """The target token's id: `target` must be exactly one token; None: the model's top next token."""
    if target is None:
        with torch.no_grad():
            return int(run.model(ids)[0, -1].argmax())
    got = run.tokenizer.encode(target)
    if len(got) != 1:
        parts = " + ".join(repr(t) for t in token_labels(run.tokenizer, got)) or "no token"
        raise AttnlabError(f"--target {target!r} is {len(got)} tokens ({parts}), not one: give a single token")
    return got[0]


def trace_circuit(
    run: Run, prompt: str, target: str | None, tcs: list[Transcoder], cfg: CircuitConfig | None = None
) -> Circuit:
    """The attribution graph of `target` after `prompt`, pruned, scored and checked by intervention."""
    cfg = cfg or CircuitConfig()
    start = time.perf_counter()
    ids = prompt_ids(run, prompt)
    tgt = target_id(run, target, ids)
    attr = attribute(run.model, ids, tgt, tcs, cfg.batch)
    pruned = prune(attr, cfg.node_threshold, cfg.edge_threshold)
    graph_s = time.perf_counter() - start
    check = intervention_check(run.model, attr, tcs, pruned.influence, cfg.top)
    data = graph_json(run, attr, pruned, check)
    data["seconds"] = {"graph": round(graph_s, 3), "total": round(time.perf_counter() - start, 3)}
    data["prompt"] = prompt
    return Circuit(attr, pruned, data)


def graph_json(run: Run, attr: Attribution, pruned: Pruned, check: dict) -> dict:
    """Nodes and edges of the pruned graph, with the scores and the check: what graph.json holds."""
    n, s = attr.nodes, attr.nodes.slices()
    tokens = token_labels(run.tokenizer, attr.frozen.ids[0].tolist())
    kept = pruned.nodes.nonzero().flatten().tolist()
    nodes = []
    for i in kept:
        node = {"id": i, "influence": float(pruned.influence[i])}
        if i < s["features"].stop:
            node.update(
                kind="feature",
                layer=int(n.layer[i]),
                pos=int(n.pos[i]),
                feature=int(n.index[i]),
                activation=float(n.act[i]),
            )
        elif i < s["errors"].stop:
            layer, pos = divmod(i - s["errors"].start, n.n_pos)
            node.update(kind="error", layer=layer, pos=pos, norm=float(attr.errors[layer, pos].norm()))
        elif i < s["embeddings"].stop:
            node.update(kind="embedding", layer=-1, pos=i - s["embeddings"].start)
        else:
            node.update(
                kind="logit", layer=n.n_layers, pos=n.n_pos - 1, value=float(attr.value[i]), bias=float(attr.bias[i])
            )
        nodes.append(node)
    t, src = pruned.edges.nonzero(as_tuple=True)
    edges = [[int(a), int(b), float(attr.adjacency[b, a])] for a, b in zip(src, t)]  # source, target, weight
    return {
        "tokens": tokens,
        "target": token_labels(run.tokenizer, [attr.target])[0],
        "target_id": attr.target,
        "metric": "logit(target) - mean logit, at the last position, before any soft-cap",
        "layers": n.n_layers,
        "nodes": nodes,
        "edges": edges,
        "counts": {
            "active_features": n.n_features,
            "nodes": len(nodes),
            "edges": len(edges),
            "full_edges": int((attr.adjacency != 0).sum()),
        },
        "scores": {"before": pruned.before, "after": pruned.after},
        "linearity_gap": attr.linearity_gap(),
        "intervention": check,
    }
