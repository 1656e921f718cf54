"""The token embedding: nn.Embedding, with an id outside the vocabulary named in the error.

Legend: B batch, T time, V vocabulary, C model width.

torch says "index out of range in self" for an id >= V (or < 0), which names neither the id nor
the vocabulary. The lookup itself is not slowed: the ids are searched only once it has failed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import ArgumentTypeError, ArgumentValueError


class TokenEmbedding(nn.Embedding):
    """(B, T) token ids -> (B, T, C) vectors; its weight is (V, C), saved as nn.Embedding's."""

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ArgumentTypeError(f"token ids must be a tensor of whole numbers (torch.long), got {idx.dtype}")
        if torch.compiler.is_compiling():  # no try in a compiled graph: the GPU asserts on a bad id anyway
            return super().forward(idx)
        try:
            return super().forward(idx)
        except IndexError:  # on the CPU; a GPU stops at a device-side assertion instead
            V = self.num_embeddings
            bad = idx[(idx < 0) | (idx >= V)]
            first = int(bad[0]) if bad.numel() else "?"
            raise ArgumentValueError(
                f"token id {first} is outside the vocabulary of {V} (ids 0 to {V - 1}); "
                f"{bad.numel()} of the {idx.numel()} ids given are"
            ) from None
