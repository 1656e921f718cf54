"""LoRA: low-rank adapters on a block's linear layers (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models").

Legend: N any leading dimensions (B, T), I input width, O output width, r rank.

    y = base(x) + (alpha / r) * dropout(x) A^T B^T      base W (O, I) frozen; A (r, I), B (O, r) trained

B starts at zero, so an adapted model computes exactly what its base does until the first step; A
starts random (kaiming-uniform with a = sqrt(5), as nn.Linear and PEFT do), so that first step's
gradient reaches B. A matrix then trains r * (I + O) numbers instead of I * O, and only those are
saved. `merge_lora` folds W + (alpha / r) B A into the weight and gives the plain layer back.

Which matrices, by name (LoRAConfig.targets), in every block of every Stack of a model:
    q, k, v          rows of attention's stacked qkv_proj (nn/attention.py), each with its own A and B:
                     PEFT adapts a Llama's separate q_proj and v_proj the same way, so the default
                     ("q", "v") is PEFT's, and a fused GPT-2 c_attn adapter is q, k, v sharing one A.
    out              attention's out_proj
    gate, up, down   the feed-forward's matrices (of every expert, in a mixture of experts)
Attention's names cover cross-attention too, as PEFT's name matching does in an encoder-decoder.

The wrapped layer stays in the adapter as `.base`, so its weights keep their names with `.base` added
(`blocks.0.attn.qkv_proj.base.weight`) and the adapter's are `...qkv_proj.lora_A.q` and `.lora_B.q`.
The base need not be an nn.Linear: any module mapping (N, I) -> (N, O) with `in_features` and
`out_features` will do (a quantized linear layer, for QLoRA); reading the matrix (`weight`, which
cross-attention slices) then asks the base for its `weight`, and merging is refused.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import check_types, option
from attnlab.errors import AttnlabError
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.dense import FeedForward, GatedFeedForward
from attnlab.nn.moe import MixtureOfExperts
from attnlab.nn.stack import stacks_of

TARGETS = ("q", "k", "v", "out", "gate", "up", "down")
# The matrices of each dense feed-forward kind, by their attribute (= target) names.
FEEDFORWARD_MATRICES: dict[type, tuple[str, ...]] = {
    FeedForward: ("up", "down"),
    GatedFeedForward: ("gate", "up", "down"),
}


@dataclass
class LoRAConfig:
    """Low-rank adapters: their rank, scale, dropout and which matrices of each block they adapt."""

    rank: int = option(
        8,
        "LoRA rank r: each adapted matrix trains r * (in + out) numbers (a fine-tuning without it trains every weight)",
        at_least=1,
    )
    alpha: float = option(16.0, "LoRA scale: the update is multiplied by alpha / rank (PEFT's lora_alpha)")
    dropout: float = option(0.0, "dropout on the adapters' input, in [0, 1)")
    targets: tuple[str, ...] = option(
        ("q", "v"),
        f"the block matrices to adapt, of {', '.join(TARGETS)}: "
        "attention's query/key/value rows and output, the feed-forward's",
        nargs="+",
    )

    def __post_init__(self):
        if isinstance(self.targets, str):  # "q,v": tuple("qv") would read it letter by letter
            self.targets = tuple(t.strip() for t in self.targets.split(","))
        self.targets = tuple(self.targets)
        check_types(self)
        if self.rank < 1:
            raise AttnlabError(f"LoRA rank must be at least 1, got {self.rank}")
        if not self.alpha > 0:
            raise AttnlabError(f"LoRA alpha must be above 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise AttnlabError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.targets or len(set(self.targets)) < len(self.targets):
            raise AttnlabError(f"LoRA targets must name matrices once each, got {list(self.targets)}")
        if unknown := [t for t in self.targets if t not in TARGETS]:
            raise AttnlabError(f"unknown LoRA target {unknown[0]!r}; choose from {', '.join(TARGETS)}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """A frozen linear layer plus one low-rank update per named range of its output rows ("parts"):
    the whole matrix (one part), or some of q, k, v of a stacked projection."""

    def __init__(
        self, base: nn.Module, parts: dict[str, tuple[int, int]], rank: int, alpha: float, dropout: float = 0.0
    ):
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.parts = dict(parts)  # name -> [lo, hi) rows of the output this part's B writes
        self.rank, self.scaling = rank, alpha / rank
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.enabled = True  # adapters_off() turns the update off: the base alone (DPO's reference)
        # The adapters train in float32 whatever the base's precision (a bf16 or quantized base), as
        # PEFT's autocast_adapter_dtype does: small updates to B would round away in bf16.
        like = next(iter([*base.parameters(), *base.buffers()]))
        kw = dict(device=like.device, dtype=torch.float64 if like.dtype == torch.float64 else torch.float32)
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        for name, (lo, hi) in self.parts.items():
            a = torch.empty(rank, self.in_features, **kw)  # (r, I)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # PEFT's and nn.Linear's init
            self.lora_A[name] = nn.Parameter(a)
            self.lora_B[name] = nn.Parameter(torch.zeros(hi - lo, rank, **kw))  # (O_part, r): starts as the base

    def delta(self, name: str) -> Tensor:
        """The part's update to the weight, (alpha / r) B A: (O_part, I)."""
        return (self.lora_B[name] @ self.lora_A[name]) * self.scaling

    def forward(self, x: Tensor) -> Tensor:  # (N, I) -> (N, O)
        y = self.base(x)  # (N, O)
        if not self.enabled:
            return y
        for name, (lo, hi) in self.parts.items():
            a = self.lora_A[name]
            h = F.linear(self.drop(x).to(a.dtype), a)  # (N, r): r numbers per position, the bottleneck
            d = F.linear(h, self.lora_B[name]) * self.scaling  # (N, O_part)
            if hi - lo < self.out_features:  # a part of the rows: zeros around it, (N, O)
                d = F.pad(d, (lo, self.out_features - hi))
            y = y + d.to(y.dtype)
        return y

    @property
    def weight(self) -> Tensor:
        """The adapted matrix W + (alpha / r) B A, (O, I), differentiable in A and B: for code that reads
        rows of the matrix rather than calling the layer (cross-attention's projections)."""
        w = self.base.weight
        if not self.enabled:
            return w
        for name, (lo, hi) in self.parts.items():
            w = w + F.pad(self.delta(name).to(w.dtype), (0, 0, lo, self.out_features - hi))
        return w

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def merged(self) -> nn.Linear:
        """The base with the updates folded into its weight (the base itself, changed in place)."""
        if not isinstance(self.base, nn.Linear):
            raise AttnlabError(
                f"cannot merge a LoRA adapter into a {type(self.base).__name__}: merge onto "
                "the unquantized base instead (a quantized weight would lose the update)"
            )
        with torch.no_grad():
            for name, (lo, hi) in self.parts.items():
                self.base.weight[lo:hi] += self.delta(name).to(self.base.weight.dtype)
        return self.base

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}, parts={self.parts}"


