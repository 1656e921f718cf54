"""`attnlab circuits RUN --prompt TEXT --target TOKEN --out DIR`: what it takes (torch-free, so that
`attnlab circuits --help` starts at once); cli/circuits_run.py does the work."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.cli.options import Answers, ReadsRun
from attnlab.config import option

KINDS = ("topk", "batchtopk", "jumprelu", "relu")  # interpret/sae.py's KINDS (tests/test_circuits.py holds them equal)


@dataclass
class CircuitsOptions(Answers, ReadsRun):
    prompt: str = option("", "the text whose next token is explained", required=True, metavar="TEXT")
    target: str | None = option(
        None,
        "the next token to explain, exactly one token of the run's tokenizer (default: the model's top prediction)",
        metavar="TOKEN",
    )
    out: str = option(
        "", "folder for graph.json, graph.html and (when trained here) transcoders/", required=True, metavar="DIR"
    )
    transcoders: str | None = option(
        None, "a transcoders folder to use (default: DIR/transcoders, trained there when missing)", metavar="DIR"
    )
    force: bool = option(False, "replace graph.json and graph.html already in --out, and retrain transcoders there")
    latents: int = option(2048, "latents per layer's transcoder", at_least=1)
    kind: str = option("topk", "how codes are made sparse (as attnlab sae train)", KINDS)
    k: int = option(16, "topk / batchtopk: active latents per token", at_least=1)
    tokens: int = option(1_000_000, "training tokens per layer", at_least=1)
    lr: float = option(1e-3, "Adam's learning rate")
    eval_tokens: int = option(16384, "validation tokens the transcoders' metrics are measured on", at_least=1)
    seed: int = option(0, "random seed of the transcoders' weights and data")


__all__ = ["CircuitsOptions"]
