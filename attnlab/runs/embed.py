"""Text embeddings: each text as one unit vector, pooled from its model's final hidden states.

Legend: N inputs, B a batch of them, T the longest one's tokens, C model width, D dimensions kept.

    texts -> the tokenizer's ids -> the model's framing of them (an encoder's [CLS], an encoder-decoder's
    shifted ids) -> batches right-padded with PAD_ID -> final hidden states (B, T, C) -> pooled over
    each text's own positions (B, C) -> the first D kept -> unit length (B, D)

How a family pools is the family's to say (models/protocols.TextEmbedding), its default first:
  gpt, reward  "last": the last token's state, the only one that has seen the whole text (a causal
               model's earlier states each saw a prefix); "mean" over the tokens is offered too
  encoder      "mean" over the real tokens, every one of which saw the whole text; a classifier
               trained on [CLS] ("pooling": "cls") defaults to "cls", the state its head was trained to read
  seq2seq      "mean" of the encoder's states, the memory its decoder reads
Other families (images, the baselines, the RNN encoder-decoder) are refused in one line.

Padding changes no text's vector: a causal model's padding comes after the text, and the encoders
mask it out of attention, so a text's vector is the same alone or batched with longer ones (tested
within 1e-6); quantized weights too, whose passes are padded to one kernel's size (least_rows).
Vectors are float32 on the CPU, of unit length; `dimensions` keeps the first D and normalises
again, as OpenAI's text-embedding-3 models do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.batches import PAD_ID
from attnlab.errors import AttnlabError
from attnlab.models import FAMILIES
from attnlab.models.common import pool
from attnlab.models.protocols import TextEmbedding
from attnlab.quant.packed import ROW_LIMIT, PackedLinear
from attnlab.runs.run import Run

POOLINGS = ("auto", "last", "mean", "cls")
# Texts per forward pass. For 48-token texts on 2 busy cores, batches of 8 to 128 ran within the
# machine's noise of each other (gpt-nano 263-372 texts/s, encoder-small 265-456): a text is already
# many rows per matrix product. 32 keeps a pass's padding and activations small.
BATCH = 32
Inputs = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


class TooLong(AttnlabError):
    """An input over the model's context (the server answers it as OpenAI's context_length_exceeded)."""

    def __init__(self, index: int, tokens: int, context: int):
        super().__init__(
            f"input {index} (from 0) takes {tokens:,} tokens, over this model's context of {context:,}; "
            "shorten it, or pass truncate=True to read its first tokens"
        )
        self.index, self.tokens, self.context = index, tokens, context


def embed(
    run_or_model: Run | nn.Module,
    inputs: Inputs,
    pooling: str = "auto",
    truncate: bool = False,
    dimensions: int | None = None,
    batch_size: int = BATCH,
) -> Tensor:
    """Unit-length embeddings (N, D) of `inputs`: a text, texts, token ids or lists of them (a run's
    tokenizer's ids; a bare model takes ids only, read as its own, unframed). pooling: "auto" (the family's
    default), "last", "mean" or "cls", where the family offers it; truncate: read an input over the
    context by its first tokens (else an error); dimensions: keep the first D and normalise again."""
    model = embedding_model(run_or_model)
    ids = model_ids(run_or_model, inputs, truncate)
    return embed_ids(model, ids, pooling, dimensions, batch_size)


def embedding_model(run_or_model: Run | nn.Module) -> nn.Module:
    """The model of a run (or the model itself) if its family makes text embeddings; else one line."""
    model = run_or_model.model if isinstance(run_or_model, Run) else run_or_model
    if makes_embeddings(model):
        return model
    if isinstance(run_or_model, Run):
        what = f"{run_or_model.path} is a {run_or_model.config.get('family')} run"
    else:
        what = f"a {type(model).__name__} model"
    families = ", ".join(embedding_families())
    raise AttnlabError(f"{what}: it has no text embedding (embeddings come from {families} runs)")


def makes_embeddings(model: nn.Module) -> bool:
    """Whether the model's family makes text embeddings (a captioner's declares none: it reads images)."""
    return isinstance(model, TextEmbedding) and bool(model.poolings)


def embedding_families() -> list[str]:
    """The families whose models make text embeddings."""
    return [name for name, (_, cls) in FAMILIES.items() if issubclass(cls, TextEmbedding) and cls.poolings]


def model_ids(run_or_model: Run | nn.Module, inputs: Inputs, truncate: bool = False) -> list[list[int]]:
    """The model ids of each input, framed as the model reads a text and checked against its context."""
    model = embedding_model(run_or_model)
    tok = run_or_model.tokenizer if isinstance(run_or_model, Run) else None
    context = model.cfg.context
    room = context - len(model.embedding_ids([], tok)) if tok is not None else context  # the framing's tokens
    out = []
    for i, item in enumerate(as_list(inputs)):
        pieces = token_ids(tok, item, i)
        if len(pieces) > room and not truncate:
            raise TooLong(i, len(pieces) + context - room, context)
        out.append(model.embedding_ids(pieces[:room], tok) if tok is not None else pieces[:room])
    return out


def as_list(inputs: Inputs) -> list[str | list[int]]:
    """One text or one list of ids as a list of one; a list of either as it is; nothing is an error."""
    if isinstance(inputs, str) or (len(inputs) and isinstance(inputs[0], int)):
        return [inputs]
    if not len(inputs):
        raise AttnlabError("no input to embed: give a text, texts, token ids or lists of them")
    return list(inputs)


def token_ids(tok, item: str | Sequence[int], index: int) -> list[int]:
    """A text's tokenizer ids (a bare model: no tokenizer, ids only), or given ids checked."""
    if isinstance(item, str):
        if tok is None:
            raise AttnlabError("a model alone has no tokenizer: give it token ids, or embed a run (attnlab.load)")
        ids = tok.encode(item)
    else:
        ids = [int(i) for i in item]
        top = tok.vocab_size if tok is not None else None
        if any(i < 0 or (top is not None and i >= top) for i in ids):
            allowed = "0 or more" if top is None else f"0..{top - 1}"
            raise AttnlabError(f"input {index} (from 0): token ids must be {allowed}")
    if not ids:
        raise AttnlabError(f"input {index} (from 0) has no tokens: an embedding needs at least one")
    return ids


