"""GPT: a decoder-only language model.

Legend: B batch, T time, C model width, V vocabulary, H heads.

    tokens (B, T) -> embeddings + positions (B, T, C) -> N causal blocks -> LayerNorm
    -> LM head (B, T, V), trained to predict token t+1 from tokens <= t.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import option
from attnlab.errors import ArgumentTypeError, ArgumentValueError, kind
from attnlab.models.common import Checkpointing, Presets, TransformerConfig, init_weights, text_body
from attnlab.models.protocols import CausalLM, TextEmbedding
from attnlab.nn import Context, KVCache
from attnlab.nn.moe import inactive_params
from attnlab.nn.position import Offset, Positions


@dataclass
class GPTConfig(TransformerConfig, Presets):
    vocab_size: int = option(50257, "vocabulary size (set from the tokenizer when training)")
    tie_weights: bool = option(True, "share the token embedding with the LM head")
    logit_softcap: float | None = option(None, "squash the logits into (-cap, cap) with cap * tanh(logits / cap)")
    bigram_vocab: int = option(
        0, "add an embedding of each (previous token, token) pair, hashed into this many rows (0 = off)"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.logit_softcap is not None and not (0 < self.logit_softcap < math.inf):
            raise ValueError(f"logit_softcap must be a finite number above 0, got {self.logit_softcap}")
        if self.bigram_vocab < 0:
            raise ValueError(f"bigram_vocab must be 0 (off) or more, got {self.bigram_vocab}")


def _nano(**kw) -> GPTConfig:
    """gpt-nano's shape (4 layers x 128, 4 heads, context 64, a byte vocabulary) with `kw` on top."""
    return GPTConfig(n_layer=4, n_head=4, d_model=128, context=64, vocab_size=256, **kw)


def _gpt2(n_layer: int, d_model: int, n_head: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_head=n_head, d_model=d_model, context=1024, activation="gelu_tanh")


def _gpt3(n_layer: int, d_model: int, n_head: int, d_head: int) -> GPTConfig:
    return GPTConfig(
        n_layer=n_layer, n_head=n_head, d_model=d_model, d_head=d_head, context=2048, activation="gelu_tanh"
    )


def _llama(n_layer: int, d_model: int, n_head: int, d_ff: int, context: int, **kw) -> GPTConfig:
    """The Llama block: rotary positions, RMSNorm, SwiGLU, no biases, an untied head."""
    return GPTConfig(
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        d_ff=d_ff,
        context=context,
        vocab_size=kw.pop("vocab_size", 32000),
        positions="rope",
        norm_kind="rmsnorm",
        feedforward=kw.pop("feedforward", "swiglu"),
        bias=False,
        tie_weights=False,
        **kw,
    )


