"""A language model's decode step compiled by inductor: one new position of one sequence through every
block with its Python and dispatch cost gone.

Legend: Hkv key/value heads, C the context, Dh head size, L keys the step attends over, V vocabulary.

A decode step at batch 1 reads every weight once and does little else, so on a CPU a small model's
step is mostly per-operation cost: a 6 x 384 GPT spent less than half of its time a token in the 25
matrix-vector products and the rest in some 200 operations around them, each paying Python, dispatch
and a thread wake-up (docs/log.md, "The compiled decode step"). Compiled (inductor: C++ kernels with
the norms, residuals, activations and cache writes fused between the matrix products, called from a
C++ wrapper), the step is the model's own forward, so every block option and the packed
int8/int4/bf16 layers come with it, traced once over caches that never move:

    the row's caches     each layer's KVCache, its (1, Hkv, C, Dh) buffers zeroed when made (a masked
                         key still multiplies: it must be a number), filled by the prompt's ordinary
                         forward, then written in place at each new position
    a step               (ids (1, 1), position (1,), bias (1, 1, 1, L), the previous token) -> logits
                         (1, V): attention over the first L = position + 1 keys (the bias: zeros, its
                         width L); L is symbolic in the compiled graph, so one compilation serves every
                         length; the previous token is what a bigram embedding reads (KVCache.last_token)

Two ways to the same compiled step, the first that works:
    ahead of time        exported.py: torch.export traces it once and AOTInductor makes a library of it,
                         called without TorchDynamo in between (a fifth of a small model's step less);
                         not under autocast
    torch.compile        the step through TorchDynamo, its guards skipped once warm (_stance)

Compiling costs tens of seconds on 2 cores the first time (inductor keeps what it built on disk, and
a later process reuses it), so it is asked for: `compile=True`, `--compile`. A step it cannot take
(a prompt, a row that asks for attention or has hooks) runs the ordinary forward on the same caches;
a model torch.compile fails on decodes as before, after one warning.
"""

from __future__ import annotations

import contextlib
import types
import warnings

import torch
from torch import Tensor, nn

from attnlab.decoding.exported import ExportedStep
from attnlab.nn.attention import KVCache
from attnlab.quant import row_kernels

# inductor's wrapper in C++: the step's 60-odd kernel calls without Python between them. Freezing the
# weights into constants and max-autotune's GEMM templates were measured too: no faster, and freezing
# keeps a second copy of the weights.
_OPTIONS = {"cpp_wrapper": True}
# The step compiled ahead of time first (exported.py: the same kernels without TorchDynamo's cost a
# call); torch.compile's step where that fails (a model torch.export cannot trace) or under autocast.
EXPORT = True
# ...on these devices only. On a GPU loading the step's package killed the process (a segmentation
# fault inside aoti_load_package, which no `except` catches; docs/log.md, "On a GPU"), so a model on a
# GPU takes torch.compile's step (worth checking again on a newer torch: benchmarks/gpu_check.sh).
EXPORT_DEVICES = ("cpu",)


def compile_options(device: torch.device) -> dict:
    """torch.compile's options for a step on `device`: the C++ wrapper on the CPU; elsewhere inductor's
    Python wrapper and Triton kernels (a GPU step costs its launches, not the per-operation dispatch
    that cpp_wrapper removes, and the C++ wrapper was never run on a GPU here)."""
    return _OPTIONS if device.type == "cpu" else {}


