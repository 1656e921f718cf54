"""What a family offers, said by the model itself: the tools built on models (interpret/, tasks/,
decoding/, serve/) ask through these small classes, never by the family's name or by probing
attributes. A family inherits the ones it implements.

    OneSequence    reads one sequence of token ids (B, T): GPT, the encoder, the baselines
    WordEmbedded   a text model's (source) word embedding, and where tokenizer ids sit in it
    Positioned     a Transformer's position scheme of its (source) input, whose vectors can be drawn
    ReadOut        what the logit lens reads: the stack whose residual stream it reads, the final
                   norm and the head that turn a stream into next-token logits
    CausalLM       a decoder-only language model: next-token logits from a key/value cache (GPT)
    StepDecoding   an encoder-decoder decoded a token at a time from its encoded source (start,
                   step), each step's attention over the source on request (captioners, translation)
    TextEmbedding  final hidden states that summarise a text as one vector, and the poolings that mean
                   something for how the family reads (runs/embed.py, /v1/embeddings)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from attnlab.nn.cache import KVCache
from attnlab.nn.position import Positions


class OneSequence:
    """forward(ids (B, T), labels=None): one sequence of token ids in, as the tokenizer gives them."""


class WordEmbedded:
    """A model that embeds words (or tokens)."""

    token_shift = 0  # model id = tokenizer id + token_shift (the encoder-decoders keep PAD, BOS, EOS below)

    @property
    def word_embedding(self) -> nn.Embedding | None:
        """The (source) token embedding, (V, C); None for a model that reads counts (the bag of words)."""
        raise NotImplementedError


class Positioned:
    """A Transformer: position information added to (or acting on) its input."""

    def input_positions(self) -> tuple[Positions, str]:
        """The position scheme of the model's input (an encoder-decoder's: its source side), and the
        side it serves, as a prefix for titles ("" or "encoder ")."""
        raise NotImplementedError


class ReadOut:
    """A model whose residual stream can be read as next-token predictions at every depth."""

    def readout(self) -> tuple[str, nn.Module, Callable[[Tensor], Tensor]]:
        """(the stack whose stream is read: its hook-point prefix, the final norm, the head)."""
        raise NotImplementedError


class CausalLM(OneSequence, WordEmbedded, Positioned, ReadOut):
    """A decoder-only language model: forward(idx (B, T), caches=, offset=) -> next-token logits
    (B, T, V), its keys and values kept in the caches that new_caches gives, one per block."""

    def new_caches(self, max_len: int | None = None) -> list[KVCache]:
        raise NotImplementedError

    def output_layer(self) -> nn.Module:
        """The layer that turns final hidden states into logits, (..., C) -> (..., V): what a decode
        step reads most of in a small model (quantization stores it small too)."""
        raise NotImplementedError


class StepDecoding:
    """An encoder-decoder: `start(src)` encodes the sources (B, ...) once; `step(tokens (B,), state)` gives
    the next-token logits (B, V) and the state after it; `state.select(rows)` keeps rows (beam search)."""

    def start(self, src: Tensor):
        raise NotImplementedError

    def step(self, tokens: Tensor, state) -> tuple[Tensor, object]:
        raise NotImplementedError

    def step_weights(self, tokens: Tensor, state) -> tuple[Tensor, object, Tensor]:
        """step, and where the new token's query looked in the source: (B, L, H, S)."""
        raise NotImplementedError


class TextEmbedding:
    """A model whose final hidden states summarise its text input as one vector (runs/embed.py).

    `embedding_ids(ids, tok)`: the model ids it reads for a text's tokenizer ids (framed as it was
    trained to read a text); `embedding_states(ids (B, T))` -> (B, T, C) for model ids right-padded with
    PAD_ID (0), padding changing no real position's state; `poolings` names the summaries that mean
    something for how the family reads, its default first: "last" (the last real position), "mean"
    (over the real positions) or "cls" (position 0). Empty: none (a captioner, whose source is an image)."""

    poolings: tuple[str, ...] = ("mean",)

    def embedding_ids(self, ids: list[int], tok) -> list[int]:
        return list(ids)

    def embedding_states(self, ids: Tensor) -> Tensor:
        raise NotImplementedError