# Named presets. The GPT-3 rows follow Table 2.1 of "Language Models are Few-Shot Learners"
# (n_layers, d_model, n_heads, d_head; context 2048, vocabulary 50257). One row of that table
# is inconsistent: GPT-3 XL lists 24 heads of 128 (3,072 wide, which would make 1.5B
# parameters) for a 2,048-wide model of 1.3B; we keep 2,048 = 16 x 128, which gives 1.3B.
PRESETS: dict[str, GPTConfig] = {
    # The CPU demo: 0.83M parameters with a character vocabulary; trains on a laptop in minutes.
    "gpt-nano": _nano(),
    # gpt-nano's shape with the modern recipe (docs/gpt.md, "The fast recipe"): what each part buys is
    # measured by `attnlab compare --task lm`.
    "gpt-nano-fast": _nano(
        positions="rope",
        qk_norm=True,
        activation="relu2",
        tie_weights=False,
        zero_init=True,
        logit_softcap=15.0,
        bigram_vocab=4096,
        norm_kind="rmsnorm",
    ),
    # The demo's model: gpt-nano-fast's parts that a GGUF architecture llama.cpp runs can hold, Qwen3's
    # block (Llama's: rotary positions, RMSNorm, SwiGLU, no biases, an untied head; with QK-norm) and
    # zero-init (only where training starts); no bigram table or soft-cap, which no such architecture
    # has. What that costs at 150 steps: docs/gpt.md, "The demo's recipe".
    "qwen3-nano-fast": _llama(4, 128, 4, None, 64, vocab_size=256, qk_norm=True, zero_init=True),
    # gpt-nano's shape as a Llama (2 key/value heads for 4 query heads) and as a mixture of 4
    # experts, 2 per token, each half of gpt-nano's feed-forward: the same compute per token.
    "llama-nano": _llama(4, 128, 4, None, 64, vocab_size=256, n_kv_head=2),
    "moe-nano": _nano(feedforward="moe", n_experts=4, experts_per_token=2, d_ff=256),
    "gpt-micro": GPTConfig(n_layer=6, n_head=6, d_model=384, context=256, vocab_size=256),
    "gpt2-small": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    "gpt3-small": _gpt3(12, 768, 12, 64),
    "gpt3-medium": _gpt3(24, 1024, 16, 64),
    "gpt3-large": _gpt3(24, 1536, 16, 96),
    "gpt3-xl": _gpt3(24, 2048, 16, 128),
    "gpt3-2.7b": _gpt3(32, 2560, 32, 80),
    "gpt3-6.7b": _gpt3(32, 4096, 32, 128),
    "gpt3-13b": _gpt3(40, 5140, 40, 128),
    "gpt3-175b": _gpt3(96, 12288, 96, 128),
    # Touvron et al. 2023 (Llama 2, table 1 and the released config); Jiang et al. 2024 (Mixtral):
    # 8 SwiGLU experts of 14,336, 2 per token, 8 key/value heads, rope base 1e6.
    "llama2-7b": _llama(32, 4096, 32, 11008, 4096),
    "mixtral-8x7b": _llama(
        32,
        4096,
        32,
        14336,
        32768,
        n_kv_head=8,
        rope_theta=1e6,
        feedforward="moe",
        n_experts=8,
        experts_per_token=2,
        expert_ff="swiglu",
    ),
}

# The training settings a preset was tuned with: a new run of the preset starts from them (flags,
# a TOML file, still win). The classic presets train with the task's defaults.
FAST_TRAINING = dict(
    optimizer="muon",
    muon_lr=6e-3,
    schedule="wsd",
    cooldown=0.4,
    min_lr=0.0,
    lr=6e-3,
    batch_size=32,
    warmup_steps=50,
)
PRESET_TRAINING: dict[str, dict] = {
    "gpt-nano-fast": FAST_TRAINING,
    "qwen3-nano-fast": FAST_TRAINING,  # the same recipe: Muon and wsd train any block
}

# The parameter counts the papers give, for `attnlab size` and the tests.
PAPER_PARAMS = {
    "gpt2-small": 124e6,
    "gpt2-medium": 355e6,
    "gpt2-large": 774e6,
    "gpt2-xl": 1558e6,
    "gpt3-small": 125e6,
    "gpt3-medium": 350e6,
    "gpt3-large": 760e6,
    "gpt3-xl": 1.3e9,
    "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9,
    "gpt3-13b": 13.0e9,
    "gpt3-175b": 175.0e9,
    "llama2-7b": 6.74e9,
    "mixtral-8x7b": 46.7e9,
}
# Parameters used per token, where the papers give them apart (mixtures of experts).
PAPER_ACTIVE_PARAMS = {"mixtral-8x7b": 12.9e9}


