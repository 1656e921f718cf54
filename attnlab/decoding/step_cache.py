"""Where compiled decode steps are kept between processes, found without tracing the model again.

exported.py keys a compiled library by the traced program (torch.export: seconds on 2 cores, more than
the rest of a warm start). So that the second use of a model starts in a second, a cold build also
writes a note under a fingerprint computed without tracing; the next process that computes the same
fingerprint loads the library the note names and skips the trace. The fingerprint holds everything
the trace reads besides the weights' values (which the library is handed at run time, never holds):

    the code          a digest of attnlab's own source files: any change to the model or the step
                      code makes every note stale (the library is traced and compiled again)
    the model         its module tree as printed, its config, each parameter's and buffer's name,
                      shape, dtype and which of them share storage (tied weights)
    the inputs        the step's example tensors' shapes and dtypes (caches, the previous token)
    the machine       torch's version and CPU capability, the CPU's model, whether attnlab's row
                      operators are loaded (the trace takes them when they are)

A note is a safetensors file: its metadata names the library, its tensors are the constants the trace
lifted out of the model (a rotary layer's tables, functions of the config alone), handed to the
library as the trace would have found them. A missing or unreadable note or library: a cold build.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.io import read_safetensors, write_safetensors
from attnlab.runtime.precision import cpu_identity

NOTES = "notes"  # under the libraries' folder


@functools.cache
def source_digest() -> str:
    """sha256 of attnlab's source files (.py and .cpp), by path: the code every trace runs."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cpp")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def fingerprint(module: nn.Module, inputs: list[Tensor | None], rows_loaded: bool, step: str = "row") -> str:
    """The step's key without a trace (the module's docstring): module the _Step being traced (its
    .model a language model with its config), inputs its example tensors in order (None where absent),
    step which step it is (exported.KINDS: a lone row's, the batched rows', a verify pass)."""
    parts = [source_digest(), torch.__version__, torch.backends.cpu.get_cpu_capability(), cpu_identity(), step]
    parts += [str(rows_loaded), repr(module), repr(module.model.cfg)]  # the language model's config
    owners: dict[int, str] = {}  # storage -> the first name holding it: tied weights show as such
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, t in named:
        first = owners.setdefault(t.untyped_storage().data_ptr(), name)
        parts.append(f"{name} {tuple(t.shape)} {t.stride()} {t.dtype} {first}")
    parts += ["-" if t is None else f"{tuple(t.shape)} {t.dtype}" for t in inputs]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def _note(folder: Path, key: str) -> Path:
    return folder / NOTES / f"{key}.safetensors"


def remembered(folder: Path, key: str) -> tuple[Path, dict[str, Tensor]] | None:
    """The library a note under `key` names and the lifted constants, or None (a cold build)."""
    note = _note(folder, key)
    if not note.is_file():
        return None
    try:
        lifted, meta = read_safetensors(note)
    except Exception:  # a note cut short or foreign: build again (it is rewritten then)
        return None
    library = folder / meta.get("library", "")
    return (library, lifted) if library.is_file() and library.suffix == ".pt2" else None


def remember(folder: Path, key: str, library: Path, lifted: dict[str, Tensor]) -> None:
    """Write the note: the library's name and the lifted constants (atomic: io.write_safetensors)."""
    _note(folder, key).parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in lifted.items()}
    write_safetensors(_note(folder, key), tensors, {"library": library.name})


class Library:
    """A compiled step's library, loaded by AOTInductor's own loader. torch's aoti_load_package first
    checks which vector instructions this CPU has by compiling and loading test programs (seconds,
    each process); the key above already holds the CPU, so the loader is called directly, and the
    public function is kept for a torch whose loader differs."""

    def __init__(self, path: Path):
        try:
            self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
            self._load = lambda named, full, user: self.loader.load_constants(named, False, full, user, False)
        except (AttributeError, TypeError, RuntimeError):
            runner = torch._inductor.aoti_load_package(str(path))
            self.loader = runner.loader
            self._load = lambda named, full, user: runner.load_constants(
                named, check_full_update=full, user_managed=user
            )

    def get_constant_fqns(self) -> list[str]:
        return self.loader.get_constant_fqns()

    def load_constants(self, named: dict[str, Tensor], check_full_update: bool, user_managed: bool) -> None:
        self._load(named, check_full_update, user_managed)
