"""The compiled decode step as a library of its own: torch.export traces it once, AOTInductor compiles
it to C++ (kernels and the wrapper that calls them), and each step is one call into that library.

Legend: Hkv key/value heads, C the context, Dh head size, L keys the step attends over, V vocabulary.

Why not torch.compile alone (compiled.py's other way): its compiled step is as fast, but each call
first passes through TorchDynamo (frame entry, guards, the runtime wrappers), about a fifth of a
small model's int8 step; one call into this library costs a few microseconds (docs/log.md, "The
compiled decode step", has the measurements).

    traced once       the step (compiled._step) over the row's caches: (ids (1, 1), position (1,), bias
                      (1, 1, 1, L), the caches' k, v buffers (1, Hkv, C + 1, Dh) each, the previous
                      token (1, 1) when the model reads it) -> logits (1, V); L symbolic (2..C); the cache
                      writes are in place, as in the model's forward. Two more kinds are traced the
                      same way, each its own library: the batched rows' step (compiled_rows.py, B rows
                      symbolic) and a lone row's verify pass (compiled_verify.py, T tokens symbolic)
    its products      a float32 layer's one-row product is attnlab's operator (quant/row_kernels.FloatRows,
                      active while the step is traced; every product of at most ROW_LIMIT rows in the
                      other two kinds), faster than PyTorch's product for a small
                      model and equal for GPT-2 small, whose matrices are read at the memory's speed
                      either way
    the weights       are not in the library: it is handed the model's own tensors by name (parameters,
                      buffers, a packed layer's operands) and keeps no copy, so a model trained in place
                      decodes with its new weights; a tensor replaced by another is handed over again
                      (refresh) before the next row
    kept on disk      the library, in inductor's cache folder under a key made of the traced program
                      (its graph, shapes and dtypes: no weight values), this torch and this CPU's
                      instruction set: another model of the same shape, or another checkout of
                      attnlab (the graph's comments, which name source files and lines, are left out),
                      loads it instead of compiling again (tens of seconds on 2 cores); and a note under
                      a key computed without the trace (step_cache.py), so the next process skips the
                      trace as well
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export.graph_signature import InputKind

from attnlab.decoding import step_cache
from attnlab.io import atomic_write
from attnlab.quant import row_kernels
from attnlab.quant.packed import ROW_LIMIT, PackedLinear

FOLDER = "attnlab-steps"  # under inductor's cache folder
COLD = (
    "attnlab: compiling this model's {step}, once for its shape and precision (about a minute on 2 "
    "cores; later runs load it in a second; --no-compile decodes without it)"
)


# Each kind of step: what the messages call it (the key names the kind, so each has a library of its own).
KINDS = {"row": "decode step", "rows": "batched decode step", "verify": "verify pass"}


class _Step(nn.Module):
    """The step as a module for torch.export: the model is a submodule, so its tensors have names."""

    def __init__(self, model: nn.Module, step):
        super().__init__()
        self.model, self._fn = model, step

    def forward(self, ids: Tensor, position: Tensor, bias: Tensor, kv: list[Tensor], last: Tensor | None):
        buffers = [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]
        return self._fn(ids, position, bias, buffers, last, self.model)


class ExportedStep:
    """One model's step compiled ahead of time. `run` takes the tensors compiled.CompiledStep keeps and
    a row's caches; `refresh` hands the library the model's tensors again when one was replaced."""

    def __init__(
        self,
        model: nn.Module,
        step,
        ids: Tensor,
        position: Tensor,
        bias: Tensor,
        kv: list[Tensor],
        last: Tensor | None,
        kind: str = "row",
    ):
        """kind: which step (KINDS): a lone row's one token, the batched rows' (compiled_rows.py, B rows
        symbolic, 2..the slots) or a lone row's verify pass (compiled_verify.py, T tokens symbolic)."""
        for layer in model.modules():
            if isinstance(layer, PackedLinear):
                layer.operands()  # made now, outside the trace: they are the layer's buffers from here on
        self.module = _Step(model, step).eval()
        self.with_last, self.kind = last is not None, kind
        loaded, folder = row_kernels.ready(), _folder()
        key = step_cache.fingerprint(self.module, [*_examples(kind, ids, position, bias), *kv, last], loaded, kind)
        warm = step_cache.remembered(folder, key)
        if warm is not None:  # made by an earlier process: no trace (step_cache.py)
            self.path, self.lifted = warm
        else:
            t0, step = time.perf_counter(), KINDS[kind]
            program = self._traced(ids, position, bias, kv, last, loaded)  # seconds: said only if compiled
            self.lifted = _as_buffers(program)
            self.path = _library(program, folder, COLD.format(step=step))
            step_cache.remember(folder, key, self.path, self.lifted)
            print(f"attnlab: the {step} is ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        self.runner = step_cache.Library(self.path)
        self.names = self.runner.get_constant_fqns()
        self.tensors: dict[str, Tensor] = {}
        self.refresh()

    def _traced(
        self, ids: Tensor, position: Tensor, bias: Tensor, kv: list[Tensor], last: Tensor | None, loaded: bool
    ) -> torch.export.ExportedProgram:
        """torch.export's program of the step, L symbolic (2..C), with rows B (2..the slots), a verify
        pass T (2..ROW_LIMIT); attnlab's row products in it when loaded."""
        with torch.inference_mode(False), torch.no_grad():
            # Example inputs of the same shapes outside inference mode (the trace writes into them).
            like = lambda t: None if t is None else torch.zeros_like(t)
            example = (like(ids), like(position), like(bias), [like(t) for t in kv], like(last))
            context = self.module.model.cfg.context
            keys = torch.export.Dim("L", min=2, max=context)
            fixed = [None] * len(kv)
            most = 1  # the rows of a product: one in a lone row's step
            if self.kind == "rows":
                b = torch.export.Dim("B", min=2, max=kv[0].shape[0])
                shapes = ({0: b}, {0: b}, {0: b, 3: keys}, fixed, None if last is None else {0: b})
                most = kv[0].shape[0] if kv[0].shape[0] <= ROW_LIMIT else 1  # the batch's rows
            elif self.kind == "verify":
                t = torch.export.Dim("T", min=2, max=min(ROW_LIMIT, context))
                shapes, most = ({1: t}, None, {3: keys}, fixed, None), ROW_LIMIT
            else:
                shapes = (None, None, {3: keys}, fixed, None)
            with row_kernels.FloatRows(most) if loaded else contextlib.nullcontext():
                return torch.export.export(self.module, example, dynamic_shapes=shapes, strict=False)

    def _current(self) -> dict[str, Tensor]:
        named = dict(self.lifted)
        named.update(self.module.named_parameters(remove_duplicate=False))  # a tied weight under each name
        named.update(self.module.named_buffers(remove_duplicate=False))
        missing = [n for n in self.names if n not in named]
        if missing:
            raise RuntimeError(f"the compiled step wants {missing[0]}, which the model no longer has")
        return {n: named[n] for n in self.names}

    def refresh(self) -> None:
        """Hand the library the model's tensors if any was replaced since (it reads them, copies none)."""
        current = self._current()
        if any(current[n] is not self.tensors.get(n) for n in self.names):
            self.runner.load_constants(current, True, True)  # every constant, the model's own tensors
            self.tensors = current

    def run(self, ids: Tensor, position: Tensor, bias: Tensor, kv: list[Tensor], last: Tensor | None) -> Tensor:
        """(1, V) logits of one step ((B, V) of the batched rows', (T, V) of a verify pass); the caches are
        written at `position` (and on) in place."""
        return self.runner.loader.run([ids, position, bias, *kv, *([last] if self.with_last else [])])[0]


def _examples(kind: str, ids: Tensor, position: Tensor, bias: Tensor) -> list[Tensor]:
    """The step's first inputs as the key reads them: a symbolic size (L; B of the batched rows; T of
    a verify pass) cut to 1, as it is no part of the key."""
    if kind == "rows":
        return [ids[:1], position[:1], bias[:1, ..., :1]]
    return [ids[:, :1] if kind == "verify" else ids, position, bias[..., :1]]


def _as_buffers(program: torch.export.ExportedProgram) -> dict[str, Tensor]:
    """The tensors the trace found held by the model's modules but not as their parameters or buffers
    (a rotary layer's tables), now named as buffers that are not saved: inductor names a buffer by its
    path, as the library must be handed it, where it would give such a constant a name of its own."""
    lifted = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR:
            spec.kind, spec.persistent = InputKind.BUFFER, False
            lifted[spec.target] = program.constants[spec.target]
    return lifted


def _folder() -> Path:
    """The libraries' folder, in inductor's cache folder: TORCHINDUCTOR_CACHE_DIR, else torch's default
    (torchinductor_USER in the temporary folder), found as torch does but without importing inductor
    (seconds: a warm start needs none of it)."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is None:
        root = Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser()))
    return Path(root).resolve() / FOLDER


def library_key(program: str) -> str:
    """The name of a traced program's library in the cache: its graph (operators, shapes, dtypes,
    constants, signature) with torch's version and the CPU's instructions, not its comments, which
    name each node's source file and line: the same graph traced in another checkout (a fresh clone,
    a worktree) or after an edit elsewhere in attnlab (which moves lines, and misses step_cache's note)
    is the same library, and is not compiled again."""
    graph = "\n".join(line for line in program.splitlines() if not line.lstrip().startswith("#"))
    text = "\n".join((graph, torch.__version__, torch.backends.cpu.get_cpu_capability()))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _library(program: torch.export.ExportedProgram, folder: Path, cold: str) -> Path:
    """The compiled library of `program`: from the folder when it was made before, else compiled and
    stored there (io.atomic_write: a second process never reads half a file), `cold` said first."""
    key = library_key(str(program))
    path = folder / f"{key}.pt2"
    if path.is_file():
        return path
    print(cold, file=sys.stderr, flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    options = {"aot_inductor.package_constants_in_so": False}
    atomic_write(
        path,
        lambda tmp: torch._inductor.aoti_compile_and_package(program, package_path=str(tmp), inductor_configs=options),
    )
    return path