class StepCache(KVCache):
    """One layer's cache inside the compiled step: the row's buffers, written at `position`, read up
    to the bias's width (the symbolic L)."""

    def __init__(self, k: Tensor, v: Tensor, position: Tensor, bias: Tensor):
        super().__init__(None)
        self.k, self.v, self.position, self.bias = k, v, position, bias

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new (1, Hkv, 1, Dh) keys/values at the position, in place; the first L, (1, Hkv, L, Dh)."""
        self.k[:, :, self.position] = k.to(self.k.dtype)
        self.v[:, :, self.position] = v.to(self.v.dtype)
        n = self.bias.shape[-1]
        return self.k[:, :, :n], self.v[:, :, :n]

    def key_bias(self) -> Tensor:
        return self.bias

    def keys_after(self, offset: int | Tensor, t: int) -> int:
        return self.bias.shape[-1]


def _step(
    ids: Tensor,
    position: Tensor,
    bias: Tensor,
    buffers: list[tuple[Tensor, Tensor]],
    last: Tensor | None,
    model: nn.Module = None,
) -> Tensor:
    """What is compiled: the model's forward over StepCaches, the last position's logits (1, V). last:
    the row's previous token (1, 1), which a model that looks one token back reads from the first
    cache (GPT's bigram embedding), or None. Each CompiledStep compiles its own copy, the model bound
    as the default of `model`."""
    caches = [StepCache(k, v, position, bias) for k, v in buffers]
    caches[0].last_token = last
    return model(ids, caches=caches, offset=position)[:, -1]


class CompiledStep:
    """The compiled decode step of one model (its compilation is shared by every row), and the small
    tensors each step reuses instead of making new ones."""

    def __init__(self, model: nn.Module, context: int, device: torch.device):
        self.own = own_copy(_step, model, self)
        self.compiled = None  # torch.compile's step, made when first taken (making it loads TorchDynamo: seconds)
        self.model, self.device = model, device
        if device.type == "cpu":  # the step's trace reads whether attnlab's operators are loaded, it cannot build them
            row_kernels.loaded()
        self.exported: ExportedStep | None = None
        self.export_failed: str | None = None  # why the step is torch.compile's (None: not tried yet)
        self.row: list[KVCache] | None = None  # the caches of the last step: a new row is checked first
        self.failed: str | None = None
        self.warm = False  # compiled once: from then on only the guards that tell compilations apart run
        with torch.inference_mode():  # as the engine's caches are: tensors of one kind, one compilation
            self.ids = torch.zeros(1, 1, dtype=torch.long, device=device)
            self.last = torch.zeros(1, 1, dtype=torch.long, device=device)  # the previous token, for bigrams
            self.position = torch.zeros(1, dtype=torch.long, device=device)
            # The bias over the keys: a row's first L keys are all its own, so it is zeros; its width is
            # what tells the graph L (symbolic), and a view of one buffer costs nothing to make.
            self.bias = torch.zeros(1, 1, 1, context, device=device)

    def _stance(self):
        """Once compiled, skip the guards that every step passes (a fifth of a small model's step): the
        inputs are always these tensors and the caches' buffers, only L changes, and L is
        symbolic. What could change the model under the graph (hooks, attention) takes the eager path."""
        if not self.warm:
            return contextlib.nullcontext()
        return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)

    def usable(self, caches: list[KVCache]) -> bool:
        """Whether these caches can take a compiled step: filled by a prompt, room for one more."""
        first = caches[0]
        return (
            self.failed is None
            and first.k is not None
            and first.max_len is not None
            and 0 < first.length < first.max_len
        )

    def feed(self, caches: list[KVCache], token: int) -> Tensor | None:
        """The (1, V) logits of `token` at the caches' next position, or None when compiling failed (the
        caller then runs the ordinary forward)."""
        n, last = caches[0].length, caches[0].last_token
        self.ids.fill_(token)
        if last is not None:  # copied into a tensor of the step's own: the prompt's is a view with other strides
            last = self.last.copy_(last.view(1, 1))
        self.position.fill_(n)
        bias = self.bias[..., : n + 1]
        kv = [t for c in caches for t in (c.k, c.v)]  # each layer's keys, values
        exported = self._exported(caches, kv, bias, last)
        try:
            if exported is not None:
                logits = exported.run(self.ids, self.position, bias, kv, last)
            else:
                if self.compiled is None:
                    options = compile_options(self.device)
                    self.compiled = torch.compile(self.own, fullgraph=True, options=options)
                torch._dynamo.mark_dynamic(bias, 3)
                with self._stance():
                    logits = self.compiled(self.ids, self.position, bias, [(c.k, c.v) for c in caches], last)
            self.warm = True
        except Exception as e:  # a model or platform inductor cannot compile: decode as before
            self.failed = _reason(e)
            warnings.warn(f"attnlab: the compiled decode step is off for this model ({self.failed})", stacklevel=2)
            return None
        for cache in caches:
            cache.length = n + 1
        if last is not None:  # the row's newest token, as the forward keeps it (its own tensor: ids is reused)
            caches[0].last_token = self.ids.clone()
        return logits

    def _exported(
        self, caches: list[KVCache], kv: list[Tensor], bias: Tensor, last: Tensor | None
    ) -> ExportedStep | None:
        """The ahead-of-time step for this call, made on the first one; None: torch.compile's step. A new
        row first hands the library any tensor of the model replaced since (exported.py)."""
        if self.device.type not in EXPORT_DEVICES and self.export_failed is None:
            where = ", ".join(EXPORT_DEVICES)
            self.export_failed = f"the ahead-of-time step runs on {where} only, not {self.device.type}"
        if not EXPORT or self.export_failed is not None or torch.is_autocast_enabled(self.device.type):
            return None
        try:
            if self.exported is None:
                self.exported = ExportedStep(self.model, _step, self.ids, self.position, bias, kv, last)
            elif caches is not self.row:
                self.exported.refresh()
        except Exception as e:  # torch.export or AOTInductor cannot take this model: torch.compile's step
            self.export_failed = _reason(e)
            self.exported = None
            return None
        self.row = caches
        return self.exported if self.exported.with_last == (last is not None) else None


def own_copy(step, model: nn.Module, owner: object):
    """`step` with a code object of its own and `model` bound as its last argument's default:
    torch.compile keeps its compilations per code object, so `owner`'s are only its own, and skipping
    their guards (_stance) cannot pick another model's."""
    code = step.__code__.replace(co_name=f"{step.__name__}_{id(owner):x}")
    return types.FunctionType(code, step.__globals__, code.co_name, (model,))


def _reason(e: Exception) -> str:
    """Why a way to the step failed, in one line: "RuntimeError: its first line"."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
