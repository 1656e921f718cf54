"""The forward passes of attnlab/nn read like the lecture: one typed Context is handed down, so no
`forward` takes more than a few parameters, and Block.forward is the block's residual lines."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from attnlab.nn import ALiBiPositions, BlockConfig, Context, KVCache, Stack

NN = Path(__file__).resolve().parent.parent / "attnlab" / "nn"
MOST_PARAMETERS = 4  # besides self: x, a context, and what picks this layer's part of it
MOST_BLOCK_LINES = 30


def forwards() -> dict[str, ast.FunctionDef]:
    """{"file.py:Class": its forward} for every class under attnlab/nn that defines one."""
    out = {}
    for path in sorted(NN.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(cls, ast.ClassDef):
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                        out[f"{path.name}:{cls.name}"] = fn
    return out


def parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1 + bool(a.vararg) + bool(a.kwarg)


def test_the_count_sees_the_forwards_it_limits():
    found = forwards()
    assert {"attention.py:MultiHeadAttention", "block.py:Block", "stack.py:Stack"} <= set(found)
    assert parameters(found["stack.py:Stack"]) == 2  # x, ctx


def test_no_forward_in_nn_takes_more_than_four_parameters():
    wide = {name: parameters(fn) for name, fn in forwards().items() if parameters(fn) > MOST_PARAMETERS}
    assert not wide, f"forwards with more than {MOST_PARAMETERS} parameters (pass a Context): {wide}"


def test_block_forward_reads_in_thirty_lines():
    fn = forwards()["block.py:Block"]
    lines = fn.end_lineno - fn.lineno + 1
    assert lines <= MOST_BLOCK_LINES, f"Block.forward is {lines} lines"


def test_a_context_is_frozen_and_adds_the_positions_bias_once():
    class Distance(torch.nn.Module):
        qk_transform = None

        def score_bias(self, tq, tk, offset=0):
            return -torch.ones(1, 1, tq, tk)

    ctx = Context(bias=torch.zeros(1, 1, 3, 3), positions=Distance())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.offset = 1
    resolved = ctx.with_score_bias(3)
    torch.testing.assert_close(resolved.bias, -torch.ones(1, 1, 3, 3))
    assert ctx.bias.sum() == 0  # the model's own context is left as it was
    assert Context().with_score_bias(3).bias is None


def test_each_block_of_a_stack_fills_its_own_cache():
    torch.manual_seed(0)
    stack = Stack(BlockConfig(d_model=8, n_head=2, d_ff=16, causal=True), 3).eval()
    x = torch.randn(2, 5, 8)
    caches = stack.new_caches()
    with torch.no_grad():
        full, _ = stack(x)
        first, _ = stack(x[:, :3], Context(caches=caches))
        rest, _ = stack(x[:, 3:], Context(caches=caches, offset=3))
    assert [c.length for c in caches] == [5, 5, 5]
    assert not torch.equal(caches[0].k, caches[1].k)  # each block's own keys
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=0)
    assert isinstance(caches[0], KVCache)


def test_a_stack_with_a_context_compiles_without_graph_breaks():
    """torch.compile traces the Context the model builds and the Stack's copy with the positions' bias
    (the compiled decode step does this too)."""
    torch.manual_seed(0)
    stack = Stack(BlockConfig(d_model=8, n_head=2, d_ff=16, causal=True), 2).eval()
    x, alibi = torch.randn(1, 4, 8), ALiBiPositions(16, n_heads=2)

    def run(x: torch.Tensor) -> torch.Tensor:
        return stack(x, Context(bias=torch.zeros(1, 1, 4, 4), positions=alibi))[0]

    with torch.no_grad():
        compiled = torch.compile(run, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), run(x), atol=1e-6, rtol=0)