@torch.no_grad()
def embed_ids(
    model: nn.Module,
    ids: list[list[int]],
    pooling: str = "auto",
    dimensions: int | None = None,
    batch_size: int = BATCH,
) -> Tensor:
    """Unit-length embeddings (N, D) of inputs already in model ids, batched by length (the longest
    together, so that short texts pad little), each put back at its own row."""
    how = pooling_of(model, pooling)
    width = model.cfg.d_model
    if dimensions is not None and not 1 <= dimensions <= width:
        raise AttnlabError(f"dimensions must be 1..{width} (this model's width), got {dimensions}")
    device, floor = next(model.parameters()).device, least_rows(model)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = torch.empty(len(ids), dimensions or width)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        longest = len(ids[rows[0]])
        lengths = torch.tensor([len(ids[i]) for i in rows], device=device)  # (B,)
        spare = max(0, -(-floor // longest) - len(rows))  # all-padding rows, up to `floor` tokens in all
        batch = torch.full((len(rows) + spare, longest), PAD_ID, device=device)  # (B + spare, T)
        for r, i in enumerate(rows):
            batch[r, : len(ids[i])] = torch.tensor(ids[i], device=device)
        states = model.embedding_states(batch)[: len(rows)]  # (B, T, C)
        vectors = pooled(states, lengths, how)[:, :dimensions]  # (B, D)
        out[rows] = F.normalize(vectors.float(), dim=-1).cpu()
    return out


def least_rows(model: nn.Module) -> int:
    """The tokens a pass must hold for a text's vector not to depend on its batch. Quantized layers
    (quant/packed.py) take attnlab's row operators for 1..ROW_LIMIT rows and matrix kernels beyond,
    which round apart (1e-3 here): past ROW_LIMIT every text takes the kernels, alone or batched."""
    return ROW_LIMIT + 1 if any(isinstance(m, PackedLinear) for m in model.modules()) else 0


def pooling_of(model: nn.Module, pooling: str) -> str:
    """The pooling asked for, if the model's family offers it; "auto": the family's default."""
    if pooling not in POOLINGS:
        raise AttnlabError(f"unknown pooling {pooling!r}: choose from {', '.join(POOLINGS)}")
    offered = model.poolings
    if pooling == "auto":
        return offered[0]
    if pooling not in offered:
        raise AttnlabError(
            f"pooling {pooling!r} does not apply to a {type(model).__name__} like this one: it offers "
            f"{', '.join(offered)}"
        )
    return pooling


def pooled(states: Tensor, lengths: Tensor, how: str) -> Tensor:
    """One vector per text (B, C) from the states (B, T, C) of texts of `lengths` (B,) tokens."""
    if how == "last":
        return states[torch.arange(len(lengths), device=states.device), lengths - 1]
    real = torch.arange(states.shape[1], device=states.device)[None, :] < lengths[:, None]  # (B, T)
    return pool(states, how, real)
