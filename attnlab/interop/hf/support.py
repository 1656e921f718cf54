"""What a HuggingFace block can express, declared by each exporter option by option.

An exporter maps every field of the block schema (nn/options.py BlockOptions) to a rule:

    ANY                  the HuggingFace config carries the value (d_model -> hidden_size)
    UNUSED               the value has no effect in the layouts the exporter writes (the experts'
                         settings of a block whose feed-forward the exporter fixes to a dense one)
    Only(values, why)    the values it can express, and why no other ("GPT-2 is pre-norm")
    a function           cfg -> None, or why this run's value cannot be expressed

A field an exporter does not name is refused unless it has its default (a part added with
add_block_option, which no exporter knows): an export never silently writes a different model.
tests/test_block_options.py fails when a block option is named by no rule of an exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.nn.options import BlockOptions

ANY = "any value"
UNUSED = "unused in this layout"


@dataclass(frozen=True)
class Only:
    """The values an exporter can express of one option, and the reason it has no others."""

    values: tuple
    why: str


Rule = str | Only | Callable[[Any], str | None]


def same_heads(name: str) -> Callable[[Any], str | None]:
    """The rule of a block whose every head has its own keys and values, d_model / n_head wide."""

    def rule(cfg) -> str | None:
        if cfg.head_width * cfg.n_head != cfg.d_model:
            return f"d_head {cfg.d_head} ({name}'s is d_model / n_head)"
        if (cfg.n_kv_head or cfg.n_head) != cfg.n_head:
            return f"n_kv_head {cfg.n_kv_head} ({name} has a key and value per head)"
        return None

    return rule


def classic_block(
    name: str, norm: str, activations, heads: Callable[[Any], str | None] | None = None
) -> dict[str, Rule]:
    """The rules of the first Transformers' block (GPT-2, BERT, ViT): an MLP with one of
    `activations` (attnlab's names), LayerNorm at `norm` ("pre" or "post"), biases, no experts and
    no QK-norm; its heads follow `heads` (default: same_heads)."""
    heads = heads or same_heads(name)
    return {
        "n_head": ANY,
        "d_model": ANY,
        "d_ff": ANY,
        "d_head": heads,
        "n_kv_head": heads,
        "dropout": ANY,
        "norm": Only((norm,), f"{name} is {norm}-norm"),
        "activation": Only(tuple(activations), f"{name} takes {', '.join(activations)}"),
        "feedforward": Only(("mlp",), f"{name}'s feed-forward is an MLP"),
        "n_experts": UNUSED,
        "experts_per_token": UNUSED,
        "expert_ff": UNUSED,
        "capacity_factor": UNUSED,
        "aux_loss_weight": UNUSED,
        "norm_kind": Only(("layernorm",), f"{name} uses LayerNorm"),
        "bias": Only((True,), f"{name} has biases"),
        "ln_eps": ANY,
        "qk_norm": Only((False,), f"{name} has no QK-norm"),
    }


def undeclared(support: dict[str, Rule]) -> list[str]:
    """The block options an exporter names no rule for."""
    return [f.name for f in fields(BlockOptions) if f.name not in support]


def block_problems(cfg: Any, support: dict[str, Rule], name: str) -> list[str]:
    """What of the run's block options the HuggingFace block `name` cannot express ([] if it fits)."""
    problems = []
    for f in fields(BlockOptions):
        value, rule = getattr(cfg, f.name), support.get(f.name)
        if rule is None:
            if f.default is MISSING or value != f.default:
                problems.append(f"{f.name} {value!r} ({name} has no place for it)")
        elif callable(rule):
            why = rule(cfg)
            problems += [why] if why else []
        elif isinstance(rule, Only) and value not in rule.values:
            problems.append(f"{f.name} {value!r} ({rule.why})")
    return list(dict.fromkeys(problems))  # one rule may speak for two fields


def field_problems(cfg: Any, rules: dict[str, Only]) -> list[str]:
    """The same rules for a family's own fields (positions, ...): each listed field must fit its rule."""
    return [
        f"{name} {getattr(cfg, name)!r} ({rule.why})"
        for name, rule in rules.items()
        if getattr(cfg, name) not in rule.values
    ]


def gpt_head_problems(cfg: Any, name: str) -> list[str]:
    """A modern GPT's extras around the stack, which neither GPT-2 nor Llama has."""
    problems = [f"logit_softcap ({name} has uncapped logits)"] if cfg.logit_softcap is not None else []
    return problems + ([f"bigram_vocab ({name} has no bigram embedding)"] if cfg.bigram_vocab else [])


def refuse_unfit(what: str, target: str, problems: list[str]) -> None:
    """One line naming everything of the run that the HuggingFace layout cannot hold."""
    if problems:
        raise AttnlabError(f"this {what} does not fit HuggingFace's {target}: {'; '.join(problems)}")
