"""The one schema of a Transformer block: every option a block has, declared once.

Every family's config inherits BlockOptions (models/common.py TransformerConfig), so each option is
a field, a command-line flag and a config.json key of GPT, the encoder, the encoder-decoder, ViT and
the captioner alike; the Stack builds its blocks from BlockConfig.of(options, causal=...), which adds
what the family decides (a causal mask, cross-attention). A part that needs a setting of its own (a
new norm's gain) adds it with `add_block_option`, and every family has it.

Exporters (interop/hf) declare, option by option, what their HuggingFace block can express.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from attnlab.config import check_types, names, option
from attnlab.nn.dense import ACTIVATIONS, DENSE, default_width
from attnlab.nn.feedforward import FEEDFORWARDS
from attnlab.nn.norm import NORMS

NORM_PLACES = ("pre", "post")


@dataclass
class BlockOptions:
    """A block's options, as a user sets them (registries given as choices are read live: a norm
    registered later is a valid --norm-kind)."""

    n_head: int = option(4, "attention heads per block")
    d_model: int = option(128, "model width (embedding size)")
    d_ff: int | None = option(None, "feed-forward hidden width (default 4 * d_model; 2/3 of that for swiglu/geglu)")
    d_head: int | None = option(None, "width of each head (default d_model / n_head)")
    n_kv_head: int | None = option(
        None, "key/value heads shared by the query heads (grouped-query attention; default n_head, 1 = multi-query)"
    )
    dropout: float = option(0.0, "dropout probability on attention, residuals and embeddings")
    norm: str = option("pre", "LayerNorm before each sublayer (pre) or after the residual (post)", NORM_PLACES)
    activation: str = option("gelu", "feed-forward activation", names(ACTIVATIONS))
    feedforward: str = option("mlp", "the feed-forward of each block", names(FEEDFORWARDS))
    n_experts: int = option(4, "experts in each mixture-of-experts feed-forward (--feedforward moe)")
    experts_per_token: int = option(2, "experts each token is routed to (top-k of the router)")
    expert_ff: str = option("mlp", "the feed-forward each expert is", names(DENSE))
    capacity_factor: float | None = option(
        None, "cap each expert at this many times its even share of the tokens; the rest are dropped (default: no cap)"
    )
    aux_loss_weight: float = option(0.01, "weight of the experts' load-balancing loss in the training loss")
    norm_kind: str = option("layernorm", "the normalization of each block", names(NORMS))
    bias: bool = option(True, "biases in linear layers and norms")
    ln_eps: float = option(1e-5, "LayerNorm epsilon")
    qk_norm: bool = option(False, "RMS-normalize each head's queries and keys (QK-norm): steadier at high lr")

    def __post_init__(self):
        check_types(self)  # GPTConfig(n_layer="2"): named here, not "'<' not supported" below
        # d_ff and d_head stay None when derived, so overriding d_model in a preset re-derives them.
        for name in ("n_head", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("d_ff", "d_head"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.ln_eps > 0:  # finite is checked with the types; 0 divides by zero on a constant row
            raise ValueError(f"ln_eps must be above 0, got {self.ln_eps}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm not in NORM_PLACES:
            raise ValueError(f"norm must be one of {NORM_PLACES}, got {self.norm!r}")
        if self.d_head is None and self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}: set d_head")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head must divide n_head {self.n_head}, got {self.n_kv_head}")
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token must be 1..n_experts ({self.n_experts}), got {self.experts_per_token}")

    @property
    def ff_width(self) -> int:
        """The feed-forward's hidden width: d_ff, or the default for the kind (nn/dense.py)."""
        return self.d_ff or default_width(self.feedforward, self.d_model, self.expert_ff)

    @property
    def head_width(self) -> int:
        return self.d_head or self.d_model // self.n_head


@dataclass
class BlockConfig(BlockOptions):
    """The options of the blocks of one Stack, with what the family decides for that stack."""

    causal: bool = False  # decoder self-attention: position i sees positions <= i only
    cross_attention: bool = False  # attend to an encoder's output (encoder-decoder models)

    @classmethod
    def of(cls, options: BlockOptions, causal: bool = False, cross_attention: bool = False) -> BlockConfig:
        """The block config of a family config: its block options, whatever they are, and the family's choices."""
        values = {f.name: getattr(options, f.name) for f in fields(BlockOptions)}
        return cls(**values, causal=causal, cross_attention=cross_attention)


def block_option_names() -> list[str]:
    return [f.name for f in fields(BlockOptions)]


@contextlib.contextmanager
def block_option(name: str, kind: Any, default: Any, help: str, choices: Any = None) -> Iterator[None]:
    """add_block_option for the with-block (a test, a notebook trying a part), removed on leaving."""
    add_block_option(name, kind, default, help, choices)
    try:
        yield
    finally:
        remove_block_option(name)


def add_block_option(name: str, kind: Any, default: Any, help: str, choices: Any = None) -> None:
    """One more field of BlockOptions, of type `kind`: and so of BlockConfig and of every family's
    config (each gains the field, its flag and its config.json key). For a part that needs a
    setting of its own; the part reads it from the BlockConfig it is built from."""
    if name in block_option_names():
        raise ValueError(f"block option {name!r} exists already")
    BlockOptions.__annotations__[name] = kind
    setattr(BlockOptions, name, option(default, help, choices))
    _rebuild()


def remove_block_option(name: str) -> None:
    del BlockOptions.__annotations__[name]
    delattr(BlockOptions, name)
    _rebuild()


def _rebuild() -> None:
    """Run @dataclass again on BlockOptions and every class built on it, parents first, so that each
    one's fields, __init__ and repr follow the schema."""
    seen, todo = [], [BlockOptions]
    while todo:
        cls = todo.pop(0)
        if cls not in seen:
            seen.append(cls)
            todo += cls.__subclasses__()
    for cls in sorted(seen, key=lambda c: len(c.__mro__)):
        own = cls.__dict__.get("__annotations__", {})
        for f in cls.__dict__.get("__dataclass_fields__", {}).values():
            if f.name in own:  # @dataclass left the default value there; it needs the Field back
                setattr(cls, f.name, f)
        for attr in (
            "__init__",
            "__repr__",
            "__eq__",
            "__hash__",
            "__match_args__",
            "__dataclass_fields__",
            "__dataclass_params__",
        ):
            if attr in cls.__dict__:
                delattr(cls, attr)
        dataclasses.dataclass(cls)
