"""What `attnlab circuits` does (imports torch: cli/main.py imports it only when the command runs):
transcoders trained or reused, the attribution graph traced, graph.json and graph.html written."""

from __future__ import annotations

import json
import time
from pathlib import Path

from attnlab.cli.circuits import CircuitsOptions
from attnlab.config import from_dict
from attnlab.errors import AttnlabError
from attnlab.interpret.circuits_config import CircuitConfig
from attnlab.interpret.circuits_page import write_circuit
from attnlab.interpret.circuits_run import prompt_ids, target_id, trace_circuit
from attnlab.interpret.sae import SAEConfig
from attnlab.interpret.transcoder import (
    INDEX,
    check_decoder,
    evaluate_transcoders,
    has_mlps,
    load_transcoders,
    save_transcoders,
    train_transcoders,
)
from attnlab.runs.outputs import check_output_folder
from attnlab.runs.run import Run, load
from attnlab.runtime.threads import share


def _transcoders(run: Run, opts: CircuitsOptions, out: Path) -> tuple[list, dict, bool]:
    """(the transcoders, their index, whether they were trained now): --transcoders DIR, else
    OUT/transcoders when it holds them (and no --force), else trained into OUT/transcoders."""
    if opts.transcoders is not None:
        return (*load_transcoders(opts.transcoders, run.device), False)
    if not has_mlps(run.model):  # attention only: nothing to transcode, the graph holds the embeddings alone
        return [], {"layers": 0}, False
    folder = out / "transcoders"
    if (folder / INDEX).is_file() and not opts.force:
        return (*load_transcoders(folder, run.device), False)
    if folder.exists() and any(folder.iterdir()) and not (folder / INDEX).is_file():
        raise AttnlabError(f"{folder} exists and holds no transcoders: move it, or choose another --out")
    data = check_decoder(run)  # a run that is not a decoder or names no data: said before any work
    # dead (for AuxK) after a tenth of the training tokens without firing, so revival has time to act
    cfg = SAEConfig(
        latents=opts.latents,
        kind=opts.kind,
        k=min(opts.k, opts.latents),
        tokens=opts.tokens,
        lr=opts.lr,
        seed=opts.seed,
        batch=4096,
        dead_after=max(4096, opts.tokens // 10),
    )
    tcs, info = train_transcoders(run, cfg, progress=not opts.json)
    metrics = evaluate_transcoders(run, tcs, opts.eval_tokens, data=data)
    index = {"run": str(Path(opts.run).absolute()), "training": info, "metrics": metrics}
    save_transcoders(folder, tcs, index)
    return tcs, {"layers": len(tcs), **index}, True


def run_circuits(opts: CircuitsOptions, graph: dict) -> int:
    share()
    cfg = from_dict(CircuitConfig, graph, "the graph's flags")
    out = check_output_folder(opts.out, opts.force, ("graph.json", "graph.html"))
    run = load(opts.run, device=opts.device)
    target_id(run, opts.target, prompt_ids(run, opts.prompt))  # not a decoder, too long, no such token: said
    # before any training
    start = time.perf_counter()
    tcs, index, trained = _transcoders(run, opts, out)
    result = trace_circuit(run, opts.prompt, opts.target, tcs, cfg)
    page = write_circuit(run, result.data, tcs, out)
    d, m = result.data, index.get("metrics", {})
    summary = {
        "out": str(out),
        "target": d["target"],
        "nodes": d["counts"]["nodes"],
        "edges": d["counts"]["edges"],
        "active_features": d["counts"]["active_features"],
        "replacement_score": d["scores"]["before"]["replacement_score"],
        "completeness_score": d["scores"]["before"]["completeness_score"],
        "pruned": d["scores"]["after"],
        "intervention_right": d["intervention"]["replacement_right"],
        "intervention_right_real": d["intervention"]["real_right"],
        "graph_seconds": d["seconds"]["graph"],
        "seconds": round(time.perf_counter() - start, 2),
        "transcoders": {
            "trained": trained,
            **{k: m[k] for k in ("explained_variance", "l0", "dead_fraction", "ce_loss_recovered") if k in m},
        },
    }
    if opts.json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    if trained:
        print(
            f"transcoders trained in {index['training']['seconds']:.0f} s: explained variance "
            f"{m['explained_variance']:.3f}, L0 {m['l0']:.1f}, dead {m['dead_fraction']:.3f}, CE loss recovered "
            f"{m['ce_loss_recovered']:.3f} (written to {out / 'transcoders'})"
        )
    print(
        f"{summary['nodes']} nodes, {summary['edges']} edges; replacement {summary['replacement_score']:.3f} "
        f"(pruned {summary['pruned']['replacement_score']:.3f}), completeness {summary['completeness_score']:.3f} "
        f"(pruned {summary['pruned']['completeness_score']:.3f}); intervention signs right "
        f"{_share(summary['intervention_right'])} (real model {_share(summary['intervention_right_real'])}); "
        f"{summary['seconds']:.1f} s (graph {summary['graph_seconds']:.1f} s)"
    )
    print(f"wrote {out / 'graph.json'} and {page}")
    return 0


def _share(x: float | None) -> str:
    return "n/a (no feature)" if x is None else f"{x:.0%}"


__all__ = ["run_circuits"]
