"""Hand-written row products for decoding on a CPU (csrc/), built on this machine the first time a packed
layer needs one, and PyTorch's operators `attnlab::int8_row_product`, `attnlab::bf16_row_product` and
`attnlab::int4_row_product` from then on (so torch.compile and torch.export see them as operators),
and a float32 one `attnlab::f32_row_product` that the ahead-of-time decode step takes (FloatRows). Each
takes one row (batch 1) or a few (a batched decode step: 2-32 rows read each weight byte once for all).

Why: at batch 1 a decode step streams every weight once. PyTorch's one-row products of int8 weights
(torch._weight_int8pack_mm, or inductor's fused sum over the stored rows) read well below what plain
reading reaches: they wait on memory. This kernel asks for each row's bytes 4 KB ahead and keeps
four accumulators, which brings it near the memory's speed (benchmarks/row_products.py; the figures
are in docs/log.md, "The one-row operators"). int4 (csrc/q4_products.cpp) rounds the activations to
int8 per block of 32 and sums the products as integers, as GGUF's q4 x q8 products do (docs/cpu.md).

It is compiled with the C++ compiler torch.compile uses ($CXX, else c++), -O3 -march=native (or the
instruction set ATEN_CPU_CAPABILITY names) and OpenMP, against the installed torch's headers and
libraries (seconds, once), and kept in the extensions folder under a name made of the source, the
flags, the torch version and the CPU, so the next process loads it in milliseconds. Where that fails
(no compiler, another platform) the layers take PyTorch's kernels as before, and `unavailable()` says
why; ATTNLAB_ROW_KERNELS=0 turns them off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from attnlab.runtime.precision import cpu_identity

try:
    import fcntl  # the build's lock: POSIX only
except ImportError:
    fcntl = None

SOURCES = ("row_products.cpp", "q4_products.cpp")  # built into one library
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
# The instruction set the kernels are built for: this CPU's own, unless PyTorch is told to use fewer
# (ATEN_CPU_CAPABILITY, which PyTorch's kernels and inductor's code also follow): with avx2 all three
# run what an AVX2-only CPU runs, so its path can be measured on an AVX-512 machine (docs/cpu.md).
MARCH = {"avx2": "-march=haswell", "default": "-march=x86-64"}
SWITCH = "ATTNLAB_ROW_KERNELS"  # "0": PyTorch's kernels only
_WHY: list[str] = []  # why the library is not loaded, once known
_LOADED: list[bool] = []  # [True] once it is
_ONCE = threading.Lock()


def _folder() -> Path:
    """Where torch.utils.cpp_extension keeps what it builds (TORCH_EXTENSIONS_DIR, else the cache)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "torch_extensions"


def _command(sources: list[Path], target: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    lib = torch_dir / "lib"
    return [
        os.environ.get("CXX", "c++"),
        *FLAGS,
        MARCH.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower(), "-march=native"),
        abi,
        f"-I{torch_dir / 'include'}",
        *map(str, sources),
        "-o",
        str(target),
        f"-L{lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{lib}",
    ]


def _sources() -> list[bytes]:
    return [(resources.files("attnlab.quant") / "csrc" / name).read_bytes() for name in SOURCES]


def _target(texts: list[bytes]) -> Path:
    """Where the library for these sources, compiler, torch and CPU is kept."""
    command = " ".join(_command([Path("s")], Path("t"))).encode()
    key = hashlib.sha256(b"|".join([*texts, command, torch.__version__.encode(), cpu_identity().encode()]))
    key = key.hexdigest()[:16]
    return _folder() / "attnlab" / f"row_products_{key}.so"