# The adaptable matrices of one attention or one dense feed-forward: that module, and for each target
# name the attribute holding its linear layer and the output rows it adapts (None: all of them).
Sites = tuple[nn.Module, dict[str, tuple[str, tuple[int, int] | None]]]


def _attention_sites(attn: MultiHeadAttention) -> Sites:
    q, kv = attn.inner, attn.kv_inner  # qkv_proj's rows: H*Dh queries, then Hkv*Dh keys and values
    return attn, {
        "q": ("qkv_proj", (0, q)),
        "k": ("qkv_proj", (q, q + kv)),
        "v": ("qkv_proj", (q + kv, q + 2 * kv)),
        "out": ("out_proj", None),
    }


def _feedforward_sites(ff: nn.Module) -> list[Sites]:
    dense = list(ff.experts) if isinstance(ff, MixtureOfExperts) else [ff]
    # an attention-only block's NoFeedForward has no matrices: an empty dict
    return [(d, {m: (m, None) for m in FEEDFORWARD_MATRICES.get(type(d), ())}) for d in dense]


def block_sites(model: nn.Module) -> list[Sites]:
    """Every adaptable matrix of every block, asked of the blocks and their parts (never of module
    paths): one entry per attention (cross-attention too) and per dense feed-forward."""
    sites = []
    for stack in stacks_of(model):
        for block in stack:
            sites.append(_attention_sites(block.attn))
            if block.cfg.cross_attention:
                sites.append(_attention_sites(block.cross))
            sites += _feedforward_sites(block.ff)
    return sites


