"""A lone row's verify pass compiled ahead of time: the newest token and k drafted ones (speculate.py)
through every block in one call, each weight read once for all of them.

Legend: Hkv key/value heads, C the context, Dh head size, T tokens fed (2..ROW_LIMIT), o the row's
position (keys already in its caches), L = o + T keys the pass attends over, V vocabulary.

Speculative decoding pays only if checking k drafts costs little more than one step. The eager pass
cost several compiled one-token steps: per-operation cost, and PyTorch's float32 product, which packs
the weight again at every call; torch.compile'd, its products stayed PyTorch's (docs/serving.md,
"Speculative decoding", has the measurements). Traced as the lone step is (exported.py), with
every float32 product through attnlab's row operator (quant/row_kernels.FloatRows: it reads a weight
once for up to ROW_LIMIT rows, as the packed int8/int4/bf16 layers' operators do), it is one call
into a library:

    traced once   (ids (1, T), position (1,) = o, bias (1, 1, 1, L) of zeros, the row's k, v buffers
                  (1, Hkv, C + 1, Dh) each, the previous token (1, 1) when the model reads it) -> logits
                  (T, V); T and L symbolic: one library serves every draft length and position. The
                  attention's causal mask is aligned bottom-right (nn/attention.py), so query j sees
                  keys up to o + j: its own drafts before it, none after
    the caches    written at o..o + T - 1 in place, as the eager pass writes them; a row's rejected
                  drafts are cut off afterwards (LMDecoder.rollback)

Where the ahead-of-time step cannot be had (a model torch.export cannot trace, a device other than
the CPU, autocast) the pass is the model's eager forward: a torch.compile'd one was measured no
cheaper where it matters (docs/serving.md, "Speculative decoding").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.decoding import compiled
from attnlab.decoding.compiled import EXPORT_DEVICES, StepCache, _reason
from attnlab.decoding.exported import ExportedStep
from attnlab.nn.attention import KVCache
from attnlab.quant import row_kernels
from attnlab.quant.packed import ROW_LIMIT


class VerifyCache(StepCache):
    """One layer's buffers inside the verify pass: the lone step's cache (compiled.StepCache) with T new
    keys/values written at position..position + T - 1."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the (1, Hkv, T, Dh) keys/values in place; the first L, (1, Hkv, L, Dh)."""
        at = self.position + torch.arange(k.shape[2], device=k.device)  # (T,) the new positions
        self.k[:, :, at] = k.to(self.k.dtype)
        self.v[:, :, at] = v.to(self.v.dtype)
        n = self.bias.shape[-1]
        return self.k[:, :, :n], self.v[:, :, :n]


def _verify(
    ids: Tensor,
    position: Tensor,
    bias: Tensor,
    buffers: list[tuple[Tensor, Tensor]],
    last: Tensor | None,
    model: nn.Module = None,
) -> Tensor:
    """What is traced: the model's forward over VerifyCaches, every position's logits (T, V). last: the
    row's previous token (1, 1) for a model that looks one token back (a bigram embedding), or None."""
    caches = [VerifyCache(k, v, position, bias) for k, v in buffers]
    caches[0].last_token = last
    return model(ids, caches=caches, offset=position)[0]


class CompiledVerify:
    """One model's verify pass, made on its first use (exported.py: traced and compiled cold, tens of
    seconds; loaded from the cache warm, about a second)."""

    def __init__(self, model: nn.Module, context: int, device: torch.device):
        self.model, self.device = model, device
        self.exported: ExportedStep | None = None
        self.failed: str | None = None if device.type in EXPORT_DEVICES else f"not on {device.type}"
        self.row: list[KVCache] | None = None  # the caches of the last pass: a new row hands tensors over first
        if device.type == "cpu":  # the trace reads whether attnlab's operators are loaded
            row_kernels.loaded()
        with torch.inference_mode():  # as the engine's caches are
            self.position = torch.zeros(1, dtype=torch.long, device=device)
            self.bias = torch.zeros(1, 1, 1, context, device=device)  # zeros; its width tells the pass L

    def usable(self, caches: list[KVCache], tokens: int, offset: int) -> bool:
        """Whether a pass of `tokens` at `offset` can be compiled: the caches' buffers of the length it is
        traced for (LMDecoder.start's: the context and one) filled up to it, room for the tokens below
        their last position (L stays under the buffers' length)."""
        first = caches[0]
        return (
            compiled.EXPORT
            and self.failed is None
            and 2 <= tokens <= ROW_LIMIT
            and first.k is not None
            and first.k.shape[2] == self.bias.shape[-1] + 1
            and 0 < first.length == offset
            and offset + tokens < first.k.shape[2]
        )

    def feed(self, caches: list[KVCache], ids: list[int]) -> Tensor | None:
        """(T, V) logits after each of `ids` at the caches' next position, written into them; None where
        the pass cannot be compiled (the caller runs the eager forward)."""
        if torch.is_autocast_enabled(self.device.type):  # not traced under autocast (as compiled.py's step)
            return None
        n, last = caches[0].length, caches[0].last_token
        tokens = torch.tensor([ids], device=self.device)  # (1, T)
        last = None if last is None else last.reshape(1, 1).clone()  # a tensor of its own strides
        self.position.fill_(n)
        bias = self.bias[..., : n + len(ids)]
        kv = [t for c in caches for t in (c.k, c.v)]  # each layer's keys, values
        try:
            if self.exported is None:
                self.exported = ExportedStep(self.model, _verify, tokens, self.position, bias, kv, last, kind="verify")
            elif caches is not self.row:
                self.exported.refresh()
        except Exception as e:  # torch.export or AOTInductor cannot take this model: the eager pass
            self.failed = _reason(e)
            return None
        self.row = caches
        if self.exported.with_last != (last is not None):
            return None
        logits = self.exported.run(tokens, self.position, bias, kv, last)
        for cache in caches:
            cache.length = n + len(ids)
        if last is not None:  # the newest token fed, as the forward keeps it
            caches[0].last_token = tokens[:, -1:].clone()
        return logits