def _built() -> Path:
    """The shared library, built once (a lock keeps two processes from building it together; the file
    appears whole, by rename)."""
    texts = _sources()
    target = _target(texts)
    if target.exists():
        return target
    folder = target.parent
    key = target.stem.removeprefix("row_products_")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{target.name}.lock", "w") as lock:
        _hold(lock)
        if not target.exists():
            sources = [folder / f"{key}_{name}" for name in SOURCES]
            partial = folder / f"{target.name}.{os.getpid()}.tmp"
            for source, text in zip(sources, texts, strict=True):
                source.write_bytes(text)
            done = subprocess.run(_command(sources, partial), capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise RuntimeError(f"the compiler failed: {last}")
            os.replace(partial, target)
    return target


def _hold(lock) -> None:
    """Wait for another process building the same library (POSIX; elsewhere each builds its own)."""
    if fcntl is not None:
        fcntl.flock(lock, fcntl.LOCK_EX)


def loaded() -> bool:
    """Whether the operators are ready in this process (built and loaded on the first call; a second
    thread asking meanwhile waits for that answer: the operators are registered once)."""
    if _LOADED:
        return True
    with _ONCE:
        return _load()


def _off() -> bool:
    return os.environ.get(SWITCH, "1") == "0"


@functools.cache
def _load() -> bool:
    if _off():
        _WHY.append(f"{SWITCH}=0")
        return False
    if not sys.platform.startswith("linux"):
        _WHY.append(f"built on Linux only, not {sys.platform}")
        return False
    try:
        torch.ops.load_library(str(_built()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        _WHY.append(str(error).splitlines()[0] if str(error) else type(error).__name__)
        return False
    torch.library.register_fake("attnlab::int8_row_product")(_rows_shape)
    torch.library.register_fake("attnlab::bf16_row_product")(_rows_shape)
    torch.library.register_fake("attnlab::f32_row_product")(_rows_shape)
    torch.library.register_fake("attnlab::int4_row_product")(_rows_shape)
    _LOADED.append(True)
    return True


def ready() -> bool:
    """loaded(); while a caller is traced (torch.compile, torch.export), what an earlier call found: a
    trace cannot build a library (decoding/compiled.py asks first)."""
    if torch.compiler.is_compiling():
        return bool(_LOADED)
    return loaded()


def _rows_shape(x: Tensor, weight: Tensor, scales: Tensor | None = None) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def status() -> str:
    """One line for `attnlab doctor`, without building anything."""
    if _LOADED:
        return "loaded"
    if _off():
        return f"off ({SWITCH}=0)"
    if _WHY:
        return f"not loaded: {_WHY[-1]}"
    target = _target(_sources())
    if target.exists():
        return f"built ({target})"
    return "not built yet: compiled the first time a one-row decode step needs them (about 15 s, once)"


def unavailable() -> str | None:
    """None when the operators are loaded, else why not (for `attnlab doctor`)."""
    return None if loaded() else (_WHY[-1] if _WHY else "not loaded")


def int8_row(x: Tensor, codes: Tensor, scales: Tensor) -> Tensor:
    """x (M, I) float32, codes (O, I) int8, scales (O,) float32 or bfloat16 -> (M, O) float32:
    x @ (codes * scales)^T, summed in float32."""
    return torch.ops.attnlab.int8_row_product(x, codes, scales)


def f32_row(x: Tensor, weight: Tensor) -> Tensor:
    """x (M, I) float32, weight (O, I) float32 -> (M, O): x @ weight^T."""
    return torch.ops.attnlab.f32_row_product(x, weight)


class FloatRows(TorchFunctionMode):
    """While active (a decode step being traced: decoding/exported.py), F.linear of float32 rows on the
    CPU is f32_row plus the bias; any other call is left as it is. rows = 1 (a lone row's step): only
    one-row products; rows > 1 (a batched step of at most `rows` rows, B symbolic): every product,
    whose rows are the step's B. The operator reads each weight once for all the rows where PyTorch's
    float32 product packs the weight again at every call (docs/cpu.md, "Quantized weights for
    inference", has the measurements)."""

    def __init__(self, rows: int = 1):
        super().__init__()
        self.rows = rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if _float_rows(x, weight) and (self.rows > 1 or x.numel() == weight.shape[-1]):
                y = f32_row(x.reshape(-1, weight.shape[-1]), weight)  # (rows, O)
                y = y if bias is None else y + bias
                return y.view(*x.shape[:-1], weight.shape[0])
        return func(*args, **kwargs)


def _float_rows(x: Tensor, weight: Tensor) -> bool:
    return (
        weight.dim() == 2 and x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
    )


def bf16_row(x: Tensor, weight: Tensor) -> Tensor:
    """x (M, I) float32, weight (O, I) bfloat16 -> (M, O) float32, summed in float32."""
    return torch.ops.attnlab.bf16_row_product(x, weight)


def int4_row(x: Tensor, blocks: Tensor) -> Tensor:
    """x (M, I) float32, I a multiple of 32, blocks (O, I / 32 * 20) uint8 (quant/packed.py's int4_blocks)
    -> (M, O) float32: x rounded to int8 per block of 32 (absmax / 127), times the int4 weights."""
    return torch.ops.attnlab.int4_row_product(x, blocks)