def available_targets(model: nn.Module) -> list[str]:
    """The target names this model's blocks have matrices for, in TARGETS' order."""
    sites = block_sites(model)
    return [t for t in TARGETS if any(t in names for _, names in sites)]


def add_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Wrap the targeted matrices of every block in LoRALinear and freeze everything else; returns the
    names of the wrapped layers. The model computes exactly what it did (B = 0)."""
    if has_lora(model):
        raise AttnlabError("this model has LoRA adapters already: merge them (merge_lora) before adding more")
    available = available_targets(model)
    if missing := [t for t in cfg.targets if t not in available]:
        choices = ", ".join(available) or "nothing (it has no Transformer blocks)"
        raise AttnlabError(
            f"this model's blocks have no {missing[0]!r} matrix to adapt; choose LoRA targets from {choices}"
        )
    model.requires_grad_(False)
    for owner, names in block_sites(model):
        parts: dict[str, dict[str, tuple[int, int]]] = {}  # attribute -> {target: rows}: q and v share qkv_proj
        for target in (t for t in cfg.targets if t in names):
            attr, rows = names[target]
            parts.setdefault(attr, {})[target] = rows or (0, owner.get_submodule(attr).out_features)
        for attr, own in parts.items():
            setattr(owner, attr, LoRALinear(owner.get_submodule(attr), own, cfg.rank, cfg.alpha, cfg.dropout))
    return list(lora_layers(model))


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def has_lora(model: nn.Module) -> bool:
    return bool(lora_layers(model))


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' A and B matrices: what an optimizer of a LoRA run trains."""
    return [p for m in lora_layers(model).values() for p in (*m.lora_A.values(), *m.lora_B.values())]


def adapter_names(model: nn.Module) -> set[str]:
    """The state-dict names of the adapters' tensors: all a LoRA run saves of its model."""
    return {
        f"{name}.lora_{ab}.{part}"
        for name, m in lora_layers(model).items()
        for ab, mats in (("A", m.lora_A), ("B", m.lora_B))
        for part in mats
    }


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapters' tensors, keyed as in the model's state dict (`blocks.0.attn.qkv_proj.lora_A.q`)."""
    return {
        f"{name}.lora_{ab}.{part}": t.detach().clone()
        for name, m in lora_layers(model).items()
        for ab, mats in (("A", m.lora_A), ("B", m.lora_B))
        for part, t in mats.items()
    }


def load_lora_state(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Copy adapter tensors (from lora_state_dict) into a model with the same adapters; a missing,
    extra or misshapen tensor is one clear error."""
    own = lora_state_dict(model)
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise AttnlabError(
            f"the LoRA adapter does not fit this model: {what} "
            f"({len(missing)} missing, {len(extra)} unexpected of {len(own)})"
        )
    params = dict(model.named_parameters())
    for key, t in tensors.items():
        if t.shape != own[key].shape:
            raise AttnlabError(
                f"the LoRA adapter does not fit this model: {key} is {tuple(t.shape)}, "
                f"the model's is {tuple(own[key].shape)}"
            )
    with torch.no_grad():
        for key, t in tensors.items():
            params[key].copy_(t)


def merge_lora(model: nn.Module) -> list[str]:
    """Fold every adapter into its base weight and put the plain layer back in its place; returns the
    names merged. The model then computes what the adapted one did, with no adapter left. Its
    parameters stay frozen as the adapted model's base was (requires_grad_() to train them all)."""
    layers = lora_layers(model)
    for name, m in layers.items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, m.merged())
    return list(layers)


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Run the base alone inside the with-block (DPO's reference model is the base without adapters)."""
    layers = list(lora_layers(model).values())
    for m in layers:
        m.enabled = False
    try:
        yield
    finally:
        for m in layers:
            m.enabled = True