class GPT(Checkpointing, CausalLM, TextEmbedding, nn.Module):
    # Its text's summary is the last position's state, the only one that has seen the whole text; the
    # mean over positions is offered too (the early positions saw only a prefix, so it blurs more).
    poolings = ("last", "mean")

    def __init__(self, cfg: GPTConfig):
        if not isinstance(cfg, GPTConfig):  # GPT("gpt-nano"): named here, not "'str' has no attribute"
            raise ArgumentTypeError(f"GPT: expected a GPTConfig (GPTConfig.from_preset('gpt-nano')), got {kind(cfg)}")
        super().__init__()
        self.cfg = cfg
        text_body(self, cfg, cfg.vocab_size, causal=True)  # tok, pos, drop, blocks (causal), norm
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # The (previous, current) token pair's own vector: what a bigram model knows, given to
        # the first block for free instead of being learnt by attention to the previous position.
        self.bigram = nn.Embedding(cfg.bigram_vocab, cfg.d_model) if cfg.bigram_vocab else None
        init_weights(self, cfg.n_layer, zero_out=cfg.zero_init)
        if self.bigram is not None:
            nn.init.zeros_(self.bigram.weight)  # starts as the plain model
        if cfg.tie_weights:
            self.head.weight = self.tok.weight  # one (V, C) matrix reads and writes tokens

    @property
    def word_embedding(self) -> nn.Embedding:
        return self.tok

    def output_layer(self) -> nn.Module:
        return self.head

    def input_positions(self) -> tuple[Positions, str]:
        return self.pos, ""

    def readout(self) -> tuple[str, nn.Module, Callable[[Tensor], Tensor]]:
        return "blocks", self.norm, self.logits

    def embedding_states(self, ids: Tensor) -> Tensor:
        return self.hidden(ids)[0]  # causal: padding after a text never reaches its positions

    def num_params(self, non_embedding: bool = False, active: bool = False) -> int:
        """Parameters; non_embedding: without the token, position and bigram tables; active: only
        those one token uses (a mixture of experts runs k of its E experts per token)."""
        n = sum(p.numel() for p in self.parameters())
        if active:
            n -= inactive_params(self)
        if non_embedding:
            n -= self.tok.weight.numel() + sum(p.numel() for p in self.pos.parameters())
            n -= 0 if self.bigram is None else self.bigram.weight.numel()
        return n

    def new_caches(self, max_len: int | None = None) -> list[KVCache]:
        """One empty key/value cache per block, for incremental decoding."""
        return self.blocks.new_caches(max_len or self.cfg.context)

    def hidden(
        self, idx: Tensor, caches: list[KVCache] | None = None, offset: Offset = 0, return_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """Final hidden states (B, T, C) for tokens idx (B, T) at positions offset.., and the
        attention weights of each layer (B, H, T, T') when asked for. offset: one position, or
        one per row (B,) with caches whose rows differ in length (decoding/slots.py)."""
        x = self.tok(idx)  # (B, T, C)
        if self.bigram is not None:
            x = x + self.bigram(self.bigram_ids(idx, caches))
        x = self.pos(x, offset)
        if self.training and self.drop.p > 0:  # else dropout is the identity: skip its call
            x = self.drop(x)
        ctx = Context(positions=self.pos, offset=offset, caches=caches, return_weights=return_weights)
        x, weights = self.blocks(x, ctx)
        return self.norm(x), weights["self"]

    def bigram_ids(self, idx: Tensor, caches: list[KVCache] | None = None) -> Tensor:
        """Row of each (previous, current) pair in the bigram table, (B, T). The first position's
        previous token is the last one the caches saw when decoding, otherwise a start id (V)."""
        v = self.cfg.vocab_size
        last = None if caches is None else caches[0].last_token
        first = idx.new_full((idx.shape[0], 1), v) if last is None else last  # (B, 1)
        if last is not None and idx.shape[1] == 1:
            prev = last  # a decoding step: the one previous token is the cache's
        else:
            # (B, T); cut after the join: a (B, T - 1) piece would make a traced T of 2 a constant
            prev = torch.cat([first, idx], dim=1)[:, :-1]
        if caches is not None:
            caches[0].last_token = idx[:, -1:].clone()  # a copy: idx may be a view of a buffer rewritten later
        return (prev * (v + 1) + idx) % self.cfg.bigram_vocab

    def logits(self, x: Tensor) -> Tensor:
        """Hidden states (B, T, C) -> next-token logits (B, T, V), soft-capped when configured:
        cap * tanh(z / cap) is z near 0 and never beyond +-cap, so no logit can run away."""
        logits = self.head(x)
        if self.cfg.logit_softcap is not None:
            cap = self.cfg.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        return logits

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, caches: list[KVCache] | None = None, offset: Offset = 0
    ) -> Tensor | tuple[Tensor, Tensor]:
        """idx (B, T) -> logits (B, T, V); with targets (B, T) also the mean cross-entropy.

        Targets equal to -1 are ignored.
        """
        if idx.dim() != 2 or idx.shape[1] == 0:  # a (T,) list of ids, or none: named, not "tuple index"
            raise ArgumentValueError(
                f"GPT: token ids must be a (batch, time) tensor with at least one token, got shape {tuple(idx.shape)}"
            )
        if caches is None and idx.shape[1] > self.cfg.context:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds the context of {self.cfg.context}")
        x, _ = self.hidden(idx, caches, offset)
        logits = self.logits(x)  # (B, T, V)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention(self, idx: Tensor) -> list[Tensor]:
        """The attention probabilities of every layer: a list of (B, H, T, T) tensors."""
        return self.hidden(idx, return_weights=True)[1]
