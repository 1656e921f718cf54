"""How an attribution graph is pruned and checked: a small dataclass without torch, so that the command
line's `attnlab circuits --help` is made without importing it (circuits_run.py uses it)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import option
from attnlab.errors import AttnlabError


@dataclass
class CircuitConfig:
    """The graph's pruning and the intervention check (the command line's flags)."""

    node_threshold: float = option(
        0.8, "keep the fewest features that carry this share of the influence on the target (circuit-tracer's 0.8)"
    )
    edge_threshold: float = option(0.98, "then keep the fewest edges that carry this share (circuit-tracer's 0.98)")
    top: int = option(10, "features of most influence ablated one at a time in the intervention check", at_least=1)
    batch: int = option(64, "target nodes per backward pass (memory: batch x prompt x width per layer)", at_least=1)

    def __post_init__(self):
        for name in ("node_threshold", "edge_threshold"):
            if not 0 < getattr(self, name) <= 1:
                raise AttnlabError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(self, name)}")
