"""The engine's batched decode step compiled ahead of time: B rows of the slots (slots.py), each one new
token at its own position, through every block with the Python and dispatch cost gone.

Legend: S slots, B rows in the step (the first B slots), Hkv key/value heads, C the context, Dh head
size, L keys the step attends over (the longest row's, new token included), V vocabulary.

A server's step over 16 rows pays the same per-operation cost as a lone row's (some 200 operations,
each with Python, dispatch and a thread wake-up around it), and for a small model that cost is most of
the step; compiled.py removed it for a lone row, this does the same for the batched step:

    traced once       (ids (B, 1), positions (B,), bias (B, 1, 1, L), the slots' k, v buffers
                      (S, Hkv, C + 1, Dh) each, the previous tokens (B, 1) when the model reads them)
                      -> logits (B, V); B (2..S) and L (2..C) symbolic: one library serves every
                      batch and length; each row's keys/values written at its own position in place
    the same library  as a lone row's step is kept (exported.py: on disk under a key that names
                      the batched step, found again without a trace by step_cache.py)

The engine checks every batched draw against the lone row's logits as before (exact.py); the
tolerance it measures when it starts is measured through this step. A model the export cannot take,
a device it does not run on, or a step under autocast goes through torch.compile instead (B and L
marked dynamic); one inductor cannot compile keeps the ordinary forward (one warning).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from attnlab.decoding import compiled
from attnlab.decoding.compiled import EXPORT_DEVICES, _reason, own_copy
from attnlab.decoding.exported import ExportedStep
from attnlab.decoding.slots import Slots
from attnlab.nn.attention import KVCache
from attnlab.quant import row_kernels


class RowsCache(KVCache):
    """One layer's slot buffers inside the compiled step: row b written at positions[b], every row's
    first L positions read, the bias saying which are its own."""

    def __init__(self, k: Tensor, v: Tensor, positions: Tensor, bias: Tensor):
        super().__init__(None)
        self.k, self.v, self.positions, self.bias = k, v, positions, bias

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's (B, Hkv, 1, Dh) keys/values at the rows' positions; (B, Hkv, L, Dh) back."""
        b, n = k.shape[0], self.bias.shape[-1]
        rows = torch.arange(b, device=k.device)
        self.k[rows, :, self.positions] = k[:, :, 0].to(self.k.dtype)
        self.v[rows, :, self.positions] = v[:, :, 0].to(self.v.dtype)
        return self.k[:b, :, :n], self.v[:b, :, :n]

    def key_bias(self) -> Tensor:
        return self.bias

    def keys_after(self, offset: int | Tensor, t: int) -> int:
        return self.bias.shape[-1]


def _rows_step(
    ids: Tensor,
    positions: Tensor,
    bias: Tensor,
    buffers: list[tuple[Tensor, Tensor]],
    last: Tensor | None,
    model: nn.Module = None,
) -> Tensor:
    """What is compiled: the model's forward over RowsCaches, each row's logits (B, V). last: the rows'
    previous tokens (B, 1) for a model that looks one token back, or None."""
    caches = [RowsCache(k, v, positions, bias) for k, v in buffers]
    caches[0].last_token = last
    return model(ids, caches=caches, offset=positions)[:, -1]


class CompiledRows:
    """The batched step of one model, made on its first use: ahead of time (exported.py; cold: traced
    and compiled, tens of seconds; warm: loaded from the cache in about a second), else, under
    autocast or where the export fails, through torch.compile with B and L marked dynamic."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.device = model, device
        self.own = own_copy(_rows_step, model, self)  # compilations of its own
        self.exported: ExportedStep | None = None
        self.export_failed: str | None = None if device.type in EXPORT_DEVICES else f"not on {device.type}"
        self.compiled = None
        self.failed: str | None = None
        if device.type == "cpu":  # the trace reads whether attnlab's operators are loaded
            row_kernels.loaded()

    def feed(self, slots: Slots, ids: Tensor, positions: Tensor) -> Tensor | None:
        """(B, V) logits of each slotted row's newest token (ids (B, 1)) at its position, or None: the
        caller runs the ordinary forward (the step failed, or the buffers are not made yet)."""
        table, b = slots.table, ids.shape[0]
        if self.failed is not None or slots.caches[0].k is None or b < 2:
            return None
        kv = [t for c in slots.caches for t in (c.k, c.v)]
        last = None if table.last is None else table.last[:b].clone()
        try:
            logits = self._run(ids, positions, table.bias, kv, last)
        except Exception as e:  # a model inductor cannot compile: the ordinary forward
            self.failed = _reason(e)
            warnings.warn(f"attnlab: the compiled batched step is off for this model ({self.failed})", stacklevel=2)
            return None
        if last is not None:  # the rows' newest tokens, as the forward keeps them (slots.SlotCache.last_token)
            table.last[:b] = ids
        return logits

    def _run(self, ids: Tensor, positions: Tensor, bias: Tensor, kv: list[Tensor], last: Tensor | None) -> Tensor:
        """The step through the library, else torch.compile's."""
        if compiled.EXPORT and self.export_failed is None and not torch.is_autocast_enabled(self.device.type):
            try:
                if self.exported is None:
                    self.exported = ExportedStep(self.model, _rows_step, ids, positions, bias, kv, last, kind="rows")
                if self.exported.with_last == (last is not None):
                    return self.exported.run(ids, positions, bias, kv, last)
            except Exception as e:  # torch.export or AOTInductor cannot take this model: torch.compile's
                self.export_failed, self.exported = _reason(e), None
        if self.compiled is None:
            self.compiled = torch.compile(self.own, fullgraph=True, options=compiled.compile_options(self.device))
        for t, dims in ((ids, (0,)), (positions, (0,)), (bias, (0, 3)), (last, (0,))):
            for d in dims if t is not None else ():
                torch._dynamo.mark_dynamic(t, d)
        return self.compiled(ids, positions, bias, [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)], last)
